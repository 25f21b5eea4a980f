"""The EC cache (design S0, `designs/standby.md`): beside a partition's stream index, the eventual
checkpoint as of a log offset X, so that a restart on the same host loads it and reads only the log's tail
[X, end) forward instead of reading the extent back.

One snapshot file per partition, written whole and put in place by rename: a SIGKILL at any point leaves
the old snapshot or the new one, never a torn one (a leftover temporary file is removed at the next open).
Not fsynced: a process crash keeps the page cache, and what a power loss could leave (a short or zeroed
file) fails the checksum like any damage.

The live checkpoint is kept in memory, updated as records become durable (`apply`, `apply_run`: dict
updates, nothing written), and written as a snapshot only once the records applied since the last one
reach the size of the checkpoint itself (at least `MIN_SNAPSHOT_RECORDS`): the cost of writing stays a
small constant per record, and a restart's tail is at most about one extent long. A clean close writes a
last snapshot, so a clean restart reads no tail.

Layout, little-endian: `MAGIC`, then the body's length (u64) and its CRC-32 (u32), then the body: the
identity (u32 length + UTF-8: the partition), X (u64), the newest record's row (u32 length, `_NONE`: none;
`pack_row`), the number of entries n (u32), the kind names (u8 count, each u8 length + ASCII) and then per
entry, as columns: kind index (u8), offset, time, seq (i64 each); then a u8, 1 when the keys are
NUL-separated (no key holds a NUL), 0 when a column of key lengths in characters (u32) follows; then value
lengths in bytes (u32), the keys' length in bytes (u64), all keys (one UTF-8 string) and all values.
Decoded by whole columns (`array`, `str.split`, `map` over slices): no Python loop per entry.

Derived data, never trusted blindly. `load` answers why not (a one-line reason) for a cache that is missing,
of another partition, damaged (checksum, length) or malformed; `recovery.cached` then checks what it loaded
against the log (each value's own checksum, the newest record against the log at its offset, the tail read
forward with checksums, N) and reads the log back when any check fails, after which `clear` removes the
snapshot and the next commit writes it again from that eventual checkpoint. A failed write drops the cache
(a warning, never an error): the next restart reads the log back.

A cache is written only once adopted (`adopt`): what a writer appends before its recovery decided the
checkpoint it continues from is not applied to an unchecked cache.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import sys
import zlib
from array import array
from collections.abc import Sequence
from itertools import accumulate, repeat
from operator import itemgetter
from pathlib import Path

from queuestore.base import Row

log = logging.getLogger(__name__)

__all__ = ["MIN_SNAPSHOT_RECORDS", "ECCache", "decode_snapshot", "encode_snapshot"]

MAGIC = b"CEC-EC2\n"
MIN_SNAPSHOT_RECORDS = 256
_FRAME = struct.Struct("<QI")  # body length, CRC-32 of the body
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEAD = struct.Struct(">QqqBI")  # a row: offset, time, seq, length of the kind, length of the key
_NONE = 0xFFFFFFFF
_FOOTPRINT_KINDS = frozenset({"GOPEN", "GCHECK"})  # cec.records.FOOTPRINT_KINDS (queuestore is below cec)
_PART_KIND = "PART"  # queuestore.chunks.PART_KIND
_SWAP = sys.byteorder != "little"
_OFFSET, _KIND, _TIME, _KEY, _SEQ, _VALUE = (itemgetter(i) for i in range(6))

Loaded = tuple[dict[str, Row], Row | None, int]


class SnapshotError(ValueError):
    """Bytes that are not a whole snapshot of this partition (the message says why, in one line)."""


def pack_row(row: Row) -> bytes:
    offset, kind, t, key, seq, value = row
    kind_bytes = kind.encode()
    key_bytes = b"" if key is None else key.encode()
    head = _HEAD.pack(offset, t, seq, len(kind_bytes), _NONE if key is None else len(key_bytes))
    return head + kind_bytes + key_bytes + value


def unpack_row(data: bytes) -> Row:
    """The row `pack_row` wrote; SnapshotError if `data` is not one."""
    if len(data) < _HEAD.size:
        raise SnapshotError(f"a row of {len(data)} bytes")
    offset, t, seq, kind_len, key_len = _HEAD.unpack_from(data)
    at = _HEAD.size
    end = at + kind_len + (0 if key_len == _NONE else key_len)
    if end > len(data):
        raise SnapshotError("a row cut short")
    try:
        kind = data[at : at + kind_len].decode()
        key = None if key_len == _NONE else data[at + kind_len : end].decode()
    except UnicodeDecodeError as exc:
        raise SnapshotError("a row's kind or key is not UTF-8") from exc
    return (offset, kind, t, key, seq, bytes(data[end:]))


def _column(code: str, values: object) -> bytes:
    column = array(code, values)  # type: ignore[call-overload]
    if _SWAP:
        column.byteswap()
    return column.tobytes()


def encode_snapshot(identity: str, next_offset: int, last: Row | None, parts: dict[str, Row]) -> bytes:
    """The snapshot file's bytes (module doc). Every entry's key is its dict key (footprints are keyed)."""
    rows = list(parts.values())
    kind_names = sorted(set(map(_KIND, rows)))
    if len(kind_names) > 255:
        raise SnapshotError("more than 255 kinds of footprint")
    kind_index = {name: i for i, name in enumerate(kind_names)}
    keys = list(map(_KEY, rows))
    values = list(map(_VALUE, rows))
    try:
        ident = identity.encode()
        joined = "\0".join(keys)
        separated = joined.count("\0") == max(len(keys) - 1, 0)  # no key holds a NUL: split in one call
        all_keys = (joined if separated else "".join(keys)).encode()
        last_bytes = b"" if last is None else pack_row(last)
    except UnicodeEncodeError as exc:  # a lone surrogate: not a key this format keeps
        raise SnapshotError("a key that is not UTF-8") from exc
    body = b"".join(
        [
            _U32.pack(len(ident)),
            ident,
            _U64.pack(next_offset),
            _U32.pack(_NONE if last is None else len(last_bytes)),
            last_bytes,
            _U32.pack(len(rows)),
            bytes([len(kind_names)]),
            *(bytes([len(name)]) + name.encode() for name in kind_names),
            bytes(map(kind_index.__getitem__, map(_KIND, rows))),
            _column("q", map(_OFFSET, rows)),
            _column("q", map(_TIME, rows)),
            _column("q", map(_SEQ, rows)),
            bytes([separated]),
            b"" if separated else _column("I", map(len, keys)),
            _column("I", map(len, values)),
            _U64.pack(len(all_keys)),
            all_keys,
            b"".join(values),
        ]
    )
    return MAGIC + _FRAME.pack(len(body), zlib.crc32(body)) + body


class _Cursor:
    """Reads a body front to back; SnapshotError past its end."""

    __slots__ = ("at", "data")

    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.at + n > len(self.data):
            raise SnapshotError("the snapshot is cut short")
        got = self.data[self.at : self.at + n]
        self.at += n
        return got

    def u32(self) -> int:
        return int(_U32.unpack(self.take(4))[0])

    def column(self, code: str, n: int) -> array[int]:
        column = array(code)
        column.frombytes(self.take(n * column.itemsize))
        if _SWAP:
            column.byteswap()
        return column


def _spans(lengths: Sequence[int]) -> map[slice]:
    ends = list(accumulate(lengths))
    return map(slice, [0, *ends[:-1]], ends)


def decode_snapshot(data: bytes, identity: str) -> Loaded:
    """(footprint rows by key, the newest record's row, X) from a snapshot's bytes; SnapshotError (one
    line) for anything else: not a snapshot, damaged (length, checksum), of another partition, malformed.
    Values are not checked against their own checksums here (`recovery.cached` does)."""
    if data[: len(MAGIC)] != MAGIC or len(data) < len(MAGIC) + _FRAME.size:
        raise SnapshotError("not an EC cache snapshot")
    length, crc = _FRAME.unpack_from(data, len(MAGIC))
    body = memoryview(data)[len(MAGIC) + _FRAME.size :]
    if len(body) != length:
        raise SnapshotError(f"the snapshot holds {len(body):,} bytes, not {length:,}")
    if zlib.crc32(body) != crc:
        raise SnapshotError("the snapshot fails its checksum")
    cursor = _Cursor(body)
    try:
        found = bytes(cursor.take(cursor.u32())).decode()
        if found != identity:
            raise SnapshotError(f"the snapshot is of {found!r}, not {identity!r}")
        next_offset = int(_U64.unpack(cursor.take(8))[0])
        last_len = cursor.u32()
        last = None if last_len == _NONE else unpack_row(bytes(cursor.take(last_len)))
        n = cursor.u32()
        kind_names = [bytes(cursor.take(cursor.take(1)[0])).decode() for _ in range(cursor.take(1)[0])]
        kinds = list(map(kind_names.__getitem__, cursor.take(n)))
        offsets = cursor.column("q", n)
        times = cursor.column("q", n)
        seqs = cursor.column("q", n)
        separated = cursor.take(1)[0]
        if separated > 1:
            raise SnapshotError("the snapshot's keys are of no known layout")
        key_lengths = None if separated else cursor.column("I", n)
        value_lengths = cursor.column("I", n)
        all_keys = bytes(cursor.take(int(_U64.unpack(cursor.take(8))[0]))).decode()
        all_values = bytes(cursor.take(sum(value_lengths)))
    except (UnicodeDecodeError, IndexError) as exc:
        raise SnapshotError(f"the snapshot is malformed ({type(exc).__name__})") from exc
    if cursor.at != len(body):
        raise SnapshotError("the snapshot has bytes past its last entry")
    if key_lengths is None:
        keys = all_keys.split("\0") if n else []
        if len(keys) != n or (not n and all_keys):
            raise SnapshotError("the snapshot's keys do not add up")
    else:
        if len(all_keys) != sum(key_lengths):
            raise SnapshotError("the snapshot's keys do not add up")  # lengths in characters, not bytes
        keys = list(map(all_keys.__getitem__, _spans(key_lengths)))
    values = list(map(all_values.__getitem__, _spans(value_lengths)))
    parts = dict(zip(keys, zip(offsets, kinds, times, keys, seqs, values, strict=True), strict=True))
    if len(parts) != n:
        raise SnapshotError("the snapshot holds a key twice")
    if n and (max(offsets) >= next_offset or min(offsets) < 0):
        raise SnapshotError("the snapshot holds an entry outside the log it covers")
    if last is not None and not 0 <= last[0] < next_offset:
        raise SnapshotError("the snapshot's newest record is outside the log it covers")
    if not _FOOTPRINT_KINDS.issuperset(kind_names):
        raise SnapshotError("the snapshot holds an entry that is no footprint")
    return parts, last, next_offset


class ECCache:
    """The EC cache of one partition (module doc). `identity` names the partition (topic/partition)."""

    def __init__(self, path: str | Path, identity: str) -> None:
        self.path = Path(path)
        self.identity = identity
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.snapshots_written = 0
        self._enabled = True
        self._adopted = False
        self._parts: dict[str, Row] = {}
        self._last: Row | None = None
        self._next = 0
        self._stored_offset: int | None = None  # X of the snapshot on disk, as this process knows it
        self._since = 0  # records applied since the snapshot on disk (all of them: none there)
        self._remove_leftovers()

    def _remove_leftovers(self) -> None:
        """Temporary files of writes a crash cut short (never read: only a rename makes a snapshot)."""
        prefix = f"{self.path.name}.tmp-"
        try:
            leftovers = [p for p in self.path.parent.iterdir() if p.name.startswith(prefix)]
        except OSError:
            return
        for leftover in leftovers:
            with contextlib.suppress(OSError):
                leftover.unlink()

    # -- reading ----------------------------------------------------------------------------------------
    def load(self) -> Loaded | str:
        """(footprint rows by key, the newest record's row, next offset) as the snapshot holds them, or why
        not, in one line. Values are not checked here."""
        if not self._enabled:
            return "the EC cache could not be written"
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return "no EC cache"
        except OSError as exc:
            return f"the EC cache cannot be read ({_line(exc)})"
        try:
            loaded = decode_snapshot(data, self.identity)
        except SnapshotError as exc:
            log.warning("the EC cache at %s is not used: %s; reading the log instead", self.path, exc)
            return f"the EC cache is not used: {exc}"
        self._stored_offset = loaded[2]
        return loaded

    # -- writing ----------------------------------------------------------------------------------------
    def adopt(self, parts: dict[str, Row], last: Row | None, next_offset: int, *, stored: bool) -> None:
        """Continue from this checkpoint (the one recovery decided on: loaded from this cache and its tail,
        `stored`, or read back from the log, which the next commit writes whole)."""
        self._parts = dict(parts)
        self._last, self._next = last, next_offset
        base = self._stored_offset  # None unless loaded from this cache and not cleared since
        # From the log (or a standby): due at the next commit. From this cache: the tail read at the
        # restart counts as applied since the snapshot.
        self._since = 0 if stored else _DUE_NOW if base is None else next_offset - base
        if next_offset == 0:
            self._since = 0  # an empty log: nothing to write before the first records
        self._adopted = True

    def clear(self) -> None:
        """Forget what the cache holds (it failed a check): a crash before the next snapshot leaves no
        cache to check again."""
        self._stored_offset = None
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("cannot remove the EC cache at %s (%s)", self.path, _line(exc))

    def apply(self, row: Row) -> None:
        """A record that became durable (whole value), the next one of the log."""
        if not self._adopted:
            return
        offset, kind, _, key, seq, _ = row
        self._next = offset + 1
        self._since += 1
        if kind == _PART_KIND:
            return
        self._last = row
        if key is None:
            return
        if kind == "R":
            entry = self._parts.get(key)
            if entry is not None and entry[4] == seq:
                del self._parts[key]
        elif kind in _FOOTPRINT_KINDS:
            self._parts[key] = row

    def apply_run(
        self, first: int, kind: str, time: int, keys: list[str], seqs: list[int], values: list[bytes]
    ) -> None:
        """`apply` of each record of a run (consecutive offsets from `first`, one kind and time: the batched
        G-check) in one step."""
        if not self._adopted or not keys:
            return
        count = len(keys)
        if kind not in _FOOTPRINT_KINDS or len(set(keys)) != count:
            for i, (key, seq, value) in enumerate(zip(keys, seqs, values, strict=True)):
                self.apply((first + i, kind, time, key, seq, value))
            return
        rows = list(zip(range(first, first + count), repeat(kind), repeat(time), keys, seqs, values))
        self._parts.update(zip(keys, rows, strict=True))
        self._last = rows[-1]
        self._next = first + count
        self._since += count

    def commit(self) -> None:
        """Called on each durable completion batch: writes a snapshot once enough was applied since the
        last one (module doc)."""
        if self._adopted and self._since >= max(MIN_SNAPSHOT_RECORDS, len(self._parts)):
            self.write_snapshot()

    def write_snapshot(self) -> None:
        """Write the checkpoint applied so far as the snapshot, atomically (by rename)."""
        if not self._adopted:
            return
        tmp = self.path.with_name(f"{self.path.name}.tmp-{os.getpid()}")
        try:
            data = encode_snapshot(self.identity, self._next, self._last, self._parts)
            with open(tmp, "wb") as file:
                file.write(data)
            os.replace(tmp, self.path)
        except (OSError, SnapshotError) as exc:
            log.warning("the EC cache at %s failed a write (%s); dropping it", self.path, _line(exc))
            self._adopted = self._enabled = False
            self._parts = {}
            for path in (tmp, self.path):
                with contextlib.suppress(OSError):
                    path.unlink(missing_ok=True)
            return
        self._stored_offset = self._next
        self._since = 0
        self.snapshots_written += 1

    def close(self) -> None:
        """A clean close: the last snapshot, so that a clean restart reads no tail."""
        if self._adopted and self._since > 0:
            self.write_snapshot()
        self._adopted = False
        self._parts = {}


_DUE_NOW = 1 << 62


def _line(error: object) -> str:
    return " ".join(str(error).split())
