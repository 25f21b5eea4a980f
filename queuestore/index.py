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
always the index of an exact prefix of the log.
"""

from __future__ import annotations

import logging
import shutil
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from rocksdict import AccessType, Options, Rdict, WriteBatch

from queuestore.base import PartitionReader, RecordMeta
from queuestore.exceptions import IndexError_

log = logging.getLogger(__name__)

__all__ = ["StreamIndex"]

_TIME = b"T"
_KEY = b"K"
_NEXT = b"M:next"
_START = b"M:start"  # the log start after trimming: no entry points below it
_IDENT = b"M:ident"
_U64 = struct.Struct(">Q")
_I64_BIAS = 1 << 63  # maps signed times onto unsigned so that byte order equals numeric order


def _time_key(time: int, offset: int) -> bytes:
    return _TIME + _U64.pack(time + _I64_BIAS) + _U64.pack(offset)


class StreamIndex:
    """Index of one partition. One writer process; `read_only=True` opens for lookups elsewhere."""

    def __init__(self, path: str | Path, identity: str, *, stride: int = 64, read_only: bool = False) -> None:
        self.path = Path(path)
        self.identity = identity
        self.stride = stride
        self._read_only = read_only
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = self._open()
        stored = self._db.get(_IDENT)
        if stored is None and not read_only:
            self._db[_IDENT] = identity.encode()
        elif stored is not None and stored.decode() != identity:
            raise IndexError_(f"index at {self.path} belongs to {stored.decode()!r}, not {identity!r}")
        nxt = self._db.get(_NEXT)
        self._next_offset = 0 if nxt is None else _U64.unpack(nxt)[0]
        start = self._db.get(_START)
        self._start_offset = 0 if start is None else _U64.unpack(start)[0]
        self._last_entry_offset = -self.stride
        self._batch = WriteBatch(raw_mode=True)
        self._batch_size = 0
        self._batch_next = self._next_offset

    def _open(self) -> Rdict:
        options = Options(raw_mode=True)
        try:
            if self._read_only:
                return Rdict(str(self.path), options, access_type=AccessType.read_only())
            options.create_if_missing(True)
            return Rdict(str(self.path), options)
        except Exception as exc:  # rocksdict raises plain Exception("Corruption: ..." / "IO error: ...")
            damage = str(exc)
            if self._read_only or not damage.startswith("Corruption"):
                raise IndexError_(f"cannot open the stream index at {self.path}: {damage}") from None
        # Everything in the index is derived from the log: a damaged one is dropped and rebuilt from it.
        log.warning("the stream index at %s is damaged (%s); rebuilding it from the log", self.path, damage)
        Rdict.destroy(str(self.path))
        shutil.rmtree(self.path, ignore_errors=True)
        return Rdict(str(self.path), options)

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
        end = first + len(keys)
        start = max(first, self._batch_next)
        if start >= end:
            return
        if kind == "R":  # results name their window in the closed-window directory: one by one
            for i in range(start - first, len(keys)):
                self.add(first + i, RecordMeta(kind, time, keys[i], seqs[i]))
            return
        entry = max(start, self._last_entry_offset + self.stride)  # add() makes one every stride offsets
        while entry < end:
            self._batch.put(_time_key(time, entry), b"")
            self._last_entry_offset = entry
            entry += self.stride
        self._batch_next = end
        self._batch_size += end - start

    def commit(self) -> None:
        if self._batch_size == 0:
            return
        self._batch.put(_NEXT, _U64.pack(self._batch_next))
        self._db.write(self._batch)
        self._next_offset = self._batch_next
        self._batch = WriteBatch(raw_mode=True)
        self._batch_size = 0

    def reconcile(self, reader: PartitionReader, progress: Callable[[int, int], None] | None = None) -> int:
        """Bring the index up to the log's real end; returns how many records were indexed.

        An index that claims more than the log holds (log replaced or truncated) is rebuilt from scratch.
        """
        reader.hint_end(self._next_offset)
        end = reader.end_offset()
        if self._next_offset > end:
            self.clear()
        log_start = reader.start_offset()
        if self._next_offset < log_start:
            # Lost (or never built) while the log was trimmed: index what is left. The closed-window
            # directory of keys whose last R was trimmed cannot be derived again from the log.
            self._batch_next = self._next_offset = log_start
        self.prune(log_start)
        start = self._next_offset
        # `end - start` offsets: an upper bound of the records on a store whose offsets have gaps.
        return self._index_records(
            ((r.offset, r.meta) for r in reader.scan_forward(start)), end - start, progress
        )

    def _index_records(
        self,
        records: Iterable[tuple[int, RecordMeta]],
        total: int,
        progress: Callable[[int, int], None] | None,
    ) -> int:
        done = 0
        for offset, meta in records:
            self.add(offset, meta)
            done += 1
            if self._batch_size >= 50_000:
                self.commit()
                if progress:
                    progress(done, total)
        self.commit()
        if progress:
            progress(done, total)
        return done

    def prune(self, before_offset: int) -> int:
        """Drop the time entries below `before_offset` (the log was trimmed there); returns how many.
        Times never decrease along the log, so they are a prefix of the time order."""
        if before_offset <= self._start_offset:
            return 0
        batch = WriteBatch(raw_mode=True)
        dropped = 0
        it = self._db.iter()
        it.seek(_TIME)
        while it.valid():
            raw = bytes(it.key())
            if not raw.startswith(_TIME) or _U64.unpack(raw[9:17])[0] >= before_offset:
                break
            batch.delete(raw)
            dropped += 1
            it.next()
        batch.put(_START, _U64.pack(before_offset))
        self._db.write(batch)
        self._start_offset = before_offset
        return dropped

    def clear(self) -> None:
        """Drop every entry (keeps the identity)."""
        self._db.close()
        Rdict.destroy(str(self.path))
        shutil.rmtree(self.path, ignore_errors=True)
        self._db = self._open()
        self._db[_IDENT] = self.identity.encode()
        self._next_offset = 0
        self._start_offset = 0
        self._batch_next = 0
        self._last_entry_offset = -self.stride
        self._batch = WriteBatch(raw_mode=True)
        self._batch_size = 0

    # -- lookups ---------------------------------------------------------------------------------------
    def offset_for_time(self, time: int) -> int:
        """An offset from which reading forward meets every record with logical time >= `time`."""
        it = self._db.iter()
        it.seek_for_prev(_time_key(time, 0))  # greatest entry strictly below (time, 0)
        if not it.valid() or not bytes(it.key()).startswith(_TIME):
            return self._start_offset
        return max(self._start_offset, int(_U64.unpack(bytes(it.key())[9:17])[0]))

    def last_closed_seq(self, key: str) -> int | None:
        """The window sequence of the last R of `key` in the indexed prefix, None if it has none."""
        value = self._db.get(_KEY + key.encode())
        return None if value is None else int(_U64.unpack(value)[0])

    def closed_windows(self) -> Iterator[tuple[str, int]]:
        """Every (key, last closed window sequence) in the indexed prefix of the log, in key byte order."""
        it = self._db.iter()
        it.seek(_KEY)
        while it.valid():
            raw = bytes(it.key())
            if not raw.startswith(_KEY):
                return
            yield raw[len(_KEY) :].decode(), int(_U64.unpack(bytes(it.value()))[0])
            it.next()

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> StreamIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
