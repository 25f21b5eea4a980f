"""A damaged stream index is rebuilt from the log, exactly, with one warning; never a traceback.

Damage is made to the RocksDB files as a failing disk or a careless hand would (a flipped byte, a file cut
short, zeroed or deleted, a lock file that is not one), in every file RocksDB reads, and on both sides of
"open": RocksDB checks some files when it opens a database and others only when a read reaches the
damaged block, possibly in the middle of a run. After the repair the index answers exactly what an index
built from the log answers.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cec.config import Checkpointing
from cec.records import Kind, OutputRecord, RecordCodec
from operators.job import JobSpec, run_job
from queuestore.base import RecordMeta
from queuestore.exceptions import DamagedLogError, IndexError_
from queuestore.index import StreamIndex
from queuestore.kafka import KafkaQueueStore
from queuestore.output import OutputQueue
from queuestore.sqlite import SqliteQueueStore
from recovery.as_of import time_cut_start
from tests.brokers import Broker
from tests.helpers import per_key, results
from tests.queuestore.damage import corrupt_record

TOPIC = "idx"
KEYS = 2000
CODEC = RecordCodec()


def _records(first: int, count: int) -> Iterator[OutputRecord]:
    """Records `first`..: a result per key in turn (the closed-window directory fills up), G-opens between
    them (time entries only), times rising."""
    for i in range(first, first + count):
        key = f"key-{i % KEYS:04d}"
        if i % 3 == 2:
            yield OutputRecord(Kind.R, 10 * i, (i,), 1, key=key, seq=i // KEYS, payload=b"r")
        else:
            yield OutputRecord(Kind.GOPEN, 10 * i, (i,), 1, key=key, seq=i // KEYS + 1, state=b"s")


def _append(store: SqliteQueueStore, first: int, count: int) -> None:
    """One writer session through the real write path (the index learns each record once durable); each
    session ends with RocksDB flushing its memtable to a table file (SST)."""
    out = OutputQueue(store, TOPIC, 0)
    try:
        for record in _records(first, count):
            out.append(CODEC.encode(record), record.meta())
        out.flush()
    finally:
        out.close()


@pytest.fixture
def store(tmp_path: Path) -> SqliteQueueStore:
    store = SqliteQueueStore(tmp_path / "store")
    store.create_topic(TOPIC, 1)
    for session in range(3):
        _append(store, session * 3000, 3000)
    return store


def _answers(index: StreamIndex) -> tuple[object, ...]:
    """Everything the index answers: its extent, the closed-window directory, time lookups."""
    return (
        index.next_offset,
        index.start_offset,
        list(index.closed_windows()),
        [index.last_closed_seq(f"key-{k:04d}") for k in range(0, KEYS, 7)],
        [index.offset_for_time(t) for t in TIMES],
    )


TIMES = range(0, 100_000, 997)


def _metas(store: SqliteQueueStore) -> list[tuple[int, RecordMeta]]:
    with store.reader(TOPIC, 0) as reader:
        return [(r.offset, r.meta) for r in reader.scan_forward(0)]


def _closed(store: SqliteQueueStore) -> dict[str, int]:
    """key -> the seq of its last result, from the log."""
    return {m.key: m.seq for _, m in _metas(store) if m.kind == "R" and m.key is not None}


def _assert_exact(answers: tuple[object, ...], store: SqliteQueueStore, stride: int = 64) -> None:
    """`answers` are those of an index of the whole log: the same extent and closed windows as the log
    says; each time lookup safe (no record at or after that time lies before it) and within one stride of
    the first such record (where its sparse entries lie depends on when the writer was restarted)."""
    metas = _metas(store)
    closed = _closed(store)
    next_offset, start_offset, windows, seqs, offsets = answers
    assert (next_offset, start_offset) == (len(metas), 0)
    assert windows == sorted(closed.items())
    assert seqs == [closed.get(f"key-{k:04d}") for k in range(0, KEYS, 7)]
    assert isinstance(offsets, list)
    for time, offset in zip(TIMES, offsets, strict=True):
        first = next((o for o, m in metas if m.time >= time), len(metas))
        assert first - stride <= offset <= first, (time, offset, first)


def _path(store: SqliteQueueStore) -> Path:
    return store.index_path(TOPIC, 0)


def _file(store: SqliteQueueStore, pattern: str) -> Path:
    """The largest file of the index matching `pattern` (the table file holding most entries)."""
    files = sorted(_path(store).glob(pattern), key=lambda p: p.stat().st_size)
    assert files, (pattern, sorted(p.name for p in _path(store).iterdir()))
    return files[-1]


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x5A
    path.write_bytes(bytes(data))


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _zero(path: Path) -> None:
    path.write_bytes(bytes(path.stat().st_size))


def _rebuild_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "queuestore.index" and r.levelno == logging.WARNING and "rebuilding it" in r.getMessage()
    ]


Damage = Callable[[SqliteQueueStore], None]
DAMAGE: dict[str, Damage] = {
    # RocksDB reads a table's footer and index when it opens the database, a data block only when a read
    # reaches it: a flip early in the largest table is found by a lookup, after a clean open.
    "table: a flipped byte in its first data block": lambda s: [_flip(t, 40) for t in _path(s).glob("*.sst")],
    "table: a flipped byte in its footer": lambda s: _flip(_file(s, "*.sst"), -20),
    "table: cut short": lambda s: _cut(_file(s, "*.sst")),
    "table: zeroed": lambda s: _zero(_file(s, "*.sst")),
    "table: deleted": lambda s: _file(s, "*.sst").unlink(),
    "MANIFEST: a flipped byte": lambda s: _flip(_file(s, "MANIFEST-*"), 40),
    "MANIFEST: cut short": lambda s: _cut(_file(s, "MANIFEST-*")),
    "MANIFEST: zeroed": lambda s: _zero(_file(s, "MANIFEST-*")),
    "MANIFEST: deleted": lambda s: _file(s, "MANIFEST-*").unlink(),
    "CURRENT: a flipped byte": lambda s: _flip(_file(s, "CURRENT"), 3),
    "CURRENT: cut short": lambda s: _cut(_file(s, "CURRENT")),
    "CURRENT: deleted": lambda s: _file(s, "CURRENT").unlink(),
    "OPTIONS: zeroed": lambda s: _zero(_file(s, "OPTIONS-*")),
    "LOCK: a directory where the lock file was": lambda s: (
        _file(s, "LOCK").unlink(),
        (_path(s) / "LOCK").mkdir(),
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_index_is_rebuilt_from_the_log_with_one_warning(
    store: SqliteQueueStore, tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    DAMAGE[damage](store)
    caplog.set_level(logging.WARNING, logger="queuestore.index")
    # The write path: open (and reconcile), then every lookup, then more records, as in a resumed run.
    out = OutputQueue(store, TOPIC, 0)
    try:
        _assert_exact(_answers(out.index), store)
        for record in _records(9000, 600):
            out.append(CODEC.encode(record), record.meta())
        out.flush()
        got_after = _answers(out.index)
    finally:
        out.close()
    _assert_exact(got_after, store)
    assert len(_rebuild_warnings(caplog)) <= 1, _rebuild_warnings(caplog)
    # The repair lasts: the next open finds an intact index and nothing to rebuild.
    caplog.clear()
    with StreamIndex(_path(store), f"{TOPIC}/0", read_only=True) as index:
        assert _answers(index) == got_after
    assert _rebuild_warnings(caplog) == []


def test_damage_found_by_a_read_in_the_middle_of_a_run_is_rebuilt_there(
    store: SqliteQueueStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the index opened, then a lookup met the damaged block and raised RocksDB's
    `Exception("Corruption: block checksum mismatch ...")`, and an iteration over it just ended early."""
    DAMAGE["table: a flipped byte in its first data block"](store)
    caplog.set_level(logging.WARNING, logger="queuestore.index")
    out = OutputQueue(store, TOPIC, 0)
    try:
        assert out.index.rebuilds == 0, "the open must not read the damaged block (else: a test of open)"
        # The closed-window directory sorts first: the damaged block holds the first keys.
        assert out.index.last_closed_seq("key-0000") == _closed(store)["key-0000"]
        assert out.index.rebuilds == 1
        assert len(_rebuild_warnings(caplog)) == 1
        _assert_exact(_answers(out.index), store)
        for record in _records(9000, 600):
            out.append(CODEC.encode(record), record.meta())
            out.poll()
        out.flush()
    finally:
        out.close()
    with StreamIndex(_path(store), f"{TOPIC}/0", read_only=True) as index:
        _assert_exact(_answers(index), store)


