"""Kafka partition readers kept in an executor's Python worker between the Spark tasks it runs.

Every micro-batch of a streaming read of the `cec-kafka` source is a new Spark task per Kafka partition,
and Spark reuses its Python workers between tasks (`spark.python.worker.reuse`, on by default). Opening
a reader afresh for each task costs a metadata request and a new consumer's connection and first fetch
(~80 ms per slice on a quiet machine, measured in benchmarks/RESULTS.md): a fixed cost per micro-batch
and partition that small, frequent micro-batches pay over and over. `ReaderPool` keeps the readers of the
slices a worker read, so the next task of the same partition continues on a connected consumer.

A reader goes back to the pool only when the read that leased it finished cleanly: a read that failed
(a damaged record, a broker error) or was abandoned by Spark (a `limit`, a cancelled task) closes its
reader and store, so nothing reuses a consumer in an unknown state. Readers are positioned explicitly by
every read (`KafkaPartitionReader.read_range_rows`), so a pooled reader serves any later slice of its
partition, not only the one that follows.
"""

from __future__ import annotations

import atexit
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from queuestore.kafka import KafkaPartitionReader, KafkaQueueStore

__all__ = ["READERS", "ReaderPool"]


class ReaderPool:
    """Idle readers by key, least recently used first; at most `capacity` are kept open."""

    def __init__(self, capacity: int = 8) -> None:
        self.capacity = capacity
        self._idle: OrderedDict[Hashable, tuple[KafkaQueueStore, KafkaPartitionReader]] = OrderedDict()
        self._lock = threading.Lock()
        self.opened = 0  # readers opened, for tests and benchmarks
        self.reused = 0  # leases served by a kept reader

    @contextmanager
    def lease(
        self, key: Hashable, open_store: Callable[[], KafkaQueueStore], topic: str, partition: int
    ) -> Iterator[KafkaPartitionReader]:
        """A reader of `topic[partition]`, kept for the next lease of `key` if the body completes."""
        with self._lock:
            entry = self._idle.pop(key, None)
            if entry is not None:
                self.reused += 1
        if entry is None:
            store = open_store()
            try:
                reader = store.reader(topic, partition)
            except BaseException:
                store.close()
                raise
            with self._lock:
                self.opened += 1
        else:
            store, reader = entry
        clean = False
        try:
            yield reader
            clean = True
        finally:
            if clean:
                self._keep(key, store, reader)
            else:
                store.close()

    def _keep(self, key: Hashable, store: KafkaQueueStore, reader: KafkaPartitionReader) -> None:
        evicted = []
        with self._lock:
            previous = self._idle.pop(key, None)  # two leases of one key at once: keep the newer
            if previous is not None:
                evicted.append(previous[0])
            self._idle[key] = (store, reader)
            while len(self._idle) > self.capacity:
                evicted.append(self._idle.popitem(last=False)[1][0])
        for old in evicted:
            old.close()

    def close(self) -> None:
        """Close every idle reader (a leased one closes when its lease ends)."""
        with self._lock:
            idle, self._idle = list(self._idle.values()), OrderedDict()
        for store, _reader in idle:
            store.close()

    def __len__(self) -> int:
        return len(self._idle)


# One pool per Python process: an executor's worker keeps its readers across the tasks it runs.
READERS = ReaderPool()
atexit.register(READERS.close)
