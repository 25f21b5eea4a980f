"""Trimming the head of an output log (DESIGN-NOTES section 3): the store side (SQLite), and a long run
whose retained log stays bounded while a registered consumer reads every result exactly, a SIGKILL
after trimming included."""

from __future__ import annotations

import signal
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cec.config import Checkpointing
from cec.records import AvroCodec, Kind, OutputRecord, RecordCodec
from operators.aggregate import RESULT_SCHEMA
from operators.job import JobSpec, run_job
from queuestore.exceptions import LogTrimmedError, TopicMismatchError
from queuestore.index import StreamIndex
from queuestore.sqlite import SqliteQueueStore
from tests.helpers import results, start_worker, wait_for


def _append(store: SqliteQueueStore, n: int) -> None:
    codec = RecordCodec()
    with store.writer("t", 0) as writer:
        for i in range(n):
            record = OutputRecord(Kind.DEAD, i, (i,), 0, payload=b"x")
            writer.append(codec.encode(record), record.meta())


def test_sqlite_trim_moves_the_log_start_and_a_read_below_it_is_a_clear_error(tmp_path: Path) -> None:
    store = SqliteQueueStore(tmp_path)
    store.create_topic("t", 1)
    _append(store, 10)
    with store.writer("t", 0) as writer:
        assert writer.trim(6) == 6
        assert writer.trim(4) == 0  # never backwards
    with store.reader("t", 0) as reader:
        assert (reader.start_offset(), reader.end_offset()) == (6, 10)
        assert [r.offset for r in reader.scan_forward(6)] == [6, 7, 8, 9]  # dense from the log start
        assert [r.offset for r in reader.scan_backward()] == [9, 8, 7, 6]  # stops at the start, no "gap"
        with pytest.raises(LogTrimmedError, match=r"t\[0\] offset 2 was trimmed: the log starts at 6"):
            list(reader.scan_forward(2))
        with pytest.raises(LogTrimmedError):
            reader.read_forward(0, 5)
    with store.writer("t", 0) as writer:
        assert writer.trim(10) == 4  # everything: the log start remembers where offsets go on
        assert writer.next_offset == 10
    with store.reader("t", 0) as reader:
        assert (reader.start_offset(), reader.end_offset()) == (10, 10)


def test_trimming_past_the_durable_end_is_refused(tmp_path: Path) -> None:
    store = SqliteQueueStore(tmp_path)
    store.create_topic("t", 1)
    _append(store, 3)
    with store.writer("t", 0) as writer, pytest.raises(Exception, match="past the durable end 3"):
        writer.trim(5)


def test_the_index_is_pruned_with_the_log_and_rebuilt_from_the_log_start(tmp_path: Path) -> None:
    store = SqliteQueueStore(tmp_path)
    store.create_topic("t", 1)
    _append(store, 300)
    with StreamIndex(tmp_path / "idx", "t/0", stride=10) as index, store.reader("t", 0) as reader:
        index.reconcile(reader)
        assert index.offset_for_time(155) == 150
        with store.writer("t", 0) as writer:
            writer.trim(200)
        assert index.prune(200) == 20
        assert index.offset_for_time(155) == 200  # never points below the log start
    # An index lost while the log was trimmed is rebuilt from the log start, not from 0 (a "gap").
    with StreamIndex(tmp_path / "idx2", "t/0", stride=10) as index, store.reader("t", 0) as reader:
        assert index.reconcile(reader) == 100
        assert index.next_offset == 300 and index.offset_for_time(0) == 200


def test_consumers_register_and_acknowledge(tmp_path: Path) -> None:
    store = SqliteQueueStore(tmp_path)
    store.create_topic("t", 2)
    store.acknowledge("t", 1, "results", 0)
    store.acknowledge("t", 1, "results", 42)
    store.acknowledge("t", 1, "down-1", 7)
    assert store.acknowledged("t", 1) == {"results": 42, "down-1": 7}
    assert store.acknowledged("t", 0) == {}
    store.forget_consumer("t", 1, "down-1")
    assert store.acknowledged("t", 1) == {"results": 42}


