"""The attached query's trimming on the executors (`operators.spark.trim.TaskTrim`) and the closed-window
directory it carries in Kafka (`operators.spark.closed_windows`), on a real broker without Spark: a write
task's steps (plan before the batch, carry in the batch's transaction, trim after its commit) over a log of
G-opens and results, then a start with a lost `state_dir` that must know every key's last closed window.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cec.exceptions import ConfigError
from cec.model import Kind, OutputRecord
from cec.records import RecordCodec
from operators.spark.closed_windows import read_directory
from operators.spark.generations import Generation
from operators.spark.trim import (
    FootprintReport,
    PartitionTrim,
    TaskTrim,
    check_trimmed_indexes,
    directory_starts,
)
from queuestore.kafka import KafkaQueueStore
from queuestore.output import OutputQueue
from tests.brokers import Broker

KEYS = [f"k{i}" for i in range(7)]


@pytest.fixture
def store(kafka_broker: Broker, tmp_path: Path) -> Iterator[KafkaQueueStore]:
    s = KafkaQueueStore(kafka_broker.bootstrap, tmp_path / "executor")
    try:
        yield s
    finally:
        s.close()


def _records(first_time: int, count: int) -> list[OutputRecord]:
    """`count` records from logical time `first_time` (one per time): each key's windows open (G-open)
    and close (R) in turn, with per-key sequences, as an aggregate's log has them."""
    out = []
    for i in range(count):
        t = first_time + i
        key = KEYS[t % len(KEYS)]
        seq = t // (2 * len(KEYS))
        kind = Kind.GOPEN if (t // len(KEYS)) % 2 == 0 else Kind.R
        out.append(OutputRecord(kind, t, (t + 1,), 0, key, seq, b"s" if kind is Kind.GOPEN else None, b"p"))
    return out


def _last_closed(records: list[OutputRecord]) -> dict[str, int]:
    seqs: dict[str, int] = {}
    for r in records:
        if r.kind is Kind.R and r.key is not None:
            seqs[r.key] = r.seq
    return seqs


def _append(store: KafkaQueueStore, topic: str, records: list[OutputRecord], trim: TaskTrim | None) -> int:
    """One write task's batch: append, carry the directory (if a bound was taken) in the same transaction,
    commit, trim; returns the offsets trimmed."""
    codec = RecordCodec()
    writer = store.writer(topic, 0)
    try:
        for r in records:
            writer.append(codec.encode(r), r.meta())
        if trim is not None:
            trim.carry(writer, topic, 0)
        writer.flush()
        if trim is None:
            return 0
        with store.reader(topic, 0) as reader:
            return trim.apply(writer, reader)
    finally:
        writer.close()


def _ends(store: KafkaQueueStore, topic: str) -> tuple[int, int]:
    with store.reader(topic, 0) as reader:
        return reader.start_offset(), reader.end_offset()


def test_a_task_trims_to_the_oldest_footprint_after_carrying_the_directory_below_it(
    store: KafkaQueueStore, kafka_broker: Broker, tmp_path: Path
) -> None:
    """Plan -> carry -> commit -> trim: the log starts at the first record at or after the oldest open
    footprint's time; the carried directory covers the trimmed part and holds every key's last R there;
    a start with a lost `state_dir` adopts it, and its index then knows every key's last closed window of
    the whole log. A second trim carries only what it adds."""
    topic = f"task-trim-{uuid.uuid4().hex[:8]}"
    store.create_topic(topic, 1)
    written = _records(0, 300)
    _append(store, topic, written, None)
    driver = KafkaQueueStore(kafka_broker.bootstrap, tmp_path / "driver")
    try:
        outputs = [OutputQueue(driver, topic, 0)]
        (covered,) = directory_starts(driver, outputs)
        outputs[0].close()
    finally:
        driver.close()
    assert covered == 0  # nothing trimmed yet: nothing to carry

    state = PartitionTrim(0, covered)
    for footprint_time, batch_from in ((120, 300), (250, 320)):
        batch = _records(batch_from, 20)
        trim = TaskTrim(10, state, FootprintReport(False, footprint_time))
        with store.reader(topic, 0) as reader:
            durable_end = reader.end_offset()
            trim.plan(reader, lambda: store.acknowledged(topic, 0), durable_end, len(batch))
        trimmed = _append(store, topic, batch, trim)
        written += batch
        start, _ = _ends(store, topic)
        with store.reader(topic, 0) as reader:
            first = next(iter(reader.scan_forward(start)))
        assert first.meta.time == footprint_time and trimmed > 0  # the oldest open footprint is kept
        carried = read_directory(store, topic, 0)
        assert carried is not None and carried.covered == start
        below = [r for r in written if r.time < footprint_time]
        assert {k: s for k, s in carried.seqs.items()} == _last_closed(below)
        state = trim.state
        assert state.covered == start

    fresh = KafkaQueueStore(kafka_broker.bootstrap, tmp_path / "lost-state-dir")
    try:
        check_trimmed_indexes(fresh, Generation(0, topic, 1))
        out = OutputQueue(fresh, topic, 0)
        try:
            assert dict(out.index.closed_windows()) == _last_closed(written)
        finally:
            out.close()
    finally:
        fresh.close()


def test_a_registered_consumer_caps_the_trim_and_nothing_is_trimmed_without_its_directory(
    store: KafkaQueueStore, kafka_broker: Broker, tmp_path: Path
) -> None:
    """The bound is capped by what a registered consumer acknowledged; a bound whose directory was carried
    by a writer that did not commit (replaced before its commit) is not applied; a trimmed log without a
    carried directory and without its index is refused at the next start."""
    topic = f"task-cap-{uuid.uuid4().hex[:8]}"
    store.create_topic(topic, 1)
    _append(store, topic, _records(0, 200), None)
    store.acknowledge(topic, 0, "reader", 40)
    driver = KafkaQueueStore(kafka_broker.bootstrap, tmp_path / "driver")
    try:
        out = OutputQueue(driver, topic, 0)
        directory_starts(driver, [out])
        out.close()
    finally:
        driver.close()

    trim = TaskTrim(10, PartitionTrim(0, 0), FootprintReport(False, 150))
    with store.reader(topic, 0) as reader:
        trim.plan(reader, lambda: store.acknowledged(topic, 0), reader.end_offset(), 5)
    assert trim.schedule.pending == 40  # the consumer's acknowledgement, below the footprint
    elsewhere = KafkaQueueStore(kafka_broker.bootstrap, tmp_path / "killed-attempt")
    try:
        replaced = elsewhere.writer(topic, 0)
        trim.carry(replaced, topic, 0)  # this attempt's writer is fenced by the next before it commits
        writer = store.writer(topic, 0)
        try:
            codec = RecordCodec()
            for r in _records(200, 5):
                writer.append(codec.encode(r), r.meta())
            writer.flush()
            with store.reader(topic, 0) as reader:
                assert trim.apply(writer, reader) == 0  # the directory below 40 was never committed
        finally:
            writer.close()
    finally:
        with contextlib.suppress(Exception):  # fenced
            elsewhere.close()
    assert _ends(store, topic)[0] == 0

    trim = TaskTrim(10, PartitionTrim(0, 0), FootprintReport(False, 150))
    with store.reader(topic, 0) as reader:
        trim.plan(reader, lambda: store.acknowledged(topic, 0), reader.end_offset(), 5)
    assert _append(store, topic, _records(205, 5), trim) == 40
    assert _ends(store, topic)[0] == 40

    bare = f"task-bare-{uuid.uuid4().hex[:8]}"
    store.create_topic(bare, 1)
    _append(store, bare, _records(0, 50), None)
    w = store.writer(bare, 0)
    try:
        assert w.trim(20)  # trimmed by hand: no directory carried
    finally:
        w.close()
    fresh = KafkaQueueStore(kafka_broker.bootstrap, tmp_path / "lost")
    try:
        with pytest.raises(ConfigError, match="closed-window directory"):
            check_trimmed_indexes(fresh, Generation(0, bare, 1))
    finally:
        fresh.close()