def test_an_iteration_that_meets_damage_is_not_taken_for_the_end(
    store: SqliteQueueStore, tmp_path: Path
) -> None:
    """RocksDB ends an iteration at a damaged block as if the entries ended there: the directory of
    closed windows must be the whole one or a rebuild, never a part of it."""
    DAMAGE["table: a flipped byte in its first data block"](store)
    with StreamIndex(_path(store), f"{TOPIC}/0", log=lambda: store.reader(TOPIC, 0)) as index:
        windows = list(index.closed_windows())
        assert index.rebuilds == 1
        _assert_exact((9000, 0, windows, *_answers(index)[3:]), store)


def test_a_read_only_index_is_never_dropped_and_says_it_is_unusable(
    store: SqliteQueueStore, tmp_path: Path
) -> None:
    """Another process's index (`cec state`, the Spark planner) is not this reader's to rebuild: a clear
    IndexError_, which those readers answer by reading the log instead."""
    DAMAGE["table: a flipped byte in its first data block"](store)
    before = _files(store)
    with StreamIndex(_path(store), f"{TOPIC}/0", read_only=True) as index:
        with pytest.raises(IndexError_, match=f"the stream index at {_path(store)} is unusable: Corruption"):
            list(index.closed_windows())
        with pytest.raises(IndexError_, match="unusable"):
            index.last_closed_seq("key-0000")
    assert _files(store) == before
    DAMAGE["CURRENT: deleted"](store)
    with pytest.raises(IndexError_, match="unusable"):
        StreamIndex(_path(store), f"{TOPIC}/0", read_only=True)
    assert time_cut_start(store, TOPIC, 0, 20_000) == 0  # cec state: reads the log from its start


