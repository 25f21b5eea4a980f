"""The executor-side writer of an attached aggregation (operators.spark.writer.write_partition), on a real
broker, without Spark (what one write task does to its output partition):

1. a duplicate attempt of a task whose first attempt committed adds nothing: exactly one copy in the log,
   and both attempts report the same cursor;
2. a retry after an attempt that was killed mid-batch (half committed, the rest produced but never
   committed) fences that attempt and appends only what is missing: the log equals a single clean write;
3. records the batch did not produce (another writer's, or a stale cursor) are a conflict: nothing is
   written;
4. a writer kept in the worker across micro-batches (`session`) appends the next batch without taking the
   partition over again only when nothing else can have written since its own commit: another session,
   a retried attempt or another cursor take the partition over as a first write would, and a kept writer
   fenced by another writer (another worker's task of the same or of a re-run batch) falls back to it,
   so the log is the same as with a fresh writer per batch.
"""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path
from typing import Any

import pytest

from cec.records import Kind, RecordCodec
from operators.exceptions import OutputConflictError
from operators.spark.live_writers import close_live
from operators.spark.writer import PartitionCursor, PartitionWrite, write_partition
from queuestore.base import RecordMeta
from queuestore.exceptions import QueueStoreError
from queuestore.kafka import KafkaQueueStore
from tests.brokers import Broker

ZERO = PartitionCursor((0, 0), 0, 0, 0)


def _batch(first_offset: int, tuples: int = 60) -> list[tuple[Any, ...]]:
    """Rows of the processor (EMIT_COLUMNS) for output partition 0: count windows of 3 over 4 keys, tuples
    alternating between input partitions 0 and 1, each with its emission index (the order the processor
    makes them in: it applies a call's tuples by (j, o)), shuffled as Spark may hand them over."""
    rows: list[tuple[Any, ...]] = []
    counts: dict[str, int] = {}
    for i in range(tuples):
        j, o = i % 2, first_offset + i // 2
        key = f"k{i % 4}"
        n = counts.get(key, 0)
        counts[key] = n + 1
        seq = n // 3
        if n % 3 == 0:
            rows.append(
                (0, j, o, len(rows), Kind.GOPEN.value, key, seq, f"{key}:{seq}:1".encode(), None, o, 1, None)
            )
        elif n % 3 == 2:
            rows.append(
                (0, j, o, len(rows), Kind.R.value, key, seq, None, f"{key}:{seq}".encode(), o, -1, None)
            )
    # The processor applies a call's tuples by (j, o) and numbers its rows as it makes them.
    rows = [(*r[:3], i, *r[4:]) for i, r in enumerate(sorted(rows, key=lambda r: (r[1], r[2])))]
    rows.reverse()
    return rows


def _log(store: KafkaQueueStore, topic: str) -> list[tuple[bytes, tuple[Any, ...]]]:
    with store.reader(topic, 0) as reader:
        return [(r.value, tuple(r.meta)) for r in reader.scan_forward(0)]


@pytest.fixture(autouse=True)
def _no_kept_writers() -> Any:
    yield
    close_live()  # writers a test kept in this process (as a Python worker would)


@pytest.fixture
def store(kafka_broker: Broker, tmp_path: Path) -> Any:
    s = KafkaQueueStore(kafka_broker.bootstrap, tmp_path / "probe")
    yield s
    s.close()


def _topic(store: KafkaQueueStore) -> str:
    topic = f"writer-{uuid.uuid4().hex[:8]}"
    store.create_topic(topic, 1)
    return topic


def test_a_duplicate_attempt_adds_nothing(kafka_broker: Broker, store: KafkaQueueStore) -> None:
    topic = _topic(store)
    rows = _batch(0)
    first = write_partition(kafka_broker.bootstrap, {}, topic, 0, ZERO, rows, has_time=True)
    assert first.found == 0 and first.written == len(rows) > 0
    again = write_partition(kafka_broker.bootstrap, {}, topic, 0, ZERO, list(reversed(rows)), has_time=True)
    assert again.found == len(rows) and again.written == 0
    assert again.cursor == first.cursor and again.kinds == first.kinds
    log = _log(store, topic)
    assert len(log) == len(rows)  # exactly one copy
    # The next batch continues from the cursor: pos, N and time go on along the log.
    nxt = write_partition(kafka_broker.bootstrap, {}, topic, 0, first.cursor, _batch(30), has_time=True)
    assert nxt.found == 0 and nxt.written > 0
    codec = RecordCodec()
    with store.reader(topic, 0) as reader:
        records = [codec.decode(r.value, r.meta) for r in reader.scan_forward(0)]
    assert len(records) == len(rows) + nxt.written
    for a, b in itertools.pairwise(records):
        assert all(x <= y for x, y in zip(a.pos, b.pos, strict=True)) and a.time <= b.time
    # N counts the open windows along the log (sorted by (j, o): two keys per input partition); every
    # window of these batches closes inside its batch.
    assert max(r.n for r in records) == 2 and records[-1].n == nxt.cursor.n == 0


