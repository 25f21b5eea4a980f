"""Embedded queue store on SQLite: one database file per partition, WAL journal.

Why SQLite rather than RocksDB for the log itself:
- several processes must read a partition while its single writer appends (the aggregate tails the
  filter's queue, the CLI reads results, recovery reads back the log). SQLite in WAL mode gives every
  reader a consistent snapshot from any process; RocksDB allows one read-write process per database and
  only lagging secondary instances beside it;
- appends are grouped into one transaction per batch (group commit). A transaction is atomic: a process
  killed in the middle of a write leaves a WAL whose torn tail SQLite detects by its frame checksums and
  ignores on the next open, so a reader can never see half a record or half a batch. The cec codec adds a
  CRC32C per record on top, so bytes damaged after the fact are detected too;
- offsets are the INTEGER PRIMARY KEY (the rowid B-tree), so seeking forward or backward is O(log n) and
  sequential reads run at several hundred thousand records per second.

Durability is against process crashes (synchronous=NORMAL: a committed transaction is in the OS page
cache before the commit returns). Set `fsync=True` for durability against power loss.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from itertools import repeat
from pathlib import Path

from queuestore.base import (
    ATTACHMENT_NAME,
    DurableCallback,
    PartitionReader,
    PartitionWriter,
    QueueStore,
    RecordMeta,
    Row,
    StoredRecord,
)
from queuestore.exceptions import (
    DamagedLogError,
    PartitionLockedError,
    QueueStoreError,
    RecordTooLargeError,
    StoreClosedError,
    TopicMismatchError,
    UnknownTopicError,
    WriterFailedError,
)

__all__ = ["SqlitePartitionReader", "SqlitePartitionWriter", "SqliteQueueStore"]

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
_ACK_PREFIX = "ack-"
_TAIL_POLL_S = 0.002  # how often a tail reader at the live end looks for new rows


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
            # Coalesce whatever else is queued into one transaction: fewer commits under load.
            while not self._io_queue.empty() and len(rows) < 8 * self._max_batch:
                more = self._io_queue.get_nowait()
                if more is None:
                    self._io_queue.put(None)
                    break
                rows = rows + more[0]
                callbacks = callbacks + more[1]
            error: Exception | None = None
            if self._failure is not None:
                # Fail-stop: these rows' offsets come after the failed batch's; writing them would leave
                # a hole in the log. They are reported failed without touching it.
                error = WriterFailedError(f"not written: an earlier append failed ({self._failure})")
            else:
                try:
                    self._conn.execute("BEGIN IMMEDIATE")
                    self._conn.executemany(f"INSERT INTO log ({_COLUMNS}) VALUES (?,?,?,?,?,?)", rows)
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


class SqliteQueueStore(QueueStore):
    """Topics under `root/<topic>/`, a `topic.json` with the partition count, `<p>.sqlite` per partition,
    and `<p>.<name>` per attachment of partition p (written atomically: temporary file, fsync, rename)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        fsync: bool = False,
        max_record_bytes: int = 16 << 20,
        max_outstanding: int = 32_768,
    ):
        """`max_outstanding` bounds the records appended but not yet durable: an operator that outruns the
        disk waits rather than running ahead of it. It is what a crash can lose to replay, and how far
        trimming (which applies a bound only once everything appended before it is durable) can lag."""
        if max_outstanding < 1:
            raise QueueStoreError("max_outstanding must be at least 1")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.state_dir = self.root
        self.max_record_bytes = max_record_bytes
        self.max_outstanding = max_outstanding
        self._fsync = fsync

    def __repr__(self) -> str:
        return f"SqliteQueueStore({str(self.root)!r})"

    def _topic_dir(self, topic: str) -> Path:
        if not topic or "/" in topic or topic.startswith("."):
            raise QueueStoreError(f"invalid topic name {topic!r}")
        return self.root / topic

    def create_topic(self, topic: str, partitions: int, *, exist_ok: bool = True) -> None:
        if partitions < 1:
            raise QueueStoreError("a topic needs at least one partition")
        meta = self._topic_dir(topic) / "topic.json"
        if meta.exists():
            existing = self.partitions(topic)
            if not exist_ok:
                raise TopicMismatchError(f"topic {topic!r} already exists")
            if existing != partitions:
                raise TopicMismatchError(f"topic {topic!r} has {existing} partitions, asked for {partitions}")
            return
        meta.parent.mkdir(parents=True, exist_ok=True)
        for p in range(partitions):
            _create_partition_file(meta.parent / f"{p}.sqlite")
        tmp = meta.with_suffix(".tmp")
        tmp.write_text(json.dumps({"partitions": partitions}))
        os.replace(tmp, meta)  # atomic: a crash never leaves a half-written topic description

    def topic_exists(self, topic: str) -> bool:
        return (self._topic_dir(topic) / "topic.json").is_file()

    def topics(self) -> list[str]:
        return sorted(d.name for d in self.root.iterdir() if (d / "topic.json").is_file())

    def partitions(self, topic: str) -> int:
        meta = self._topic_dir(topic) / "topic.json"
        try:
            return int(json.loads(meta.read_text())["partitions"])
        except (FileNotFoundError, NotADirectoryError):
            raise UnknownTopicError(f"no topic {topic!r} in {self.root}") from None
        except (ValueError, KeyError, TypeError):
            raise DamagedLogError(f"{meta} is damaged; {WAY_OUT}") from None

    def _partition_path(self, topic: str, partition: int) -> Path:
        count = self.partitions(topic)
        if not 0 <= partition < count:
            raise QueueStoreError(f"{topic} has partitions 0..{count - 1}, not {partition}")
        return self._topic_dir(topic) / f"{partition}.sqlite"

    def writer(self, topic: str, partition: int) -> SqlitePartitionWriter:
        return SqlitePartitionWriter(
            self._partition_path(topic, partition),
            topic,
            partition,
            max_record_bytes=self.max_record_bytes,
            fsync=self._fsync,
            max_outstanding=self.max_outstanding,
        )

    def reader(self, topic: str, partition: int) -> SqlitePartitionReader:
        reader = SqlitePartitionReader(self._partition_path(topic, partition), topic, partition)
        reader.dense_offsets = self.dense_offsets
        return reader

    def _attachment_path(self, topic: str, partition: int, name: str) -> Path:
        if not ATTACHMENT_NAME.match(name):
            raise QueueStoreError(f"invalid attachment name {name!r}")
        return self._partition_path(topic, partition).with_name(f"{partition}.{name}")

    def read_attachment(self, topic: str, partition: int, name: str) -> bytes | None:
        try:
            return self._attachment_path(topic, partition, name).read_bytes()
        except FileNotFoundError:
            return None

    def write_attachment(self, topic: str, partition: int, name: str, value: bytes) -> None:
        path = self._attachment_path(topic, partition, name)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            f.write(value)
            f.flush()
            os.fsync(f.fileno())  # the rename below must never expose an empty or partial file
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # and the rename itself must be durable before the log grows
        finally:
            os.close(dir_fd)

    # -- registered consumers: one attachment per consumer, so that each writes only its own ----------
    def _ack_name(self, consumer: str) -> str:
        name = _ACK_PREFIX + consumer
        if not ATTACHMENT_NAME.match(name):
            raise QueueStoreError(f"invalid consumer name {consumer!r} (lower-case letters, digits, '-')")
        return name

    def acknowledge(self, topic: str, partition: int, consumer: str, offset: int) -> None:
        self.write_attachment(topic, partition, self._ack_name(consumer), str(int(offset)).encode())

    def forget_consumer(self, topic: str, partition: int, consumer: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._attachment_path(topic, partition, self._ack_name(consumer)).unlink()

    def acknowledged(self, topic: str, partition: int) -> dict[str, int]:
        folder = self._partition_path(topic, partition).parent
        prefix = f"{partition}.{_ACK_PREFIX}"
        acks: dict[str, int] = {}
        for path in folder.glob(prefix + "*"):
            try:
                acks[path.name[len(prefix) :]] = int(path.read_bytes())
            except FileNotFoundError:  # unregistered meanwhile
                continue
            except ValueError:
                raise DamagedLogError(f"the acknowledgement {path} is damaged; {WAY_OUT}") from None
        return acks

    def close(self) -> None:
        pass
