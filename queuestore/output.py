"""A persistent output queue: one partition's writer with its stream index kept up to date.

This is the data path's write end: the operator appends, the store makes records durable, and on each
durable completion the index learns the record (paper appendix: "once a completion of a write I/O is
posted ... we first update a per-stream index").

Fail-stop, on every backend (the writers implement it, see `queuestore.base`): the first failed append
makes `append`, `poll` and `flush` raise `WriterFailedError` at once, and nothing after the failed record
is ever written, so the log stays a gapless prefix of what the operator produced and a restart recovers
from it exactly. The operator must stop; it never goes on past a hole.

A fresh host (the state directory lost) finds its index empty beside a long log. With `defer_index_above`,
an index more than that many records behind is not rebuilt before the operator starts: the gap is noted
(`StreamIndex.defer`), recovery reads the log back from its end as far as it needs
(`recovery.closed_directory`), and the host calls `catch_up_index` while it runs to index the rest.
"""

from __future__ import annotations

from collections.abc import Callable

from queuestore.base import PartitionReader, PartitionWriter, QueueStore, RecordMeta
from queuestore.chunks import split
from queuestore.ec_cache import ECCache
from queuestore.exceptions import WriterResetError
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
        defer_index_above: int | None = None,
        on_index: Callable[[], None] | None = None,
        ec_cache: bool = False,
        fence_later: bool = False,
    ) -> None:
        """`defer_index_above`: defer the index's rebuild when it is more than this many records behind
        the log (module doc); None: always bring it up to the log's end here. `on_index` is told when the
        writer is open and the index is about to be (a host's restart timeline, `recovery.timeline`).
        `ec_cache`: keep the EC cache beside the index (`queuestore.ec_cache`: written once the host's
        recovery adopted a checkpoint). `fence_later`: the writer fences the partition's earlier writers in
        the background while the host reads its log; the host calls `settle_fence` before it appends."""
        self.store = store
        self.topic = topic
        self.partition = partition
        self.writer: PartitionWriter = store.writer(topic, partition, fence_later=fence_later)
        self._fence_later = fence_later
        if on_index is not None:
            on_index()
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
                self.reconciled = 0
                if defer_index_above is not None:
                    reader.hint_end(self.index.next_offset)
                    reader.hint_end_from_store()  # this queue holds the writer: a lost index gives no hint
                    if reader.end_offset() - self.index.next_offset > defer_index_above:
                        self.index.defer(reader)
                if not self.index.deferred:
                    # Paper appendix, recovery step (1): reconcile the index with the log's real length.
                    self.reconciled = self.index.reconcile(reader, index_progress)
        except BaseException:
            self.index.close()
            self.writer.close()
            raise
        self.ec_cache: ECCache | None = None
        if ec_cache:
            self.ec_cache = ECCache(store.ec_cache_path(topic, partition), identity=f"{topic}/{partition}")
        self.durable_count = 0
        self.appended = 0  # records handed to the writer (parts count one each): durable_count catches up
        self.failures: list[Exception] = []  # failed appends whose callbacks were served
        self._catch_up_reader: PartitionReader | None = None

    @property
    def log_end(self) -> int:
        """The log's end as far as this queue knows before it appends: the index's `next_offset`, or the
        end a deferred index is catching up with."""
        deferred = self.index.deferred_end
        return self.index.next_offset if deferred is None else max(deferred, self.index.next_offset)

    def settle_fence(self, reader: PartitionReader, read_to: int) -> None:
        """Wait until the writer fenced the partition's earlier writers (`fence_later`), then make sure none
        of them added a record at or above `read_to`, where the caller's reading of the log ended, before
        it was fenced. A writer that died is fenced with nothing more (its open transaction aborted); one
        still alive (on another host, or a zombie) may have committed meanwhile: WriterResetError then,
        and the owner recovers again from a log that no one else can add to any more."""
        self.writer.await_fence()
        if not self._fence_later:
            return
        end = reader.end_offset()
        if end > read_to and reader.read_forward(read_to, 1):
            raise WriterResetError(
                f"{self.topic}[{self.partition}]: an earlier writer added to the log (offsets {read_to:,}.."
                f"{end:,}) while this one fenced it; recovering again from the log"
            )

    def catch_up_index(self, max_records: int | None = None) -> bool:
        """Index up to `max_records` more records of a deferred rebuild (None: all that is left); True once
        the index is caught up with the log (at once when nothing was deferred)."""
        if not self.index.deferred:
            return True
        if self._catch_up_reader is None:
            self._catch_up_reader = self.store.reader(self.topic, self.partition)
        done = self.index.catch_up(self._catch_up_reader, max_records)
        if done:
            self._close_catch_up()
        return done

    def _close_catch_up(self) -> None:
        reader, self._catch_up_reader = self._catch_up_reader, None
        if reader is not None:
            reader.close()

    def _on_durable(self, meta: RecordMeta, value: bytes) -> Callable[[int | None, Exception | None], None]:
        """`value`: the record's whole value (a chunked value's, for its manifest), for the EC cache."""
        cache = self.ec_cache

        def done(offset: int | None, error: Exception | None) -> None:
            if error is not None or offset is None:
                self.failures.append(error or RuntimeError("no offset"))
                return
            self.index.add(offset, meta)
            if cache is not None:
                cache.apply((offset, meta.kind, meta.time, meta.key, meta.seq, value))
            self.durable_count += 1

        return done

    def append(self, value: bytes, meta: RecordMeta) -> None:
        """Append a record; one larger than the store takes is written as parts plus a manifest
        (`queuestore.chunks`), all-or-nothing for readers."""
        limit = self.store.value_limit(meta)
        if len(value) <= limit:
            self.writer.append(value, meta, self._on_durable(meta, value))
            self.appended += 1
            return
        for part_value, part_meta in split(value, meta, limit):
            whole = value if part_meta is meta else part_value  # the manifest stands for the whole value
            self.writer.append(part_value, part_meta, self._on_durable(part_meta, whole))
            self.appended += 1

    def _on_durable_run(
        self, kind: str, time: int, keys: list[str], seqs: list[int], values: list[bytes]
    ) -> Callable[[int | None, Exception | None], None]:
        cache = self.ec_cache

        def done(last: int | None, error: Exception | None) -> None:
            if error is not None or last is None:
                self.failures.append(error or RuntimeError("no offset"))
                return
            first = last - len(keys) + 1
            self.index.add_run(first, kind, time, keys, seqs)
            if cache is not None:
                cache.apply_run(first, kind, time, keys, seqs, values)
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
                append_run(
                    kind, time, keys, seqs, values, self._on_durable_run(kind, time, keys, seqs, values)
                )
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
        if self.ec_cache is not None:
            self.ec_cache.commit()
        return served

    def flush(self) -> None:
        self.writer.flush()
        self.index.commit()
        if self.ec_cache is not None:
            self.ec_cache.commit()

    @property
    def outstanding(self) -> int:
        return self.writer.outstanding

    def close(self) -> None:
        try:
            self.writer.close()
            self.index.commit()
        finally:
            try:
                self._close_catch_up()  # a catch-up not finished: the next start takes it up again
                if self.ec_cache is not None:
                    self.ec_cache.commit()
                    self.ec_cache.close()
            finally:
                self.index.close()