# -- a long run --------------------------------------------------------------------------------------

TUPLES = 300_000
TRIM_EVERY = 2_000
IN_FLIGHT = 4_096  # the store's bound on records appended but not yet durable
BATCH = 256
# Records one batch can append: an R and a G-open per input at most, and a G-check per open window (100
# keys, count windows: at most 100 open). The runtime looks at trimming once per batch.
BATCH_RECORDS = 2 * BATCH + 100
EXTENT = 2_000  # records between the oldest open window's footprint and the end (U = 2,000 inputs)
# docs/long-runs.md, "How far behind trimming can be": every due point (TRIM_EVERY records appended, all
# of them made durable there) trims to min(the extent start, the consumer's acknowledgement); until the
# next one the log grows by a trim interval and a batch, and the consumer reads on from its acknowledgement
# (up to what is durable, IN_FLIGHT records a step). Below the consumer's acknowledgement (a bound kept
# from the store's former in-flight rule, which it still covers):
RETAINED_BOUND = max(TRIM_EVERY, IN_FLIGHT) + 3 * IN_FLIGHT + 2 * BATCH_RECORDS + EXTENT


def _job(root: Path, *, trim: bool) -> JobSpec:
    return JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "avg",
            "window_count": 5,
        },
        source={"type": "generator", "count": TUPLES, "keys": 100, "seed": 5, "partitions": 1},
        store={"type": "sqlite", "root": str(root), "max_outstanding": IN_FLIGHT},
        output_topic="agg",
        checkpointing=Checkpointing(u_target=2_000, ci_ms=10.0, cp_ms=10.0),
        batch_size=BATCH,
        trim_every=TRIM_EVERY if trim else None,
    )


class ResultsConsumer:
    """A registered consumer: reads the results as they come, keeps them, acknowledges what it read."""

    def __init__(self, store: SqliteQueueStore) -> None:
        self.store = store
        self.next = 0
        self.rows: list[dict[str, Any]] = []
        self.ended = False
        self.retained: list[int] = []  # records kept below the acknowledged position, at every look
        self._codec = RecordCodec()
        self._payload = AvroCodec(RESULT_SCHEMA)
        store.acknowledge("agg", 0, "results", 0)

    def step(self) -> int:
        """Read what is durable (up to 4,096 records); the number read."""
        with self.store.reader("agg", 0) as reader:
            # What the log keeps below this consumer's acknowledged position: the part trimming decides
            # (the rest is this consumer's own lag, which holds trimming back by design).
            self.retained.append(self.next - reader.start_offset())
            records = reader.read_forward(self.next, 4096)
        for stored in records:
            assert stored.offset == self.next  # dense: nothing lost between the ack and the read
            self._codec.verify(stored.value, stored.meta)
            if stored.meta.kind == Kind.R.value:
                record = self._codec.decode(stored.value, stored.meta, verified=True)
                assert record.payload is not None
                self.rows.append(self._payload.decode(record.payload))
            elif stored.meta.kind == Kind.EOS.value:
                self.ended = True
            self.next = stored.offset + 1
        if records:
            self.store.acknowledge("agg", 0, "results", self.next)
        return len(records)


def _logged(store: SqliteQueueStore) -> tuple[int, int]:
    with store.reader("agg", 0) as reader:
        return reader.start_offset(), reader.end_offset()


