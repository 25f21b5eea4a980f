"""Positioned reads and the tail of one SQLite partition (`SqlitePartitionReader`), each from its own
read-only connection (a consistent snapshot while the writer appends)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from queuestore.base import (
    PartitionReader,
    Row,
    StoredRecord,
)
from queuestore.sqlite.files import (
    _COLUMNS,
    WAY_OUT,
    _connect,
    _create_partition_file,
    _failed,
    _lenient_text,
    _log_start,
    _newest_offset,
    _row_to_record,
    _undecodable,
)

__all__ = ["SqlitePartitionReader"]

_TAIL_POLL_S = 0.002  # how often a tail reader at the live end looks for new rows


class SqlitePartitionReader(PartitionReader):
    """Reads one partition file. Whatever SQLite raises on it becomes one line naming the file
    (`DamagedLogError` with the way out when the file is damaged); a row whose text is not UTF-8 is read
    with that text replaced, so that its record fails its checksum like any other damaged record."""

    way_out = WAY_OUT

    def __init__(self, path: Path, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.store_name = str(path.parent.parent)  # the store's root
        self._path = path
        _create_partition_file(path)  # a reader may come before the first writer
        self._conn = _connect(path, read_only=True, fsync=False)
        self._lenient: sqlite3.Connection | None = None

    @property
    def log_name(self) -> str:
        return f"{self._path}: {self.topic}[{self.partition}]"

    def _rows(self, sql: str, parameters: tuple[int, ...]) -> list[Row]:
        # Rows straight from sqlite3: the column order is the Row layout.
        try:
            rows: list[Row] = self._conn.execute(sql, parameters).fetchall()
            return rows
        except sqlite3.DatabaseError as exc:
            if not _undecodable(exc):
                raise _failed(self._path, exc) from None
        try:
            if self._lenient is None:
                self._lenient = _connect(self._path, read_only=True, fsync=False)
                self._lenient.text_factory = _lenient_text
            rows = self._lenient.execute(sql, parameters).fetchall()
        except sqlite3.DatabaseError as exc:
            raise _failed(self._path, exc) from None
        return rows

    def end_offset(self) -> int:
        newest = _newest_offset(self._conn, self._path)
        return self.start_offset() if newest is None else newest + 1

    def start_offset(self) -> int:
        return _log_start(self._conn, self._path)

    def read_forward(self, from_offset: int, max_records: int) -> list[StoredRecord]:
        return [_row_to_record(r) for r in self.read_forward_rows(from_offset, max_records)]

    def read_forward_rows(self, from_offset: int, max_records: int) -> list[Row]:
        rows = self._rows(
            f"SELECT {_COLUMNS} FROM log WHERE offset >= ? ORDER BY offset LIMIT ?",
            (from_offset, max_records),
        )
        # Only when the first row is not the one asked for: was it trimmed (a clear error), or is it
        # past the end or lost (the caller's dense check says which)?
        if (not rows or rows[0][0] != from_offset) and from_offset < self.start_offset():
            raise self.trimmed(from_offset)
        return rows

    def read_backward(self, before_offset: int, max_records: int) -> list[StoredRecord]:
        return [_row_to_record(r) for r in self.read_backward_rows(before_offset, max_records)]

    def read_backward_rows(self, before_offset: int, max_records: int) -> list[Row]:
        return self._rows(
            f"SELECT {_COLUMNS} FROM log WHERE offset < ? ORDER BY offset DESC LIMIT ?",
            (before_offset, max_records),
        )

    def tail(
        self,
        from_offset: int,
        *,
        stop: Callable[[], bool] | None = None,
        idle_timeout: float | None = None,
        batch: int = 4096,
    ) -> Iterator[list[StoredRecord]]:
        offset = from_offset
        idle_since = time.monotonic()
        while stop is None or not stop():
            records = self.read_forward(offset, batch)
            if records:
                offset = records[-1].offset + 1
                idle_since = time.monotonic()
                yield records
                continue
            if idle_timeout is not None and time.monotonic() - idle_since >= idle_timeout:
                return
            # At the live end: SQLite has no change notification across processes, so poll briefly.
            time.sleep(_TAIL_POLL_S)

    def close(self) -> None:
        self._conn.close()
        if self._lenient is not None:
            self._lenient.close()
