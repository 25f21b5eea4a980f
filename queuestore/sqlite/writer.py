"""The writer of one SQLite partition (`SqlitePartitionWriter`): appends grouped into one transaction per
batch by an I/O thread, durable-completion callbacks once committed, trimming."""

from __future__ import annotations

import contextlib
import fcntl
import queue
import sqlite3
import threading
import time
from collections import deque
from functools import lru_cache
from itertools import chain, repeat
from pathlib import Path

from queuestore.base import (
    DurableCallback,
    PartitionWriter,
    RecordMeta,
)
from queuestore.exceptions import (
    PartitionLockedError,
    QueueStoreError,
    RecordTooLargeError,
    StoreClosedError,
    WriterFailedError,
)
from queuestore.sqlite.files import (
    _COLUMNS,
    _connect,
    _create_partition_file,
    _failed,
    _is_damage,
    _log_start,
    _newest_offset,
)

__all__ = ["SqlitePartitionWriter"]


# Rows per INSERT statement, at most: SQLite binds at most SQLITE_LIMIT_VARIABLE_NUMBER parameters per statement
# (32,766 since 3.32, 999 before), six per row.
_MAX_ROWS_PER_STATEMENT = 4096


def _statement_rows(conn: sqlite3.Connection) -> int:
    getlimit = getattr(conn, "getlimit", None)  # Python >= 3.11
    variables = 999 if getlimit is None else getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    return max(1, min(_MAX_ROWS_PER_STATEMENT, variables // 6))


@lru_cache(maxsize=32)
def _insert_sql(count: int) -> str:
    return f"INSERT INTO log ({_COLUMNS}) VALUES " + ",".join(repeat("(?,?,?,?,?,?)", count))


def insert_rows(
    conn: sqlite3.Connection, rows: list[tuple[object, ...]], per_statement: int | None = None
) -> None:
    """INSERT `rows` (offset, kind, time, key, seq, value) in a few multi-row statements, not one per row.

    Why: `executemany` gives up the GIL around every row's step and takes it back to bind the next one, so an
    I/O thread beside a busy operator thread waits a switch interval per row: 32,768 rows took 8.2-9.5 s
    against 0.07-0.09 s alone (benchmarks/bench_sqlite_gil.py; at 50k tuples/s the log's durable end stood
    still for 1-3 s at a time, benchmarks/bench_durable_gaps.py). One statement of k rows binds them all, then
    steps once: 0.16-0.19 s beside the same busy thread at k = 4,096.
    Statements are of a full size or a power of two below it, so that the connection's statement cache
    holds every SQL text used."""
    size = per_statement or _statement_rows(conn)
    at, total = 0, len(rows)
    while at < total:
        left = total - at
        count = size if left >= size else 1 << (left.bit_length() - 1)
        conn.execute(_insert_sql(count), list(chain.from_iterable(rows[at : at + count])))
        at += count


class SqlitePartitionWriter(PartitionWriter):
    """Appends through a background thread that commits one transaction per batch.

    The operator thread never waits on I/O unless more than `max_outstanding` records are in flight;
    completions are handed back through a queue and their callbacks run in `poll()`/`flush()`, the way
    librdkafka serves delivery reports, so callbacks never race with the operator's own state.

    Fail-stop: offsets are assigned at `append`, so once a batch fails (and is rolled back) any later batch
    would leave a hole before it. The I/O thread therefore writes nothing after the first failure (later
    batches complete as failed), and `append`/`poll`/`flush` raise `WriterFailedError`.
    """

    def __init__(
        self,
        path: Path,
        topic: str,
        partition: int,
        *,
        max_record_bytes: int,
        fsync: bool = False,
        max_outstanding: int = 32_768,
        max_batch: int = 4096,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self._max_record_bytes = max_record_bytes
        _create_partition_file(path)
        self._lock_file = open(path.with_suffix(".lock"), "a+")  # noqa: SIM115 - held for the writer's life
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise PartitionLockedError(f"{topic}[{partition}] already has a writer") from None
        try:
            self._conn = _connect(path, read_only=False, fsync=fsync)
            try:
                newest = _newest_offset(self._conn, path)
                self._next_offset = max(_log_start(self._conn, path), 0 if newest is None else newest + 1)
            except BaseException:
                self._conn.close()
                raise
        except BaseException:
            self._lock_file.close()
            raise
        self._path = path
        self._fsync = fsync
        self._trim_conn: sqlite3.Connection | None = None
        self._max_batch = max_batch
        self._statement_rows = _statement_rows(
            self._conn
        )  # the connection's limit: asked once, not per commit
        self._pending: list[tuple[int, str, int, str | None, int, bytes]] = []
        self._pending_callbacks: list[DurableCallback | None] = []
        self._max_outstanding = max_outstanding
        self._io_queue: queue.Queue[tuple[list[tuple], list[DurableCallback | None]] | None] = queue.Queue()
        self._completed: deque[tuple[list[int], list[DurableCallback | None], Exception | None]] = deque()
        self._completed_cv = threading.Condition()
        self._outstanding = 0
        self._closed = False
        self._thread = threading.Thread(target=self._io_loop, name=f"sqlite-writer-{topic}-{partition}")
        self._thread.daemon = True
        self._thread.start()

    # -- operator thread -------------------------------------------------------------------------------
    def append(self, value: bytes, meta: RecordMeta, on_durable: DurableCallback | None = None) -> None:
        if self._closed:
            raise StoreClosedError(f"writer of {self.topic}[{self.partition}] is closed")
        self._check_failed()
        if len(value) > self._max_record_bytes:
            raise RecordTooLargeError(f"{len(value)} bytes > max_record_bytes={self._max_record_bytes}")
        while self._outstanding >= self._max_outstanding:
            self.poll(0.05)  # back-pressure: wait for completions (the counter is only touched here)
        self._pending.append((self._next_offset, meta.kind, meta.time, meta.key, meta.seq, value))
        self._pending_callbacks.append(on_durable)
        self._next_offset += 1
        self._outstanding += 1
        if len(self._pending) >= self._max_batch:
            self._submit()

    def append_run(
        self,
        kind: str,
        time: int,
        keys: list[str],
        seqs: list[int],
        values: list[bytes],
        on_durable: DurableCallback | None,
    ) -> None:
        """`append(values[i], RecordMeta(kind, time, keys[i], seqs[i]))` of each, in order, in one call
        (the batched G-check): consecutive offsets, and `on_durable` called once, with the last one's
        offset, when all of them are durable."""
        if self._closed:
            raise StoreClosedError(f"writer of {self.topic}[{self.partition}] is closed")
        self._check_failed()
        count = len(values)
        if not count:
            return
        longest = max(map(len, values))
        if longest > self._max_record_bytes:
            raise RecordTooLargeError(f"{longest} bytes > max_record_bytes={self._max_record_bytes}")
        while self._outstanding and self._outstanding + count > self._max_outstanding:
            self.poll(0.05)  # back-pressure, as in append
        first = self._next_offset
        self._pending.extend(
            zip(range(first, first + count), repeat(kind), repeat(time), keys, seqs, values, strict=False)
        )
        callbacks = self._pending_callbacks
        callbacks.extend(repeat(None, count - 1))
        callbacks.append(on_durable)  # served after the run's earlier records: completions come in order
        self._next_offset = first + count
        self._outstanding += count
        if len(self._pending) >= self._max_batch:
            self._submit()

    def _submit(self) -> None:
        if self._pending:
            self._io_queue.put((self._pending, self._pending_callbacks))
            self._pending, self._pending_callbacks = [], []

    def poll(self, timeout: float = 0.0) -> int:
        # A batch still being filled is handed to the I/O thread here too, so that records appended by a
        # slow operator become durable without waiting for the batch to fill.
        self._submit()
        served = 0
        deadline = time.monotonic() + timeout
        while True:
            with self._completed_cv:
                if not self._completed and timeout > 0:
                    remaining = deadline - time.monotonic()
                    if remaining > 0:
                        self._completed_cv.wait(remaining)
                batches = list(self._completed)
                self._completed.clear()
            for offsets, callbacks, error in batches:
                for offset, callback in zip(offsets, callbacks, strict=True):
                    self._outstanding -= 1
                    if callback is not None:
                        callback(None, error) if error else callback(offset, None)
                    served += 1
            self._check_failed()
            if served or timeout <= 0 or time.monotonic() >= deadline:
                return served

    def flush(self, timeout: float | None = None) -> None:
        self._submit()
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._outstanding:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{self._outstanding} records still outstanding")
            self.poll(0.05)
        self._check_failed()

    @property
    def outstanding(self) -> int:
        return self._outstanding

    @property
    def next_offset(self) -> int:
        """Offset the next appended record will get."""
        return self._next_offset

    def trim(self, before_offset: int) -> int:
        """Range delete below `before_offset` and the new log start, in one transaction (its own
        connection: the I/O thread's commits and this one serialise on SQLite's write lock)."""
        if self._trim_conn is None:
            self._trim_conn = _connect(self._path, read_only=False, fsync=self._fsync)
        conn = self._trim_conn
        try:
            return self._trim(conn, before_offset)
        except sqlite3.DatabaseError as exc:
            raise _failed(self._path, exc) from None

    def _trim(self, conn: sqlite3.Connection, before_offset: int) -> int:
        conn.execute("BEGIN IMMEDIATE")
        try:
            start = _log_start(conn, self._path)
            row = conn.execute("SELECT MAX(offset) FROM log").fetchone()
            durable_end = 0 if row[0] is None else row[0] + 1
            if before_offset > durable_end:
                raise QueueStoreError(
                    f"{self.topic}[{self.partition}]: cannot trim below {before_offset}, past the durable "
                    f"end {durable_end}"
                )
            if before_offset <= start:
                conn.execute("ROLLBACK")
                return 0
            conn.execute("DELETE FROM log WHERE offset < ?", (before_offset,))
            conn.execute(
                "INSERT OR REPLACE INTO meta (name, value) VALUES ('log_start', ?)", (before_offset,)
            )
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        return before_offset - start

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._close_flush(self.flush)
        finally:
            self._closed = True
            self._io_queue.put(None)
            self._thread.join()
            self._conn.close()
            if self._trim_conn is not None:
                self._trim_conn.close()
            self._lock_file.close()

    # -- I/O thread ------------------------------------------------------------------------------------
    def _commit(self) -> None:
        """COMMIT the I/O thread's open transaction (its rows inserted): the one place a batch becomes
        durable (the tests' crash and disk-error points wrap it: tests/killpoints)."""
        self._conn.execute("COMMIT")

    def _io_loop(self) -> None:
        while True:
            item = self._io_queue.get()
            if item is None:
                return
            rows, callbacks = item
            # Coalesce whatever else is queued into one transaction: fewer commits under load. Extended in
            # place (`_submit` hands its lists over and starts new ones): the operator submits a small batch
            # at every poll, and `rows = rows + more` copied the transaction so far once per queued batch.
            while not self._io_queue.empty() and len(rows) < 8 * self._max_batch:
                more = self._io_queue.get_nowait()
                if more is None:
                    self._io_queue.put(None)
                    break
                rows.extend(more[0])
                callbacks.extend(more[1])
            error: Exception | None = None
            if self._failure is not None:
                # Fail-stop: these rows' offsets come after the failed batch's; writing them would leave
                # a hole in the log. They are reported failed without touching it.
                error = WriterFailedError(f"not written: an earlier append failed ({self._failure})")
            else:
                try:
                    self._conn.execute("BEGIN IMMEDIATE")
                    insert_rows(self._conn, rows, self._statement_rows)
                    self._commit()
                except Exception as exc:  # the whole batch failed: every record in it is reported failed
                    if isinstance(exc, sqlite3.DatabaseError) and _is_damage(exc):
                        exc = _failed(self._path, exc)  # a restart will not help: say what will
                    error = exc
                    self._fail(exc)
                    with contextlib.suppress(sqlite3.Error):
                        self._conn.execute("ROLLBACK")
            with self._completed_cv:
                self._completed.append(([r[0] for r in rows], callbacks, error))
                self._completed_cv.notify_all()