def test_a_long_run_keeps_a_bounded_log_and_a_sigkill_after_trimming_recovers_exactly(
    tmp_path: Path,
) -> None:
    run_job(_job(tmp_path / "reference", trim=False))
    reference = SqliteQueueStore(tmp_path / "reference")
    want = results(reference, "agg")
    produced = _logged(reference)[1]

    store = SqliteQueueStore(tmp_path / "trimmed")
    store.create_topic("agg", 1)
    consumer = ResultsConsumer(store)
    spec = _job(tmp_path / "trimmed", trim=True)
    proc = start_worker(spec, tmp_path / "spec.json")

    def trimmed_or_over() -> bool:
        consumer.step()
        return consumer.ended or _logged(store)[0] > 0 or proc.poll() is not None

    try:
        # Kill once the log has been trimmed (the first trim comes within the first few percent of the
        # run; waiting for more would race with the end of the run on a loaded machine, because trimming
        # follows the writer's and the consumer's pace).
        wait_for(trimmed_or_over, 300)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    start_at_kill = _logged(store)[0]
    assert start_at_kill > 0
    # Bounded whatever the machine's load: it does not grow with the run (120,000 records produced).
    assert max(consumer.retained) <= RETAINED_BOUND, (max(consumer.retained), produced)

    # The consumer reads all that survived the kill, then stands still: its acknowledgement is all that
    # limits the recovered run's trimming, so what that run must trim to is known.
    while consumer.step():
        pass
    acked_at_kill = consumer.next
    assert not consumer.ended and acked_at_kill > start_at_kill
    proc = start_worker(spec, tmp_path / "spec.json")  # recovers from the trimmed log
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-2000:]
    start, end = _logged(store)
    # The recovered run trimmed on past the crash-time start, up to the consumer's acknowledgement: its
    # loaded windows got newer footprints (or closed), so recovery no longer needs the older records.
    assert start_at_kill < start <= acked_at_kill and end >= produced, (start_at_kill, start, acked_at_kill)

    while consumer.step():
        pass
    assert consumer.ended and consumer.rows == want  # every result, once, in order
    with pytest.raises(LogTrimmedError):
        results(store, "agg")  # an unregistered reader from offset 0 meets a clear error, not a gap


def test_an_unregistered_consumer_gets_everything_trimmed_up_to_the_extent(tmp_path: Path) -> None:
    """Without a registered consumer, the log keeps only what recovery needs (and its newest record)."""
    spec = _job(tmp_path, trim=True)
    spec.source = replace(spec.source, count=80_000)
    stats = run_job(spec)
    assert stats.trimmed_offsets > 0
    start, end = _logged(SqliteQueueStore(tmp_path))
    # Every due point trims to what recovery needs then, whatever the machine's pace, and the end of the run
    # to what it needs at the end: each right after a trim, none more than the extent (up to the stream
    # index's granularity: an entry every 64 offsets, a run of up to 256 G-checks sharing one time).
    assert len(stats.trims) >= stats.outputs // (2 * TRIM_EVERY)
    assert all(kept == needed for _, kept, needed in stats.trims), stats.trims
    assert 0 < end - start <= stats.max_extent + 64 + 256, (start, end, stats.max_extent)


# -- Kafka -------------------------------------------------------------------------------------------


def test_kafka_topic_with_a_finite_retention_is_refused_at_start(kafka_broker: Any, tmp_path: Path) -> None:
    from queuestore.kafka import KafkaQueueStore

    topic = f"short-{uuid.uuid4().hex[:10]}"
    store = KafkaQueueStore(kafka_broker.bootstrap, tmp_path, topic_configs={"retention.ms": "60000"})
    try:
        store.create_topic(topic, 1)
        with pytest.raises(TopicMismatchError, match=r"retention\.ms=60000: the broker would delete"):
            store.check_retention(topic)
        spec = _job(tmp_path / "job", trim=True)
        spec.store = {
            "type": "kafka",
            "bootstrap_servers": kafka_broker.bootstrap,
            "state_dir": str(tmp_path),
        }
        spec.output_topic = topic
        with pytest.raises(TopicMismatchError):
            run_job(spec)  # refused before anything is read or written
        with store.reader(topic, 0) as reader:
            assert reader.end_offset() == 0
    finally:
        store.close()
    ok = f"ok-{uuid.uuid4().hex[:10]}"
    plain = KafkaQueueStore(kafka_broker.bootstrap, tmp_path)
    try:
        plain.create_topic(ok, 1)
        plain.check_retention(ok)  # cec's own topics: retention.ms=-1
    finally:
        plain.close()


