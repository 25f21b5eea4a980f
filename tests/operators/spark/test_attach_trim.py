"""Trimming on the attached query: `cec_aggregate(..., trim_every=N)`, the engine's rule
(`operators.engine.trimming`) applied by the driver (`operators.spark.trim`), on a real broker and real
local Spark, over two input partitions and two output partitions.

A downstream consumer (the test's own, registered with `QueueStore.acknowledge` before the first run, as a
downstream `cec run` registers itself) reads the results as they are written and acknowledges what it
read. Three runs: the first is SIGKILLed mid-write (its consumer has acknowledged nothing yet, so nothing
may be trimmed); the consumer catches up; the second is SIGKILLed mid-write after it trimmed (up to what
the consumer acknowledged, never past it); the third runs to the end. What the consumer read over the
three runs is exactly the failure-free results, each window once, and the logs' starts advanced.
"""

from __future__ import annotations

import shutil
import signal
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cec.exceptions import ConfigError
from cec.inspection import inspect_topic
from cec.records import AvroCodec, Kind, OutputRecord, RecordCodec
from operators.aggregate import RESULT_SCHEMA
from operators.engine.trimming import DEFAULT_TRIM_EVERY
from operators.sources import PurchaseGenerator
from operators.spark.attach import RESULT_COLUMNS, cec_aggregate, read_results
from queuestore.kafka import KafkaQueueStore
from tests.brokers import Broker
from tests.helpers.attached import run_to_end
from tests.killpoints import PLAN_AFTER_EC_BUILD, WRITER_BEFORE_TRIM, WRITER_IN_COMMIT, WRITER_IN_TRIM
from tests.operators.spark.test_attach import (
    COUNT,
    INPUT_SCHEMA,
    KEYS,
    PerKey,
    Purchases,
    Reference,
    _args,
    _driver_child,
    _killed_driver,
    _per_key,
    purchases,  # noqa: F401 - the module's fixtures
    reference,  # noqa: F401
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CONSUMER = "downstream-test"
TRIM_EVERY = 40


class Downstream:
    """A consumer of every output partition: reads from where it stands to the end, keeps the results, and
    acknowledges the offset after what it read."""

    def __init__(self, store: KafkaQueueStore, topic: str, partitions: int) -> None:
        self.store = store
        self.topic = topic
        self.positions = [0] * partitions
        self.results: dict[tuple[str, int], tuple[Any, ...]] = {}
        self.repeated: list[tuple[str, int]] = []
        self.codec = AvroCodec(RESULT_SCHEMA)
        self.records = RecordCodec()
        for q in range(partitions):
            store.acknowledge(topic, q, CONSUMER, 0)

    def catch_up(self) -> None:
        for q, position in enumerate(self.positions):
            with self.store.reader(self.topic, q) as reader:
                # Never below the log start: trimming must not pass what this consumer acknowledged.
                assert reader.start_offset() <= position
                for record in reader.scan_forward(position):
                    position = record.offset + 1
                    if record.meta.kind != Kind.R.value:
                        continue
                    payload = self.records.decode(record.value, record.meta).payload
                    assert payload is not None
                    row = self.codec.decode(payload)
                    window = (str(row["key"]), int(row["window"]))
                    if window in self.results:
                        self.repeated.append(window)
                    self.results[window] = tuple(row[c] for c in RESULT_COLUMNS)
            self.positions[q] = position
            self.store.acknowledge(self.topic, q, CONSUMER, position)

    def per_key(self) -> dict[str, list[tuple[Any, ...]]]:
        out: dict[str, list[tuple[Any, ...]]] = {}
        for (key, _), row in sorted(self.results.items()):
            out.setdefault(key, []).append(row)
        return out


def _starts(store: KafkaQueueStore, topic: str) -> list[int]:
    starts = []
    for q in range(store.partitions(topic)):
        with store.reader(topic, q) as reader:
            starts.append(reader.start_offset())
    return starts


def test_trimmed_logs_recover_exactly_after_driver_sigkills_and_keep_unread_records(
    spark: SparkSession,
    purchases: Purchases,  # noqa: F811
    reference: Reference,  # noqa: F811
    tmp_path: Path,
) -> None:
    output = f"avg-trim-{uuid.uuid4().hex[:8]}"
    store = KafkaQueueStore(purchases.bootstrap, tmp_path / "downstream")
    try:
        store.create_topic(output, 2)  # generation 0, so that the consumer registers before any record
        downstream = Downstream(store, output, 2)
        args = _args(purchases, tmp_path, output, partitions=2, trim_every=TRIM_EVERY)

        _killed_driver(args, tmp_path / "first", hit=3)
        assert _starts(store, output) == [0, 0]  # nothing read downstream yet: nothing trimmed
        downstream.catch_up()
        read_first = list(downstream.positions)
        assert all(read_first)

        _killed_driver(args, tmp_path / "second", hit=3)
        after_second = _starts(store, output)
        assert all(after_second), after_second  # it trimmed before it was killed ...
        assert all(s <= r for s, r in zip(after_second, read_first, strict=True))  # ... never past the reads
        downstream.catch_up()

        query = run_to_end(spark, args)
        assert query.recovery.resumed and query.recovery.ec_windows > 0
        assert query.cec_progress["trimmed_offsets"] > 0
        downstream.catch_up()
        final = _starts(store, output)
        assert all(f >= s for f, s in zip(final, after_second, strict=True)) and final != after_second
    finally:
        store.close()
    assert downstream.repeated == []
    assert downstream.per_key() == reference.results


def test_trim_every_is_refused_below_zero(
    spark: SparkSession,
    purchases: Purchases,  # noqa: F811
    tmp_path: Path,
) -> None:
    for bad in (-1, -3, 2.5, True):
        with pytest.raises(ConfigError, match="trim_every"):
            cec_aggregate(spark, **_args(purchases, tmp_path, "never-made", trim_every=bad))


def _write_purchases(bootstrap: str, root: Path, count: int, partitions: int) -> Purchases:
    """`count` purchases (no invalid one) as CEC R records in a topic of `partitions` partitions."""
    topic = f"purchases-{uuid.uuid4().hex[:8]}"
    gen = PurchaseGenerator(count, KEYS, seed=17, partitions=partitions)
    codec, payloads = RecordCodec(), AvroCodec(INPUT_SCHEMA)
    store = KafkaQueueStore(bootstrap, root)
    try:
        store.create_topic(topic, partitions)
        for j in range(partitions):
            with store.writer(topic, j) as writer:
                for o in range(gen.sizes[j]):
                    value = gen.tuple_at(j, o)
                    out = OutputRecord(
                        Kind.R, int(value["item_time"] or 0), (), 0, payload=payloads.encode(value)
                    )
                    writer.append(codec.encode(out), out.meta())
    finally:
        store.close()
    return Purchases(bootstrap, topic, root, 0)


def test_trimming_is_on_by_default_and_trim_every_zero_turns_it_off(
    spark: SparkSession,
    spark_kafka_broker: Broker,
    tmp_path: Path,
) -> None:
    """Without `trim_every` the query trims every DEFAULT_TRIM_EVERY records (its results stream from the
    log as it runs, as a `cec run --follow`'s do); `trim_every=0` never trims. Count windows of 2 give
    about one record per tuple: 25,000 tuples are 2.5 trim intervals of one output partition."""
    count = int(2.5 * DEFAULT_TRIM_EVERY)
    source = _write_purchases(spark_kafka_broker.bootstrap, tmp_path / "input", count, 1)
    store = KafkaQueueStore(source.bootstrap, tmp_path / "observer")
    try:
        for every, trims in ((None, True), (0, False)):
            output = f"avg-default-{uuid.uuid4().hex[:8]}"
            extra: dict[str, Any] = {} if every is None else {"trim_every": every}
            args = _args(source, tmp_path / output, output, partitions=1, window_count=2,
                         max_records_per_trigger=DEFAULT_TRIM_EVERY // 2, **extra)  # fmt: skip
            query = run_to_end(spark, args)
            assert sum(query.cec_progress["records"].values()) >= 2 * DEFAULT_TRIM_EVERY
            [start] = _starts(store, output)
            assert (query.cec_progress["trimmed_offsets"] > 0) is trims
            assert (start >= DEFAULT_TRIM_EVERY) is trims, start
    finally:
        store.close()


@pytest.fixture(scope="module")
def purchases3(spark_kafka_broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Purchases:
    """The purchases of `test_attach` over three input partitions."""
    state_dir = tmp_path_factory.mktemp("attach-trim-input")
    topic = f"purchases3-{uuid.uuid4().hex[:8]}"
    gen = PurchaseGenerator(COUNT, KEYS, seed=13, partitions=3, invalid_every=37)
    codec, payloads = RecordCodec(), AvroCodec(INPUT_SCHEMA)
    dead = 0
    store = KafkaQueueStore(spark_kafka_broker.bootstrap, state_dir)
    try:
        store.create_topic(topic, 3)
        for j in range(3):
            with store.writer(topic, j) as writer:
                for o in range(gen.sizes[j]):
                    value = gen.tuple_at(j, o)
                    dead += value["item_price"] is None
                    out = OutputRecord(
                        Kind.R, int(value["item_time"] or 0), (), 0, payload=payloads.encode(value)
                    )
                    writer.append(codec.encode(out), out.meta())
    finally:
        store.close()
    return Purchases(spark_kafka_broker.bootstrap, topic, state_dir, dead)


def _read(spark: SparkSession, source: Purchases, output: str, consumer: str) -> list[Any]:
    return read_results(spark, output, source.bootstrap, consumer=consumer).collect()


def test_executor_trims_stay_exact_through_driver_sigkills_in_a_trim_and_in_recovery(
    spark: SparkSession,
    purchases3: Purchases,
    tmp_path: Path,
) -> None:
    """Trimming on the executors (the default writers), three input and three output partitions, a
    reader registered through `read_results(consumer=...)` that reads between the runs:
    1. the driver is SIGKILLed mid-batch; its reader has acknowledged nothing, so nothing is trimmed;
    2. the reader reads (and, by reading again, acknowledges) what run 1 wrote; the driver is SIGKILLed by a
       write task right after its first trim (`DeleteRecords` answered, the driver told nothing): the logs
       were trimmed, never past what the reader acknowledged (the records it has not read are kept);
    3. the driver is SIGKILLed during the next start's recovery (its planning task), its `state_dir` then
       deleted: the closed-window directory of the trimmed part comes from Kafka;
    4. a run to the end.
    What the reader got over all its reads equals the failure-free run's results, each window exactly once.
    """
    failure_free = f"avg-ref3-{uuid.uuid4().hex[:8]}"
    run_to_end(spark, _args(purchases3, tmp_path / "ref", failure_free))
    expected: PerKey = _per_key(read_results(spark, failure_free, purchases3.bootstrap).collect())

    output = f"avg-etrim-{uuid.uuid4().hex[:8]}"
    reader = "trim-reader"
    store = KafkaQueueStore(purchases3.bootstrap, tmp_path / "observer")
    got: list[Any] = []
    try:
        store.create_topic(output, 3)  # generation 0, so that the reader registers before any record
        assert _read(spark, purchases3, output, reader) == []  # registered at offset 0 everywhere
        args = _args(purchases3, tmp_path, output, partitions=3, trim_every=TRIM_EVERY)

        _killed_driver(args, tmp_path / "first", hit=2)
        assert _starts(store, output) == [0, 0, 0]  # nothing acknowledged: nothing trimmed
        got += _read(spark, purchases3, output, reader)
        got += _read(spark, purchases3, output, reader)  # acknowledges what the first read returned
        acked = [store.acknowledged(output, q)[reader] for q in range(3)]
        assert any(acked)

        _driver_child(args, tmp_path / "second", f"{WRITER_IN_TRIM}:1", expect=-signal.SIGKILL)
        trimmed = _starts(store, output)
        assert any(trimmed), trimmed  # a write task trimmed before the driver was killed ...
        assert all(s <= a for s, a in zip(trimmed, acked, strict=True))  # ... never past the reader

        _driver_child(args, tmp_path / "third", f"{PLAN_AFTER_EC_BUILD}:1", expect=-signal.SIGKILL)
        shutil.rmtree(tmp_path / "state")  # the closed-window directory of the trimmed part: in Kafka only

        query = run_to_end(spark, args)
        assert query.recovery.resumed
        got += _read(spark, purchases3, output, reader)
        got += _read(spark, purchases3, output, reader)
        assert all(f >= t for f, t in zip(_starts(store, output), trimmed, strict=True))
    finally:
        store.close()
    windows = Counter((r["key"], r["window"]) for r in got)
    assert windows and max(windows.values()) == 1, [w for w, n in windows.items() if n > 1][:5]
    assert _per_key(got) == expected


def test_executor_trims_stay_exact_and_bounded_through_sigkills_in_the_write_tasks_commit(
    spark: SparkSession,
    purchases3: Purchases,
    tmp_path: Path,
) -> None:
    """Trimming on the executors, three input and three output partitions, a registered reader reading
    between the runs (`read_results(consumer=...)`), on Apache Kafka:
    1. the driver is SIGKILLed mid-batch (so that the reader has something to acknowledge);
    2. it is SIGKILLed by a write task inside the commit of the first transaction that carries a trim
       bound's closed-window directory: the records sent and delivered, `commit_transaction` not called
       (the restart's writer aborts the open transaction: that batch's records and directory never were);
    3. it is SIGKILLed by a write task right after a commit that made a bound's directory durable, before
       its `DeleteRecords`: the bound is never applied in that run;
    4. a run to the end.
    What the reader got equals the failure-free run's results, each window exactly once; no log was ever
    trimmed past the reader; and the retained bound holds after the restarts: the last run trimmed every
    partition at least up to min(the reader's acknowledgement, the extent's start before that run), so no
    bound a kill left unapplied keeps records, and what a partition keeps is the extent plus what the last
    run wrote since.
    """
    failure_free = f"avg-ref3c-{uuid.uuid4().hex[:8]}"
    small = {"max_records_per_trigger": 600}  # about 7 micro-batches: every run takes a bound or more
    run_to_end(spark, _args(purchases3, tmp_path / "ref", failure_free, trim_every=0))
    expected: PerKey = _per_key(read_results(spark, failure_free, purchases3.bootstrap).collect())

    output = f"avg-ctrim-{uuid.uuid4().hex[:8]}"
    reader = "commit-kill-reader"
    store = KafkaQueueStore(purchases3.bootstrap, tmp_path / "observer")
    got: list[Any] = []

    def read_all() -> list[int]:
        """Read everything written (twice: the second call acknowledges what the first returned); the
        reader's acknowledged offsets, each never below its log's start."""
        got.extend(_read(spark, purchases3, output, reader))
        got.extend(_read(spark, purchases3, output, reader))
        acked = [store.acknowledged(output, q)[reader] for q in range(3)]
        assert all(s <= a for s, a in zip(_starts(store, output), acked, strict=True))
        return acked

    try:
        store.create_topic(output, 3)  # generation 0, so that the reader registers before any record
        assert _read(spark, purchases3, output, reader) == []
        args = _args(purchases3, tmp_path, output, partitions=3, trim_every=TRIM_EVERY, **small)

        _killed_driver(args, tmp_path / "first", hit=2)
        acked = read_all()
        assert any(acked)

        _driver_child(args, tmp_path / "in-commit", f"{WRITER_IN_COMMIT}:1", expect=-signal.SIGKILL)
        acked = read_all()

        _driver_child(args, tmp_path / "before-trim", f"{WRITER_BEFORE_TRIM}:1", expect=-signal.SIGKILL)
        acked = read_all()
        extents = [s.checkpoint.extent_start for s in inspect_topic(store, output, shared=True)]
        before = _starts(store, output)

        query = run_to_end(spark, args)
        assert query.recovery.resumed and query.cec_progress["trimmed_offsets"] > 0
        final = _starts(store, output)
        for q in range(3):
            assert final[q] <= acked[q], (q, final, acked)  # never past the reader ...
            # ... and at least to where the reader and the extent before the last run allowed: no bound
            # left unapplied by the kills holds records back.
            assert final[q] >= min(acked[q], extents[q]), (q, final, acked, extents, before)
        read_all()
    finally:
        store.close()
    windows = Counter((r["key"], r["window"]) for r in got)
    assert windows and max(windows.values()) == 1, [w for w, n in windows.items() if n > 1][:5]
    assert _per_key(got) == expected
