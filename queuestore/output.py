"""A persistent output queue: one partition's writer with its stream index kept up to date.

This is the data path's write end: the operator appends, the store makes records durable, and on each
durable completion the index learns the record (paper appendix: "once a completion of a write I/O is
posted ... we first update a per-stream index").

Fail-stop, on every backend (the writers implement it, see `queuestore.base`): the first failed append
makes `append`, `poll` and `flush` raise `WriterFailedError` at once, and nothing after the failed record
is ever written, so the log stays a gapless prefix of what the operator produced and a restart recovers
from it exactly. The operator must stop; it never goes on past a hole.
"""

from __future__ import annotations

from collections.abc import Callable

from queuestore.base import PartitionWriter, QueueStore, RecordMeta
from queuestore.chunks import split
from queuestore.index import StreamIndex

__all__ = ["OutputQueue"]


class OutputQueue:
    def __init__(
        self,
        store: QueueStore,
        topic: str,
        partition: int,
        *,
        index_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.store = store
        self.topic = topic
        self.partition = partition
        self.writer: PartitionWriter = store.writer(topic, partition)
        try:
            # Given the log: an index found damaged in the middle of the run is rebuilt from it there.
            self.index = StreamIndex(
                store.index_path(topic, partition),
                identity=f"{topic}/{partition}",
                log=lambda: store.reader(topic, partition),
            )
        except BaseException:
            self.writer.close()  # else the partition's writer lock stays held by this process
            raise
        try:
            with store.reader(topic, partition) as reader:
                # Paper appendix, recovery step (1): reconcile the index with the log's real length.
                self.reconciled = self.index.reconcile(reader, index_progress)
        except BaseException:
            self.index.close()
            self.writer.close()
            raise
        self.durable_count = 0
        self.appended = 0  # records handed to the writer (parts count one each): durable_count catches up
        self.failures: list[Exception] = []  # failed appends whose callbacks were served

    def _on_durable(self, meta: RecordMeta) -> Callable[[int | None, Exception | None], None]:
        def done(offset: int | None, error: Exception | None) -> None:
            if error is not None or offset is None:
                self.failures.append(error or RuntimeError("no offset"))
                return
            self.index.add(offset, meta)
            self.durable_count += 1

        return done

    def append(self, value: bytes, meta: RecordMeta) -> None:
        """Append a record; one larger than the store takes is written as parts plus a manifest
        (`queuestore.chunks`), all-or-nothing for readers."""
        limit = self.store.value_limit(meta)
        if len(value) <= limit:
            self.writer.append(value, meta, self._on_durable(meta))
            self.appended += 1
            return
        for part_value, part_meta in split(value, meta, limit):
            self.writer.append(part_value, part_meta, self._on_durable(part_meta))
            self.appended += 1

    def _on_durable_run(
        self, kind: str, time: int, keys: list[str], seqs: list[int]
    ) -> Callable[[int | None, Exception | None], None]:
        def done(last: int | None, error: Exception | None) -> None:
            if error is not None or last is None:
                self.failures.append(error or RuntimeError("no offset"))
                return
            self.index.add_run(last - len(keys) + 1, kind, time, keys, seqs)
            self.durable_count += len(keys)

        return done

    def append_run(self, kind: str, time: int, keys: list[str], seqs: list[int], values: list[bytes]) -> None:
        """`append(values[i], RecordMeta(kind, time, keys[i], seqs[i]))` of each, in order: records of one
        kind and time (the batched G-check), in one writer call when the writer takes runs (consecutive
        offsets, one completion for the run) and every value fits in one record; else one by one. Indexed,
        like any record, only once durable."""
        if not values:
            return
        append_run = getattr(self.writer, "append_run", None)
        if append_run is not None:
            # 4 bytes per character at most: a store whose limit depends on the key (Kafka) gets the worst.
            longest_key = max(map(len, keys))
            limit = self.store.value_limit(RecordMeta(kind, time, "x" * (4 * longest_key), 0))
            if max(map(len, values)) <= limit:
                append_run(kind, time, keys, seqs, values, self._on_durable_run(kind, time, keys, seqs))
                self.appended += len(values)
                return
        for key, seq, value in zip(keys, seqs, values, strict=True):
            self.append(value, RecordMeta(kind, time, key, seq))

    def poll(self, timeout: float = 0.0) -> int:
        served = self.writer.poll(timeout)
        # Not only what this call served: a writer may settle completions in `append` too (the Kafka
        # writer reaps a pipelined commit that is through there), and the index must learn them now, not
        # at the final flush. A no-op when the index learnt nothing.
        self.index.commit()
        return served

    def flush(self) -> None:
        self.writer.flush()
        self.index.commit()

    @property
    def outstanding(self) -> int:
        return self.writer.outstanding

    def close(self) -> None:
        try:
            self.writer.close()
            self.index.commit()
        finally:
            self.index.close()
