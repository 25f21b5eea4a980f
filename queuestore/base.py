"""The queue-store interface that every backend (embedded SQLite, Kafka) implements.

A queue store holds persistent, append-only output queues: topics split into partitions, each partition an
ordered log addressed by offsets 0, 1, 2, ... Records are opaque bytes plus a small `RecordMeta` that the
store keeps beside the value (SQLite columns; on Kafka a kind header, the message key and a small frame in
front of the value) so that the stream index and downstream consumers can read kind/time/window without
decoding the value.

Contract (checked by the conformance suite in `tests/queuestore/conformance`):
- exactly one writer per partition; appends are durable in order and reported through callbacks served
  by `poll()`/`flush()` in the writer's thread, each with the record's offset;
- the durable log is always a prefix of what the writer appended (a crash loses a suffix, never a record
  in the middle, never duplicates);
- a reader never returns part of a record; it can read forward from an offset, backward from an offset,
  and find the end of the partition; readers may live in other processes than the writer. A durable
  record is readable by every reader at once on the embedded store; on Kafka once the broker wrote its
  transaction's commit markers, which it does just after the commit returns (a new writer's
  initialisation waits for them, so recovery always reads a settled log);
- writers are fail-stop: after the first failed append a writer refuses every later one and its
  `append`/`poll`/`flush` raise `WriterFailedError`, so a failed record never leaves a hole with later
  records after it;
- on a store with `dense_offsets` (every offset below the end holds a record) a missing offset is damage:
  the scans raise `DamagedLogError` naming it. Kafka with transactions is not dense (markers take offsets).
"""

from __future__ import annotations

import abc
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from cec.stored import RecordMeta, Row
from queuestore.exceptions import DamagedLogError, LogTrimmedError, WriterFailedError

__all__ = [
    "ATTACHMENT_NAME",
    "DurableCallback",
    "PartitionReader",
    "PartitionWriter",
    "QueueStore",
    "RecordMeta",
    "Row",
    "StoredRecord",
]


# Attachment names are file-name and header safe: lower-case letters, digits and dashes.
ATTACHMENT_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")


class StoredRecord(NamedTuple):
    offset: int
    value: bytes
    meta: RecordMeta


# Called once per appended record when it is durable (offset, None) or definitely failed (None, error).
DurableCallback = Callable[[int | None, Exception | None], None]


