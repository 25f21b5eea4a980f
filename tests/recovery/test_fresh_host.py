"""A fresh host (the state directory lost) recovers by reading the log's extent, not its history (issue
26), and exactly: a real operator process with three input partitions is SIGKILLed mid-run, its state
directory (the stream index) deleted, and the restart counts every record it reads through the store's
reader up to the moment it has caught up with the crash point. The index is rebuilt afterwards, while the
operator runs, and ends up what a rebuild from the whole log gives."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from operators.job import JobSpec, run_job
from operators.local_restore import LocalRestore
from queuestore.base import QueueStore
from queuestore.index import StreamIndex
from queuestore.kafka import KafkaQueueStore
from queuestore.kafka import reader as kafka_reader
from queuestore.kafka.reader import KafkaPartitionReader
from queuestore.sqlite import SqlitePartitionReader, SqliteQueueStore
from recovery.timeline import PHASES
from tests.brokers import Broker
from tests.helpers import per_key, results, start_worker

TUPLES = 120_000
KILL_AT = 100_000
# What a recovery reads besides the extent: the EC build's first read back (8,192 records) and its
# slack chunk (8,192 more), the directory's read back on demand (8,192 at most here) and the crash
# tuple's records (`_results_at_end`).
SLACK = 3 * 8192 + 1024


# A kill after KILL_AT tuples loses at most this many appended records (the writer's back-pressure): the
# killed log is long whatever the machine's load (the default bound, 32,768 on SQLite, is a third of it).
MAX_OUTSTANDING = 4096


def _spec(store: dict[str, object], topic: str) -> JobSpec:
    store = {**store, "max_outstanding": MAX_OUTSTANDING}
    return JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "sum",
            "window_count": 2,  # about a record per tuple: a long log over a short extent
        },
        source={
            "type": "generator",
            "count": TUPLES,
            "keys": 100,
            "seed": 11,
            "partitions": 3,
            "invalid_every": 50,
            "interleave": 17,
        },
        store=store,
        output_topic=topic,
        batch_size=64,
    )


class _ReadCounter:
    """Counts the records every reader of the store returns, and the count when recovery caught up."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.records = 0
        self.at_caught_up: int | None = None
        counter = self

        sqlite_rows = SqlitePartitionReader._rows

        def rows(reader: SqlitePartitionReader, sql: str, parameters: tuple[int, ...]) -> Any:
            found = sqlite_rows(reader, sql, parameters)
            counter.records += len(found)
            return found

        kafka_read = KafkaPartitionReader._read

        def read(reader: KafkaPartitionReader, *args: Any, **kwargs: Any) -> Any:
            result = kafka_read(reader, *args, **kwargs)
            counter.records += len(result.records) + len(result.rows)
            return result

        # Finding a Kafka log's end consumes it from a hint to the EOF event: those records count too.
        find_ends = kafka_reader.find_ends

        def counting_find_ends(consumer: Any, *args: Any, **kwargs: Any) -> Any:
            return find_ends(_CountingConsumer(consumer, counter), *args, **kwargs)

        caught_up: Callable[[LocalRestore], None] = LocalRestore.caught_up

        def at_caught_up(restorer: LocalRestore) -> None:
            counter.at_caught_up = counter.records
            caught_up(restorer)

        monkeypatch.setattr(SqlitePartitionReader, "_rows", rows)
        monkeypatch.setattr(KafkaPartitionReader, "_read", read)
        monkeypatch.setattr(LocalRestore, "caught_up", at_caught_up)
        monkeypatch.setattr(kafka_reader, "find_ends", counting_find_ends)


class _CountingConsumer:
    """A consumer whose polled messages (records, not events) count as read."""

    def __init__(self, consumer: Any, counter: _ReadCounter) -> None:
        self._consumer, self._counter = consumer, counter

    def _count(self, messages: list[Any]) -> None:
        self._counter.records += sum(1 for m in messages if m is not None and m.error() is None)

    def poll(self, *args: Any, **kwargs: Any) -> Any:
        message = self._consumer.poll(*args, **kwargs)
        self._count([message])
        return message

    def consume(self, *args: Any, **kwargs: Any) -> Any:
        messages = self._consumer.consume(*args, **kwargs)
        self._count(messages)
        return messages

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def _fresh_host_restart(
    spec: JobSpec,
    tmp_path: Path,
    state_dir: Path,
    checker: QueueStore,
    topic: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_job(_spec({"type": "sqlite", "root": str(tmp_path / "ref")}, "agg"))
    want = results(SqliteQueueStore(tmp_path / "ref"), "agg")

    proc = start_worker(spec, tmp_path / "spec.json", faults=f"runtime.after_input:{KILL_AT}")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    with checker.reader(topic, 0) as reader:
        log_end = reader.end_offset()
    assert log_end >= 80_000, f"the killed run left only {log_end:,} records"
    shutil.rmtree(state_dir / "index")  # the fresh host: no stream index

    counter = _ReadCounter(monkeypatch)
    stats = run_job(spec)
    rec = stats.recovery
    assert rec is not None and stats.completed
    assert counter.at_caught_up is not None
    # The index was deferred, and recovery read O(extent) records, not the log's history.
    assert rec.index_deferred >= log_end - 8192
    assert counter.at_caught_up <= rec.extent_records + rec.ec_windows + SLACK, (counter.at_caught_up, rec)
    assert counter.at_caught_up * 3 <= log_end, (counter.at_caught_up, log_end)
    assert list(rec.phases) == list(PHASES)
    assert rec.recovery_seconds == pytest.approx(sum(rec.phases.values()))

    got = results(checker, topic)
    assert per_key(got) == per_key(want)
    assert len(got) == len(want)

    # The index caught up while the run went on: what a rebuild from the whole log answers.
    with checker.reader(topic, 0) as reader:
        end = reader.end_offset()
        with StreamIndex(tmp_path / "rebuilt", f"{topic}/0") as rebuilt:
            rebuilt.reconcile(reader)
            with StreamIndex(
                state_dir / "index" / f"{topic}.0.rocksdb", f"{topic}/0", read_only=True
            ) as kept:
                assert kept.next_offset == rebuilt.next_offset
                assert end - 1 <= kept.next_offset <= end
                assert list(kept.closed_windows()) == list(rebuilt.closed_windows())


def test_a_fresh_host_recovers_from_the_extent_on_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    spec = _spec({"type": "sqlite", "root": str(root)}, "agg")
    checker = SqliteQueueStore(root)
    try:
        _fresh_host_restart(spec, tmp_path, root, checker, "agg", monkeypatch)
    finally:
        checker.close()


def test_a_fresh_host_recovers_from_the_extent_on_kafka(
    kafka_broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = f"fresh-{tmp_path.name[-20:]}".replace("_", "-")
    state = tmp_path / "state"
    spec = _spec(
        {"type": "kafka", "bootstrap_servers": kafka_broker.bootstrap, "state_dir": str(state)}, topic
    )
    checker = KafkaQueueStore(kafka_broker.bootstrap, tmp_path / "check")
    try:
        _fresh_host_restart(spec, tmp_path, state, checker, topic, monkeypatch)
    finally:
        checker.close()
