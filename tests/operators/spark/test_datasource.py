"""The "cec-kafka" Python Data Source against a real broker: batch reads of an operator's output queue
(results only by default, control tuples on request), streaming reads with admission control that see
every record exactly once (also across a restart from the query checkpoint), and the sink.
"""

from __future__ import annotations

import math
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cec.records import Kind
from operators.aggregate import RESULT_SCHEMA
from operators.sinks import count_kinds, iter_payloads
from operators.sources import PURCHASE_SCHEMA, PurchaseGenerator
from operators.spark.datasource import FORMAT, KafkaSlice, _batches, _Options
from operators.spark.kafka_sink import SinkCommit, write_rows
from operators.spark.reader_pool import ReaderPool
from operators.spark.slices import admit
from queuestore.exceptions import QueueStoreError
from queuestore.kafka import KafkaQueueStore
from tests.brokers import Broker
from tests.helpers import wait_for
from tests.operators.spark.pipelines import AGGREGATED, FILTERED, filter_aggregate, run_reference

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

RESULT_FIELDS = [f["name"] for f in RESULT_SCHEMA["fields"]]
PURCHASE_FIELDS = [f["name"] for f in PURCHASE_SCHEMA["fields"]]


class Written:
    """A filter -> aggregate run written to Kafka by the operators themselves (KafkaQueueStore)."""

    def __init__(self, broker: Broker, state_dir: Path) -> None:
        self.bootstrap = broker.bootstrap
        self.state_dir = state_dir
        suffix = uuid.uuid4().hex[:8]  # a long-lived broker keeps topics of earlier runs
        self.topic = f"{AGGREGATED}-{suffix}"
        store_spec = {"type": "kafka", "bootstrap_servers": broker.bootstrap, "state_dir": str(state_dir)}
        pipeline = filter_aggregate(store_spec, count=6000, keys=40)
        pipeline[0].output_topic = f"{FILTERED}-{suffix}"
        pipeline[1].source = replace(pipeline[1].source, topic=pipeline[0].output_topic)
        pipeline[1].output_topic = self.topic
        # Long windows and a small Q: the extent outgrows Q, so the log holds G-checks as well as G-opens.
        pipeline[1].operator = replace(pipeline[1].operator, window_count=40)
        pipeline[1].checkpointing = replace(pipeline[1].checkpointing, q_target=50)
        run_reference(pipeline)

    def store(self) -> KafkaQueueStore:
        return KafkaQueueStore(self.bootstrap, self.state_dir)