class PartitionWriter(abc.ABC):
    """The single writer of one partition, fail-stop (see the module docstring): a backend records its
    first failed append with `_fail` and calls `_check_failed` in `append`, `poll` and `flush`."""

    topic: str
    partition: int
    _failure: Exception | None = None
    _failure_raised = False

    @property
    def failure(self) -> Exception | None:
        """The first failed append, after which the writer refuses every append."""
        return self._failure

    def _fail(self, error: Exception) -> None:
        if self._failure is None:
            self._failure = error

    def _check_failed(self) -> None:
        if self._failure is not None:
            self._failure_raised = True
            if isinstance(self._failure, DamagedLogError):  # restarting will not help: say what will
                raise self._failure
            raise WriterFailedError(
                f"append to {self.topic}[{self.partition}] failed ({self._failure}); the writer stopped "
                "there and writes nothing more: restart the operator to recover from the log"
            ) from self._failure

    def _close_flush(self, flush: Callable[[], None]) -> None:
        """`flush` for `close`: a failure the owner was already told about is not raised again (it would
        hide the original error when `close` runs in a `finally`)."""
        try:
            flush()
        except WriterFailedError:
            if not self._failure_raised:
                raise

    @abc.abstractmethod
    def append(self, value: bytes, meta: RecordMeta, on_durable: DurableCallback | None = None) -> None:
        """Queue a record for durable append. May block while too much data is outstanding."""

    @abc.abstractmethod
    def poll(self, timeout: float = 0.0) -> int:
        """Serve completion callbacks of records that became durable; returns how many were served."""

    @abc.abstractmethod
    def flush(self, timeout: float | None = None) -> None:
        """Wait until every appended record is durable and its callback served."""

    @property
    @abc.abstractmethod
    def outstanding(self) -> int:
        """Records appended whose completion has not been served yet."""

    def await_fence(self) -> None:
        """Return once no earlier writer of the partition can add to its log. A writer opened with
        `fence_later` (`QueueStore.writer`) may still be fencing; a backend whose writer excludes the
        others when it is made (a lock) has nothing to wait for. Raises what the fence failed with."""
        return None

    def trim(self, before_offset: int) -> int:
        """Delete every record below `before_offset` (trimming, DESIGN-NOTES section 3: the caller has
        checked that neither a checkpoint nor a registered consumer still needs them); the log start then
        is `before_offset`. Returns how many offsets were removed. A backend that cannot trim keeps all."""
        return 0

    @abc.abstractmethod
    def close(self) -> None:
        """Flush and release the partition."""

    def __enter__(self) -> PartitionWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PartitionReader(abc.ABC):
    """Reads one partition. Safe to use from a process other than the writer's.

    `dense_offsets` and `store_name` are set by the store that makes the reader (see `QueueStore`)."""

    topic: str
    partition: int
    dense_offsets: bool = True
    store_name: str = "queue store"
    # What a user can do about a damaged log, said after every damage error (a backend says it its way).
    way_out: str = "restore it from a backup, or start over with a new output topic"

    @property
    def log_name(self) -> str:
        """How an error names the log: the store (a backend may name the file) and topic[partition]."""
        return f"{self.store_name}: {self.topic}[{self.partition}]"

    def where(self, offset: int) -> str:
        """How an error names a record: the log (`log_name`) and the offset."""
        return f"{self.log_name} offset {offset}"

    def damaged(self, offset: int, reason: object) -> DamagedLogError:
        """The error for a record that fails its checksum (or is otherwise not what was written)."""
        return DamagedLogError(f"{self.where(offset)} is damaged: {reason}; {self.way_out}")

    def missing(self, offset: int) -> DamagedLogError:
        """The error for an offset missing from a dense log (a record lost to damage)."""
        return DamagedLogError(
            f"{self.where(offset)} is missing: the log is damaged (its offsets must be dense); {self.way_out}"
        )

    @abc.abstractmethod
    def end_offset(self) -> int:
        """One past the last durable record (0 for an empty partition)."""

    def start_offset(self) -> int:
        """The log start: the first offset not trimmed (0 for a log never trimmed)."""
        return 0

    def trimmed(self, offset: int) -> LogTrimmedError:
        """The error for a read below the log start."""
        return LogTrimmedError(
            f"{self.where(offset)} was trimmed: the log starts at {self.start_offset()} (a consumer that "
            "must read it has to be registered and acknowledge what it has read)"
        )

    def hint_end(self, offset: int) -> None:  # noqa: B027 - optional: a backend that can use it overrides
        """Tell the reader that the partition holds at least `offset` records (e.g. the stream index's
        `next_offset`), so that finding the end need not read what is known to be there. Only a lower
        bound: the end is still found by reading; a wrong hint costs time, never correctness."""

    def hint_end_from_store(self) -> None:  # noqa: B027 - optional: a backend whose end costs a read overrides
        """`hint_end` with what the store tells cheaply, for a caller that holds the partition's writer (so
        nothing is in flight): on Kafka the high watermark, where the end-finder then starts reading instead
        of at the index's `next_offset`, which a lost index (a fresh host) leaves at the log start. Still
        only a hint: the end is found by reading."""

    @abc.abstractmethod
    def read_forward(self, from_offset: int, max_records: int) -> list[StoredRecord]:
        """Up to `max_records` records with offset >= `from_offset`, oldest first."""

    @abc.abstractmethod
    def read_backward(self, before_offset: int, max_records: int) -> list[StoredRecord]:
        """Up to `max_records` records with offset < `before_offset`, newest first."""

    def read_forward_rows(self, from_offset: int, max_records: int) -> list[Row]:
        """`read_forward` as flat rows (see `Row`): the same records, oldest first. Backends override it
        to skip building objects per record (a queue source reads every record of its input, replay too)."""
        return [
            (r.offset, r.meta.kind, r.meta.time, r.meta.key, r.meta.seq, r.value)
            for r in self.read_forward(from_offset, max_records)
        ]

    def read_range_rows(self, start: int, stop_before: int) -> list[Row]:
        """The rows (see `Row`) at offsets in [start, stop_before), oldest first: fewer than the offsets
        where a store's offsets are not dense, none past the end. Backends override it with one bulk read
        (the Spark source reads each micro-batch's slice of a partition so)."""
        rows: list[Row] = []
        offset = start
        while offset < stop_before:
            chunk = self.read_forward_rows(offset, stop_before - offset)
            if not chunk:
                break
            rows.extend(r for r in chunk if r[0] < stop_before)
            offset = chunk[-1][0] + 1
        return rows

    def read_backward_rows(self, before_offset: int, max_records: int) -> list[Row]:
        """`read_backward` as flat rows (see `Row`): the same records, newest first. Backends override it
        to skip building objects per record (recovery scans read every record of the extent)."""
        return [
            (r.offset, r.meta.kind, r.meta.time, r.meta.key, r.meta.seq, r.value)
            for r in self.read_backward(before_offset, max_records)
        ]

    def scan_backward(self, before_offset: int | None = None, chunk: int = 4096) -> Iterator[StoredRecord]:
        """Every record below `before_offset` (default: the end), newest first, read in chunks."""
        upper = self.end_offset() if before_offset is None else before_offset
        dense = self.dense_offsets
        first = True
        start = self.start_offset()
        while upper > start:
            records = self.read_backward(upper, chunk)
            if not records:
                if dense and not first:
                    raise self.missing(upper - 1)
                return
            # The newest record found is the top of the log (`before_offset` may lie past the end); below
            # it, a dense log has every offset.
            top = records[0].offset if first else upper - 1
            if dense and (records[0].offset != top or top - records[-1].offset != len(records) - 1):
                _check_dense(self, records, top, -1)
            first = False
            yield from records
            upper = records[-1].offset

    def scan_forward(self, from_offset: int = 0, chunk: int = 4096) -> Iterator[StoredRecord]:
        """Every record from `from_offset` to the end as it is now, oldest first."""
        for records in self.scan_forward_chunks(from_offset, chunk):
            yield from records

    def scan_forward_chunks(
        self, from_offset: int = 0, chunk: int = 4096, *, stop_before: int | None = None
    ) -> Iterator[list[StoredRecord]]:
        """`scan_forward` in the lists it reads (up to `chunk` records each): what a checker of whole
        batches (`cec.verified.LogVerifier.check`, in C when built) takes. `stop_before`: the end of the
        stretch to read, an end the log is known to have reached (default: its end as it is now)."""
        end = self.end_offset() if stop_before is None else stop_before
        offset = from_offset
        dense = self.dense_offsets
        if offset < end and offset < self.start_offset():
            raise self.trimmed(offset)
        while offset < end:
            records = self.read_forward(offset, min(chunk, end - offset))
            if not records:
                if dense:
                    raise self.missing(offset)
                return
            if dense and (records[0].offset != offset or records[-1].offset - offset != len(records) - 1):
                _check_dense(self, records, offset, 1)
            yield records
            offset = records[-1].offset + 1

    @abc.abstractmethod
    def tail(
        self,
        from_offset: int,
        *,
        stop: Callable[[], bool] | None = None,
        idle_timeout: float | None = None,
        batch: int = 4096,
    ) -> Iterator[list[StoredRecord]]:
        """Batches from `from_offset` through the stored end and on into the live stream (catch-up).

        Ends when `stop()` returns true or nothing new arrived for `idle_timeout` seconds.
        """

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> PartitionReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_dense(reader: PartitionReader, records: list[StoredRecord], first: int, step: int) -> None:
    """Raise for the first offset missing from `records`, which should run from `first` by `step`."""
    expected = first
    for stored in records:
        if stored.offset != expected:
            raise reader.missing(expected)
        expected += step


