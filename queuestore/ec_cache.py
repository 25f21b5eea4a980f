"""The EC cache (design S0, `designs/standby.md`): beside a partition's stream index, the eventual
checkpoint as of a log offset, kept forward as records become durable (`recovery.forward`), so that a
restart on the same host loads it and reads only the log's tail instead of reading the extent back.

Layout (RocksDB, raw keys): `P<key>` -> the row of the key's window's latest footprint; `M:last` -> the
row of the newest record applied; `M:next` -> every record below this offset is applied; `M:ident` -> the
partition it belongs to. Each commit is one WriteBatch: the cache is always that of an exact prefix of the
log, like the index.

Derived data, never trusted blindly. `load` refuses (None) a cache that is missing, of another partition,
malformed, or cannot be read; `recovery.manager` then checks what it loaded against the log (each value's
own checksum, the newest record against the log at its offset, the tail read forward with checksums, N)
and reads the log back when any check fails, after which `replace` writes the cache again from that
eventual checkpoint. Any RocksDB failure while writing drops the cache (a warning, never an error): the
next restart reads the log back.

A cache is written only once adopted (`adopt`): what a writer appends before its recovery decided the
checkpoint it continues from is not applied to an unchecked cache.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import struct
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict, WriteBatch

from queuestore.base import Row

log = logging.getLogger(__name__)

__all__ = ["ECCache"]

_PART = b"P"
_LAST = b"M:last"
_NEXT = b"M:next"
_IDENT = b"M:ident"
_U64 = struct.Struct(">Q")
_HEAD = struct.Struct(">QqqBI")  # offset, time, seq, length of the kind, length of the key (_NO_KEY: none)
_NO_KEY = 0xFFFFFFFF
_FOOTPRINT_KINDS = frozenset({"GOPEN", "GCHECK"})  # cec.records.FOOTPRINT_KINDS (queuestore is below cec)
_PART_KIND = "PART"  # queuestore.chunks.PART_KIND


def pack_row(row: Row) -> bytes:
    offset, kind, t, key, seq, value = row
    kind_bytes = kind.encode()
    key_bytes = b"" if key is None else key.encode()
    head = _HEAD.pack(offset, t, seq, len(kind_bytes), _NO_KEY if key is None else len(key_bytes))
    return head + kind_bytes + key_bytes + value


def unpack_row(data: bytes) -> Row:
    """The row `pack_row` wrote; ValueError if `data` is not one."""
    if len(data) < _HEAD.size:
        raise ValueError(f"a cache entry of {len(data)} bytes")
    offset, t, seq, kind_len, key_len = _HEAD.unpack_from(data)
    at = _HEAD.size
    kind = data[at : at + kind_len].decode()
    at += kind_len
    key: str | None = None
    if key_len != _NO_KEY:
        key = data[at : at + key_len].decode()
        at += key_len
    if at > len(data):
        raise ValueError("a cache entry cut short")
    return (offset, kind, t, key, seq, bytes(data[at:]))


class ECCache:
    """The EC cache of one partition (module doc). `identity` names the partition (topic/partition)."""

    def __init__(self, path: str | Path, identity: str) -> None:
        self.path = Path(path)
        self.identity = identity
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db: Rdict | None = None
        self._adopted = False
        self._seqs: dict[str, int] = {}  # key -> the window seq of its entry (what an R must match)
        self._last: Row | None = None
        self._next = 0
        self._batch = WriteBatch(raw_mode=True)
        self._pending = 0
        self._rewrite = False  # the next commit writes the whole checkpoint (`replace`)
        self._parts: dict[str, Row] = {}  # only while a rewrite is pending
        try:
            self._db = Rdict(str(self.path), Options(raw_mode=True))
        except Exception as exc:  # rocksdict raises plain Exceptions: a damaged or foreign directory
            if "lock" in str(exc).lower():  # held by a live handle: not ours to remove; run without it
                log.warning("the EC cache at %s is in use (%s); running without it", self.path, _line(exc))
                return
            log.warning("the EC cache at %s is unusable (%s); starting it over", self.path, _line(exc))
            self._discard()
            self._open_empty()

    # -- reading ----------------------------------------------------------------------------------------
    def load(self) -> tuple[dict[str, Row], Row | None, int] | None:
        """(footprint rows by key, the newest record's row, next offset) as stored, or None: no cache, one
        of another partition, or one that cannot be read whole. Values are not checked here."""
        db = self._db
        if db is None:
            return None
        try:
            ident = db.get(_IDENT)
            raw_next = db.get(_NEXT)
            if ident is None or bytes(ident) != self.identity.encode() or raw_next is None:
                return None
            next_offset = int(_U64.unpack(bytes(raw_next))[0])
            raw_last = db.get(_LAST)
            last = None if raw_last is None else unpack_row(bytes(raw_last))
            parts: dict[str, Row] = {}
            it: Any = db.iter()
            try:
                it.seek(_PART)
                while it.valid():
                    key = bytes(it.key())
                    if not key.startswith(_PART):
                        break
                    row = unpack_row(bytes(it.value()))
                    if row[3] != key[len(_PART) :].decode():
                        raise ValueError("an entry under another key")
                    parts[key[len(_PART) :].decode()] = row
                    it.next()
                it.status()
            finally:
                it = None
        except Exception as exc:  # RocksDB damage, or entries this module did not write
            log.warning(
                "the EC cache at %s cannot be read (%s); reading the log instead", self.path, _line(exc)
            )
            return None
        return parts, last, next_offset

    # -- writing ----------------------------------------------------------------------------------------
    def adopt(self, parts: dict[str, Row], last: Row | None, next_offset: int, *, stored: bool) -> None:
        """Continue from this checkpoint (the one recovery decided on: loaded from this cache, `stored`,
        or read back from the log, which the next commit writes whole)."""
        self._seqs = {key: row[4] for key, row in parts.items()}
        self._last, self._next = last, next_offset
        self._batch = WriteBatch(raw_mode=True)
        self._pending = 0
        self._rewrite = not stored
        self._parts = {} if stored else dict(parts)
        self._adopted = True

    def clear(self) -> None:
        """Forget what the cache holds (it failed a check): a crash before the next rewrite leaves no cache
        to trust."""
        db = self._db
        if db is None:
            return
        batch = WriteBatch(raw_mode=True)
        batch.delete(_NEXT)
        self._write(batch)

    def apply(self, row: Row) -> None:
        """A record that became durable (whole value), the next one of the log."""
        if not self._adopted:
            return
        offset, kind, _, key, seq, _ = row
        self._next = offset + 1
        self._pending += 1
        if kind == _PART_KIND:
            return
        self._last = row
        if key is None:
            return
        if kind == "R":
            if self._seqs.get(key) == seq:
                del self._seqs[key]
                if self._rewrite:
                    self._parts.pop(key, None)
                else:
                    self._batch.delete(_PART + key.encode())
        elif kind in _FOOTPRINT_KINDS:
            self._seqs[key] = seq
            if self._rewrite:
                self._parts[key] = row
            else:
                self._batch.put(_PART + key.encode(), pack_row(row))

    def commit(self) -> None:
        """Make what was applied durable in the cache, in one write."""
        if not self._adopted or self._db is None or (self._pending == 0 and not self._rewrite):
            return
        batch = self._batch
        if self._rewrite:
            batch = WriteBatch(raw_mode=True)
            batch.delete_range(_PART, _PART + b"\xff")
            for key, row in self._parts.items():
                batch.put(_PART + key.encode(), pack_row(row))
            batch.put(_IDENT, self.identity.encode())
            self._parts, self._rewrite = {}, False
        if self._last is not None:
            batch.put(_LAST, pack_row(self._last))
        batch.put(_NEXT, _U64.pack(self._next))
        self._write(batch)
        self._batch = WriteBatch(raw_mode=True)
        self._pending = 0

    def _write(self, batch: WriteBatch) -> None:
        db = self._db
        if db is None:
            return
        try:
            db.write(batch)
        except Exception as exc:
            log.warning("the EC cache at %s failed a write (%s); dropping it", self.path, _line(exc))
            self._adopted = False
            self.close()
            self._discard()

    def _open_empty(self) -> None:
        try:
            self._db = Rdict(str(self.path), Options(raw_mode=True))
        except Exception as exc:
            log.warning("cannot create the EC cache at %s (%s); running without it", self.path, _line(exc))
            self._db = None

    def _discard(self) -> None:
        aside = self.path.with_name(f"{self.path.name}.unusable-{os.getpid()}")
        try:
            os.rename(self.path, aside)
        except OSError:
            aside = self.path
        shutil.rmtree(aside, ignore_errors=True)

    def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(Exception):
                db.close()


def _line(error: object) -> str:
    return " ".join(str(error).split())