def test_an_index_this_process_holds_through_another_handle_is_a_clear_error(store: SqliteQueueStore) -> None:
    """RocksDB refuses a second open of a database by the same process: whoever holds that handle may be
    using the index, so it is not taken for damage."""
    from rocksdict import Options, Rdict

    held = Rdict(str(_path(store)), Options(raw_mode=True))
    try:
        before = _files(store)
        with pytest.raises(IndexError_, match="is in use by another process or handle"):
            OutputQueue(store, TOPIC, 0)
        assert _files(store) == before
    finally:
        held.close()


def _files(store: SqliteQueueStore) -> list[str]:
    """The index's files (RocksDB rotates its info LOG on every open attempt)."""
    return sorted(p.name for p in _path(store).iterdir() if not p.name.startswith("LOG"))


def test_an_index_held_by_another_live_process_is_a_clear_error_and_left_alone(
    store: SqliteQueueStore,
) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from rocksdict import Options, Rdict; "
            f"db = Rdict({str(_path(store))!r}, Options(raw_mode=True)); print('held', flush=True); "
            "sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        before = _files(store)
        with pytest.raises(IndexError_, match=f"the stream index at {_path(store)} is in use by another"):
            OutputQueue(store, TOPIC, 0)
        assert _files(store) == before
        with store.writer(TOPIC, 0):  # the failed open released the partition
            pass
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)


