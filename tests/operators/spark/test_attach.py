"""CEC attached to a PySpark aggregation (operators.spark.attach) on a real broker and real local Spark:

1. without failures, the results equal Spark's own windowed aggregation of the same input (count and time
   windows), and the log holds exactly the footprints and dead letters the contract asks for;
2. after the driver is SIGKILLed in the middle of a sink write, a restart recovers from the output logs
   (`resume_checkpoint=False`, and `writers="driver"`, which never resumes) or resumes Spark's own
   checkpoint (the default), and the results equal the failure-free run's, per key;
3. the same when the restart uses another partition count, twice (2 -> 3 -> 2: three generations), which
   never resumes a checkpoint.

Input: two partitions of purchases (each item in one partition, as the contract requires), some with no
price (the aggregate dead-letters them, so replay also meets DEAD records).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cec.records import AvroCodec, Kind, OutputRecord, RecordCodec
from operators.sinks import count_kinds
from operators.sources import PurchaseGenerator
from operators.spark.attach import (
    RESULT_COLUMNS,
    cec_aggregate,
    list_generations,
    read_results,
)
from operators.spark.datasource import FORMAT
from operators.spark.query import CecAggregateQuery
from operators.spark.resume import FROM_LOGS, RESUMED, latest_checkpoint
from operators.spark.writer import ExecutorSink
from queuestore.kafka import KafkaQueueStore
from tests.brokers import Broker
from tests.helpers import child_env, log_records, process_group_gone, wait_for
from tests.helpers.attached import run_to_end
from tests.killpoints import SINK_MID_BATCH, WRITER_KILL_TASK
from tests.operators.spark.result_rows import epoch_ms

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

COUNT = 4000
KEYS = 50
WINDOW = 7
TRIGGER_ROWS = 1000  # several micro-batches per run, so crashes land between and inside batches
INPUT_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Purchase",
    "namespace": "cec.test",
    "fields": [
        {"name": "item_id", "type": "long"},
        {"name": "item_price", "type": ["null", "long"]},
        {"name": "item_time", "type": "long"},
    ],
}

PerKey = dict[str, list[tuple[Any, ...]]]


@dataclass
class Purchases:
    bootstrap: str
    topic: str
    state_dir: Path
    dead: int  # tuples without a price
    truth: PerKey  # the count-window averages in plain Python (`_truth`), as `_per_key` gives results


def write_purchases(
    bootstrap: str, state_dir: Path, *, partitions: int, seed: int, count: int = COUNT, invalid_every: int = 0
) -> Purchases:
    """`count` purchases over KEYS items (each item in one partition) written to a new topic of `partitions`
    partitions as CEC R records (what an upstream CEC stage or the cec-kafka sink writes); with
    `invalid_every`, about one in that many without a price (the aggregate dead-letters them)."""
    topic = f"purchases-{uuid.uuid4().hex[:8]}"
    gen = PurchaseGenerator(count, KEYS, seed=seed, partitions=partitions, invalid_every=invalid_every)
    codec, payloads = RecordCodec(), AvroCodec(INPUT_SCHEMA)
    dead = 0
    priced: dict[int, list[tuple[int, int]]] = {}  # item -> (offset, price) in its partition's order
    store = KafkaQueueStore(bootstrap, state_dir)
    try:
        store.create_topic(topic, partitions)
        for j in range(partitions):
            with store.writer(topic, j) as writer:
                for o in range(gen.sizes[j]):
                    value = gen.tuple_at(j, o)
                    dead += value["item_price"] is None
                    if value["item_price"] is not None:
                        priced.setdefault(value["item_id"], []).append((o, value["item_price"]))
                    record = OutputRecord(
                        Kind.R, int(value["item_time"] or 0), (), 0, payload=payloads.encode(value)
                    )
                    writer.append(codec.encode(record), record.meta())
    finally:
        store.close()
    return Purchases(bootstrap, topic, state_dir, dead, _truth(priced))


def _truth(priced: dict[int, list[tuple[int, int]]]) -> PerKey:
    """The closed count windows of WINDOW priced purchases per item, in offset order (each item lives in
    one partition), as `_per_key` gives results: (key, window, mean price, count, first offset, last
    offset) — a count window without a time field spans offsets. The mean is the sum over the count, as
    the aggregate computes it: integer prices, so the float is exact and compared with `==`."""
    out: PerKey = {}
    for item, tuples in priced.items():
        for w in range(len(tuples) // WINDOW):
            chunk = tuples[w * WINDOW : (w + 1) * WINDOW]
            mean = sum(float(price) for _, price in chunk) / WINDOW
            out.setdefault(str(item), []).append((str(item), w, mean, WINDOW, chunk[0][0], chunk[-1][0]))
    return out


@pytest.fixture(scope="module")
def purchases(spark_kafka_broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Purchases:
    """The input topic: two partitions, some purchases without a price."""
    state_dir = tmp_path_factory.mktemp("attach-input")
    data = write_purchases(spark_kafka_broker.bootstrap, state_dir, partitions=2, seed=11, invalid_every=37)
    assert data.dead > 0
    return data


def _args(purchases: Purchases, root: Path, output: str, **extra: Any) -> dict[str, Any]:
    return {
        "input_topic": purchases.topic,
        "bootstrap_servers": purchases.bootstrap,
        "output_topic": output,
        "key": "item_id",
        "value": "item_price",
        "agg": "avg",
        "input_schema": INPUT_SCHEMA,
        "state_dir": str(root / "state"),
        "checkpoint_location": str(root / "checkpoints"),
        "max_records_per_trigger": TRIGGER_ROWS,
        **({"window_count": WINDOW} if "window_time" not in extra else {}),
        **extra,
    }


def _per_key(rows: list[Any]) -> PerKey:
    out: PerKey = {}
    for row in rows:
        out.setdefault(str(row["key"]), []).append(tuple(epoch_ms(row[c]) for c in RESULT_COLUMNS))
    for values in out.values():
        values.sort(key=lambda r: r[1])
    return out


def _results(spark: SparkSession, purchases: Purchases, output: str) -> PerKey:
    rows = read_results(spark, output, purchases.bootstrap).collect()
    windows = Counter((r["key"], r["window"]) for r in rows)
    assert windows and max(windows.values()) == 1, "a window has more than one result"
    return _per_key(rows)


def _input(spark: SparkSession, purchases: Purchases) -> DataFrame:
    from pyspark.sql import functions as F

    return (
        spark.read.format(FORMAT)
        .option("topic", purchases.topic)
        .option("bootstrap.servers", purchases.bootstrap)
        .option("schema", json.dumps(INPUT_SCHEMA))
        .load()
        .where(F.col("item_price").isNotNull())
    )


@dataclass
class Reference:
    output: str
    results: PerKey
    store_dir: Path
    sink: Any = None  # the run's foreachBatch sink (its counters)


@pytest.fixture(scope="module")
def reference(
    spark: SparkSession, purchases: Purchases, tmp_path_factory: pytest.TempPathFactory
) -> Reference:
    """The failure-free CEC run over count windows (test 1 checks it against Spark's own aggregation)."""
    root = tmp_path_factory.mktemp("attach-ref")
    output = f"avg-ref-{uuid.uuid4().hex[:8]}"
    query = run_to_end(spark, _args(purchases, root, output))
    assert not query.recovery.resumed and query.batches >= COUNT // TRIGGER_ROWS
    return Reference(output, _results(spark, purchases, output), root / "state", query._sink)


def test_no_output_record_passes_through_the_driver(purchases: Purchases, reference: Reference) -> None:
    """The write tasks wrote every record; the driver appended none and got back only a summary per
    partition and batch, with its state partition's extent figures (no checkpointing here, so no
    checkpoint controls): a number of rows bounded by partitions x batches, whatever the key count."""
    sink = reference.sink
    assert isinstance(sink, ExecutorSink)
    assert sum(out.appended for out in sink.outputs) == 0
    logged = sum(_kinds(purchases, reference.store_dir.parent, reference.output)[0].values())
    assert sink.records == logged > 0
    assert 0 < sink.summary_rows <= sink.batches * len(sink.outputs) * 2 < logged


def test_count_windows_equal_sparks_own_aggregation(
    spark: SparkSession, purchases: Purchases, reference: Reference
) -> None:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    per_key = Window.partitionBy("item_id").orderBy("cec_partition", "cec_offset")
    native = (
        _input(spark, purchases)
        .withColumn("window", F.floor((F.row_number().over(per_key) - 1) / WINDOW))
        .groupBy("item_id", "window")
        .agg(
            F.avg("item_price").alias("value"),
            F.count("*").alias("count"),
            F.min("cec_offset").alias("start"),  # no time field: a count window spans offsets
            F.max("cec_offset").alias("end"),
        )
        .where(F.col("count") == WINDOW)  # closed windows only
        .collect()
    )
    want = {(str(r["item_id"]), r["window"]): (r["value"], r["count"], r["start"], r["end"]) for r in native}
    got = {(k, w): (v, c, s, e) for k, rows in reference.results.items() for (_, w, v, c, s, e) in rows}
    assert got.keys() == want.keys() and len(got) > 400
    for wid, (value, count, start, end) in want.items():
        assert got[wid] == (pytest.approx(value, rel=1e-12), count, start, end), wid
    # The plain-Python truth the other modules hold their runs to (instead of a failure-free run of their
    # own) is this run's results, exactly.
    assert reference.results == purchases.truth

    # The log: one G-open per window that outlived its first tuple, a dead letter per priceless tuple, and
    # N at the end of each partition = windows still open there (keys whose count is not a multiple of 7).
    valid = Counter(str(r["item_id"]) for r in _input(spark, purchases).select("item_id").collect())
    still_open = sum(1 for n in valid.values() if n % WINDOW)
    store = KafkaQueueStore(purchases.bootstrap, reference.store_dir)
    try:
        kinds = count_kinds(store, reference.output)
        final_n = sum(log_records(store, reference.output, q)[-1].n for q in range(2))
    finally:
        store.close()
    assert kinds == {"R": len(got), "GOPEN": len(got) + still_open, "DEAD": purchases.dead}
    assert final_n == still_open > 0


def test_handle_runs_until_stopped_and_a_restart_writes_nothing_twice(
    spark: SparkSession, purchases: Purchases, reference: Reference, tmp_path: Path
) -> None:
    """The default trigger runs until stopped; a restart at the end of the input resumes the stopped query's
    own checkpoint (the default) and writes nothing; one that recovers from the logs
    (`resume_checkpoint=False`) replays the tail of the input and writes nothing either (everything it sees
    is below the crash points)."""
    output = f"avg-handle-{uuid.uuid4().hex[:8]}"
    args = _args(purchases, tmp_path, output)
    with cec_aggregate(spark, **args) as query:
        query.processAllAvailable()
        assert query.isActive and query.batches >= COUNT // TRIGGER_ROWS
        query.stop()
        assert not query.isActive
    assert _results(spark, purchases, output) == reference.results
    written = _kinds(purchases, tmp_path, output)
    with cec_aggregate(spark, **args) as resumed:
        resumed.processAllAvailable()
        assert resumed.checkpoint == query.checkpoint
        assert _recovery_path(resumed) == (RESUMED, "the checkpoint agrees with every output log")
        assert resumed.recovery.ec_windows == 0
    assert _kinds(purchases, tmp_path, output) == written
    with cec_aggregate(spark, **args, resume_checkpoint=False) as again:
        again.processAllAvailable()
        assert again.recovery.resumed and again.recovery.ec_windows > 0 and again.batches >= 1
        assert _recovery_path(again) == (FROM_LOGS, "resume_checkpoint=False")
    assert _kinds(purchases, tmp_path, output) == written


def _recovery_path(query: CecAggregateQuery) -> tuple[str, str]:
    """Which way the query's start went, and why, as its progress says (`lastProgress["cec"]["recovery"]`)."""
    recovery = query.cec_progress["recovery"]
    return recovery["path"], recovery["reason"]


DURATION = 400


@pytest.fixture(scope="module")
def time_reference(
    spark: SparkSession, purchases: Purchases, tmp_path_factory: pytest.TempPathFactory
) -> Reference:
    """The failure-free CEC run over time windows: a tuple that closes a window opens the next one, so the
    log holds R + G-open pairs produced by one input tuple."""
    root = tmp_path_factory.mktemp("attach-time-ref")
    output = f"avg-time-{uuid.uuid4().hex[:8]}"
    run_to_end(spark, _time_args(purchases, root, output))
    return Reference(output, _results(spark, purchases, output), root / "state")


def _time_args(purchases: Purchases, root: Path, output: str) -> dict[str, Any]:
    return _args(purchases, root, output, window_time=f"{DURATION}ms", time="item_time")


def test_time_windows_equal_sparks_own_aggregation(
    spark: SparkSession, purchases: Purchases, time_reference: Reference
) -> None:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    got = {(k, w): rest for k, rows in time_reference.results.items() for (_, w, *rest) in rows}
    windows = (
        _input(spark, purchases)
        .withColumn("start", F.col("item_time") - F.col("item_time") % DURATION)
        .groupBy("item_id", "start")
        .agg(F.avg("item_price").alias("value"), F.count("*").alias("count"))
        .withColumn("window", F.dense_rank().over(Window.partitionBy("item_id").orderBy("start")) - 1)
        .withColumn("newest", F.max("start").over(Window.partitionBy("item_id")))
        .where(F.col("start") < F.col("newest"))  # closed: a later tuple of the key fell past its end
        .collect()
    )
    want = {
        (str(r["item_id"]), r["window"]): (r["value"], r["count"], r["start"], r["start"] + DURATION)
        for r in windows
    }
    assert got.keys() == want.keys() and len(got) > 300
    for wid, (value, count, start, end) in want.items():
        assert tuple(got[wid]) == (pytest.approx(value, rel=1e-12), count, start, end), wid


def test_exact_after_a_log_cut_between_two_records_of_one_tuple(
    spark: SparkSession, purchases: Purchases, time_reference: Reference, tmp_path: Path
) -> None:
    """A crash can leave a log ending anywhere: copy a prefix of each partition of the failure-free log to a
    new output topic (partition 0 cut between the R and the G-open that one input tuple produced, partition
    1 elsewhere) and start on it. Recovery must re-process that tuple to reopen the window, once."""
    output = f"avg-cut-{uuid.uuid4().hex[:8]}"
    codec = RecordCodec()
    store = KafkaQueueStore(purchases.bootstrap, tmp_path / "copy")
    try:
        logs = []
        for q in range(2):
            with store.reader(time_reference.output, q) as reader:
                logs.append(list(reader.scan_forward(0)))
        decoded = [codec.decode(r.value, r.meta) for r in logs[0]]
        pairs = [
            i
            for i in range(len(decoded) - 1)
            if decoded[i].kind is Kind.R
            and decoded[i + 1].kind is Kind.GOPEN
            and decoded[i + 1].window == (decoded[i].key, decoded[i].seq + 1)
        ]
        assert pairs, "time windows roll over with R + G-open from one tuple"
        cut_after = min(pairs, key=lambda i: abs(i - len(decoded) // 2))
        # The R does not claim its tuple (pos one lower on that partition); the G-open does.
        r, g = decoded[cut_after], decoded[cut_after + 1]
        assert sum(g.pos) - sum(r.pos) == 1
        store.create_topic(output, 2)
        for q, prefix in enumerate([logs[0][: cut_after + 1], logs[1][: len(logs[1]) // 3]]):
            with store.writer(output, q) as writer:
                for stored in prefix:
                    writer.append(stored.value, stored.meta)
    finally:
        store.close()
    query = run_to_end(spark, _time_args(purchases, tmp_path, output))
    assert query.recovery.resumed and query.recovery.ec_windows > 0
    assert _results(spark, purchases, output) == time_reference.results
    assert _kinds(purchases, tmp_path, output)[0]["DEAD"] == purchases.dead


# -- crashes ---------------------------------------------------------------------------------------------


def _killed_driver(args: dict[str, Any], work: Path, hit: int) -> None:
    """Run the driver script in a child process that is SIGKILLed with half of one partition's micro-batch
    durable in its log: with writers="driver", the sink's `hit`-th pass of its mid-batch fault site; with
    the executors' writers, the first write task of the `hit`-th micro-batch kills the driver's whole
    process group (driver, JVM, Python workers) half way through its partition."""
    _driver_child(args, work, f"{SINK_MID_BATCH}:{hit}", expect=-signal.SIGKILL)
    assert not (work / "done.json").exists()


def _driver_child(args: dict[str, Any], work: Path, faults: str, *, expect: int) -> tuple[int, bytes]:
    """Run the driver script with the kill plan `faults` (tests/killpoints); it must exit with `expect`."""
    work.mkdir(parents=True, exist_ok=True)
    done = work / "done.json"
    spec = work / "args.json"
    spec.write_text(json.dumps({**args, "done": str(done)}))
    # Its own session (process group): the driver's JVM and Python workers are its descendants.
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.operators.spark.attach_driver", str(spec)],
        env=child_env(faults),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        _, err = child.communicate(timeout=900)
        assert child.returncode == expect, f"driver exited {child.returncode}:\n{err.decode()[-3000:]}"
        # The JVM exits when its stdin (the dead driver) closes, and takes its Python workers with it.
        wait_for(process_group_gone(child.pid), timeout=300, interval=0.05)
    finally:
        if child.poll() is None or not process_group_gone(child.pid)():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
    return child.returncode, err


def _kinds(purchases: Purchases, root: Path, output: str) -> list[Counter[str]]:
    """Record kinds per generation of `output`."""
    store = KafkaQueueStore(purchases.bootstrap, root / "probe")
    try:
        return [count_kinds(store, g.topic) for g in list_generations(store, output)]
    finally:
        store.close()


@pytest.mark.parametrize(
    ("writers", "hit", "resume", "path"),
    # The third micro-batch: the driver sink passes its site twice per batch (once per partition).
    [
        ("executors", 3, False, FROM_LOGS),
        ("driver", 5, True, FROM_LOGS),  # the default, which a driver sink never takes: from the logs
        ("executors", 3, True, RESUMED),  # the default: Spark's checkpoint, read through the cec-kafka source
    ],
    ids=["executors-from-logs", "driver", "executors-resumed"],
)
def test_exact_after_driver_sigkill_mid_sink_write(
    spark: SparkSession,
    purchases: Purchases,
    reference: Reference,
    tmp_path: Path,
    writers: str,
    hit: int,
    resume: bool,
    path: str,
) -> None:
    output = f"avg-kill-{uuid.uuid4().hex[:8]}"
    args = _args(purchases, tmp_path, output, partitions=2, writers=writers, resume_checkpoint=resume)
    _killed_driver(args, tmp_path / "driver", hit=hit)
    partial = _kinds(purchases, tmp_path, output)[0]
    total = sum(len(v) for v in reference.results.values())
    assert 0 < partial["R"] < total, (partial, total)
    killed_run = latest_checkpoint(tmp_path / "checkpoints")

    query = run_to_end(spark, args)
    rec = query.recovery
    assert _recovery_path(query)[0] == path, query.cec_progress["recovery"]
    if path == RESUMED:
        # Spark's own state store and last committed micro-batch: no eventual checkpoint read, no replay
        # from T; the rerun batch's write task found its durable half and appended the rest.
        assert query.checkpoint == killed_run and rec.checkpoint_batch is not None
        assert rec.ec_windows == 0 and rec.initial is None
    else:
        assert rec.resumed and rec.ec_windows > 0 and rec.closed_keys > 0
        assert 0 < sum(rec.start) < COUNT  # replay starts inside the input, not from its beginning
    assert _results(spark, purchases, output) == reference.results
    assert _kinds(purchases, tmp_path, output)[0]["DEAD"] == purchases.dead  # none lost, none repeated


def test_exact_after_a_driver_sigkill_during_recovery(
    spark: SparkSession, purchases: Purchases, reference: Reference, tmp_path: Path
) -> None:
    """Killed mid-write, then killed again mid-write in the restart's first micro-batch (the restart
    replays from the oldest footprint, below the crash point), then restarted once more: every footprint
    and position the state partitions computed across both kills still gives exactly the results. The
    runs that were killed recovered from the logs (`resume_checkpoint=False`), so they kept no manifest: the
    last start, with the default, does not resume their checkpoint either."""
    output = f"avg-kill-rec-{uuid.uuid4().hex[:8]}"
    args = _args(purchases, tmp_path, output, partitions=2, resume_checkpoint=False)
    _killed_driver(args, tmp_path / "first", hit=3)
    first = sum(_kinds(purchases, tmp_path, output)[0].values())
    _killed_driver(args, tmp_path / "recovering", hit=1)
    assert sum(_kinds(purchases, tmp_path, output)[0].values()) > first  # it died writing, not before
    query = run_to_end(spark, {**args, "resume_checkpoint": True})
    assert query.recovery.resumed and query.recovery.ec_windows > 0
    path, reason = _recovery_path(query)
    assert path == FROM_LOGS and reason.startswith("the checkpoint's cec manifest: missing"), reason
    assert _results(spark, purchases, output) == reference.results
    assert _kinds(purchases, tmp_path, output)[0]["DEAD"] == purchases.dead


def test_a_write_task_killed_mid_write_is_retried_and_writes_nothing_twice(
    spark: SparkSession, purchases: Purchases, reference: Reference, tmp_path: Path
) -> None:
    """Every write task of the second micro-batch SIGKILLs its Python worker on its first attempt, half of
    its partition committed; Spark retries it, the retry fences the dead attempt's writer, finds the half
    and appends only the rest: the run ends normally with exactly the failure-free output."""
    output = f"avg-retry-{uuid.uuid4().hex[:8]}"
    args = _args(purchases, tmp_path, output, partitions=2)
    _driver_child(args, tmp_path / "driver", f"{WRITER_KILL_TASK}:2", expect=0)
    summary = json.loads((tmp_path / "driver" / "done.json").read_text())
    assert summary["found"] > 0  # the retries met their killed attempts' records ...
    assert summary["driver_appends"] == 0
    assert _results(spark, purchases, output) == reference.results  # ... and did not write them again
    assert _kinds(purchases, tmp_path, output) == _kinds(purchases, tmp_path, reference.output)


def test_exact_after_restarts_with_other_partition_counts(
    spark: SparkSession, purchases: Purchases, reference: Reference, tmp_path: Path
) -> None:
    output = f"avg-repart-{uuid.uuid4().hex[:8]}"
    _killed_driver(_args(purchases, tmp_path, output, partitions=2), tmp_path / "p2", hit=3)
    # Restarted with 3 output partitions: a new generation. Stopped after its first micro-batch, while
    # windows carried over from generation 0 are still open (their footprints stay in generation 0's log).
    middle = cec_aggregate(spark, **_args(purchases, tmp_path, output, partitions=3))
    try:
        wait_for(lambda: middle.batches >= 1 or not middle.isActive, timeout=600, interval=0.05)
    finally:
        middle.stop()
    assert middle.exception() is None and middle.recovery.resumed and middle.recovery.ec_windows > 0
    # Spark's state checkpoint of 2 partitions is never resumed by a start with 3 (nor the reverse, below).
    path, reason = _recovery_path(middle)
    assert path == FROM_LOGS and "with 2 partitions, this start writes" in reason, reason
    # Across generations the plan's figures come per output partition of the new generation, one row each.
    plan = middle.recovery
    assert len(plan.partition_windows) == 3
    assert sum(n for n, _ in plan.partition_windows) == plan.ec_windows
    assert plan.driver_rows <= sum(len(c) for c in plan.crash_points) + 3  # a summary per log, a row per q
    lows = [low for _, low in plan.partition_windows if low is not None]
    assert all(min(low[j] for low in lows) >= plan.start[j] for j in range(len(plan.start)))
    query = run_to_end(spark, _args(purchases, tmp_path, output, partitions=2))  # and back to 2: a third one
    assert query.recovery.resumed and query.recovery.ec_windows > 0
    assert [g.partitions for g in query.recovery.generations] == [2, 3, 2]
    path, reason = _recovery_path(query)
    assert path == FROM_LOGS and "with 3 partitions, this start writes" in reason, reason
    kinds = _kinds(purchases, tmp_path, output)
    assert all(k["R"] > 0 for k in kinds), kinds  # each generation produced results
    assert _results(spark, purchases, output) == reference.results
    assert sum(k["DEAD"] for k in kinds) == purchases.dead


def test_cec_aggregate_validates_its_configuration_before_touching_kafka(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Every refusal is one ConfigError line raised before any Kafka client exists (the broker address
    here answers nothing)."""
    from cec import Checkpointing
    from cec.exceptions import ConfigError

    common: dict[str, Any] = dict(
        input_topic="in", bootstrap_servers="127.0.0.1:1", output_topic="out", key="item_id",
        value="item_price", window_count=3, state_dir=tmp_path, checkpoint_location=tmp_path / "ckpt",
    )  # fmt: skip
    with pytest.raises(ConfigError, match="checkpointing"):
        cec_aggregate(spark, checkpointing="often", **common)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="CI"):
        cec_aggregate(spark, checkpointing={"ci_ms": 0}, **common)
    with pytest.raises(ConfigError, match="recovery_target"):
        cec_aggregate(spark, checkpointing={"recovery_target": "soon"}, **common)
    with pytest.raises(ConfigError, match="input_format"):
        cec_aggregate(spark, input_format="xml", **common)
    with pytest.raises(ConfigError, match="writers must be one of executors, driver"):
        cec_aggregate(spark, writers="everywhere", **common)
    with pytest.raises(ConfigError, match="input_schema"):
        cec_aggregate(spark, input_format="avro", **common)
    with pytest.raises(ConfigError, match="schema_registry_url"):
        cec_aggregate(spark, input_format="registry", **common)
    # Every Checkpointing the local runtime takes passes validation (Q, a recovery target, cost-benefit:
    # operators.spark.checkpointing): the next check, on the columns, is what stops these calls.
    for checkpointing in (
        Checkpointing(u_target=100),
        Checkpointing(q_target=50, recovery_target="3s"),
        Checkpointing(policy="cost-benefit", mtbf="1h"),
    ):
        with pytest.raises(ConfigError, match="different columns"):
            cec_aggregate(spark, checkpointing=checkpointing, **{**common, "value": "item_id"})
