"""The stream index: RocksDB (rocksdict) beside each output partition.

It answers two questions about a partition's log without reading the log:
- *time -> offset*: where to start reading to see every record whose logical time is >= t (replay
  requests by time, paper appendix). Entries are sparse (one per `stride` records, like the paper's one
  entry per stream event): logical time is non-decreasing along the log, so the greatest entry with a
  time strictly below t is a safe starting point and the reader skips the few records before t;
- *key -> last closed window sequence* (the closed-window directory): after a crash, a key with no open
  window in the eventual checkpoint must open its next window with the right per-key sequence number, and
  that number lives in the key's last R record, which may lie anywhere in the log.

Everything here is derived from the log: entries are written when records become durable, `reconcile`
indexes whatever the log holds past `next_offset` (a crash between durable completion and the index
write loses index entries, never log records), and a missing or foreign index is rebuilt from offset 0.
Updates of one durable batch go in one RocksDB WriteBatch together with `next_offset`, so the index is
always the index of an exact prefix of the log. `reconcile` indexes only records that pass their
checksum (`cec.verified`): a damaged footprint is passed over, as recovery passes over it (DESIGN-NOTES
section 2); any other damaged record is `DamagedLogError`, never an entry.

Damage to the index itself is repaired, never reported as a traceback: any RocksDB error (corruption, an
unreadable, truncated or missing file, a lock file it cannot take), whether on open or on a later read
(a damaged block is found only when a read reaches it), drops the index and rebuilds it from the log,
with one warning. A writer's index (`log` given, as `OutputQueue` does) rebuilds at once, in the middle of
a run too; one opened without a log is rebuilt by its next `reconcile`. A read-only index (another
process's) is never dropped: it raises `IndexError_`, and its readers fall back to the log. Only a lock
held by another live process is an error for a writer too: that process may be using the index.

A writer that finds its index far behind the log (a fresh host: the state directory was lost) need not
read the whole log before it starts (issue 26: recovery must grow with the extent, not the history):
`defer` notes the log's end instead, `catch_up` then indexes the missing stretch a slice at a time while
the operator runs, and the records that become durable meanwhile are held in memory and indexed once the
stretch is done. The index stays the index of an exact prefix of the log throughout, so a crash during the
catch-up leaves an index the next start reconciles (or defers) from where it got to.

One module, one job: the index of one partition (its two questions share one RocksDB, one WriteBatch per
durable batch and one rule for damage, so they are not split).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from rocksdict import AccessType, Options, Rdict, WriteBatch

from queuestore.base import PartitionReader, RecordMeta
from queuestore.exceptions import IndexError_, StoreClosedError

log = logging.getLogger(__name__)

__all__ = ["StreamIndex"]

_TIME = b"T"
_KEY = b"K"
_NEXT = b"M:next"
_START = b"M:start"  # the log start after trimming: no entry points below it
_IDENT = b"M:ident"
_U64 = struct.Struct(">Q")
_I64_BIAS = 1 << 63  # maps signed times onto unsigned so that byte order equals numeric order
_FOOTPRINT_KINDS = frozenset({"GOPEN", "GCHECK"})  # cec.records.FOOTPRINT_KINDS (no import: see _intact)
# RocksDB's answers when a live process (another, or this one through another handle) holds the LOCK.
_LOCK_HELD = ("Resource temporarily unavailable", "lock hold by current process")
_aside = itertools.count()

T = TypeVar("T")


def _time_key(time: int, offset: int) -> bytes:
    return _TIME + _U64.pack(time + _I64_BIAS) + _U64.pack(offset)


class _Unusable(Exception):
    """A RocksDB call failed (rocksdict raises plain `Exception`s: "Corruption: ...", "IO error: ..."), or
    what it returned is not what this module writes. Internal: turned into a rebuild or `IndexError_`."""

    def __init__(self, error: object) -> None:
        super().__init__(" ".join(str(error).split()))  # RocksDB's messages span lines: one line


class StreamIndex:
    """Index of one partition. One writer process; `read_only=True` opens for lookups elsewhere.

    `log`: opens a reader of the partition's log, so that an index found damaged after it was opened
    (on a later read, in the middle of a run) is rebuilt from the log there and then."""

    def __init__(
        self,
        path: str | Path,
        identity: str,
        *,
        stride: int = 64,
        read_only: bool = False,
        log: Callable[[], PartitionReader] | None = None,
    ) -> None:
        self.path = Path(path)
        self.identity = identity
        self.stride = stride
        self._read_only = read_only
        self._log = log
        self.rebuilds = 0  # times the index was found unusable and rebuilt from the log
        self.passed_over: list[int] = []  # offsets of damaged footprints `reconcile` did not index
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._batch = WriteBatch(raw_mode=True)
        self._db: Rdict | None = None
        # While deferred (`defer`): the log's end when the catch-up began, the durable records noted since
        # (indexed once the catch-up reaches that end) and the catch-up's position in the log.
        self._deferred_end: int | None = None
        self._held: list[tuple[int, str, int, list[str] | str | None, list[int] | int]] | None = None
        self._catching: Iterator[tuple[int, RecordMeta | None]] | None = None
        try:
            try:
                self._db = self._connect()
                self._load()
            except _Unusable as damage:
                self._rebuilt(damage, now=log is not None)  # without a log: the next `reconcile` rebuilds it
        except BaseException:
            self.close()  # a foreign or unusable index: its LOCK must not stay held by this process
            raise

    def _connect(self) -> Rdict:
        options = Options(raw_mode=True)
        try:
            if self._read_only:
                return Rdict(str(self.path), options, access_type=AccessType.read_only())
            options.create_if_missing(True)
            return Rdict(str(self.path), options)
        except Exception as exc:
            raise _Unusable(exc) from None

    def _load(self) -> None:
        """Read the index's own metadata (identity, next offset, log start) and reset the batch."""
        stored = self._get(_IDENT)
        if stored is None and not self._read_only:
            self._write_one(_IDENT, self.identity.encode())
        elif stored is not None and stored != self.identity.encode():
            raise IndexError_(
                f"index at {self.path} belongs to {stored.decode(errors='replace')!r}, not {self.identity!r}"
            )
        self._next_offset = self._get_u64(_NEXT)
        self._start_offset = self._get_u64(_START)
        self._last_entry_offset = -self.stride
        self._batch = WriteBatch(raw_mode=True)
        self._batch_size = 0
        self._batch_next = self._next_offset

    # -- RocksDB calls: every failure is `_Unusable` ---------------------------------------------------
    def _rdict(self) -> Rdict:
        if self._db is None:  # closed (or a reset that could not open a new index raised)
            raise StoreClosedError(f"the stream index at {self.path} is closed")
        return self._db

    def _get(self, key: bytes) -> bytes | None:
        db = self._rdict()
        try:
            value = db.get(key)
        except Exception as exc:
            raise _Unusable(exc) from None
        return None if value is None else bytes(value)

    def _get_u64(self, key: bytes) -> int:
        value = self._get(key)
        if value is None:
            return 0
        if len(value) != _U64.size:
            raise _Unusable(f"entry {key!r} holds {len(value)} bytes, not {_U64.size}")
        return int(_U64.unpack(value)[0])

    def _write(self, batch: WriteBatch) -> None:
        db = self._rdict()
        try:
            db.write(batch)
        except Exception as exc:
            raise _Unusable(exc) from None

    def _write_one(self, key: bytes, value: bytes) -> None:
        batch = WriteBatch(raw_mode=True)
        batch.put(key, value)
        self._write(batch)

    def _entries(self, prefix: bytes, *, before: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Entries whose key starts with `prefix`, in key order, from the greatest key below `before`
        (when given) or from the first. A read that fails midway raises (RocksDB ends such an iteration
        as if the data ended there, and says so only when asked: `status()`)."""
        db, it = self._rdict(), None
        try:
            it = db.iter()
            if before is None:
                it.seek(prefix)
            else:
                it.seek_for_prev(before)
            while it.valid():
                key = bytes(it.key())
                if not key.startswith(prefix):
                    break
                yield key, bytes(it.value())
                it.next()
            it.status()
        except Exception as exc:
            raise _Unusable(exc) from None
        finally:
            # An iterator keeps its database open (and locked) while it lives: the error's traceback must
            # not keep it alive into a rebuild, which reopens the database at the same path.
            it = None

    # -- damage ------------------------------------------------------------------------------------------
    def _error(self, damage: _Unusable) -> IndexError_:
        return IndexError_(f"the stream index at {self.path} is unusable: {damage}")

    def _warn(self, damage: _Unusable) -> None:
        self.rebuilds += 1
        log.warning("the stream index at %s is damaged (%s); rebuilding it from the log", self.path, damage)

    def _discard(self) -> None:
        """Remove the index's files. Moved aside first: a directory that cannot be emptied (an unreadable
        file) or whose LOCK this process still holds through a handle it lost is out of the way at once."""
        aside = self.path.with_name(f"{self.path.name}.unusable-{os.getpid()}-{next(_aside)}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        except OSError:
            aside = self.path
        shutil.rmtree(aside, ignore_errors=True)

    def _reset(self, damage: _Unusable | None) -> None:
        """Start over with an empty index (a `reconcile` then indexes the log from its start); with a
        warning when it replaces a damaged one. A lock held by a live process (this one included: RocksDB
        refuses a second open of a database in one process) is not damage: whoever holds it may be using
        the index, so it is an error and the index is left alone."""
        if damage is not None:
            for held in _LOCK_HELD:
                if held in str(damage):
                    raise IndexError_(
                        f"the stream index at {self.path} is in use by another process or handle ({damage})"
                    )
            self._warn(damage)
        if self._db is not None:
            with contextlib.suppress(Exception):  # a damaged database may fail to close: its files go anyway
                self._db.close()
            self._db = None
        self._discard()
        self._catching = None  # a deferred catch-up starts over from the (new, empty) index's start
        try:
            self._db = self._connect()
            self._load()
        except _Unusable as again:
            raise IndexError_(f"cannot create the stream index at {self.path}: {again}") from None

    def _rebuilt(self, damage: _Unusable, *, now: bool = True) -> None:
        """An index found damaged: drop it and (`now`) rebuild it from the log at once, or say why not."""
        if self._read_only or (now and self._log is None):
            raise self._error(damage)
        self._reset(damage)
        if not now or self._log is None:
            return
        try:
            with self._log() as reader:
                self._reconciled(reader, None)
        except _Unusable as again:
            raise IndexError_(f"cannot rebuild the stream index at {self.path}: {again}") from None

    def _repairing(self, operation: Callable[[], T]) -> T:
        """`operation()`, rebuilt and retried once if the index turns out damaged."""
        try:
            return operation()
        except _Unusable as damage:
            self._rebuilt(damage)
        try:
            return operation()
        except _Unusable as damage:
            raise self._error(damage) from None

    @property
    def start_offset(self) -> int:
        """The log start the index was last pruned to (0: never)."""
        return self._start_offset

    @property
    def next_offset(self) -> int:
        """Every log record below this offset is reflected in the index (after `commit`)."""
        return self._next_offset

    # -- writing ---------------------------------------------------------------------------------------
    def add(self, offset: int, meta: RecordMeta) -> None:
        """Note a durable record. Records must be added in offset order; `commit` makes them visible."""
        if self._held is not None:  # deferred: indexed once the catch-up reaches the log's end
            self._held.append((offset, meta.kind, meta.time, meta.key, meta.seq))
            return
        self._add(offset, meta)

    def _add(self, offset: int, meta: RecordMeta) -> None:
        if offset < self._batch_next:
            return  # already indexed (reconcile after a restart may offer records twice)
        if offset - self._last_entry_offset >= self.stride:
            self._batch.put(_time_key(meta.time, offset), b"")
            self._last_entry_offset = offset
        if meta.kind == "R" and meta.key is not None and meta.seq >= 0:
            self._batch.put(_KEY + meta.key.encode(), _U64.pack(meta.seq))
        self._batch_next = offset + 1
        self._batch_size += 1

    def add_run(self, first: int, kind: str, time: int, keys: list[str], seqs: list[int]) -> None:
        """`add(first + i, RecordMeta(kind, time, keys[i], seqs[i]))` for each record of a run with
        consecutive offsets (the batched G-check): the same entries, without a call per record."""
        if self._held is not None:  # deferred (see `add`)
            self._held.append((first, kind, time, list(keys), list(seqs)))
            return
        self._add_run(first, kind, time, keys, seqs)

    def _add_run(self, first: int, kind: str, time: int, keys: list[str], seqs: list[int]) -> None:
        end = first + len(keys)
        start = max(first, self._batch_next)
        if start >= end:
            return
        if kind == "R":  # results name their window in the closed-window directory: one by one
            for i in range(start - first, len(keys)):
                self._add(first + i, RecordMeta(kind, time, keys[i], seqs[i]))
            return
        entry = max(start, self._last_entry_offset + self.stride)  # add() makes one every stride offsets
        while entry < end:
            self._batch.put(_time_key(time, entry), b"")
            self._last_entry_offset = entry
            entry += self.stride
        self._batch_next = end
        self._batch_size += end - start

    def commit(self) -> None:
        """Make the records added so far visible, with `next_offset` past them, in one write."""
        try:
            self._commit()
        except _Unusable as damage:
            self._rebuilt(damage)  # the rebuilt index holds every record of the log, this batch's too

    def _commit(self) -> None:
        if self._batch_size == 0:
            return
        self._batch.put(_NEXT, _U64.pack(self._batch_next))
        self._write(self._batch)
        self._next_offset = self._batch_next
        self._batch = WriteBatch(raw_mode=True)
        self._batch_size = 0

    def reconcile(self, reader: PartitionReader, progress: Callable[[int, int], None] | None = None) -> int:
        """Bring the index up to the log's real end; returns how many records were indexed.

        An index that claims more than the log holds (log replaced or truncated) is rebuilt from scratch,
        and so is one that turns out damaged on the way.
        """
        try:
            return self._reconciled(reader, progress)
        except _Unusable as damage:
            if self._read_only:
                raise self._error(damage) from None
            self._reset(damage)
        try:
            return self._reconciled(reader, progress)
        except _Unusable as damage:
            raise IndexError_(f"cannot rebuild the stream index at {self.path}: {damage}") from None

    def _reconciled(self, reader: PartitionReader, progress: Callable[[int, int], None] | None) -> int:
        """`_reconcile`, which also completes a deferred catch-up: it reads the log to its real end."""
        done = self._reconcile(reader, progress)
        if self._deferred_end is not None:
            self._end_deferral()
        return done

    def _align_to_log(self, reader: PartitionReader) -> int:
        """The index made an index of a prefix of the log as it is now (rebuilt if it claims more than the
        log holds; entries below the log's start pruned); returns the log's end."""
        reader.hint_end(self._next_offset)
        end = reader.end_offset()
        if self._next_offset > end:
            log.info("the stream index at %s claims more than its log holds: rebuilding it", self.path)
            self._reset(None)
        log_start = reader.start_offset()
        if self._next_offset < log_start:
            # Lost (or never built) while the log was trimmed: index what is left. The closed-window
            # directory of keys whose last R was trimmed cannot be derived again from the log.
            self._batch_next = self._next_offset = log_start
        self._prune(log_start)
        return end

    def _reconcile(self, reader: PartitionReader, progress: Callable[[int, int], None] | None) -> int:
        end = self._align_to_log(reader)
        start = self._next_offset
        # `end - start` offsets: an upper bound of the records on a store whose offsets have gaps.
        return self._index_records(_intact(reader, start, self.passed_over), end - start, progress)

    # -- a deferred catch-up (module doc) ----------------------------------------------------------------
    @property
    def deferred(self) -> bool:
        """The index is catching up with the log's end noted by `defer` (`catch_up` has work left)."""
        return self._deferred_end is not None

    @property
    def deferred_end(self) -> int | None:
        """The log's end noted by `defer` while the catch-up is under way, else None."""
        return self._deferred_end

    def defer(self, reader: PartitionReader) -> int:
        """Note the log's real end instead of indexing up to it now (module doc); returns how many offsets
        are left to index (0: the index was up to date, nothing is deferred). Like `reconcile`, an index
        that claims more than the log holds, or turns out damaged, starts over empty (and then defers)."""
        try:
            return self._defer(reader)
        except _Unusable as damage:
            self._reset(damage)
        try:
            return self._defer(reader)
        except _Unusable as damage:
            raise IndexError_(f"cannot rebuild the stream index at {self.path}: {damage}") from None

    def _defer(self, reader: PartitionReader) -> int:
        end = self._align_to_log(reader)
        if end <= self._next_offset:
            return 0
        self._deferred_end, self._held, self._catching = end, [], None
        return end - self._next_offset

    def catch_up(self, reader: PartitionReader, max_records: int | None = None) -> bool:
        """Index up to `max_records` more records (None: all) of the stretch `defer` left, with the same
        checks as `reconcile`; once the stretch is done, index the records held meanwhile. True when the
        index is caught up (or nothing was deferred). An index found damaged starts over from the log start,
        keeping the records held."""
        if self._deferred_end is None:
            return True
        try:
            return self._catch_up(reader, max_records)
        except _Unusable as damage:
            self._reset(damage)
            return False

    def _catch_up(self, reader: PartitionReader, max_records: int | None) -> bool:
        end = self._deferred_end
        assert end is not None
        if self._catching is None:
            log_start = reader.start_offset()
            if self._next_offset < log_start:  # trimmed meanwhile (an index reset restarts at 0)
                self._batch_next = self._next_offset = log_start
            self._catching = _intact(reader, self._next_offset, self.passed_over, stop_before=end)
        for done, (offset, meta) in enumerate(self._catching, 1):
            if meta is not None:
                self._add(offset, meta)
            elif offset >= self._batch_next:  # a damaged footprint: no entry, but indexed past
                self._batch_next = offset + 1
                self._batch_size += 1
            if self._batch_size >= 50_000:
                self._commit()
            if max_records is not None and done >= max_records:
                self._commit()
                return False
        self._commit()
        self._end_deferral()
        return True

    def _end_deferral(self) -> None:
        """The deferred stretch is indexed: index the records held meanwhile (those already indexed, by a
        rebuild that read the log past the stretch, are passed over by `_add`) and go back to indexing
        durable records as they come."""
        held = self._held or []
        self._deferred_end, self._held, self._catching = None, None, None
        for offset, kind, time, key, seq in held:
            if isinstance(key, list):
                assert isinstance(seq, list)
                self._add_run(offset, kind, time, key, seq)
            else:
                assert isinstance(seq, int)
                self._add(offset, RecordMeta(kind, time, key, seq))
        self._commit()

    def _index_records(
        self,
        records: Iterable[tuple[int, RecordMeta | None]],
        total: int,
        progress: Callable[[int, int], None] | None,
    ) -> int:
        done = 0
        for offset, meta in records:
            if meta is not None:
                self._add(offset, meta)
            elif offset >= self._batch_next:  # a damaged footprint: no entry, but indexed past
                self._batch_next = offset + 1
                self._batch_size += 1
            done += 1
            if self._batch_size >= 50_000:
                self._commit()
                if progress:
                    progress(done, total)
        self._commit()
        if progress:
            progress(done, total)
        return done

    def adopt_closed_windows(self, closed: Iterable[tuple[str, int]], log_start: int) -> None:
        """Take `closed` (key, last closed window sequence) as the closed-window directory of a log trimmed
        to `log_start` while this index was behind it (its writer trimmed on another host: the directory
        was carried in Kafka, `operators.spark.closed_windows`), and index the log again from `log_start`.

        `closed` must hold every key's last R below some offset at or above `log_start`: entries from the
        retained part are then set again by the next `reconcile`, in log order, so each key ends with its
        last R in the log, or the carried one when the retained part has none."""
        entries = list(closed)  # a rebuild retries with the same entries
        self._repairing(lambda: self._adopt(entries, log_start))

    def _adopt(self, closed: list[tuple[str, int]], log_start: int) -> None:
        batch = WriteBatch(raw_mode=True)
        for key, seq in closed:
            batch.put(_KEY + key.encode(), _U64.pack(seq))
        batch.put(_NEXT, _U64.pack(log_start))
        self._write(batch)
        self._load()
        self._prune(log_start)

    def prune(self, before_offset: int) -> int:
        """Drop the time entries below `before_offset` (the log was trimmed there); returns how many.
        Times never decrease along the log, so they are a prefix of the time order."""
        return self._repairing(lambda: self._prune(before_offset))

    def _prune(self, before_offset: int) -> int:
        if before_offset <= self._start_offset:
            return 0
        batch = WriteBatch(raw_mode=True)
        dropped = 0
        for raw, _ in self._entries(_TIME):
            if _offset_of(raw) >= before_offset:
                break
            batch.delete(raw)
            dropped += 1
        batch.put(_START, _U64.pack(before_offset))
        self._write(batch)
        self._start_offset = before_offset
        return dropped

    # -- lookups ---------------------------------------------------------------------------------------
    def offset_for_time(self, time: int) -> int:
        """An offset from which reading forward meets every record with logical time >= `time`."""
        return self._repairing(lambda: self._offset_for_time(time))

    def _offset_for_time(self, time: int) -> int:
        # The greatest entry strictly below (time, 0), if it is a time entry.
        for raw, _ in self._entries(_TIME, before=_time_key(time, 0)):
            return max(self._start_offset, _offset_of(raw))
        return self._start_offset

    def last_closed_seq(self, key: str) -> int | None:
        """The window sequence of the last R of `key` in the indexed prefix, None if it has none."""
        entry = _KEY + key.encode()
        return self._repairing(lambda: self._seq(entry))

    def _seq(self, entry: bytes) -> int | None:
        value = self._get(entry)
        return None if value is None else _u64(value)

    def closed_windows(self) -> Iterator[tuple[str, int]]:
        """Every (key, last closed window sequence) in the indexed prefix of the log, in key byte order."""
        return iter(self._repairing(self._closed_windows))

    def _closed_windows(self) -> list[tuple[str, int]]:
        # Read whole before anything is handed out: a read that fails midway is rebuilt and read again.
        try:
            return [(raw[len(_KEY) :].decode(), _u64(value)) for raw, value in self._entries(_KEY)]
        except UnicodeDecodeError as exc:
            raise _Unusable(f"a malformed key entry: {exc}") from None

    def close(self) -> None:
        db, self._db = self._db, None
        if db is None:
            return
        try:
            db.close()
        except Exception as exc:  # derived data: what was not flushed is reconciled from the log next time
            log.debug("closing the stream index at %s: %s", self.path, _Unusable(exc))

    def __enter__(self) -> StreamIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _u64(value: bytes) -> int:
    if len(value) != _U64.size:
        raise _Unusable(f"an entry of {len(value)} bytes, not {_U64.size}")
    return int(_U64.unpack(value)[0])


def _offset_of(time_key: bytes) -> int:
    """The log offset in a time entry's key (`_time_key`)."""
    if len(time_key) != 1 + 2 * _U64.size:
        raise _Unusable(f"a malformed time entry of {len(time_key)} bytes")
    return int(_U64.unpack_from(time_key, 1 + _U64.size)[0])


def _intact(
    reader: PartitionReader, start: int, passed_over: list[int], *, stop_before: int | None = None
) -> Iterator[tuple[int, RecordMeta | None]]:
    """(offset, meta) of each record from `start` on that passes its checksum, in log order, and
    (offset, None) of each damaged footprint (noted in `passed_over`, with a warning): the index takes
    nothing from a damaged record, but recovery may still fall back past it (DESIGN-NOTES section 2).
    Any other damage is `DamagedLogError`. (A chunked value's parts come as its manifest.) `stop_before`:
    the end of the stretch to read (default: the log's end as it is now)."""
    # cec imports queuestore (its records carry a RecordMeta): imported here, not at module level.
    from cec.verified import LogVerifier

    damaged: list[int] = []
    verifier = LogVerifier(reader, passable=_FOOTPRINT_KINDS, passed_over=damaged)
    verifier.seek(start)
    seen = 0
    for records in reader.scan_forward_chunks(
        start, stop_before=stop_before
    ):  # whole lists: checked in one C call when plain
        for record in verifier.check(records):
            while seen < len(damaged):
                yield damaged[seen], None
                seen += 1
            yield record.offset, record.meta
    yield from ((offset, None) for offset in damaged[seen:])
    if damaged:
        passed_over.extend(damaged)
        log.warning(
            "%s: %d damaged footprint(s) not indexed (offsets %s); recovery falls back to older ones",
            reader.log_name,
            len(damaged),
            ", ".join(map(str, damaged[:10])) + (", ..." if len(damaged) > 10 else ""),
        )