def test_a_retry_after_a_killed_attempt_appends_only_the_rest(
    kafka_broker: Broker, store: KafkaQueueStore, tmp_path: Path
) -> None:
    rows = _batch(0)
    clean = _topic(store)
    write_partition(kafka_broker.bootstrap, {}, clean, 0, ZERO, rows, has_time=True)
    want = _log(store, clean)

    topic = _topic(store)
    # The killed attempt: its writer committed the first half, then produced more that it never committed.
    zombie_store = KafkaQueueStore(kafka_broker.bootstrap, tmp_path / "zombie")
    zombie = zombie_store.writer(topic, 0)
    try:
        half = len(want) // 2
        for value, meta in want[:half]:
            zombie.append(value, RecordMeta(*meta))
        zombie.flush()
        for value, meta in want[half : half + 5]:
            zombie.append(value, RecordMeta(*meta))
        zombie.poll(0.5)  # produced, never committed

        retry = write_partition(kafka_broker.bootstrap, {}, topic, 0, ZERO, rows, has_time=True)
        # The committed half always counts as found; a broker that shows aborted records (Tansu) shows the
        # uncommitted five as well, and they are a prefix too.
        assert retry.found in (half, half + 5) and retry.found + retry.written == len(want)
        assert _log(store, topic) == want
        # The killed attempt, were it still alive, is fenced: it can add nothing.
        with pytest.raises(QueueStoreError):
            zombie.append(want[-1][0], RecordMeta(*want[-1][1]))
            zombie.flush(30)
        assert _log(store, topic) == want
    finally:
        zombie.close(5)
        zombie_store.close()


def test_records_the_batch_did_not_produce_are_a_conflict(
    kafka_broker: Broker, store: KafkaQueueStore
) -> None:
    topic = _topic(store)
    first = write_partition(kafka_broker.bootstrap, {}, topic, 0, ZERO, _batch(0), has_time=True)
    before = _log(store, topic)
    # A stale task: it was handed the cursor from before that batch, for other rows.
    with pytest.raises(OutputConflictError, match="did not produce"):
        write_partition(kafka_broker.bootstrap, {}, topic, 0, ZERO, _batch(30), has_time=True)
    assert _log(store, topic) == before
    assert first.cursor.next_offset > len(before) - 1


def _write(
    bootstrap: str, topic: str, cursor: PartitionCursor, first_offset: int, **kw: Any
) -> PartitionWrite:
    return write_partition(bootstrap, {}, topic, 0, cursor, _batch(first_offset), has_time=True, **kw)


def _reference_log(bootstrap: str, store: KafkaQueueStore, batches: int) -> list[tuple[bytes, Any]]:
    """The log that a fresh writer per batch makes of `batches` consecutive batches."""
    topic = _topic(store)
    cursor = ZERO
    for b in range(batches):
        cursor = _write(bootstrap, topic, cursor, 30 * b).cursor
    return _log(store, topic)


def test_a_kept_writer_appends_the_next_batches_itself(kafka_broker: Broker, store: KafkaQueueStore) -> None:
    want = _reference_log(kafka_broker.bootstrap, store, 3)
    topic = _topic(store)
    first = _write(kafka_broker.bootstrap, topic, ZERO, 0, session="run-1")
    second = _write(kafka_broker.bootstrap, topic, first.cursor, 30, session="run-1")
    third = _write(kafka_broker.bootstrap, topic, second.cursor, 60, session="run-1")
    assert (first.reused, second.reused, third.reused) == (False, True, True)
    assert second.found == third.found == 0 and second.written > 0 and third.written > 0
    assert second.cursor.next_offset > first.cursor.next_offset
    assert _log(store, topic) == want
    # A new run of the query (its driver fenced every earlier writer) never uses the old run's writer.
    fourth = _write(kafka_broker.bootstrap, topic, third.cursor, 90, session="run-2")
    assert not fourth.reused and fourth.found == 0


def test_a_retried_attempt_or_another_cursor_takes_the_partition_over(
    kafka_broker: Broker, store: KafkaQueueStore
) -> None:
    want = _reference_log(kafka_broker.bootstrap, store, 3)
    topic = _topic(store)
    first = _write(kafka_broker.bootstrap, topic, ZERO, 0, session="run")
    # A retried task (attempt 1) checks the log even when this worker's writer ends it.
    retried = _write(kafka_broker.bootstrap, topic, first.cursor, 30, session="run", attempt=1)
    assert not retried.reused and retried.found == 0
    # Handed an older cursor (a re-run stage of the batch just written): the log is checked and the batch,
    # already there, is not written twice.
    rerun = _write(kafka_broker.bootstrap, topic, first.cursor, 30, session="run")
    assert not rerun.reused and rerun.found == retried.written and rerun.written == 0
    assert rerun.cursor == retried.cursor
    third = _write(kafka_broker.bootstrap, topic, rerun.cursor, 60, session="run")
    assert third.reused
    assert _log(store, topic) == want


def test_a_fenced_kept_writer_checks_the_log_with_a_new_writer(
    kafka_broker: Broker, store: KafkaQueueStore, tmp_path: Path
) -> None:
    want = _reference_log(kafka_broker.bootstrap, store, 3)
    topic = _topic(store)
    first = _write(kafka_broker.bootstrap, topic, ZERO, 0, session="run")
    # Another worker's task writes the next batch: its init_transactions() fences this worker's writer,
    # which still believes it ends the log at first.cursor.
    other = _write(kafka_broker.bootstrap, topic, first.cursor, 30)
    assert not other.reused and other.written > 0
    # A re-run of that batch lands in this worker with the cursor its kept writer ends at: the writer is
    # fenced, so the task takes the partition over and finds the batch already written.
    again = _write(kafka_broker.bootstrap, topic, first.cursor, 30, session="run")
    assert not again.reused and again.written == 0 and again.found == other.written
    assert again.cursor == other.cursor
    # Fenced without anything written since (a writer of another worker that died before appending).
    with KafkaQueueStore(kafka_broker.bootstrap, tmp_path / "idle") as idle:
        idle.writer(topic, 0).close()
    third = _write(kafka_broker.bootstrap, topic, again.cursor, 60, session="run")
    assert not third.reused and third.found == 0 and third.written > 0
    assert _log(store, topic) == want
