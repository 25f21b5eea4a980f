"""A partition file of the SQLite store: its tables, connections, the one-line errors for a damaged file,
and its newest offset and log start, checked."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from queuestore.base import (
    RecordMeta,
    StoredRecord,
)
from queuestore.exceptions import (
    DamagedLogError,
    QueueStoreError,
)

__all__ = ["WAY_OUT"]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS log (
    offset INTEGER PRIMARY KEY,
    kind   TEXT    NOT NULL,
    time   INTEGER NOT NULL,
    key    TEXT,
    seq    INTEGER NOT NULL,
    value  BLOB    NOT NULL
)
"""
# The log start after trimming: offsets below it were deleted on purpose (readers start there; below it
# is `LogTrimmedError`, never a gap taken for damage). Set in the transaction that deletes them.
_META_SCHEMA = "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)"
_COLUMNS = "offset, kind, time, key, seq, value"


def _row_to_record(row: tuple[int, str, int, str | None, int, bytes]) -> StoredRecord:
    offset, kind, time_, key, seq, value = row
    return StoredRecord(offset, value, RecordMeta(kind, time_, key, seq))


def _create_partition_file(path: Path) -> None:
    """Create an empty partition database atomically, so no reader ever opens one without its table."""
    if path.exists():
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    conn = sqlite3.connect(tmp, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(_SCHEMA)
        conn.execute(_META_SCHEMA)
    finally:
        conn.close()
    os.replace(tmp, path)


# What a user can do about a damaged partition file (the CLI's --store-dir is the store directory).
WAY_OUT = "restore it from a backup, or start over with a new store directory (--store-dir)"


def _is_damage(exc: sqlite3.DatabaseError) -> bool:
    """Whether SQLite says the file itself is damaged (rather than busy, read-only, out of space...)."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_FORMAT")):
        return True
    return not isinstance(exc, sqlite3.OperationalError) or "malformed" in str(exc)


def _failed(path: Path, exc: sqlite3.DatabaseError) -> QueueStoreError:
    """The one-line error for what SQLite raised on a partition file: naming it, and the way out."""
    if _is_damage(exc):
        return DamagedLogError(f"the output log {path} is damaged ({exc}); {WAY_OUT}")
    return QueueStoreError(f"cannot use the output log {path}: {exc}")


def _undecodable(exc: sqlite3.DatabaseError) -> bool:
    """A TEXT cell that is not UTF-8 (sqlite3 decodes TEXT columns as it fetches them)."""
    return isinstance(exc, sqlite3.OperationalError) and str(exc).startswith("Could not decode to UTF-8")


def _lenient_text(raw: bytes) -> str:
    # Undecodable bytes become U+FFFD: the text then differs from what was written, and the record's
    # checksum, which covers its metadata, names the damage (what sqlite3 raises names no record).
    return raw.decode("utf-8", "replace")


def _connect(path: Path, *, read_only: bool, fsync: bool) -> sqlite3.Connection:
    if read_only:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False, timeout=30)
    else:
        conn = sqlite3.connect(path, check_same_thread=False, timeout=30, isolation_level=None)
    try:
        if read_only:
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1")  # sqlite reads the file lazily: read it now
        else:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
            conn.execute(_SCHEMA)
            conn.execute(_META_SCHEMA)
    except sqlite3.DatabaseError as exc:  # a file that is not a log: one clear error, not a traceback
        conn.close()
        raise _failed(path, exc) from None
    return conn


def _newest_offset(conn: sqlite3.Connection, path: Path) -> int | None:
    """The offset of the newest record (None: the log holds none), checked. SQLite takes the end of the
    rowid B-tree as it finds it: a last page cut short or zeroed reads as cells of offset 0, and a flipped
    bit in the last cell's rowid moves it anywhere, so a damaged end could pass for a shorter log, read
    without a word. The two newest offsets of a log are consecutive (appends are dense, trimming removes
    only the oldest): anything else is damage."""
    try:
        rows = conn.execute("SELECT offset FROM log ORDER BY offset DESC LIMIT 2").fetchall()
    except sqlite3.DatabaseError as exc:
        raise _failed(path, exc) from None
    if not rows:
        return None
    newest: int = rows[0][0]
    if len(rows) == 2 and rows[1][0] != newest - 1:
        raise DamagedLogError(
            f"the output log {path} is damaged (its newest offsets read {newest} and {rows[1][0]}); {WAY_OUT}"
        )
    return newest


def _log_start(conn: sqlite3.Connection, path: Path) -> int:
    """The log start, checked against the oldest record: a trim deletes every record below its bound and
    sets the log start to it in one transaction, so a log that holds records starts exactly at the log
    start (0 if never trimmed). Anything else is damage: a log start read too high would make readers
    start late without a word, an oldest record gone is a record lost."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE name = 'log_start'").fetchone()
    except sqlite3.OperationalError as exc:
        if not str(exc).startswith("no such table"):
            raise _failed(path, exc) from None
        row = None  # a partition file from before trimming existed: never trimmed
    except sqlite3.DatabaseError as exc:
        raise _failed(path, exc) from None
    start = 0 if row is None else row[0]
    if type(start) is not int or start < 0:
        raise DamagedLogError(f"the output log {path} is damaged (log start {start!r}); {WAY_OUT}")
    try:
        oldest = conn.execute("SELECT offset FROM log ORDER BY offset LIMIT 1").fetchone()
    except sqlite3.DatabaseError as exc:
        raise _failed(path, exc) from None
    if oldest is not None and oldest[0] != start:
        raise DamagedLogError(
            f"the output log {path} is damaged (its oldest offset reads {oldest[0]}, its log start {start}); "
            f"{WAY_OUT}"
        )
    return start