class QueueStore(abc.ABC):
    """A set of topics. `state_dir` holds local state such as the stream indexes.

    `dense_offsets`: every offset below a partition's end holds a record (SQLite: offsets are rowids), so
    readers treat a missing one as damage. False where the log legitimately skips offsets (Kafka
    transaction markers)."""

    state_dir: Path
    max_record_bytes: int
    dense_offsets: bool = True

    @abc.abstractmethod
    def create_topic(self, topic: str, partitions: int, *, exist_ok: bool = True) -> None:
        """Create a topic, or check that an existing one has `partitions` partitions."""

    @abc.abstractmethod
    def topic_exists(self, topic: str) -> bool: ...

    def topics(self) -> list[str]:
        """The output topics the store holds, sorted (`cec inspect --list`). Backends override it."""
        raise NotImplementedError(f"{type(self).__name__} cannot list its topics")

    @abc.abstractmethod
    def partitions(self, topic: str) -> int: ...

    @abc.abstractmethod
    def writer(self, topic: str, partition: int, *, fence_later: bool = False) -> PartitionWriter:
        """Take exclusive ownership of a partition for appending. `fence_later`: a backend whose exclusion
        of earlier writers takes a round trip (Kafka's fence) may return before it is done; the owner reads
        meanwhile and calls `PartitionWriter.await_fence` before it trusts the log's end or appends."""

    @abc.abstractmethod
    def reader(self, topic: str, partition: int) -> PartitionReader: ...

    def value_limit(self, meta: RecordMeta) -> int:
        """The largest value a record with this meta may carry (larger ones go in parts, see chunks)."""
        return self.max_record_bytes

    # -- attachments: small named values kept with a partition's log ----------------------------------
    # They live where the log lives (the SQLite topic directory; on Kafka a companion topic), so whoever
    # can read the log can read them, e.g. the identity of the input the log was built from.

    def check_retention(self, topic: str) -> None:  # noqa: B027 - a store without retention has nothing to check
        """Raise if the store itself may delete records of `topic` (broker retention): only cec may trim
        its logs, or recovery would meet a gap."""

    # -- registered consumers (trimming keeps what they have not acknowledged) --------------------------
    def acknowledge(self, topic: str, partition: int, consumer: str, offset: int) -> None:
        """Register `consumer` of the partition, or move its acknowledged position: it will never read
        below `offset` again (a restart included). Trimming never passes it."""
        raise NotImplementedError(f"{type(self).__name__} does not keep consumer acknowledgements")

    def forget_consumer(self, topic: str, partition: int, consumer: str) -> None:
        """Unregister `consumer`: trimming no longer waits for it."""
        raise NotImplementedError(f"{type(self).__name__} does not keep consumer acknowledgements")

    def acknowledged(self, topic: str, partition: int) -> dict[str, int]:
        """Every registered consumer of the partition and its acknowledged position."""
        raise NotImplementedError(f"{type(self).__name__} does not keep consumer acknowledgements")

    @abc.abstractmethod
    def read_attachment(self, topic: str, partition: int, name: str) -> bytes | None:
        """The newest value written under `name` for the partition, None if there is none."""

    @abc.abstractmethod
    def write_attachment(self, topic: str, partition: int, name: str, value: bytes) -> None:
        """Replace the value under `name` for the partition, atomically; durable when this returns.

        Only the partition's writer calls it, while holding the partition (one writer at a time)."""

    def index_path(self, topic: str, partition: int) -> Path:
        """Where the stream index of a partition lives (local, derived state: can be rebuilt)."""
        return self.state_dir / "index" / f"{topic}.{partition}.rocksdb"

    def ec_cache_path(self, topic: str, partition: int) -> Path:
        """Where the EC cache of a partition lives, beside its index (`queuestore.ec_cache`; derived)."""
        return self.index_path(topic, partition).with_name(f"{topic}.{partition}.ec.snapshot")

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> QueueStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