@pytest.mark.kafka_transactions
def test_kafka_reads_of_a_trimmed_log_hold_what_is_kept_and_refuse_what_is_not(
    kafka_broker: Any, tmp_path: Path
) -> None:
    """The Kafka reader on a log whose head `delete_records` removed, as the SQLite one above: backward
    reads whose window reaches below the log start return the records kept (recovery's EC build reads
    so), forward reads below it are `LogTrimmedError`. Failed before: the broker answers a fetch below the
    log start with OFFSET_OUT_OF_RANGE, which the reader took for "past the end", so a backward window
    reaching below the log start came back empty (recovery and `cec inspect` saw an empty log) and a
    forward read there silently returned nothing."""
    from queuestore.kafka import KafkaQueueStore

    topic = f"trimmed-{uuid.uuid4().hex[:10]}"
    store = KafkaQueueStore(kafka_broker.bootstrap, tmp_path)
    try:
        store.create_topic(topic, 1)
        codec = RecordCodec()
        with store.writer(topic, 0) as writer:
            for i in range(300):
                record = OutputRecord(Kind.DEAD, i, (i,), 0, payload=b"x")
                writer.append(codec.encode(record), record.meta())
                if i % 50 == 49:
                    writer.flush()  # a transaction marker after every 50 records: offsets are not dense
            writer.flush()
            kept = [r.offset for r in _kafka_records(store, topic)]
            cut = kept[200]
            assert writer.trim(cut) == cut
        with store.reader(topic, 0) as reader:
            assert reader.start_offset() == cut
            want = kept[200:]
            end = reader.end_offset()
            assert [r[0] for r in reader.read_backward_rows(end, 1_000)] == want[::-1]
            assert [r.offset for r in reader.read_backward(end, 1_000)] == want[::-1]
            assert [r.offset for r in reader.read_backward(end, 30)] == want[::-1][:30]
            assert [r.offset for r in reader.scan_backward(chunk=64)] == want[::-1]
            assert [r.offset for r in reader.scan_forward(cut)] == want
            assert [r[0] for r in reader.read_range_rows(cut, end)] == want
            with pytest.raises(LogTrimmedError, match=rf"offset 3 was trimmed: the log starts at {cut}"):
                reader.read_forward(3, 10)
            with pytest.raises(LogTrimmedError):
                list(reader.scan_forward(0))
            with pytest.raises(LogTrimmedError):
                reader.read_range_rows(0, end)
    finally:
        store.close()


def _kafka_records(store: Any, topic: str) -> list[Any]:
    with store.reader(topic, 0) as reader:
        return list(reader.scan_forward(0))


def test_kafka_trim_and_acknowledgements(kafka_broker: Any, tmp_path: Path) -> None:
    """delete_records where the broker has it; where it does not (Tansu 0.6 drops the connection on
    DeleteRecords), nothing is deleted, the writer goes on, and reads stay exact."""
    from queuestore.kafka import KafkaQueueStore

    topic = f"trim-{uuid.uuid4().hex[:10]}"
    store = KafkaQueueStore(kafka_broker.bootstrap, tmp_path)
    try:
        store.create_topic(topic, 1)
        codec = RecordCodec()
        with store.writer(topic, 0) as writer:
            for i in range(20):
                record = OutputRecord(Kind.DEAD, i, (i,), 0, payload=b"x")
                writer.append(codec.encode(record), record.meta())
            writer.flush()
            trimmed = writer.trim(10)
            record = OutputRecord(Kind.EOS, 20, (20,), 0)
            writer.append(codec.encode(record), record.meta())  # the writer still works
        with store.reader(topic, 0) as reader:
            start = reader.start_offset()
            offsets = [r.offset for r in reader.scan_forward(start)]
        if kafka_broker.kind == "tansu":
            assert (trimmed, start) == (0, 0)
        else:
            assert (trimmed, start) == (10, 10)
        assert offsets[0] == start and len(offsets) == 21 - start
        store.acknowledge(topic, 0, "results", 5)
        store.acknowledge(topic, 0, "results", 12)
        store.acknowledge(topic, 0, "down", 3)
        assert store.acknowledged(topic, 0) == {"results": 12, "down": 3}
        store.forget_consumer(topic, 0, "down")
        assert store.acknowledged(topic, 0) == {"results": 12}
    finally:
        store.close()
