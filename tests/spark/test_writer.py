"""The executor-side writer of an attached aggregation (operators.spark.writer.write_partition), on a real
broker, without Spark (what one write task does to its output partition):

1. a duplicate attempt of a task whose first attempt committed adds nothing: exactly one copy in the log,
   and both attempts report the same cursor;
2. a retry after an attempt that was killed mid-batch (half committed, the rest produced but never
   committed) fences that attempt and appends only what is missing: the log equals a single clean write;
3. records the batch did not produce (another writer's, or a stale cursor) are a conflict: nothing is
   written.
"""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path
from typing import Any

import pytest

from cec.records import Kind, RecordCodec
from operators.exceptions import OutputConflictError
from operators.spark.writer import PartitionCursor, write_partition
from queuestore.base import RecordMeta
from queuestore.exceptions import QueueStoreError
from queuestore.kafka import KafkaQueueStore
from tests.brokers import Broker

ZERO = PartitionCursor((0, 0), 0, 0, 0)


def _batch(first_offset: int, tuples: int = 60) -> list[tuple[Any, ...]]:
    """Rows of the processor (EMIT_COLUMNS) for output partition 0: count windows of 3 over 4 keys, tuples
    alternating between input partitions 0 and 1, shuffled as Spark may hand them over."""
    rows: list[tuple[Any, ...]] = []
    counts: dict[str, int] = {}
    for i in range(tuples):
        j, o = i % 2, first_offset + i // 2
        key = f"k{i % 4}"
        n = counts.get(key, 0)
        counts[key] = n + 1
        seq = n // 3
        if n % 3 == 0:
            rows.append((0, j, o, 0, Kind.GOPEN.value, key, seq, f"{key}:{seq}:1".encode(), None, o, 1))
        elif n % 3 == 2:
            rows.append((0, j, o, 0, Kind.R.value, key, seq, None, f"{key}:{seq}".encode(), o, -1))
    rows.reverse()
    return rows


def _log(store: KafkaQueueStore, topic: str) -> list[tuple[bytes, tuple[Any, ...]]]:
    with store.reader(topic, 0) as reader:
        return [(r.value, tuple(r.meta)) for r in reader.scan_forward(0)]


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
    assert first.footprints == {f"k{k}": None for k in range(4)}  # every window of the batch closed in it


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