def test_an_index_left_by_a_killed_writer_opens_as_it_is(store: SqliteQueueStore, tmp_path: Path) -> None:
    """The lock of a writer that was SIGKILLed is held by nobody: RocksDB takes it, nothing is rebuilt."""
    script = (
        "import os, signal; from queuestore.sqlite import SqliteQueueStore; "
        "from queuestore.output import OutputQueue; "
        f"out = OutputQueue(SqliteQueueStore({str(store.root)!r}), {TOPIC!r}, 0); "
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    killed = subprocess.run([sys.executable, "-c", script], cwd=os.getcwd(), timeout=120, check=False)
    assert killed.returncode == -9
    with StreamIndex(_path(store), f"{TOPIC}/0", log=lambda: store.reader(TOPIC, 0)) as index:
        _assert_exact(_answers(index), store)
        assert index.rebuilds == 0


def test_a_kafka_stores_damaged_index_is_rebuilt_from_the_topic_with_exact_results(
    kafka_broker: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The Kafka store keeps its stream index in RocksDB under its state dir, by the same rule: a resumed
    run whose index is damaged rebuilds it from the output topic and finishes exactly."""

    def spec(store: dict[str, Any], topic: str) -> JobSpec:
        return JobSpec(
            operator={
                "type": "aggregate",
                "key_field": "item_id",
                "value_field": "item_price",
                "agg": "sum",
                "window_count": 2,
            },
            source={"type": "generator", "count": 6000, "keys": 2500, "seed": 9, "partitions": 2},
            store=store,
            output_topic=topic,
            checkpointing=Checkpointing(q_target=None),
            batch_size=64,
        )

    reference = spec({"type": "sqlite", "root": str(tmp_path / "ref")}, "agg")
    run_job(reference)
    want = per_key(results(SqliteQueueStore(tmp_path / "ref"), "agg"))

    state = tmp_path / "state"
    topic = f"damaged-index-{uuid.uuid4().hex[:12]}"
    job = spec({"type": "kafka", "bootstrap_servers": kafka_broker.bootstrap, "state_dir": str(state)}, topic)
    run_job(job, max_inputs=4000)
    store = KafkaQueueStore(kafka_broker.bootstrap, state)
    try:
        index = store.index_path(topic, 0)
        tables = sorted(index.glob("*.sst"))
        assert tables
        for table in tables:
            _flip(table, 40)
        caplog.set_level(logging.WARNING, logger="queuestore.index")
        run_job(job)
        assert len(_rebuild_warnings(caplog)) == 1, _rebuild_warnings(caplog)
        assert per_key(results(store, topic)) == want
        with store.reader(topic, 0) as reader:
            stored = list(reader.scan_forward(0))
        closed = {r.meta.key: r.meta.seq for r in stored if r.meta.kind == "R"}
        with StreamIndex(index, f"{topic}/0", read_only=True) as rebuilt:
            assert dict(rebuilt.closed_windows()) == closed
            assert rebuilt.next_offset == stored[-1].offset + 1  # (transaction markers take offsets too)
    finally:
        store.close()


@pytest.mark.parametrize("kind", ["GOPEN", "R"])
def test_a_rebuild_takes_nothing_from_a_damaged_record(
    store: SqliteQueueStore, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The index is built from checked records only (before: from whatever metadata a damaged record had
    beside it). A damaged footprint is passed over, as recovery passes over it; a damaged result is an
    error naming it: its window's sequence number cannot be known."""
    offset = next(o for o, m in _metas(store) if m.kind == kind and o > 4000)
    corrupt_record(store, TOPIC, 0, offset)
    shutil.rmtree(_path(store))
    caplog.set_level(logging.WARNING, logger="queuestore.index")
    if kind == "R":
        with pytest.raises(
            DamagedLogError, match=f"{TOPIC}\\[0\\] offset {offset} is damaged: checksum mismatch"
        ):
            OutputQueue(store, TOPIC, 0)
        return
    out = OutputQueue(store, TOPIC, 0)
    try:
        assert out.index.passed_over == [offset]
        _assert_exact(_answers(out.index), store)
    finally:
        out.close()
    (warning,) = [r.getMessage() for r in caplog.records if "not indexed" in r.getMessage()]
    assert f"1 damaged footprint(s) not indexed (offsets {offset}); recovery falls back" in warning


def test_the_spark_planner_reads_the_closed_windows_from_the_log_when_the_drivers_index_is_damaged(
    store: SqliteQueueStore,
) -> None:
    """A planning task only reads the driver's index (read-only): a damaged one is not its to rebuild, so
    it takes the closed-window directory from the log instead (before: RocksDB's `Exception`)."""
    from operators.spark.plan_task import _closed_windows

    DAMAGE["table: a flipped byte in its first data block"](store)
    with store.reader(TOPIC, 0) as reader:
        end = reader.end_offset()
        closed = _closed_windows(store, reader, TOPIC, 0, end, current=True)  # type: ignore[arg-type]
    assert closed == _closed(store)