@pytest.fixture(scope="module")
def written(spark_kafka_broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Written:
    return Written(spark_kafka_broker, tmp_path_factory.mktemp("kafka-state"))


def _reader(spark: SparkSession, written: Written, **options: Any) -> Any:
    reader = (
        spark.read.format(FORMAT)
        .option("topic", written.topic)
        .option("bootstrap.servers", written.bootstrap)
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader


def _expected(store: KafkaQueueStore, topic: str) -> dict[int, list[tuple[Any, ...]]]:
    """Each partition's result payloads in log order, straight from the queue store."""
    from cec.records import AvroCodec, RecordCodec

    codec, payloads = RecordCodec(), AvroCodec(RESULT_SCHEMA)
    out: dict[int, list[tuple[Any, ...]]] = {}
    for p in range(store.partitions(topic)):
        with store.reader(topic, p) as reader:
            out[p] = [
                tuple(payloads.decode(codec.decode(r.value, r.meta).payload or b"")[f] for f in RESULT_FIELDS)
                for r in reader.scan_forward(0)
                if r.meta.kind == Kind.R.value
            ]
    return out


def _slice_rows(opts: _Options, piece: KafkaSlice) -> list[tuple[Any, ...]]:
    return [tuple(row[f] for f in RESULT_FIELDS) for b in _batches(opts, piece) for row in b.to_pylist()]


def test_a_worker_reads_its_next_slice_through_the_reader_it_kept(
    written: Written, tmp_path: Path, reader_pool: ReaderPool
) -> None:
    """Consecutive slices of a partition read in one process (the tasks of one Python worker) share one
    reader and return what the log holds; a read that fails, or that Spark abandons, closes its reader
    instead of giving it back."""
    options = {"topic": written.topic, "bootstrap.servers": written.bootstrap, "schema": "aggregate"}
    opts = _Options.parse({**options, "stateDir": str(tmp_path / "source")})  # a key no other test holds
    store = written.store()
    try:
        expected = _expected(store, written.topic)[0]
        with store.reader(written.topic, 0) as reader:
            end = reader.end_offset()
    finally:
        store.close()
    opened, reused = reader_pool.opened, reader_pool.reused
    halves = [KafkaSlice(0, 0, end // 2), KafkaSlice(0, end // 2, end)]
    assert [r for piece in halves for r in _slice_rows(opts, piece)] == expected
    assert (reader_pool.opened - opened, reader_pool.reused - reused) == (1, 1)

    with pytest.raises(QueueStoreError, match="ends before offset"):
        _slice_rows(opts, KafkaSlice(0, 0, end + 1_000))
    abandoned = _batches(opts, KafkaSlice(0, 0, end))
    next(abandoned)
    abandoned.close()
    # The failed read took the kept reader and closed it; so did the abandoned one with its own.
    assert (reader_pool.opened - opened, reader_pool.reused - reused) == (2, 2)
    assert _slice_rows(opts, halves[1]) == expected[len(_slice_rows(opts, halves[0])) :]
    assert (reader_pool.opened - opened, reader_pool.reused - reused) == (3, 3)


def test_admission_splits_the_limit_over_pending_partitions() -> None:
    assert admit([0, 0], [10, 30], None) == [10, 30]
    assert admit([0, 0], [10, 30], 100) == [10, 30]
    end = admit([0, 0], [10, 30], 8)
    assert sum(end) == 8 and end[0] >= 1 and end[1] > end[0]
    assert admit([10, 5], [10, 30], 4) == [10, 9]  # a partition with nothing pending stays put


def test_batch_read_yields_results_only_by_default(spark: SparkSession, written: Written) -> None:
    store = written.store()
    try:
        expected = _expected(store, written.topic)
        kinds = count_kinds(store, written.topic)
    finally:
        store.close()
    rows = _reader(spark, written, schema="aggregate").load().collect()
    assert {r.cec_kind for r in rows} == {"R"}
    assert len(rows) == kinds["R"] == sum(len(v) for v in expected.values())
    for p, want in expected.items():
        got = sorted((r for r in rows if r.cec_partition == p), key=lambda r: r.cec_offset)
        assert [tuple(r[f] for f in RESULT_FIELDS) for r in got] == want
        assert all(r.cec_key == r.key and len(r.cec_pos) == 1 for r in got)  # window id and pos kept


def test_batch_read_with_control_tuples(spark: SparkSession, written: Written) -> None:
    store = written.store()
    try:
        kinds = count_kinds(store, written.topic)
        expected = _expected(store, written.topic)
    finally:
        store.close()
    assert kinds[Kind.GOPEN.value] and kinds[Kind.GCHECK.value] and kinds[Kind.EOS.value] == 2
    df = _reader(spark, written, schema="aggregate", includeControl="true").load()
    rows = df.collect()
    assert Counter(r.cec_kind for r in rows) == kinds
    for r in rows:
        if r.cec_kind in (Kind.GOPEN.value, Kind.GCHECK.value):
            assert r.cec_state and r.key is None and r.cec_key is not None  # state raw, no payload columns
        elif r.cec_kind == Kind.R.value:
            assert r.key == r.cec_key and r.cec_state is None
    # Results among control tuples (one Arrow batch holds both) carry the payload columns they have alone.
    for p, want in expected.items():
        got = sorted(
            (r for r in rows if r.cec_partition == p and r.cec_kind == "R"), key=lambda r: r.cec_offset
        )
        assert [tuple(r[f] for f in RESULT_FIELDS) for r in got] == want
    # Every record of a partition is read once (offsets have gaps: the writers' commit markers).
    store = written.store()
    try:
        for p in (0, 1):
            offsets = sorted(r.cec_offset for r in rows if r.cec_partition == p)
            with store.reader(written.topic, p) as reader:
                assert offsets == [x.offset for x in reader.scan_forward()]
    finally:
        store.close()


def _collect_stream(df: DataFrame, checkpoint: Path, columns: list[str]) -> list[list[tuple[Any, ...]]]:
    """Run a streaming read to the current end (Trigger.AvailableNow); each micro-batch's rows."""
    batches: list[list[tuple[Any, ...]]] = []

    def each(batch: DataFrame, batch_id: int) -> None:
        batches.append([tuple(r) for r in batch.select(*columns).collect()])

    query = (
        df.writeStream.foreachBatch(each)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive and query.exception() is None, query.exception()
    return batches


def test_streaming_read_with_admission_control_sees_every_result_once(
    spark: SparkSession, written: Written, tmp_path: Path
) -> None:
    store = written.store()
    try:
        expected = _expected(store, written.topic)
        offsets = 0
        for p in (0, 1):
            with store.reader(written.topic, p) as reader:
                offsets += reader.end_offset()
    finally:
        store.close()
    limit = offsets // 4 + 1  # forces at least four micro-batches
    df = (
        spark.readStream.format(FORMAT)
        .option("topic", written.topic)
        .option("bootstrap.servers", written.bootstrap)
        .option("schema", "aggregate")
        .option("maxRecordsPerTrigger", limit)
        .load()
    )
    batches = _collect_stream(df, tmp_path / "ckpt", ["cec_partition", "cec_offset", *RESULT_FIELDS])
    non_empty = [b for b in batches if b]
    assert len(non_empty) >= math.ceil(offsets / limit) >= 4  # the limit really split the backlog
    assert all(len(b) <= limit for b in batches)
    rows = [r for b in batches for r in b]
    assert len({(r[0], r[1]) for r in rows}) == len(rows)  # exactly once
    for p, want in expected.items():
        assert [r[2:] for r in sorted((r for r in rows if r[0] == p), key=lambda r: r[1])] == want


def _purchases(n: int, start: int) -> list[dict[str, int]]:
    gen = PurchaseGenerator(start + n, 25, seed=11)
    gen.seek([start])
    out: list[dict[str, int]] = []
    for batch in iter(lambda: gen.poll(500), None):
        out.extend(dict(t.value) for t in batch if t.value is not None)
    return out


def test_sink_and_stream_restart_from_checkpoint(
    spark: SparkSession, spark_kafka_broker: Broker, tmp_path: Path
) -> None:
    """Rows written by the sink read back as CEC results (by the queue store and by the source); a stream
    restarted from its checkpoint reads only what was appended since, and a streaming sink copies it."""
    bootstrap = spark_kafka_broker.bootstrap
    topic, copy = f"purchases-{uuid.uuid4().hex[:8]}", f"copy-{uuid.uuid4().hex[:8]}"
    common = {"bootstrap.servers": bootstrap, "schema": "purchase"}

    def write(rows: list[dict[str, int]]) -> None:
        (
            spark.createDataFrame(rows)
            .repartition(3)
            .write.format(FORMAT)
            .options(**common)
            .option("topic", topic)
            .option("partitions", 2)
            .option("keyField", "item_id")
            .option("timeField", "item_time")
            .mode("append")
            .save()
        )

    first, second = _purchases(1500, 0), _purchases(700, 1500)
    write(first)
    store = KafkaQueueStore(bootstrap, tmp_path / "state")
    try:
        # Each task's transaction is committed when the write returns, but a read_committed reader sees
        # it once the broker has written the commit markers, which it does after answering the commit.
        wait_for(lambda: len(list(iter_payloads(store, topic, PURCHASE_SCHEMA))) >= len(first), 60)
        assert sorted(map(_key, iter_payloads(store, topic, PURCHASE_SCHEMA))) == sorted(map(_key, first))
        # keyField: each item lives in one partition (what keeps a downstream operator's per-key order).
        homes: dict[int, set[int]] = {}
        for p in (0, 1):
            with store.reader(topic, p) as reader:
                assert all(r.meta.kind == Kind.R.value for r in reader.scan_forward(0))
        for row in _read_all(spark, topic, common):
            homes.setdefault(row["item_id"], set()).add(row["cec_partition"])
        assert all(len(h) == 1 for h in homes.values())
    finally:
        store.close()

    def stream() -> DataFrame:
        return (
            spark.readStream.format(FORMAT)
            .options(**common)
            .option("topic", topic)
            .option("maxRecordsPerTrigger", 1000)
            .load()
        )

    ckpt = tmp_path / "ckpt"
    got1 = [r for b in _collect_stream(stream(), ckpt, PURCHASE_FIELDS) for r in b]
    assert sorted(got1) == sorted(map(_key, first))
    write(second)
    got2 = [r for b in _collect_stream(stream(), ckpt, PURCHASE_FIELDS) for r in b]
    assert sorted(got2) == sorted(map(_key, second))  # only the new rows, each once

    query = (
        stream()
        .select(*PURCHASE_FIELDS)
        .writeStream.format(FORMAT)
        .options(**common)
        .option("topic", copy)
        .option("partitions", 1)
        .option("checkpointLocation", str(tmp_path / "ckpt-copy"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    store = KafkaQueueStore(bootstrap, tmp_path / "state")
    try:
        wait_for(lambda: len(list(iter_payloads(store, copy, PURCHASE_SCHEMA))) >= len(first + second), 60)
        copied = sorted(map(_key, iter_payloads(store, copy, PURCHASE_SCHEMA)))
    finally:
        store.close()
    assert copied == sorted(map(_key, first + second))


def _key(row: dict[str, int]) -> tuple[int, ...]:
    return tuple(row[f] for f in PURCHASE_FIELDS)


def _read_all(spark: SparkSession, topic: str, options: dict[str, str]) -> Iterator[dict[str, Any]]:
    df = spark.read.format(FORMAT).options(**options).option("topic", topic).load()
    return (r.asDict() for r in df.collect())


def test_a_result_whose_stored_kind_is_flipped_fails_the_read_clearly(
    spark: SparkSession, spark_kafka_broker: Broker, tmp_path: Path
) -> None:
    """A result stored with its kind damaged (R -> Q, in the message key and the cec.kind header): the
    checksum, which covers the stored kind, is checked before the kind is used, so the read fails naming
    the record instead of silently dropping (or passing on) a result."""
    from confluent_kafka import Producer

    from cec.records import AvroCodec, OutputRecord, RecordCodec
    from queuestore.base import RecordMeta
    from queuestore.kafka import meta_to_headers, meta_to_key

    bootstrap = spark_kafka_broker.bootstrap
    topic = f"flipped-{uuid.uuid4().hex[:8]}"
    codec, payloads = RecordCodec(), AvroCodec(RESULT_SCHEMA)

    def result(i: int) -> OutputRecord:
        payload = {"key": f"k{i}", "window": 0, "value": float(i), "count": 1, "start": 0, "end": 0}
        return OutputRecord(Kind.R, i, (i + 1,), 0, f"k{i}", 0, None, payloads.encode(payload))

    store = KafkaQueueStore(bootstrap, tmp_path / "state")
    try:
        store.create_topic(topic, 1)
        with store.writer(topic, 0) as writer:
            for i in range(5):
                writer.append(codec.encode(result(i)), result(i).meta())
        intact = _reader(spark, _At(topic, bootstrap), schema="aggregate").load().collect()
        assert [r.key for r in intact] == [f"k{i}" for i in range(5)]

        meta = result(5).meta()
        flipped = RecordMeta("Q", meta.time, meta.key, meta.seq)
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        delivered: list[int] = []
        producer.produce(
            topic,
            codec.encode(result(5)),
            meta_to_key(flipped),
            partition=0,
            headers=meta_to_headers(flipped),
            on_delivery=lambda err, msg: delivered.append(msg.offset()),
        )
        assert producer.flush(60) == 0
        (damaged,) = delivered  # not 5: the writer's commit marker took an offset
        with store.writer(topic, 0) as writer:
            for i in range(6, 9):
                writer.append(codec.encode(result(i)), result(i).meta())
    finally:
        store.close()
    for options in ({}, {"includeControl": "true"}):
        with pytest.raises(Exception, match=rf"{topic}\[0\] offset {damaged} is damaged"):
            _reader(spark, _At(topic, bootstrap), schema="aggregate", **options).load().collect()


class _At:
    """Where `_reader` reads: a topic on a broker."""

    def __init__(self, topic: str, bootstrap: str) -> None:
        self.topic = topic
        self.bootstrap = bootstrap


# -- the sink is exactly once ---------------------------------------------------------------------------


def _copied(bootstrap: str, state_dir: Path, topic: str) -> list[tuple[int, ...]]:
    store = KafkaQueueStore(bootstrap, state_dir)
    try:
        return sorted(map(_key, iter_payloads(store, topic, PURCHASE_SCHEMA)))
    finally:
        store.close()


def test_sink_task_attempts_write_once(spark_kafka_broker: Broker, tmp_path: Path) -> None:
    """A task's attempts share one transactional.id: a retry of a committed (batch, task) writes nothing,
    and a newer attempt fences an older one still running, which then fails and leaves nothing."""
    bootstrap = spark_kafka_broker.bootstrap
    topic = f"sink-{uuid.uuid4().hex[:8]}"
    store = KafkaQueueStore(bootstrap, tmp_path / "state")
    try:
        store.create_topic(topic, 2)
    finally:
        store.close()
    opts = _Options.parse(
        {"topic": topic, "bootstrap.servers": bootstrap, "schema": "purchase", "keyField": "item_id",
         "timeField": "item_time", "stateDir": str(tmp_path / "state")}
    )  # fmt: skip
    rows0, rows1, rows2 = _purchases(200, 0), _purchases(150, 200), _purchases(120, 350)
    assert write_rows(opts, iter(rows0), sink_id="q", batch_id=0, task=0) == SinkCommit(0, 200, 0)
    # Retried after it had committed (the executor died before Spark heard of it): skipped.
    assert write_rows(opts, iter(rows0), sink_id="q", batch_id=0, task=0) == SinkCommit(0, 0, 0, True)
    assert write_rows(opts, iter(rows1), sink_id="q", batch_id=0, task=1).records == 150

    newer: list[SinkCommit] = []

    def older_rows() -> Iterator[dict[str, int]]:
        # The older attempt has begun its transaction; a newer one (speculation) runs to its commit now.
        newer.append(write_rows(opts, iter(rows2), sink_id="q", batch_id=1, task=0))
        yield from rows2

    with pytest.raises(QueueStoreError, match=r"task 0, batch 1\): transaction failed"):
        write_rows(opts, older_rows(), sink_id="q", batch_id=1, task=0)
    assert newer == [SinkCommit(0, 120, 1)]
    assert _copied(bootstrap, tmp_path / "state", topic) == sorted(map(_key, rows0 + rows1 + rows2))


def test_sink_rerun_micro_batch_adds_no_duplicate(
    spark: SparkSession, spark_kafka_broker: Broker, tmp_path: Path
) -> None:
    """The driver dies after the sink's tasks committed a micro-batch but before Spark's commit log
    recorded it: the restarted query runs that batch again, and the sink writes none of it twice."""
    bootstrap = spark_kafka_broker.bootstrap
    source, copy = f"src-{uuid.uuid4().hex[:8]}", f"copy-{uuid.uuid4().hex[:8]}"
    common = {"bootstrap.servers": bootstrap, "schema": "purchase"}
    rows = _purchases(900, 0)
    (
        spark.createDataFrame(rows)
        .repartition(2)
        .write.format(FORMAT)
        .options(**common)
        .option("topic", source)
        .option("partitions", 2)
        .option("keyField", "item_id")
        .mode("append")
        .save()
    )
    ckpt = tmp_path / "ckpt"

    def run() -> list[int]:
        query = (
            spark.readStream.format(FORMAT)
            .options(**common)
            .option("topic", source)
            .option("maxRecordsPerTrigger", 400)
            .load()
            .select(*PURCHASE_FIELDS)
            .writeStream.format(FORMAT)
            .options(**common)
            .option("topic", copy)
            .option("partitions", 2)
            .option("keyField", "item_id")
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)
        assert query.exception() is None, query.exception()
        return [p.batchId for p in query.recentProgress if p.numInputRows > 0]

    batches = run()
    assert len(batches) >= 2
    assert _copied(bootstrap, tmp_path / "state", copy) == sorted(map(_key, rows))
    last = batches[-1]
    # What a driver crash between the sink's commits and the commit log leaves: no commit for `last`.
    (ckpt / "commits" / str(last)).unlink()
    (ckpt / "commits" / f".{last}.crc").unlink(missing_ok=True)
    assert run() == [last]  # Spark ran that micro-batch again, with its rows
    assert _copied(bootstrap, tmp_path / "state", copy) == sorted(map(_key, rows))
