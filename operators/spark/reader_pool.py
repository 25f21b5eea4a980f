"""Kafka readers kept in an executor's Python worker between the Spark tasks it runs.

Every micro-batch of a streaming read of the `cec-kafka` or `cec-topic` source is a new Spark task per
Kafka partition, and Spark reuses its Python workers between tasks (`spark.python.worker.reuse`, on by
default). Opening a reader afresh for each task costs a metadata request and a new consumer's connection
and first fetch (~80 ms per slice on a quiet machine, benchmarks/RESULTS.md), and for a Schema Registry
topic the registry lookups too: a fixed cost per micro-batch and partition that small, frequent
micro-batches pay over and over. `ReaderPool` keeps the readers of the slices a worker read, so the next
task of the same partition continues on a connected consumer.

A reader goes back to the pool only when the read that leased it finished cleanly: a read that failed
(a damaged record, a broker error, the retention error) or was abandoned by Spark (a `limit`, a cancelled
task) closes its reader, so nothing reuses a consumer in an unknown state. Every read positions its
reader explicitly (`KafkaPartitionReader.read_range_rows`; `KafkaTopicSource.pin` and `seek`), so a pooled
reader serves any later slice of its partition, not only the one that follows. A kept reader fetches
nothing in the background: both readers end every read with their consumer unassigned, so what it holds
is its connections.
"""

from __future__ import annotations

import atexit
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

__all__ = ["READERS", "Closeable", "ReaderPool"]


class Closeable(Protocol):
    def close(self) -> Any: ...


R = TypeVar("R", bound=Closeable)


class ReaderPool:
    """Idle readers by key, least recently used first; at most `capacity` are kept open."""

    def __init__(self, capacity: int = 8) -> None:
        self.capacity = capacity
        self._idle: OrderedDict[Hashable, Closeable] = OrderedDict()
        self._lock = threading.Lock()
        self.opened = 0  # readers opened, for tests and benchmarks
        self.reused = 0  # leases served by a kept reader

    @contextmanager
    def lease(self, key: Hashable, open_reader: Callable[[], R]) -> Iterator[R]:
        """The kept reader of `key`, or a new one from `open_reader`; kept again if the body completes.
        `key` must say everything the reader was opened with (a kept reader is used as it is)."""
        with self._lock:
            kept = self._idle.pop(key, None)
            if kept is not None:
                self.reused += 1
        if kept is None:
            reader = open_reader()
            with self._lock:
                self.opened += 1
        else:
            reader = kept  # type: ignore[assignment]  # stored under the key it was opened with
        clean = False
        try:
            yield reader
            clean = True
        finally:
            if clean:
                self._keep(key, reader)
            else:
                reader.close()

    def _keep(self, key: Hashable, reader: Closeable) -> None:
        evicted = []
        with self._lock:
            previous = self._idle.pop(key, None)  # two leases of one key at once: keep the newer
            if previous is not None:
                evicted.append(previous)
            self._idle[key] = reader
            while len(self._idle) > self.capacity:
                evicted.append(self._idle.popitem(last=False)[1])
        for old in evicted:
            old.close()

    def close(self) -> None:
        """Close every idle reader (a leased one closes when its lease ends)."""
        with self._lock:
            idle, self._idle = list(self._idle.values()), OrderedDict()
        for reader in idle:
            reader.close()


# One pool per Python process: an executor's worker keeps its readers across the tasks it runs.
READERS = ReaderPool()
atexit.register(READERS.close)
