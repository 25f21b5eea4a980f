"""The embedded SQLite store's writer is fail-stop: a disk error in one group commit stops it there, no
later batch is ever written (the log has no hole), and every later call says so at once."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cec.records import RecordCodec
from queuestore.exceptions import WriterFailedError
from queuestore.output import OutputQueue
from queuestore.sqlite import SqlitePartitionWriter, SqliteQueueStore
from tests.helpers import child_env, wait_for
from tests.queuestore.conformance.append_child import record

CODEC = RecordCodec()


@pytest.fixture
def disk_error_at_commit_2(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The writer's second commit fails with a disk error (its COMMIT, wrapped from the test side)."""
    commit = SqlitePartitionWriter._commit
    calls = [0]

    def failing(self: SqlitePartitionWriter) -> None:
        calls[0] += 1
        if calls[0] == 2:
            raise sqlite3.OperationalError("disk I/O error")
        commit(self)

    monkeypatch.setattr(SqlitePartitionWriter, "_commit", failing)
    yield


def _stored(store: SqliteQueueStore, topic: str) -> list[bytes]:
    with store.reader(topic, 0) as reader:
        records = list(reader.scan_forward(0))  # a dense scan: raises on a hole
    assert [r.offset for r in records] == list(range(len(records)))
    return [r.value for r in records]


def test_a_failed_commit_stops_the_writer_and_nothing_after_it_is_written(
    tmp_path: Path, disk_error_at_commit_2: None
) -> None:
    store = SqliteQueueStore(tmp_path)
    store.create_topic("t", 1)
    writer = SqlitePartitionWriter(
        tmp_path / "t" / "0.sqlite", "t", 0, max_record_bytes=1 << 20, max_batch=10
    )
    durable: list[int] = []

    def on_durable(offset: int | None, error: Exception | None) -> None:
        if offset is not None:
            durable.append(offset)

    values = [CODEC.encode(record(i)) for i in range(50)]
    for i in range(10):
        writer.append(values[i], record(i).meta(), on_durable)
    writer.flush()  # commit 1: these ten are durable
    # Four more batches handed to the I/O thread at once: commit 2 fails, and whatever comes after it
    # (later batches, queued before the failure was known) must not be written: it would follow a hole.
    for i in range(10, 50):
        writer.append(values[i], record(i).meta(), on_durable)
    with pytest.raises(WriterFailedError, match=r"t\[0\] failed \(disk I/O error\)"):
        writer.flush()
    assert durable == list(range(10))  # no record after the failed commit is ever reported durable
    with pytest.raises(WriterFailedError):
        writer.append(values[0], record(0).meta())
    with pytest.raises(WriterFailedError):
        writer.poll()
    writer.close()  # already reported: closing does not raise it again
    assert _stored(store, "t") == values[:10]


def test_a_disk_error_in_a_child_process_leaves_an_exact_prefix(tmp_path: Path) -> None:
    """A real process whose third group commit hits a disk error: it stops with the error, and the log is
    exactly the first two commits."""
    spec = {"type": "sqlite", "root": str(tmp_path)}
    store = SqliteQueueStore(tmp_path)
    store.create_topic("t", 1)
    per_commit = 250
    child = subprocess.run(
        [sys.executable, "-m", "tests.queuestore.conformance.append_child", json.dumps(spec), "t", "0", "0", "5000",
         "--flush-every", str(per_commit)],
        env=child_env("store.io_error:3"),
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert child.returncode == 3  # append_child's exit code for a store error, reported in one line
    assert "WriterFailedError" in child.stderr and "disk I/O error" in child.stderr
    assert _stored(store, "t") == [CODEC.encode(record(i)) for i in range(2 * per_commit)]
    # The next writer continues right after the prefix.
    with store.writer("t", 0) as writer:
        assert writer.next_offset == 2 * per_commit


def test_an_output_queue_raises_at_once_after_a_failed_append(
    tmp_path: Path, disk_error_at_commit_2: None
) -> None:
    """What the operator runtime sees: once an append failed, its next append, poll or flush raises."""
    store = SqliteQueueStore(tmp_path)
    store.create_topic("t", 1)
    output = OutputQueue(store, "t", 0)
    try:
        output.append(CODEC.encode(record(0)), record(0).meta())
        output.flush()
        output.append(CODEC.encode(record(1)), record(1).meta())
        with contextlib.suppress(WriterFailedError):  # raises already if the commit failed that fast
            output.writer.poll()  # hands the batch to the I/O thread, whose commit fails
        wait_for(lambda: output.writer.failure is not None)
        for call in (
            lambda: output.append(CODEC.encode(record(2)), record(2).meta()),
            output.poll,
            output.flush,
        ):
            with pytest.raises(WriterFailedError, match="disk I/O error"):
                call()
    finally:
        output.close()
    assert _stored(store, "t") == [CODEC.encode(record(0))]
