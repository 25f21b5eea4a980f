"""CEC on Spark against Spark's own stateful streaming, on the same input, in one run on one machine.

Workload (the paper's aggregate): average `item_price` per `item_id` over count windows of 10. Input: a
purchases topic of P partitions on the broker from tests/brokers.py (or KAFKA_BOOTSTRAP_SERVERS), written
once per run as CEC R records by a pass-all filter stage over `PurchaseGenerator` (each item in one
partition, an EOS at the end of each partition). Every system below reads that same topic.

Throughput = input tuples / wall time from "start" to "all input processed", session start excluded
(reported separately). Every throughput is also reported as a ratio to Spark native, measured in the same
run, because the machine is shared and noisy. Every driver (JVM) first runs its system once over a small
warm-up topic (4k tuples): the first micro-batch of a fresh JVM took 7-8 s here against ~1 s warm (JIT,
Python workers, pandas/pyarrow, RocksDB), which would otherwise swamp every figure; that cold start is
reported on its own. Failure-free throughputs are the best of --repeats runs (default 2, --quick 1); CEC
attached runs once.

1. Spark native, as a Spark user writes it (the default, `--native-io kafka`): Spark's own Kafka source
   (`readStream.format("kafka")`, the connector from `make spark-kafka-jars`) over the JSON twin of the
   purchases topic (the same tuples, one JSON object per record, same partitions) -> from_json ->
   `groupBy(item_id).applyInPandasWithState(count-window average)` with Spark's own state checkpoints
   (RocksDB state store provider with changelog checkpointing, a checkpointLocation) -> a Kafka sink (JSON
   rows; at-least-once, so the results are read back deduplicated by (item, window) and the rows written
   twice are counted). `--native-io cec`: the earlier baseline, `readStream.format("cec-kafka")` over the
   cec queue and a foreachBatch sink (counts results, sums their values). Trigger.AvailableNow, shuffle
   partitions = P.
   Two micro-batch plans, in one driver process of their own: `maxRecordsPerTrigger` = input / --batches
   (the plan the recovery run uses; the ratio baseline), and one batch with everything (Spark's best case).
2. CEC long-running host: `SparkOperatorHost` (chained mode, local[P,4]), the aggregate stage (G-open
   footprints only) reading the purchases topic through a queue source, output log and index on Kafka;
   `host.run()` wall time. Plus CEC's local engine (`run_job` per partition, in this process, one after the
   other, no Spark) as a reference point.
3. CEC attached: `operators.spark.attach.cec_aggregate` (transformWithStateInPandas), AvailableNow, the same
   micro-batch plan as Spark native, in the CEC session; over the cec queue, or with `--focus attached
   --attached-readers spark-kafka,python` over the JSON twin through each input reader
   (`cec_aggregate(input_reader=...)`), one attached system per reader, interleaved with Spark native. `run_attached` is the hook: it raises
   NotImplementedError when that module is not importable, and the output then says why there is no figure.
4. Recovery after a kill at half the input.
   - CEC host: partition 0's Python worker is SIGKILLed (pid file, as tests/operators/spark/test_host.py does) halfway
     through its processing, timed from the failure-free run just before (why time and not the log: see
     `_HostKiller`); the durable input position at the crash is reported. Spark relaunches the task, which
     recovers from its log. Reported: the relaunched instance's own report
     (EC build, EC load, replay, recovery_seconds), the relaunch latency (kill -> new attempt's pid file),
     and the overhead of the whole run's wall time over the failure-free host run (the --repeats failure-free
     and killed runs alternate; their means are compared).
   - Spark native: the driver process (its whole process group: driver, JVM and Python workers) is
     SIGKILLed as soon as the micro-batch that completes half the input has committed
     (`<checkpoint>/commits/<k>` exists); a new driver process (warm-up query first) restarts the same
     query from the checkpoint and runs it to the end. Reported: recovery_seconds = the restarted query's
     wall time (start() -> all input processed) minus the processing time (triggerExecution) of the batches
     after k in the first failure-free plan run (which, like the killed and restarted queries, ran right
     after the warm-up only), i.e. query restart, state store load from the checkpoint and slower first
     batches; what a cold restarted driver pays on top (session start + cold start) is given beside it; and
     the total overhead = (query start -> kill) + restarted wall - that failure-free run's wall.
   The two faults differ on purpose (what each design is built to survive): CEC's unit of failure is one
   long-running task; Spark's state checkpoint is what a restarted driver/query resumes from (a failed task
   is retried within its micro-batch from the previous state version). The JSON's "definitions" say
   exactly what each figure is.

Every run's results are checked against CEC's local engine: the same number of window results and the
same sum of averages (Spark native, CEC host, CEC attached, and the recovered runs: for Spark native, the
sink's output per batch id, a batch re-run after the restart counted once).

    .venv/bin/python benchmarks/bench_spark.py            # 200k tuples, 2,000 keys, P=2: ~4-5 minutes
    .venv/bin/python benchmarks/bench_spark.py --quick    # 50k tuples, 500 keys: ~2-2.5 minutes
    .venv/bin/python benchmarks/bench_spark.py --tuples 400000 --keys 4000 --partitions 2 --batches 4 --repeats 3
    # Spark's Kafka connector section of RESULTS.md: CEC attached through both input readers vs Spark native
    # (Kafka source and sink, RocksDB + changelog checkpointing), throughput and driver-kill recovery, one run
    .venv/bin/python benchmarks/bench_spark.py --focus attached --attached-readers spark-kafka,python --keys 100000 --tuples 100000 --repeats 1 --recovery-target 10s
    # the same throughput before and after a code change, in one interleaved run: each attached system also
    # runs from a second tree (a `git archive` snapshot with the C extension copied in), after / before per repeat
    .venv/bin/python benchmarks/bench_spark.py --focus attached --attached-readers spark-kafka,python --keys 100000 --tuples 100000 --repeats 3 --skip-recovery --before-tree /tmp/before
    # the same in CPU seconds of each driver's whole process tree (driver, JVM, Spark's Python processes),
    # with Spark's per-stage task metrics per micro-batch from each driver's event log and the output logs'
    # volume; --skip-native leaves Spark native out (after / before only)
    .venv/bin/python benchmarks/bench_spark.py --focus attached --attached-readers spark-kafka,python --keys 100000 --tuples 100000 --repeats 3 --skip-recovery --before-tree /tmp/before --cpu-seconds [--skip-native]
Writes benchmarks/out/spark.json and benchmarks/spark.png. Progress on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: the repo's packages and tests/brokers.py
    sys.path.insert(0, str(ROOT))

from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle  # noqa: E402

from operators.aggregate import RESULT_SCHEMA  # noqa: E402
from operators.job import JobSpec, instance_spec, run_job  # noqa: E402
from operators.sinks import iter_payloads  # noqa: E402
from operators.sources import PurchaseGenerator  # noqa: E402
from queuestore.factory import open_store  # noqa: E402

sys.path.append(str(ROOT / "benchmarks"))  # spark_trace beside this script, behind the tree's packages
from bytecode import compile_tree  # noqa: E402
from spark_trace import cpu_delta, event_log_conf, progress_window, stage_summary, tree_cpu  # noqa: E402

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery
    from pyspark.sql.streaming.state import GroupState

__all__ = [
    "KillMissedError",
    "Workload",
    "main",
    "make_native_function",
    "measure_cec_host",
    "measure_cec_local",
    "measure_cec_on_spark",
    "measure_native",
    "measure_native_recovery",
    "run_attached",
]

OUT_JSON = ROOT / "benchmarks" / "out" / "spark.json"
OUT_PNG = ROOT / "benchmarks" / "spark.png"
WINDOW = 10
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
CHANGELOG_CONF = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
CHILD_TIMEOUT_S = 1800.0  # a hang guard: at load ~20 on 2 cores one driver took over 5 minutes
# Every driver (JVM) first runs its system over this many tuples of a separate topic: the first micro-batch
# of a fresh JVM took 7-8 s here (JIT, Python workers, pandas/pyarrow imports, RocksDB) against ~1 s warm,
# which would otherwise dominate every throughput. The cold start is reported on its own.
WARMUP_TUPLES = 4_000
# Spark's per-task attempt budget in local mode (`local[N,F]`): a killed long-running task is relaunched.
TASK_ATTEMPTS = 4


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Workload:
    """One run's input and where it lives; every system reads `input_topic`."""

    tuples: int
    keys: int
    partitions: int
    batches: int  # micro-batches of the Spark plans (maxRecordsPerTrigger = offsets / batches)
    bootstrap: str
    work: Path  # scratch: Kafka store state (indexes, locks), Spark checkpoints, child logs
    input_topic: str
    repeats: int = 1  # failure-free runs per system (best taken) and kill runs of the CEC host
    attached_writers: str = "executors"  # cec_aggregate(writers=...): who writes the attached output logs
    recovery_target: str | None = None  # cec_aggregate(checkpointing=Checkpointing(recovery_target=...))
    # cec_aggregate(checkpointing=Checkpointing.gopen_only()) where the tree has it (a tree from before the
    # default checkpointing writes G-opens only anyway): both trees of --before-tree do the same work.
    gopen_only: bool = False
    # --attached-resume (--recovery-only): each attached system also runs with
    # cec_aggregate(resume_checkpoint=True) as "<system>_resume", whose restart resumes Spark's checkpoint
    attached_resume: bool = False
    # --checkpoint-deleted (--recovery-only): every system's Spark checkpoint directory is deleted between
    # the kill and the restart (Spark native then starts a new query without state; CEC recovers from the logs)
    checkpoint_deleted: bool = False
    offsets: int = 0  # the input topic's end offsets summed (records, EOS and transaction markers); 0: unread
    tws_baseline: bool = False  # --focus attached: also Spark native under transformWithStateInPandas
    # Spark native's input and output: "kafka" (Spark's Kafka source over the JSON twin of the input, a Kafka
    # sink: what a Spark user writes; the default) or "cec" (the cec-kafka source, a foreachBatch sink).
    native_io: str = "kafka"
    # cec_aggregate over the JSON twin with these input readers (operators.spark.kafka_input), one attached
    # system each; () = one attached system over the cec queue itself (input_format="cec").
    attached_readers: tuple[str, ...] = ()
    # --before-tree: a second source tree whose attached systems run in the same interleaved loop (each
    # attached system once from each tree per repeat), for a before/after of a code change in one run.
    before_tree: Path | None = None
    # --cpu-seconds: each driver reports its process tree's CPU seconds per query and Spark's per-stage task
    # metrics (benchmarks/spark_trace.py); --skip-native (with --before-tree): no Spark native runs.
    cpu_seconds: bool = False
    skip_native: bool = False

    @property
    def master(self) -> str:
        # P task slots: the host's chained mode holds one long-running task per partition.
        return f"local[{self.partitions},{TASK_ATTEMPTS}]"

    @property
    def sizes(self) -> list[int]:
        return PurchaseGenerator(self.tuples, self.keys, partitions=self.partitions).sizes

    @property
    def batch_rows(self) -> int:
        # Offsets, not rows: each partition also holds its EOS record and its writers' transaction markers,
        # which the data source skips but counts. Rounded up, so that exactly `batches` micro-batches cover
        # the topic (a trailing micro-batch of a few rows would add one batch's fixed cost to every plan).
        offsets = self.offsets or self.tuples + self.partitions
        return -(-offsets // self.batches)

    @property
    def json_topic(self) -> str:
        """The input's JSON twin: the same tuples, one JSON object per record, in the same partitions."""
        return self.input_topic + "-json"

    @property
    def json_batch_rows(self) -> int:
        # A plain producer's topic: offsets are the tuples, no EOS, no markers.
        return -(-self.tuples // self.batches)

    def warmup(self) -> Workload:
        """A small input of its own that each driver runs through first (see `WARMUP_TUPLES`)."""
        return replace(
            self,
            tuples=WARMUP_TUPLES,
            keys=min(self.keys, 200),
            input_topic=self.input_topic + "-warmup",
            offsets=0,
        )

    def store(self, name: str) -> dict[str, Any]:
        """A Kafka queue-store spec with its own local state directory (stream indexes, writer locks)."""
        return {"type": "kafka", "bootstrap_servers": self.bootstrap, "state_dir": str(self.work / name)}


# -- input and the reference ------------------------------------------------------------------------------


def write_input(w: Workload) -> dict[str, Any]:
    """A purchases topic: a pass-all filter (every generated price is 1..1000) writes each generator
    partition as CEC R records plus EOS, which is what an upstream CEC stage hands the aggregate."""
    template = JobSpec(
        operator={"type": "filter", "field": "item_price", "op": ">", "value": 0, "schema": "purchase"},
        source={
            "type": "generator",
            "count": w.tuples,
            "keys": w.keys,
            "seed": 42,
            "partitions": w.partitions,
        },
        store=w.store("input"),
        output_topic=w.input_topic,
        output_partitions=w.partitions,
        batch_size=1024,
    )
    started = time.perf_counter()
    written = 0
    for p in range(w.partitions):
        stats = run_job(instance_spec(template, p))
        assert stats.completed, p
        written += stats.results
    seconds = time.perf_counter() - started
    assert written == w.tuples, (written, w.tuples)
    return {"tuples": written, "seconds": seconds, "tuples_per_s": written / seconds}


def write_json_input(w: Workload) -> dict[str, Any]:
    """The JSON twin of the purchases topic (`Workload.json_topic`): each generated tuple as a JSON object,
    in its generator partition, in order, by a plain idempotent producer (what Spark users read)."""
    from confluent_kafka import Producer

    from tests.topic_data import create_topic

    create_topic(w.bootstrap, w.json_topic, w.partitions)
    gen = PurchaseGenerator(w.tuples, w.keys, seed=42, partitions=w.partitions)
    producer = Producer(
        {"bootstrap.servers": w.bootstrap, "linger.ms": 20, "enable.idempotence": True, "batch.size": 1 << 20}
    )
    started = time.perf_counter()
    dumps = json.dumps
    for j, size in enumerate(gen.sizes):
        for o in range(size):
            while True:
                try:
                    producer.produce(w.json_topic, dumps(gen.tuple_at(j, o)).encode(), partition=j)
                    break
                except BufferError:
                    producer.poll(0.05)
    assert producer.flush(120) == 0
    return {"tuples": w.tuples, "seconds": time.perf_counter() - started}


def kafka_sink_digest(bootstrap: str, topic: str) -> dict[str, Any]:
    """Spark native's Kafka sink output (JSON rows item_id, window, value): window results counted once
    per (item, window), as a reader that deduplicates would (the sink is at-least-once: a micro-batch re-run
    after a restart writes its rows again), with the rows written twice counted beside them."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = len(admin.list_topics(timeout=30).topics[topic].partitions)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"digest-{uuid.uuid4().hex}",
            "enable.partition.eof": True,
        }
    )
    seen: dict[tuple[int, int], float] = {}
    rows = 0
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        ended: set[int] = set()
        deadline = time.monotonic() + 300
        while len(ended) < partitions and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 0.5):
                if msg.error() is not None:
                    ended.add(msg.partition())  # PARTITION_EOF (the topic is not being written)
                    continue
                row = json.loads(msg.value())
                rows += 1
                seen[(int(row["item_id"]), int(row["window"]))] = float(row["value"])
    finally:
        consumer.close()
    return {
        "results": len(seen),
        "value_sum": sum(seen.values()),
        "rows_written": rows,
        "duplicates": rows - len(seen),
    }


def log_volume(bootstrap: str, topic: str) -> dict[str, int]:
    """An output log's committed messages and their key + value bytes (read_committed), all partitions."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = len(admin.list_topics(timeout=30).topics[topic].partitions)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"volume-{uuid.uuid4().hex}",
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    messages = size = 0
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        ended: set[int] = set()
        deadline = time.monotonic() + 300
        while len(ended) < partitions and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 0.5):
                if msg.error() is not None:
                    ended.add(msg.partition())
                    continue
                messages += 1
                size += len(msg.value() or b"") + len(msg.key() or b"")
    finally:
        consumer.close()
    return {"log_messages": messages, "log_bytes": size}


def input_offsets(w: Workload) -> int:
    """The input topic's end offsets, summed over its partitions (what `maxRecordsPerTrigger` counts)."""
    from queuestore.kafka import KafkaQueueStore

    store = KafkaQueueStore(w.bootstrap, w.work / "offsets")
    try:
        total = 0
        for p in range(w.partitions):
            with store.reader(w.input_topic, p) as reader:
                total += reader.end_offset()
        return total
    finally:
        store.close()


def _aggregate_spec(w: Workload, store: dict[str, Any], topic: str) -> JobSpec:
    """The CEC aggregate stage over the purchases topic: G-open footprints only (the JobSpec defaults'
    policy), as in bench_recovery's reference runs."""
    return JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "avg",
            "window_count": WINDOW,
        },
        source={"type": "queue", "topic": w.input_topic, "schema": "purchase"},
        store=store,
        output_topic=topic,
        output_partitions=w.partitions,
        batch_size=512,
    )


def result_digest(store_spec: dict[str, Any], topic: str) -> dict[str, Any]:
    """Window results in a CEC log (any generation layout is the caller's business): count and value sum."""
    store = open_store(store_spec)
    try:
        count, total = 0, 0.0
        for row in iter_payloads(store, topic, RESULT_SCHEMA):
            count += 1
            total += float(row["value"])
        return {"results": count, "value_sum": total}
    finally:
        store.close()


def _same(digest: dict[str, Any], reference: dict[str, Any]) -> bool:
    return digest["results"] == reference["results"] and math.isclose(
        digest["value_sum"], reference["value_sum"], rel_tol=1e-9
    )


def measure_cec_local(w: Workload) -> dict[str, Any]:
    """CEC's local engine: each partition's instance in this process, one after the other (one core);
    best of `repeats` runs, each writing its own output topic."""
    runs: list[dict[str, Any]] = []
    for _ in range(w.repeats):
        topic = f"agg-local-{uuid.uuid4().hex[:6]}"
        template = _aggregate_spec(w, w.store("local"), topic)
        started = time.perf_counter()
        stats = [run_job(instance_spec(template, p)) for p in range(w.partitions)]
        seconds = time.perf_counter() - started
        assert all(s.completed for s in stats)
        runs.append(
            {
                "seconds": seconds,
                "tuples_per_s": w.tuples / seconds,
                "gopens": sum(s.gopens for s in stats),
                **result_digest(template.store, topic),
            }
        )
    best = dict(min(runs, key=lambda r: r["seconds"]))
    best["runs_seconds"] = [r["seconds"] for r in runs]
    return best


# -- Spark native ----------------------------------------------------------------------------------------


def count_windows(
    key: tuple[Any, ...], frames: list[pd.DataFrame], stored: Any, window: int
) -> tuple[pd.DataFrame, tuple[int, int, float]]:
    """One key's micro-batch under the native count-window average: its results and the state to keep,
    (next window, tuples in the open window, their sum); `stored` is that state (None: the key is new)."""
    import pandas as pd

    seq, n, total = (0, 0, 0.0) if stored is None else (int(stored[0]), int(stored[1]), float(stored[2]))
    batch = pd.concat(frames) if len(frames) > 1 else frames[0]
    # Input order within a key: the shuffle does not promise it, CEC's per-partition order does; the offset
    # restores it (each key lives in one input partition), so both systems form the same windows.
    prices = batch.sort_values("cec_offset")["item_price"].tolist()
    windows: list[int] = []
    values: list[float] = []
    for price in prices:
        n += 1
        total += price
        if n == window:
            windows.append(seq)
            values.append(total / n)
            seq, n, total = seq + 1, 0, 0.0
    item = int(key[0])
    results = pd.DataFrame({"item_id": [item] * len(windows), "window": windows, "value": values})
    return results, (seq, n, total)


def make_native_function(
    window: int,
) -> Callable[[tuple[Any, ...], Iterator[pd.DataFrame], GroupState], Iterator[pd.DataFrame]]:
    """The count-window average as an applyInPandasWithState function; state = (next window, tuples in
    the open window, their sum). A closure (not a global), so that the window size travels with it."""

    def count_window_avg(
        key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        results, kept = count_windows(key, list(frames), state.get if state.exists else None, window)
        state.update(kept)
        yield results

    return count_window_avg


class NativeCountWindowAvg(StatefulProcessor):
    """The same count-window average under transformWithStateInPandas (the API the attached operator runs
    on: timers, initial state): per key a ValueState (next window, tuples in the open window, their sum)."""

    def __init__(self, window: int) -> None:
        self.window = window

    def init(self, handle: StatefulProcessorHandle) -> None:
        from pyspark.sql.types import DoubleType, LongType, StructField, StructType

        schema = StructType(
            [
                StructField("seq", LongType(), False),
                StructField("n", LongType(), False),
                StructField("total", DoubleType(), False),
            ]
        )
        self.state = handle.getValueState("window", schema)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        results, kept = count_windows(key, list(rows), self.state.get(), self.window)
        self.state.update(kept)
        yield results

    def close(self) -> None:
        pass


def purchases_stream(
    spark: SparkSession, topic: str, bootstrap: str, state_dir: str, batch_rows: int | None
) -> Any:
    """The purchases topic as a streaming DataFrame through the `cec-kafka` source (what Spark native
    reads; `batch_rows`: maxRecordsPerTrigger, None for all of it in one micro-batch)."""
    from operators.spark.datasource import FORMAT

    reader = (
        spark.readStream.format(FORMAT)
        .option("topic", topic)
        .option("bootstrap.servers", bootstrap)
        .option("schema", "purchase")
        .option("stateDir", state_dir)
    )
    if batch_rows:
        reader = reader.option("maxRecordsPerTrigger", str(batch_rows))
    return reader.load().select("cec_offset", "item_id", "item_price")


def kafka_purchases_stream(spark: SparkSession, topic: str, bootstrap: str, batch_rows: int | None) -> Any:
    """The JSON purchases topic through Spark's own Kafka source, as a Spark user reads it: from_json of
    the value, the record's offset beside it (the count windows follow each key's order in its partition)."""
    from pyspark.sql import functions as F

    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    if batch_rows:
        reader = reader.option("maxOffsetsPerTrigger", str(batch_rows))
    purchase = F.from_json(F.col("value").cast("string"), "item_id long, item_price long, item_time long")
    return (
        reader.load()
        .select(F.col("offset").alias("cec_offset"), purchase.alias("p"))
        .select("cec_offset", "p.item_id", "p.item_price")
    )


def _native_query(spark: SparkSession, spec: dict[str, Any], progress: Path) -> StreamingQuery:
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    kafka_io = spec.get("io") == "kafka"
    if kafka_io:
        rows = kafka_purchases_stream(spark, spec["json_topic"], spec["bootstrap"], spec["batch_rows"])
    else:
        rows = purchases_stream(
            spark, spec["topic"], spec["bootstrap"], spec["state_dir"], spec["batch_rows"]
        )
    if spec.get("api") == "tws":
        results = rows.groupBy("item_id").transformWithStateInPandas(
            statefulProcessor=NativeCountWindowAvg(spec["window"]),
            outputStructType="item_id long, window long, value double",
            outputMode="Append",
            timeMode="None",
        )
    else:
        results = rows.groupBy("item_id").applyInPandasWithState(
            make_native_function(spec["window"]),
            outputStructType="item_id long, window long, value double",
            stateStructType="seq long, n long, total double",
            outputMode="append",
            timeoutConf=GroupStateTimeout.NoTimeout,
        )
    name = spec["name"]
    if kafka_io:  # a Kafka sink, JSON rows (at-least-once: a batch re-run after a restart is written again)
        out = results.select(
            F.col("item_id").cast("string").alias("key"),
            F.to_json(F.struct("item_id", "window", "value")).alias("value"),
        )
        return (
            out.writeStream.format("kafka")
            .option("kafka.bootstrap.servers", spec["bootstrap"])
            .option("topic", spec["output"])
            .option("checkpointLocation", spec["checkpoint"])
            .queryName(name)
            .trigger(availableNow=True)
            .start()
        )

    def sink(df: Any, batch_id: int) -> None:
        # One action per batch (a second one would run the stateful operator twice).
        row = df.agg(F.count(F.lit(1)).alias("n"), F.sum("value").alias("s")).collect()[0]
        line = {
            "event": "batch",
            "query": name,
            "batch": batch_id,
            "results": row["n"],
            "sum": row["s"] or 0.0,
        }
        with progress.open("a") as f:
            f.write(json.dumps(line) + "\n")

    return (
        results.writeStream.foreachBatch(sink)
        .option("checkpointLocation", spec["checkpoint"])
        .queryName(name)
        .trigger(availableNow=True)
        .start()
    )


def _progress_rows(query: StreamingQuery) -> list[dict[str, Any]]:
    rows = []
    # The progress as the query hands it out: CEC attached's handle counts input tuples (its source packs
    # them into a few rows per state partition, which is what Spark's own JSON counts).
    for p in query.recentProgress:
        d = _progress_json(p)
        state = (d.get("stateOperators") or [{}])[0]
        rows.append(
            {
                "batch": d["batchId"],
                "rows": d.get("numInputRows", 0),
                "trigger_ms": d.get("durationMs", {}).get("triggerExecution", 0),
                "duration_ms": d.get("durationMs", {}),
                "state_rows": state.get("numRowsTotal"),
                "state_commit_ms": state.get("commitTimeMs"),
            }
        )
    return rows


def native_child(args_path: Path) -> int:
    """A Spark driver process running the native queries listed in ARGS (hidden `--native-child` mode): the
    process the recovery measurement SIGKILLs. Writes a result JSON after each query ends."""
    from operators.spark.datasource import register
    from operators.spark.session import local_session

    args = json.loads(args_path.read_text())
    progress, result_path = Path(args["progress"]), Path(args["result"])
    started = time.perf_counter()
    # --cpu-seconds: the process tree's CPU seconds per query and Spark's event log (benchmarks/spark_trace.py)
    trace_dir = Path(args["trace"]) if args.get("trace") else None
    cpu_at_start = tree_cpu() if trace_dir else {}
    # Spark's recommended state store configuration: RocksDB with changelog checkpointing.
    conf = {PROVIDER_CONF: ROCKSDB_PROVIDER, CHANGELOG_CONF: "true"}
    if trace_dir is not None:
        conf.update(event_log_conf(trace_dir / "events"))
    spark = local_session(
        args["master"],
        app_name="bench-spark-native",
        shuffle_partitions=args["partitions"],  # = state partitions; Spark's default 200 is absurd here
        extra_conf=conf,
    )
    register(spark)
    out: dict[str, Any] = {"session_seconds": time.perf_counter() - started, "queries": []}
    # Which source tree this driver and its Python workers import (--before-tree runs two trees).
    out["code_tree"] = _code_tree()
    out["worker_code_tree"] = spark.sparkContext.parallelize([0], 1).map(lambda _: _code_tree()).collect()[0]
    sink_profile = _profile_attached_sink() if args.get("profile") else None
    out["conf"] = {key: spark.conf.get(key, None) for key in (PROVIDER_CONF, CHANGELOG_CONF, "spark.jars")}
    if trace_dir is not None:
        out["cpu_session_start"] = cpu_delta(cpu_at_start, tree_cpu())
    windows: dict[str, list[tuple[int, float, float]]] = {}
    for spec in args["queries"]:
        with progress.open("a") as f:
            f.write(json.dumps({"event": "start", "query": spec["name"], "t": time.time()}) + "\n")
        cpu_before = tree_cpu() if trace_dir is not None else {}
        begin = time.perf_counter()
        extra: dict[str, Any] = {}
        if spec.get("system") == "attached":
            attached = _attached_query(spark, spec)
            query = _streaming_query(attached)
            extra["recovery"] = _recovery_summary(attached)
            extra["start_seconds"] = time.perf_counter() - begin  # cec_aggregate(): recovery planning + start
        else:
            attached, query = None, _native_query(spark, spec, progress)
        query.awaitTermination()
        wall = time.perf_counter() - begin
        if trace_dir is not None:
            extra["cpu"] = cpu_delta(cpu_before, tree_cpu())
            windows[spec["name"]] = [
                (int(p["batchId"]), *progress_window(p)) for p in map(_progress_json, query.recentProgress)
            ]
        if query.exception() is not None:
            raise RuntimeError(f"query {spec['name']} failed: {query.exception()}")
        if attached is not None:
            with contextlib.suppress(Exception):  # older handles have no cec_progress
                # What the start replayed and its G-checks (the progress's CEC figures), for the report.
                extra["cec_recovery"] = attached.cec_progress["recovery"]
                extra["cec_gchecks"] = attached.cec_progress["gchecks"]
                extra["cec_records"] = attached.cec_progress["records"]
            sink = getattr(attached, "_sink", None)
            if sink is not None and hasattr(sink, "write_tasks"):
                # Executor writers: how many write tasks appended through their worker's kept writer.
                extra["write_tasks"] = {"tasks": sink.write_tasks, "reused": sink.reused, "found": sink.found}
                # Everything the driver collected from the write tasks (summaries and control rows).
                extra["write_tasks"]["summary_rows"] = getattr(sink, "summary_rows", None)
            with contextlib.suppress(Exception):
                attached.stop()  # closes its output writers
        if sink_profile is not None and attached is not None:
            extra["driver_sink"] = sink_profile.report()
        out["queries"].append(
            {
                "name": spec["name"],
                "wall_seconds": wall,
                "progress": _progress_rows(attached if attached is not None else query),
                **extra,
            }
        )
        _write_result(result_path, out)
    spark.stop()
    if trace_dir is not None:  # the event log is complete once the context stopped
        out["stages"] = stage_summary(trace_dir / "events", windows)
        _write_result(result_path, out)
    return 0


def _write_result(path: Path, out: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(path)


def _progress_json(p: Any) -> dict[str, Any]:
    """A StreamingQueryProgress as its JSON dict (older PySpark hands out dicts)."""
    if isinstance(p, dict):
        return dict(p)
    raw = p.json() if callable(p.json) else p.json
    return dict(json.loads(raw))


def _code_tree() -> str:
    """The source tree whose `operators` package this process imports."""
    import operators

    return str(Path(operators.__file__).resolve().parent.parent)


class _SinkProfile:
    """Where the attached query's driver-side sink (foreachBatch, operators.spark.sink.CecSink) spends its
    time: cProfile around each call, in the Py4J callback thread that runs it. `toArrow()` there is also
    where the micro-batch itself executes (the batch DataFrame is lazy), so its cumulative time is the
    executors' work seen from the driver; everything else is driver-side Python."""

    def __init__(self) -> None:
        import cProfile

        self.profile = cProfile.Profile()
        self.calls = 0
        self.seconds = 0.0

    def wrap(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed(sink: Any, *args: Any) -> Any:
            begin = time.perf_counter()
            self.profile.enable()
            try:
                return call(sink, *args)
            finally:
                self.profile.disable()
                self.calls += 1
                self.seconds += time.perf_counter() - begin

        return timed

    def report(self, top: int = 25) -> dict[str, Any]:
        import io
        import pstats

        text = io.StringIO()
        stats = pstats.Stats(self.profile, stream=text)
        stats.sort_stats("cumulative").print_stats(top)
        rows = {}
        for (file, line, func), (_cc, _nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
            rows[f"{Path(file).name}:{line}:{func}"] = (tt, ct)
        by_name = {k: {"self_s": v[0], "cumulative_s": v[1]} for k, v in rows.items()}
        # The outermost toArrow (nested ones are inside it): the micro-batch execution seen from the driver.
        arrow = max((v[1] for k, v in rows.items() if k.endswith(":toArrow")), default=0.0)
        out = {
            "calls": self.calls,
            "seconds": self.seconds,
            "toArrow_cumulative_s": arrow,
            "driver_python_s": self.seconds - arrow,
            "top_cumulative": text.getvalue().splitlines()[:60],
            "functions": dict(sorted(by_name.items(), key=lambda kv: -kv[1]["cumulative_s"])[:40]),
        }
        self.profile = __import__("cProfile").Profile()
        self.calls, self.seconds = 0, 0.0
        return out


def _profile_attached_sink() -> _SinkProfile | None:
    """Patch the attached sink's __call__ in this driver process (benchmark only; None if there is no
    driver-side sink in this version of operators.spark)."""
    try:
        from operators.spark.sink import CecSink
    except ImportError:
        return None
    profile = _SinkProfile()
    CecSink.__call__ = profile.wrap(CecSink.__call__)  # type: ignore[method-assign]
    return profile


def _attached_query(spark: SparkSession, spec: dict[str, Any]) -> Any:
    """`cec_aggregate` over the purchases topic, Trigger.AvailableNow, Spark native's micro-batch plan."""
    from operators.spark.attach import cec_aggregate

    kwargs: dict[str, Any] = dict(
        input_topic=spec["topic"], bootstrap_servers=spec["bootstrap"], output_topic=spec["output"],
        key="item_id", value="item_price", agg="avg", window_count=spec["window"],
        state_dir=spec["state_dir"], checkpoint_location=spec["checkpoint"], partitions=spec["partitions"],
        available_now=True, writers=spec.get("writers", "executors"),
    )  # fmt: skip
    if spec.get("input_format"):
        kwargs.update(input_format=spec["input_format"], input_reader=spec["input_reader"])
    if spec.get("recovery_target"):
        from cec.config import Checkpointing

        kwargs["checkpointing"] = Checkpointing(recovery_target=spec["recovery_target"])
    elif spec.get("gopen_only"):
        from cec.config import Checkpointing

        if hasattr(Checkpointing, "gopen_only"):
            kwargs["checkpointing"] = Checkpointing.gopen_only()
    if spec["batch_rows"]:
        kwargs["max_records_per_trigger"] = spec["batch_rows"]
    if "trim_every" in inspect.signature(cec_aggregate).parameters:
        kwargs["trim_every"] = None  # never, in every tree: `log_volume` reads the whole log after the run
    if "resume_checkpoint" in inspect.signature(cec_aggregate).parameters:
        # Explicit either way: the log-path system must not take the default (resume, since issue 26) and
        # a tree from before the keyword never sees it.
        kwargs["resume_checkpoint"] = bool(spec.get("resume_checkpoint"))
    return cec_aggregate(spark, **kwargs)


def _streaming_query(attached: Any) -> StreamingQuery:
    """The Spark StreamingQuery behind an attached handle (older handles wrap it as `.query`; newer ones
    are StreamingQuery-compatible themselves)."""
    inner = getattr(attached, "query", None)
    return inner if inner is not None and hasattr(inner, "recentProgress") else attached


def _recovery_summary(attached: Any) -> dict[str, Any]:
    """What the attached start found in its logs (field names as operators.spark.attach has them)."""
    rec = getattr(attached, "recovery", None)
    if rec is None:
        return {}
    out: dict[str, Any] = {}
    for name in ("resumed", "ec_windows", "closed_keys", "records_read", "seconds", "start", "driver_rows"):
        value = getattr(rec, name, None)
        if value is not None:
            out[name] = list(value) if isinstance(value, tuple) else value
    return out


@dataclass
class _Child:
    proc: subprocess.Popen[bytes]
    progress: Path
    result: Path
    log: Path

    def fail(self, what: str) -> RuntimeError:
        tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
        return RuntimeError(f"{what} (exit {self.proc.returncode}); log tail:\n{tail}")

    def wait(self) -> dict[str, Any]:
        try:
            rc = self.proc.wait(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise self.fail("native driver timed out") from None
        if rc != 0:
            raise self.fail("native driver failed")
        return dict(json.loads(self.result.read_text()))

    def kill(self) -> None:
        # Its own process group (start_new_session): the driver, its JVM and the JVM's Python workers.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)

    def events(self) -> list[dict[str, Any]]:
        if not self.progress.exists():
            return []
        return [json.loads(line) for line in self.progress.read_text().splitlines() if line.strip()]


def _spawn_native(
    w: Workload, name: str, queries: list[dict[str, Any]], profile: bool = False, tree: Path | None = None
) -> _Child:
    """A driver process running `queries`, importing the packages of `tree` (default: this checkout)."""
    d = w.work / "native" / name
    d.mkdir(parents=True, exist_ok=True)
    args = {
        "master": w.master,
        "partitions": w.partitions,
        "queries": queries,
        "progress": str(d / "progress.jsonl"),
        "result": str(d / "result.json"),
        "profile": profile,
        "trace": str(d / "trace") if w.cpu_seconds else None,
    }
    shutil.rmtree(d / "trace", ignore_errors=True)
    (d / "args.json").write_text(json.dumps(args))
    # A name is spawned once per repeat: a fresh progress file, so that events() holds this driver's
    # events only (appended to, the kill's time counted from the first repeat's query start).
    (d / "progress.jsonl").unlink(missing_ok=True)
    env = dict(os.environ)
    code = tree or ROOT
    # The tree's packages first. ROOT stays on the path behind it (this script, run as the child, inserts
    # ROOT first only when it is missing); the working directory is the tree too, as Spark starts its Python
    # workers with `python -m pyspark.daemon`, which puts the working directory first on their path.
    paths = [str(code), *([str(ROOT)] if tree else [])]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    log = d / "driver.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--native-child", str(d / "args.json")],
            env=env,
            cwd=code,
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return _Child(proc, d / "progress.jsonl", d / "result.json", log)


def _native_query_spec(w: Workload, name: str, batch_rows: int | None) -> dict[str, Any]:
    spec = {
        "name": name,
        "io": w.native_io,
        "topic": w.input_topic,
        "bootstrap": w.bootstrap,
        "window": WINDOW,
        "batch_rows": batch_rows,
        "checkpoint": str(w.work / "checkpoints" / f"{name}-{uuid.uuid4().hex[:6]}"),
        "state_dir": str(w.work / "source-state"),
    }
    if w.native_io == "kafka":
        from tests.topic_data import create_topic

        # The same plan over the JSON twin (its offsets are the tuples), results to a topic of its own.
        spec["json_topic"] = w.json_topic
        spec["batch_rows"] = w.json_batch_rows if batch_rows else None
        spec["output"] = f"native-{name}-{uuid.uuid4().hex[:6]}"
        create_topic(w.bootstrap, spec["output"], w.partitions)
    return spec


def _native_digest(spec: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    """The window results a native run produced: from its output topic (Kafka sink) or from what its
    foreachBatch sink saw."""
    if spec.get("io") == "kafka":
        return kafka_sink_digest(spec["bootstrap"], spec["output"])
    return _batch_digest(events, spec["name"])


def _batch_digest(events: list[dict[str, Any]], query: str) -> dict[str, Any]:
    """Results the sink saw, one entry per batch id (a batch re-run after a restart replaces its first
    run, as the restarted sink output would be deduplicated by batch id)."""
    per_batch: dict[int, tuple[int, float]] = {}
    for e in events:
        if e.get("event") == "batch" and e["query"] == query:
            per_batch[e["batch"]] = (int(e["results"]), float(e["sum"]))
    return {
        "results": sum(n for n, _ in per_batch.values()),
        "value_sum": sum(s for _, s in per_batch.values()),
    }


def _native_run_row(w: Workload, q: dict[str, Any], digest: dict[str, Any]) -> dict[str, Any]:
    return {
        "wall_seconds": q["wall_seconds"],
        "tuples_per_s": w.tuples / q["wall_seconds"],
        "batches": len([p for p in q["progress"] if p["rows"]]),
        "processing_seconds": sum(p["trigger_ms"] for p in q["progress"]) / 1000,
        "progress": q["progress"],
        **digest,
    }


def _median(values: list[float]) -> float:
    """The median, NaN for no values (no Spark native runs: --skip-native)."""
    return statistics.median(values) if values else math.nan


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _query(result: dict[str, Any], name: str) -> dict[str, Any]:
    return next(q for q in result["queries"] if q["name"] == name)


def measure_native(w: Workload, one_batch: bool = True) -> dict[str, Any]:
    """Failure-free Spark native runs in one fresh driver process: the warm-up query, then `repeats` runs of
    the micro-batch plan (the ratio baseline), then `repeats` runs with everything in one batch (Spark's
    best case); each run has its own checkpoint. Throughput: the best run; every run is kept."""
    warm = _native_query_spec(w.warmup(), "warmup", None)
    plans = [_native_query_spec(w, f"native_plan.{i}", w.batch_rows) for i in range(w.repeats)]
    ones = (
        [_native_query_spec(w, f"native_one_batch.{i}", None) for i in range(w.repeats)] if one_batch else []
    )
    child = _spawn_native(w, "failure_free", [warm, *plans, *ones])
    result = child.wait()
    out: dict[str, Any] = {
        "session_seconds": result["session_seconds"],
        "cold_start_seconds": _query(result, "warmup")["wall_seconds"],
        "conf": result["conf"],
    }
    say(
        f"  driver session start {out['session_seconds']:.1f} s; warm-up query ({WARMUP_TUPLES:,} tuples, "
        f"cold JVM) {out['cold_start_seconds']:.1f} s"
    )
    for label, specs in (("native_plan", plans), ("native_one_batch", ones)):
        if not specs:
            continue
        rows = [
            _native_run_row(w, _query(result, spec["name"]), _native_digest(spec, child.events()))
            for spec in specs
        ]
        best = dict(min(rows, key=lambda r: r["wall_seconds"]))
        best["runs"] = [{k: r[k] for k in ("wall_seconds", "progress", "results", "value_sum")} for r in rows]
        best["same_results_every_run"] = all(_same(r, rows[0]) for r in rows)
        out[label] = best
        walls = ", ".join(f"{r['wall_seconds']:.2f}" for r in rows)
        say(
            f"  {label:<17} {best['tuples_per_s']:>9,.0f} tuples/s  best wall {best['wall_seconds']:6.2f} s "
            f"of [{walls}] ({best['batches']} batches)"
        )
    return out


def _delete_checkpoint(w: Workload, checkpoint: Path) -> None:
    """With --checkpoint-deleted: the killed query's Spark checkpoint directory removed before the restart
    (a lost disk, a new host without the shared checkpoint: what Spark native cannot recover from)."""
    if w.checkpoint_deleted:
        shutil.rmtree(checkpoint)
        say(f"  deleted the Spark checkpoint {checkpoint}")


def measure_native_recovery(w: Workload, failure_free: dict[str, Any]) -> dict[str, Any]:
    """Kill the driver after the batch that completes half the input committed; restart from the checkpoint.

    Both drivers run the warm-up query first, so that the restart is compared warm with the failure-free
    run; what a cold restarted driver pays on top (session start, cold start) is reported beside it.
    """
    warm = _native_query_spec(w.warmup(), "warmup", None)
    spec = _native_query_spec(w, "native_recovery", w.batch_rows)
    kill_after = max(0, w.batches // 2 - 1)  # batches 0..k cover half the input
    commit = Path(spec["checkpoint"]) / "commits" / str(kill_after)
    first = _spawn_native(w, "recovery_killed", [warm, spec])
    while not commit.exists():
        if first.proc.poll() is not None:
            raise first.fail(f"the native driver ended before batch {kill_after} committed")
        time.sleep(0.005)
    killed_at = time.time()
    first.kill()
    started = next(e["t"] for e in first.events() if e.get("event") == "start" and e["query"] == spec["name"])
    to_kill = killed_at - started
    say(
        f"  killed the native driver {to_kill:.2f} s into its query, right after batch {kill_after} committed"
    )
    _delete_checkpoint(w, Path(spec["checkpoint"]))

    warm2 = _native_query_spec(w.warmup(), "warmup", None)
    second = _spawn_native(w, "recovery_restarted", [warm2, spec])
    result = second.wait()
    q = _query(result, spec["name"])
    digest = _native_digest(spec, first.events() + second.events())
    # The failure-free run to compare with: the first plan run of the failure-free driver, which like the
    # killed and the restarted queries ran right after the warm-up query only (later runs are warmer still:
    # the first two plan runs differed by up to 1.4x here).
    ff = failure_free["runs"][0]
    ff_remaining = sum(p["trigger_ms"] for p in ff["progress"] if p["batch"] > kill_after) / 1000
    ff_wall = ff["wall_seconds"]
    first_after = q["progress"][0] if q["progress"] else None
    ff_same_ms = next(
        (p["trigger_ms"] for p in ff["progress"] if first_after and p["batch"] == first_after["batch"]), None
    )
    recovery = q["wall_seconds"] - ff_remaining
    cold = _query(result, "warmup")["wall_seconds"]
    row = {
        "kill_after_batch": kill_after,
        "seconds_to_kill": to_kill,
        "batches_before_kill": [
            e["batch"] for e in first.events() if e.get("event") == "batch" and e["query"] == spec["name"]
        ],
        "restart_wall_seconds": q["wall_seconds"],
        "restart_progress": q["progress"],
        "failure_free_remaining_seconds": ff_remaining,
        "recovery_seconds": recovery,
        "first_batch_after_restart_ms": first_after["trigger_ms"] if first_after else None,
        "same_batch_failure_free_ms": ff_same_ms,
        "failure_free_wall_seconds": ff_wall,
        "total_overhead_seconds": to_kill + q["wall_seconds"] - ff_wall,
        "restart_session_seconds": result["session_seconds"],
        "restart_cold_start_seconds": cold,
        "recovery_with_cold_driver_seconds": recovery + result["session_seconds"] + cold,
        **digest,
    }
    restarted = "as a new query, its checkpoint deleted" if w.checkpoint_deleted else "from the checkpoint"
    say(
        f"  restarted {restarted} (warm driver): {q['wall_seconds']:.2f} s to the end vs "
        f"{ff_remaining:.2f} s failure-free for batches > {kill_after}: recovery {recovery:.2f} s; total "
        f"overhead {row['total_overhead_seconds']:.2f} s; a cold driver adds session start "
        f"{result['session_seconds']:.1f} s + cold start {cold:.1f} s"
    )
    return row


# -- CEC attached, in driver processes like Spark native's ---------------------------------------------------


def _attached_spec(
    w: Workload, name: str, output: str | None = None, reader: str | None = None, resume: bool = False
) -> dict[str, Any]:
    """CEC attached's query: over the cec queue (`reader` None), or over the JSON twin through
    cec_aggregate(input_reader=reader), with the same micro-batch plan as Spark native's."""
    output = output or f"agg-{name}-{uuid.uuid4().hex[:6]}"
    spec = {
        "name": name,
        "system": "attached",
        "topic": w.input_topic,
        "bootstrap": w.bootstrap,
        "output": output,
        "window": WINDOW,
        "batch_rows": w.batch_rows,
        "partitions": w.partitions,
        "checkpoint": str(w.work / "checkpoints" / output),
        "state_dir": str(w.work / f"attached-{output}"),
        "writers": w.attached_writers,
        "recovery_target": w.recovery_target,
        "gopen_only": w.gopen_only,
    }
    if resume:  # only then: a tree from before the keyword never sees it
        spec["resume_checkpoint"] = True
    if reader is not None:
        spec.update(
            topic=w.json_topic, input_format="json", input_reader=reader, batch_rows=w.json_batch_rows
        )
    return spec


def _attached_systems(w: Workload) -> dict[str, str | None]:
    """The attached systems of a run, by name: `attached` (the first reader, or the cec queue), then
    `attached_<reader>` for each further reader."""
    if not w.attached_readers:
        return {"attached": None}
    first, *rest = w.attached_readers
    return {"attached": first, **{f"attached_{r.replace('-', '_')}": r for r in rest}}


def _attached_digest(w: Workload, spec: dict[str, Any]) -> dict[str, Any]:
    # One partition count, one start or a restart with the same P: generation 0 is the topic itself.
    return result_digest({**w.store("probe"), "state_dir": str(w.work / "probe")}, spec["output"])


def measure_attached(w: Workload, profile: bool = False, resume: bool = False) -> dict[str, Any]:
    """Failure-free CEC attached runs (cec_aggregate, the micro-batch plan of Spark native) in one fresh
    driver process, after the same warm-up as Spark native's driver: best of `repeats`. `resume`: with
    cec_aggregate(resume_checkpoint=True) (its batch markers written)."""
    reader = _attached_systems(w)["attached"]
    warm = _attached_spec(w.warmup(), "attached-warmup", reader=reader)
    warm["batch_rows"] = None
    runs = [_attached_spec(w, f"attached.{i}", reader=reader, resume=resume) for i in range(w.repeats)]
    child = _spawn_native(w, "attached_failure_free", [warm, *runs], profile=profile)
    result = child.wait()
    rows = []
    for spec in runs:
        q = _query(result, spec["name"])
        rows.append(
            {
                **_native_run_row(w, q, _attached_digest(w, spec)),
                "start_seconds": q.get("start_seconds"),
                "recovery_at_start": q.get("recovery"),
                "driver_sink": q.get("driver_sink"),
            }
        )
    best = dict(min(rows, key=lambda r: r["wall_seconds"]))
    best["runs"] = [{k: r[k] for k in ("wall_seconds", "progress", "results", "value_sum")} for r in rows]
    best["session_seconds"] = result["session_seconds"]
    best["cold_start_seconds"] = _query(result, "attached-warmup")["wall_seconds"]
    walls = ", ".join(f"{r['wall_seconds']:.2f}" for r in rows)
    say(
        f"  attached (transformWithStateInPandas) {best['tuples_per_s']:>9,.0f} tuples/s  best wall "
        f"{best['wall_seconds']:6.2f} s of [{walls}] ({best['batches']} batches; cold start "
        f"{best['cold_start_seconds']:.1f} s)"
    )
    return best


def steady_rate(progress: list[dict[str, Any]]) -> float:
    """Input rows per second of processing (triggerExecution) over the micro-batches after the first."""
    later = [p for p in progress if p["batch"] > min(q["batch"] for q in progress)]
    seconds = sum(p["trigger_ms"] for p in later) / 1000
    return sum(p["rows"] for p in later) / seconds if seconds else math.nan


def measure_interleaved(w: Workload) -> tuple[dict[str, Any], dict[str, Any], list[float]]:
    """Failure-free Spark native (plan) and CEC attached runs, interleaved: repeat i runs one driver process
    per system (each: warm-up query, then the measured run), the order rotated by one system per repeat,
    so that a drift of the shared machine's load falls on every side.
    Returns (native, attached, the ratio attached / native of each pair); each side's figures are its best
    run, with every run kept, in the shapes `measure_native` / `measure_attached` give. With several
    attached readers (`Workload.attached_readers`), the further ones are under attached["others"], each
    with its own per-pair ratios. With `Workload.before_tree`, each attached system also runs from that tree
    (`before_<system>`, right after its own in the rotation); those are under attached["before"], and each
    attached system gets the per-repeat ratios after / before (`after_before_pair_ratios`, steady too)."""
    attached_systems = _attached_systems(w)
    before_of = {system: f"before_{system}" for system in attached_systems} if w.before_tree else {}
    readers = {**attached_systems, **{before_of[s]: r for s, r in attached_systems.items() if s in before_of}}
    tree_of = {before: w.before_tree for before in before_of.values()}
    systems = [
        *([] if w.skip_native else ["native"]),
        *(["native_tws"] if w.tws_baseline else []),
        *(name for system in attached_systems for name in (system, before_of.get(system)) if name),
    ]
    rows_of: dict[str, list[dict[str, Any]]] = {system: [] for system in systems}
    sessions: dict[str, list[float]] = {system: [] for system in systems}
    colds: dict[str, list[float]] = {system: [] for system in systems}
    conf: dict[str, Any] = {}
    pairs: dict[str, list[float]] = {system: [] for system in readers}
    steady: dict[str, list[float]] = {system: [] for system in readers}
    after_before: dict[str, list[float]] = {system: [] for system in before_of}
    after_before_steady: dict[str, list[float]] = {system: [] for system in before_of}
    after_before_cpu: dict[str, list[float]] = {system: [] for system in before_of}
    repeats: list[dict[str, Any]] = []  # each repeat's order and the load average after each driver
    tws_pairs: list[float] = []
    tws_steady: list[float] = []
    for i in range(w.repeats):
        order = systems[i % len(systems) :] + systems[: i % len(systems)]  # rotates who goes first
        row: dict[str, dict[str, Any]] = {}
        repeat_loads: list[float] = []
        repeats.append(
            {"order": order, "loadavg_start": os.getloadavg()[0], "loadavg_after_each": repeat_loads}
        )
        for system in order:
            if system.startswith("native"):
                api = "tws" if system == "native_tws" else "apply"
                warm = {**_native_query_spec(w.warmup(), "warmup", None), "api": api}
                spec = {**_native_query_spec(w, f"{system}_plan.{i}", w.batch_rows), "api": api}
                child = _spawn_native(w, f"{system}_failure_free.{i}", [warm, spec])
                result = child.wait()
                q = _query(result, spec["name"])
                row[system] = _native_run_row(w, q, _native_digest(spec, child.events()))
                if w.cpu_seconds:
                    row[system]["cpu"] = q.get("cpu")
                colds[system].append(_query(result, "warmup")["wall_seconds"])
                conf = result["conf"]
            else:
                reader = readers[system]
                warm = _attached_spec(w.warmup(), f"{system}-warmup", reader=reader)
                warm["batch_rows"] = None
                spec = _attached_spec(w, f"{system}.{i}", reader=reader)
                tree = tree_of.get(system)
                child = _spawn_native(w, f"{system}_failure_free.{i}", [warm, spec], tree=tree)
                result = child.wait()
                expected = str((tree or ROOT).resolve())
                if {result.get("code_tree"), result.get("worker_code_tree")} != {expected}:
                    raise child.fail(
                        f"{system}'s driver imported {result.get('code_tree')} (its Python workers "
                        f"{result.get('worker_code_tree')}), not {expected}"
                    )
                q = _query(result, spec["name"])
                row[system] = {
                    **_native_run_row(w, q, _attached_digest(w, spec)),
                    "code_tree": expected,
                    "input_reader": reader or "cec-kafka",
                    "start_seconds": q.get("start_seconds"),
                    "recovery_at_start": q.get("recovery"),
                    "write_tasks": q.get("write_tasks"),
                }
                if w.cpu_seconds:  # the measured query's process-tree CPU and its stages (spark_trace)
                    row[system]["cpu"] = q.get("cpu")
                    row[system]["stages"] = result.get("stages", {}).get(spec["name"])
                    row[system]["cec_records"] = q.get("cec_records")
                    row[system].update(log_volume(w.bootstrap, spec["output"]))
                colds[system].append(_query(result, f"{system}-warmup")["wall_seconds"])
            sessions[system].append(result["session_seconds"])
            tasks = row[system].get("write_tasks")
            row[system]["loadavg_after"] = load = os.getloadavg()[0]
            repeat_loads.append(load)
            cpu = row[system].get("cpu")
            say(
                f"  repeat {i}: {system:<8} {row[system]['tuples_per_s']:>9,.0f} tuples/s  wall "
                f"{row[system]['wall_seconds']:7.2f} s ({row[system]['batches']} batches; load "
                f"{load:.1f}"
                + (
                    f"; CPU {cpu['total']:.2f} s ("
                    + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items() if k != "total" and v >= 0.05)
                    + ")"
                    if cpu
                    else ""
                )
                + (
                    f"; {tasks['reused']} of {tasks['tasks']} write tasks through a kept writer; "
                    f"{tasks.get('summary_rows')} rows collected from them"
                    if tasks
                    else ""
                )
                + ")"
            )
        for system in order:
            row[system]["steady_tuples_per_s"] = steady_rate(row[system]["progress"])
            rows_of[system].append(row[system])
        for system in readers if "native" in row else ():
            pairs[system].append(row[system]["tuples_per_s"] / row["native"]["tuples_per_s"])
            steady[system].append(row[system]["steady_tuples_per_s"] / row["native"]["steady_tuples_per_s"])
            say(
                f"  repeat {i}: {system} / native {pairs[system][-1]:.2f}, steady state (batches after the "
                f"first) {steady[system][-1]:.2f}"
            )
        for system, before in before_of.items():
            after_before[system].append(row[system]["tuples_per_s"] / row[before]["tuples_per_s"])
            after_before_steady[system].append(
                row[system]["steady_tuples_per_s"] / row[before]["steady_tuples_per_s"]
            )
            cpus = [row[name].get("cpu") for name in (system, before)]
            if cpus[0] and cpus[1]:  # CPU seconds of the query: before / after, as a throughput ratio
                after_before_cpu[system].append(cpus[1]["total"] / cpus[0]["total"])
            say(
                f"  repeat {i}: {system} after / before {after_before[system][-1]:.2f}, steady state "
                f"{after_before_steady[system][-1]:.2f}"
                + (
                    f", CPU seconds before / after {after_before_cpu[system][-1]:.2f} "
                    f"({cpus[1]['total']:.2f} s against {cpus[0]['total']:.2f} s)"
                    if cpus[0] and cpus[1]
                    else ""
                )
                + f" (load after each driver: {', '.join(f'{x:.1f}' for x in repeat_loads)})"
            )
        if "native_tws" in row:
            tws_pairs.append(row["attached"]["tuples_per_s"] / row["native_tws"]["tuples_per_s"])
            tws_steady.append(
                row["attached"]["steady_tuples_per_s"] / row["native_tws"]["steady_tuples_per_s"]
            )
            say(
                f"  repeat {i}: attached / native under transformWithStateInPandas {tws_pairs[-1]:.2f}, "
                f"steady state {tws_steady[-1]:.2f}"
            )
    out = {}
    for system, rows in rows_of.items():
        best = dict(min(rows, key=lambda r: r["wall_seconds"]))
        best["runs"] = [
            {
                k: r.get(k)
                for k in (
                    "wall_seconds",
                    "tuples_per_s",
                    "progress",
                    "results",
                    "value_sum",
                    "duplicates",
                    "steady_tuples_per_s",
                    "write_tasks",
                    "loadavg_after",
                    "cpu",
                    "stages",
                    "cec_records",
                    "log_messages",
                    "log_bytes",
                )
            }
            for r in rows
        ]
        best["same_results_every_run"] = all(_same(r, rows[0]) for r in rows)
        best["session_seconds"] = sessions[system][0]
        best["cold_start_seconds"] = colds[system][0]
        out[system] = best
    for system in readers:
        out[system]["pair_ratios"] = pairs[system]
        out[system]["steady_pair_ratios"] = steady[system]
    for system in before_of:
        out[system]["after_before_pair_ratios"] = after_before[system]
        out[system]["after_before_steady_pair_ratios"] = after_before_steady[system]
        if after_before_cpu[system]:
            out[system]["after_before_cpu_pair_ratios"] = after_before_cpu[system]
    native = {"conf": conf, "native_plan": out.get("native"), "repeats": repeats}
    if "native_tws" in out:
        native["tws_plan"] = out["native_tws"]
        out["attached"]["tws_pair_ratios"] = tws_pairs
        out["attached"]["tws_steady_pair_ratios"] = tws_steady
    others = [system for system in attached_systems if system != "attached"]
    if others:
        out["attached"]["others"] = {system: out[system] for system in others}
    if before_of:
        out["attached"]["before"] = {before: out[before] for before in before_of.values()}
    return native, out["attached"], pairs["attached"]


def measure_attached_recovery(
    w: Workload,
    failure_free: dict[str, Any],
    reader: str | None = None,
    system: str = "attached",
    resume: bool = False,
) -> dict[str, Any]:
    """As `measure_native_recovery`, for CEC attached: SIGKILL the driver's process group once the batch that
    completes half the input has committed, then start the same `cec_aggregate` call in a new driver (warm-up
    first), which recovers from the output logs and runs to the end of the input; with `resume`
    (resume_checkpoint=True) it resumes the killed run's Spark checkpoint instead, when that agrees with the
    logs (the restart's `restart_cec_recovery` says which path it took and why)."""
    warm = _attached_spec(w.warmup(), f"{system}-warmup", reader=reader)
    warm["batch_rows"] = None
    spec = _attached_spec(w, f"{system}_recovery", reader=reader, resume=resume)
    kill_after = max(0, w.batches // 2 - 1)
    checkpoints = Path(spec["checkpoint"])
    first = _spawn_native(w, f"{system}_killed", [warm, spec])
    # A start that recovers from the logs makes a fresh Spark checkpoint under checkpoint_location.
    while not any(checkpoints.glob(f"**/commits/{kill_after}")):
        if first.proc.poll() is not None:
            raise first.fail(f"the attached driver ended before batch {kill_after} committed")
        time.sleep(0.005)
    killed_at = time.time()
    first.kill()
    started = next(e["t"] for e in first.events() if e.get("event") == "start" and e["query"] == spec["name"])
    to_kill = killed_at - started
    say(
        f"  killed the attached driver {to_kill:.2f} s into its query, right after batch {kill_after} committed"
    )
    _delete_checkpoint(w, checkpoints)
    second = _spawn_native(w, f"{system}_restarted", [dict(warm, output=warm["output"] + "-2"), spec])
    result = second.wait()
    q = _query(result, spec["name"])
    ff = failure_free["runs"][0]
    ff_remaining = sum(p["trigger_ms"] for p in ff["progress"] if p["batch"] > kill_after) / 1000
    recovery = q["wall_seconds"] - ff_remaining
    cold = _query(result, f"{system}-warmup")["wall_seconds"]
    row = {
        "input_reader": reader or "cec-kafka",
        "kill_after_batch": kill_after,
        "seconds_to_kill": to_kill,
        "restart_wall_seconds": q["wall_seconds"],
        "restart_start_seconds": q.get("start_seconds"),
        "restart_plan": q.get("recovery"),
        "restart_cec_recovery": q.get("cec_recovery"),
        "restart_progress": q["progress"],
        "failure_free_remaining_seconds": ff_remaining,
        "recovery_seconds": recovery,
        "failure_free_wall_seconds": ff["wall_seconds"],
        "total_overhead_seconds": to_kill + q["wall_seconds"] - ff["wall_seconds"],
        "restart_session_seconds": result["session_seconds"],
        "restart_cold_start_seconds": cold,
        "recovery_with_cold_driver_seconds": recovery + result["session_seconds"] + cold,
        **_attached_digest(w, spec),
    }
    plan = q.get("recovery") or {}
    say(
        f"  restarted (warm driver): cec_aggregate() {q.get('start_seconds') or 0:.2f} s (EC plan "
        f"{plan.get('seconds', float('nan')):.2f} s, {plan.get('ec_windows', '?')} open windows), "
        f"{q['wall_seconds']:.2f} s to the end vs {ff_remaining:.2f} s failure-free for batches > "
        f"{kill_after}: recovery {recovery:.2f} s; total overhead {row['total_overhead_seconds']:.2f} s"
    )
    return row


# -- CEC on Spark ----------------------------------------------------------------------------------------


class KillMissedError(RuntimeError):
    """The SIGKILL did not hit partition 0's running task (too late): the run had no failure in it."""


class _HostKiller(threading.Thread):
    """SIGKILLs partition 0's Python worker (first attempt) `delay` seconds after its task started (its pid
    file appeared): the failure-free instance's start-up plus half its processing time, so mid-run.

    Why time and not "half the input seen in the log" (tests/operators/spark/test_host.py's trigger, on SQLite): on
    Kafka (Tansu) here, a consumer following partition 0's log, and positioned reads of its end, saw the
    instance's records only at the end of its run in --quick (25k tuples, ~1 s), so a log-triggered kill
    always came after the instance had finished. A timed kill always hits the running task; but with a
    short run the relaunched instance may then find little or nothing durable in its log (crash_input ~ 0,
    `resumed` false: it starts over), which the output reports. The kill is retried earlier if it missed.
    """

    def __init__(self, pid_dir: Path, delay: float) -> None:
        super().__init__(daemon=True, name="bench-killer")
        self.pid_dir, self.delay = pid_dir, delay
        self.done = threading.Event()
        self.killed_at: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        from operators.spark.host import pid_file_name

        pid_file = self.pid_dir / pid_file_name("chain", 1, 0, 0)
        try:
            while not pid_file.exists():
                if self.done.wait(0.002):
                    return
            if self.done.wait(self.delay):
                return
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
            self.killed_at = time.time()
        except BaseException as exc:  # reported by the caller
            self.error = exc


def measure_cec_host(
    spark: SparkSession, w: Workload, name: str, *, kill_after_s: float | None = None
) -> dict[str, Any]:
    """The aggregate stage as P long-running Spark tasks; with `kill_after_s`, partition 0's Python worker
    is SIGKILLed that many seconds after its task started."""
    from operators.spark.host import SparkOperatorHost, pid_file_name

    topic = f"agg-{name}-{uuid.uuid4().hex[:6]}"
    store = w.store(name)
    pid_dir = w.work / f"pids-{name}"
    pid_dir.mkdir(parents=True, exist_ok=True)
    host = SparkOperatorHost(spark, [_aggregate_spec(w, store, topic)], pid_dir=pid_dir)
    killer = _HostKiller(pid_dir, kill_after_s) if kill_after_s is not None else None
    if killer is not None:
        killer.start()
    try:
        result = host.run()
    finally:
        ended = time.time()
        if killer is not None:
            killer.done.set()
            killer.join(timeout=30)
    instance0 = result.instance(0, 0)
    first_pid = pid_dir / pid_file_name("chain", 1, 0, 0)
    row: dict[str, Any] = {
        "wall_seconds": result.seconds,
        "tuples_per_s": w.tuples / result.seconds,
        "job_attempts": result.job_attempts,
        "instances": [
            {"partition": r.partition, "task_attempt": r.task_attempt, "resumed": r.resumed, **r.stats}
            for r in result.instances
        ],
        **result_digest(store, topic),
    }
    if killer is None:
        # Task start (pid file) -> end of the run, minus the instance's processing time: its start-up (store,
        # readers, recovery check on its log), assuming partition 0 ends about when the job does. The next
        # killed run times its kill from these two.
        row["partition0_startup_seconds"] = ended - first_pid.stat().st_mtime - instance0.stats["seconds"]
        row["partition0_processing_seconds"] = instance0.stats["seconds"]
    else:
        if killer.error is not None or killer.killed_at is None:
            raise KillMissedError(f"no kill: {killer.error!r}")
        if instance0.task_attempt == 0:
            # The instance had finished when the signal came (an idle, reused Python worker took it).
            raise KillMissedError(
                f"the kill {kill_after_s:.2f} s after the task started came after it finished"
            )
        relaunch = pid_dir / pid_file_name("chain", 1, 0, 1)
        recovery = instance0.stats.get("recovery") or {}
        row.update(
            {
                "kill_after_seconds": kill_after_s,
                "crash_input": sum(recovery.get("crash_pos") or [0]),  # durable input position at the crash
                "partition0_inputs": w.sizes[0],
                "relaunched_task_attempt": instance0.task_attempt,
                "relaunch_latency_seconds": relaunch.stat().st_mtime - killer.killed_at
                if relaunch.exists()
                else None,
                "recovery": instance0.stats.get("recovery"),
            }
        )
    return row


def _killed_host_run(
    spark: SparkSession, w: Workload, name: str, free: dict[str, Any], result: dict[str, Any]
) -> dict[str, Any]:
    """A host run with partition 0 killed halfway through its processing, timed from the failure-free run
    just before (`free`); run again with an earlier kill (up to 3 runs) if the kill missed the task."""
    delay = free["partition0_startup_seconds"] + free["partition0_processing_seconds"] / 2
    for attempt in range(3):
        try:
            return measure_cec_host(spark, w, f"{name}.{attempt}", kill_after_s=delay)
        except KillMissedError as exc:
            result.setdefault("cec_host_kill_misses", []).append(str(exc))
            say(f"  host: {exc}; running again with the kill earlier")
            delay *= 0.7
    raise RuntimeError("three kills in a row missed the running task")


def run_attached(spark: SparkSession, w: Workload, name: str = "attached") -> dict[str, Any]:
    """CEC attached to a Spark aggregation (transformWithStateInPandas), from operators/spark/attach.py.

    HOOK: raises NotImplementedError when that module (another engineer's work) is missing or has no
    usable `cec_aggregate`; the caller then records the reason instead of a figure.
    """
    try:
        from operators.spark.attach import cec_aggregate
    except ImportError as exc:
        raise NotImplementedError(f"operators.spark.attach.cec_aggregate is not available: {exc}") from exc
    topic = f"agg-{name}-{uuid.uuid4().hex[:6]}"
    store = w.store(name)
    started = time.perf_counter()
    query = cec_aggregate(
        spark,
        input_topic=w.input_topic,
        bootstrap_servers=w.bootstrap,
        output_topic=topic,
        key="item_id",
        value="item_price",
        agg="avg",
        window_count=WINDOW,
        state_dir=store["state_dir"],
        checkpoint_location=str(w.work / "checkpoints" / topic),
        partitions=w.partitions,
        available_now=True,
        max_records_per_trigger=w.batch_rows,  # Spark native's micro-batch plan
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"the attached query failed: {query.exception()}")
    return {
        "wall_seconds": seconds,
        "tuples_per_s": w.tuples / seconds,
        "batches": query.batches,
        "progress": _progress_rows(query),
        **result_digest(store, topic),  # generation 0 is the topic itself (one start, one partition count)
    }


def measure_cec_on_spark(w: Workload, result: dict[str, Any]) -> None:
    """CEC host (failure-free, then with a kill) and CEC attached, in one session of this process, each
    after its own warm-up run over the warm-up topic."""
    from operators.spark.datasource import register
    from operators.spark.session import local_session

    begin = time.perf_counter()
    spark = local_session(w.master, app_name="bench-spark", shuffle_partitions=w.partitions)
    spark.sparkContext.setLogLevel("FATAL")  # the worker we kill makes Spark log a stack trace
    register(spark)
    result["cec_session_seconds"] = time.perf_counter() - begin
    say(f"CEC on Spark ({w.master}; session started in {result['cec_session_seconds']:.1f} s)")
    try:
        warm = measure_cec_host(spark, w.warmup(), "host-warmup")
        result["cec_host_cold_start_seconds"] = warm["wall_seconds"]
        # Failure-free and killed runs alternate, so that load swings on this shared machine hit both alike;
        # the overhead compares their means.
        free: list[dict[str, Any]] = []
        killed: list[dict[str, Any]] = []
        for i in range(w.repeats):
            free.append(measure_cec_host(spark, w, f"host.{i}"))
            killed.append(_killed_host_run(spark, w, f"host-kill.{i}", free[-1], result))
        host = dict(min(free, key=lambda r: r["wall_seconds"]))
        host["runs_wall_seconds"] = [r["wall_seconds"] for r in free]
        result["cec_host"] = host
        walls = ", ".join(f"{r['wall_seconds']:.2f}" for r in free)
        say(
            f"  host (chained, failure-free) {host['tuples_per_s']:>9,.0f} tuples/s  best wall "
            f"{host['wall_seconds']:.2f} s of [{walls}] (warm-up run {warm['wall_seconds']:.1f} s)"
        )
        overhead = _mean([r["wall_seconds"] for r in killed]) - _mean([r["wall_seconds"] for r in free])
        for k in killed:
            rec = k.get("recovery")
            relaunch = k["relaunch_latency_seconds"]
            recovered = (
                f"instance recovery {rec['recovery_seconds']:.3f} s (EC build {rec['ec_build_seconds']:.3f} s, "
                f"load {rec['ec_load_seconds']:.3f} s, replayed {rec['tuples_replayed']:,})"
                if rec
                else "its log was still empty: the relaunched instance started over (no recovery report)"
            )
            say(
                f"  host, partition 0's worker SIGKILLed {k['kill_after_seconds']:.2f} s into its task (durable "
                f"input position at the crash {k['crash_input']:,} of {k['partition0_inputs']:,}): relaunched in "
                f"{relaunch if relaunch is not None else float('nan'):.2f} s; {recovered}; "
                f"wall {k['wall_seconds']:.2f} s"
            )
        say(f"  host: total overhead of a kill (mean killed wall - mean failure-free wall) {overhead:.2f} s")
        first = dict(killed[0])
        first["total_overhead_seconds"] = overhead
        first["runs"] = [
            {
                key: k[key]
                for key in (
                    "wall_seconds",
                    "kill_after_seconds",
                    "crash_input",
                    "relaunch_latency_seconds",
                    "recovery",
                    "results",
                    "value_sum",
                )
            }
            for k in killed
        ]
        result["recovery"]["cec_host"] = first
        try:
            warm_attached = run_attached(spark, w.warmup(), "attached-warmup")
            result["cec_attached"] = attached = run_attached(spark, w)
            attached["cold_start_seconds"] = warm_attached["wall_seconds"]
            say(
                f"  attached (transformWithStateInPandas) {attached['tuples_per_s']:>9,.0f} tuples/s  wall "
                f"{attached['wall_seconds']:.2f} s ({attached['batches']} batches; warm-up "
                f"{warm_attached['wall_seconds']:.1f} s)"
            )
        except NotImplementedError as exc:  # the hook: attach.py missing
            result["cec_attached"] = None
            result["cec_attached_note"] = f"not measured: {exc}"
            say(f"  attached: {result['cec_attached_note']}")
        except Exception as exc:  # attach.py is being written concurrently: report, keep the other figures
            result["cec_attached"] = None
            result["cec_attached_note"] = f"failed: {type(exc).__name__}: {str(exc)[:500]}"
            say(f"  attached: {result['cec_attached_note']}")
    finally:
        spark.stop()


# -- report ----------------------------------------------------------------------------------------------


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5))
    ratios = result["throughput_ratio_to_spark_native"]
    names = [k for k, v in ratios.items() if v is not None]
    values = [ratios[k] for k in names]
    rates = _rates(result)
    bars = left.bar(names, values, color=["#888888" if n.startswith("spark") else "#3b75af" for n in names])
    left.axhline(1.0, color="black", linewidth=0.8)
    left.bar_label(bars, labels=[f"{ratios[n]:.2f}\n{rates[n]:,.0f}/s" for n in names])
    left.set_ylim(0, max(values) * 1.2)
    left.set_ylabel("throughput / Spark native (same run)")
    left.set_title(f"{result['tuples']:,} tuples, {result['keys']:,} keys, P={result['partitions']}")
    left.tick_params(axis="x", labelrotation=20)
    if result.get("cec_attached_note"):  # the hook: say why the attached bar is missing
        left.text(
            0.02,
            0.97,
            f"CEC attached {result['cec_attached_note'][:80]}",
            transform=left.transAxes,
            fontsize=8,
            va="top",
        )

    rec = result["recovery"]
    labels: list[str] = []
    secs: list[float] = []
    colors: list[str] = []
    native, host = rec.get("spark_native"), rec.get("cec_host")
    if native:
        labels += [
            "Spark native\nrestart (warm)",
            "Spark native\n+ cold driver",
            "Spark native\ntotal overhead",
        ]
        secs += [
            native["recovery_seconds"],
            native["recovery_with_cold_driver_seconds"],
            native["total_overhead_seconds"],
        ]
        colors += ["#888888", "#aaaaaa", "#cccccc"]
    if host:
        labels += ["CEC host\ninstance recovery", "CEC host\ntotal overhead"]
        secs += [(host.get("recovery") or {}).get("recovery_seconds") or 0.0, host["total_overhead_seconds"]]
        colors += ["#3b75af", "#8fb3d9"]
    bars = right.bar(labels, secs, color=colors)
    right.bar_label(bars, fmt="%.2f s")
    right.set_ylabel("seconds")
    right.set_title("after a kill at half the input (see spark.json for what each measures)")
    fig.suptitle("CEC on Spark vs Spark's own stateful streaming (count-window average)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


DEFINITIONS: dict[str, str] = {
    "steady_tuples_per_s": "--focus attached: input rows / triggerExecution seconds of the micro-batches "
    "after the first one (the first pays each query's start: for CEC attached the transformWithState "
    "driver-side processor init; cec_aggregate()'s recovery planning is before it and outside it too)",
    "throughput_ratio_attached_to_native": "--focus attached: median over the interleaved pairs of "
    "attached tuples_per_s / native tuples_per_s",
    "steady_ratio_attached_to_native": "--focus attached: median over the interleaved pairs of attached "
    "steady_tuples_per_s / native steady_tuples_per_s",
    "tuples_per_s": "input tuples / wall seconds from query start (or host.run / first run_job) to all input "
    "processed; session start excluded; measured after a warm-up run in the same driver (JVM); best of "
    "`repeats` runs (CEC attached: one run)",
    "throughput_ratio_to_spark_native": "tuples_per_s / spark_native.native_plan.tuples_per_s of this run",
    "spark_native.native_plan": "applyInPandasWithState, RocksDB state store with changelog checkpointing, "
    "Trigger.AvailableNow, driver in its own process; native_io kafka: Spark's Kafka source over the JSON "
    "twin (maxOffsetsPerTrigger = tuples / batches), from_json, a Kafka sink whose output is read back "
    "deduplicated by (item, window) (duplicates: rows written twice); native_io cec: the cec-kafka source "
    "(maxRecordsPerTrigger = input offsets / batches), a foreachBatch sink",
    "spark_native.native_one_batch": "the same query with no maxRecordsPerTrigger: all input in one batch",
    "spark_native.cold_start_seconds": "wall of the first (warm-up) query of a fresh driver, 4k tuples",
    "recovery.spark_native.recovery_seconds": "restarted query's wall (start() -> all input processed, in a "
    "new driver process that ran the warm-up query first) minus the failure-free run's triggerExecution sum "
    "of the batches after the last one committed before the kill, in the first failure-free plan run (the "
    "one that, like the killed and the restarted queries, ran right after the warm-up query only)",
    "recovery.spark_native.recovery_with_cold_driver_seconds": "recovery_seconds + the new driver's session "
    "start + its cold start (what a driver restarted cold after a crash pays on top)",
    "recovery.spark_native.total_overhead_seconds": "(query start -> SIGKILL of the driver's process group) + "
    "restarted query's wall - the first failure-free plan run's wall",
    "recovery.cec_host.recovery": "the relaunched instance's own report: EC build, EC load, replay (catch-up) "
    "and recovery_seconds (log scan to caught up with the crash point)",
    "recovery.cec_host.kill": "partition 0's Python worker SIGKILLed kill_after_seconds after its task "
    "started = start-up + half the processing time of partition 0 in the failure-free run just before "
    "(x0.7 per retry if a kill missed the running task, see cec_host_kill_misses); crash_input = the "
    "durable input position of its log at the crash",
    "recovery.cec_host.relaunch_latency_seconds": "SIGKILL of partition 0's Python worker -> Spark's new "
    "attempt wrote its pid file",
    "recovery.cec_host.total_overhead_seconds": "mean host.run wall with the kill - mean failure-free "
    "host.run wall (the runs alternate)",
}


def _rates(result: dict[str, Any]) -> dict[str, float | None]:
    attached = result.get("cec_attached")
    return {
        "spark_native": result["spark_native"]["native_plan"]["tuples_per_s"],
        "spark_native_1batch": result["spark_native"]["native_one_batch"]["tuples_per_s"],
        "cec_host": result["cec_host"]["tuples_per_s"],
        "cec_attached": attached["tuples_per_s"] if attached else None,
        "cec_local_engine": result["cec_local"]["tuples_per_s"],
    }


def _ratios(result: dict[str, Any]) -> dict[str, float | None]:
    rates = _rates(result)
    base = rates["spark_native"]
    assert base is not None
    return {name: None if rate is None else rate / base for name, rate in rates.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="50k tuples, 500 keys")
    parser.add_argument("--tuples", type=int, default=None, help="input tuples (default 200000; quick 50000)")
    parser.add_argument("--keys", type=int, default=None, help="items (default 2000; quick 500)")
    parser.add_argument("--partitions", type=int, default=2, help="input/output partitions P (default 2)")
    parser.add_argument("--batches", type=int, default=4, help="micro-batches of the Spark plans (default 4)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="failure-free runs per system, kill runs of the host (default 2; quick 1)",
    )
    parser.add_argument(
        "--focus",
        choices=("all", "attached"),
        default="all",
        help="attached: only CEC attached vs Spark native (plan) and both recoveries after a driver kill, "
        "each system in driver processes of its own; writes benchmarks/out/spark-attached-<keys>.json and "
        "redraws benchmarks/spark-attached.png from every such file",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="with --focus attached: cProfile the attached query's driver-side sink (a separate figure: "
        "the profiler slows what it measures)",
    )
    parser.add_argument(
        "--skip-recovery",
        action="store_true",
        help="with --focus attached: failure-free throughput only (no driver-kill recovery runs)",
    )
    parser.add_argument(
        "--attached-writers",
        choices=("executors", "driver"),
        default="executors",
        help="cec_aggregate(writers=...): each output partition's task writes its log (executors, the "
        "default) or every record goes to the driver, which writes them (driver, the earlier path); with "
        "driver, --focus attached writes spark-attached-<keys>-driver-writers.json, labelled so",
    )
    parser.add_argument(
        "--recovery-only",
        action="store_true",
        help="with --focus attached: only the recoveries after a driver kill (one failure-free run of each "
        "system, their baselines, then both kills), --repeats pairs alternating which system goes first; "
        "writes benchmarks/out/spark-attached-recovery-<keys>.json",
    )
    parser.add_argument(
        "--recovery-target",
        default=None,
        help="with --focus attached: cec_aggregate(checkpointing=Checkpointing(recovery_target=...)), e.g. "
        "'2s'; output files get a -rto-<target> suffix",
    )
    parser.add_argument(
        "--attached-resume",
        action="store_true",
        help="with --focus attached --recovery-only: each attached system also runs with "
        "cec_aggregate(resume_checkpoint=True), whose restart resumes Spark's checkpoint when it agrees with "
        'the logs ("<system>_resume"; ratios to native and to the log path); files get a -resume suffix',
    )
    parser.add_argument(
        "--checkpoint-deleted",
        action="store_true",
        help="with --focus attached --recovery-only: delete every system's Spark checkpoint directory between "
        "the kill and the restart (Spark native starts a new query without state, from startingOffsets "
        "earliest; CEC recovers from its output logs); files get a -ckpt-deleted suffix",
    )
    parser.add_argument(
        "--gopen-only",
        action="store_true",
        help="with --focus attached: cec_aggregate(checkpointing=Checkpointing.gopen_only()) in every tree that "
        "has it (with --before-tree: the same checkpointing work in both trees)",
    )
    parser.add_argument(
        "--tws-baseline",
        action="store_true",
        help="with --focus attached: a second Spark native baseline, the same aggregate under "
        "transformWithStateInPandas (per-key ValueState), interleaved with the other two; its ratios are "
        "reported beside the applyInPandasWithState ones",
    )
    parser.add_argument(
        "--native-io",
        choices=("kafka", "cec"),
        default="kafka",
        help="Spark native's input and output: kafka (the default: Spark's Kafka source over a JSON twin of "
        "the input topic, from_json, a Kafka sink: what a Spark user writes) or cec (the cec-kafka source "
        "over the cec queue, a foreachBatch sink: the baseline of the earlier sections)",
    )
    parser.add_argument(
        "--attached-readers",
        default=None,
        help="with --focus attached: comma-separated cec_aggregate(input_reader=...) values (spark-kafka, "
        "python); CEC attached then reads the JSON twin through each, one attached system per reader, "
        "interleaved with Spark native; writes benchmarks/out/spark-connector-<keys>.json (or "
        "spark-connector-recovery-<keys>.json) and redraws benchmarks/spark-connector.png",
    )
    parser.add_argument(
        "--before-tree",
        type=Path,
        default=None,
        help="with --focus attached --skip-recovery: a second source tree (e.g. a `git archive` snapshot "
        "with its C extension built); each attached system also runs from it, right after its own run in "
        "every repeat (its drivers import that tree first), and the report gives after / before per repeat "
        "and their median; writes benchmarks/out/before-after-spark-attached-<keys>.json",
    )
    parser.add_argument(
        "--cpu-seconds",
        action="store_true",
        help="with --focus attached --skip-recovery: each driver process reports the CPU seconds (user + "
        "system) of its whole process tree (driver, JVM, Spark's Python processes) per query, by kind, and "
        "its Spark event log's per-stage task metrics per micro-batch (benchmarks/spark_trace.py); with "
        "--before-tree the report gives CPU seconds before / after per repeat (a loaded machine changes "
        "them far less than wall time)",
    )
    parser.add_argument(
        "--skip-native",
        action="store_true",
        help="with --before-tree: no Spark native runs (after / before only; no ratio to native)",
    )
    parser.add_argument("--native-child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.native_child is not None:
        return native_child(args.native_child)
    tuples = args.tuples or (50_000 if args.quick else 200_000)
    keys = args.keys or (500 if args.quick else 2_000)
    repeats = args.repeats or (1 if args.quick else 2)
    if repeats < 1 or args.partitions < 1 or args.batches < 2 or tuples < args.batches * WINDOW:
        parser.error("need --repeats >= 1, --partitions >= 1, --batches >= 2 and enough tuples for them")
    if args.before_tree is not None:
        if args.focus != "attached" or not args.skip_recovery or args.recovery_only or args.profile:
            parser.error("--before-tree needs --focus attached --skip-recovery (throughput only)")
        if not (args.before_tree / "operators" / "__init__.py").is_file():
            parser.error(f"--before-tree {args.before_tree}: no operators package there")

    if args.cpu_seconds and (args.focus != "attached" or not args.skip_recovery or args.recovery_only):
        parser.error("--cpu-seconds needs --focus attached --skip-recovery (throughput only)")
    if args.skip_native and args.before_tree is None:
        parser.error("--skip-native needs --before-tree (the ratios to native need native)")

    from tests.brokers import start_broker

    # Every tree's bytecode before any driver starts: an installed cec has it, as PySpark has (bytecode.py).
    for tree in (ROOT, *([args.before_tree] if args.before_tree else [])):
        compile_tree(tree)
    started = time.perf_counter()
    result: dict[str, Any] = {
        "tuples": tuples,
        "keys": keys,
        "partitions": args.partitions,
        "window": WINDOW,
        "batches": args.batches,
        "repeats": repeats,
        "definitions": DEFINITIONS,
        "loadavg_start": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    broker = start_broker()
    work = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    try:
        result["broker"] = broker.kind
        w = Workload(
            tuples,
            keys,
            args.partitions,
            args.batches,
            broker.bootstrap,
            work,
            f"purchases-{uuid.uuid4().hex[:6]}",
            repeats,
            args.attached_writers,
            args.recovery_target,
            tws_baseline=args.tws_baseline,
            native_io=args.native_io,
            attached_readers=tuple(r.strip() for r in (args.attached_readers or "").split(",") if r.strip()),
            before_tree=args.before_tree.resolve() if args.before_tree else None,
            gopen_only=args.gopen_only,
            attached_resume=args.attached_resume,
            checkpoint_deleted=args.checkpoint_deleted,
            cpu_seconds=args.cpu_seconds,
            skip_native=args.skip_native,
        )
        result["recovery_target"] = args.recovery_target
        result["attached_writers"] = args.attached_writers
        say(f"broker: {broker.kind} at {broker.bootstrap}; scratch {work}")
        say(f"input: {tuples:,} purchases over {keys:,} items, P={w.partitions}, count windows of {WINDOW}")
        result["input"] = write_input(w)
        result["warmup_input"] = write_input(w.warmup())
        result["native_io"] = w.native_io
        result["attached_readers"] = list(w.attached_readers)
        if w.native_io == "kafka" or w.attached_readers:
            result["json_input"] = write_json_input(w)
            write_json_input(w.warmup())
            say(f"  and its JSON twin {w.json_topic} in {result['json_input']['seconds']:.2f} s")
        w = replace(w, offsets=input_offsets(w))
        result["input"]["offsets"] = w.offsets
        result["input"]["batch_rows"] = w.batch_rows
        say(
            f"  written in {result['input']['seconds']:.2f} s (+ {WARMUP_TUPLES:,} warm-up tuples on their own topic)"
        )

        if args.focus == "attached" and args.recovery_only:
            _recovery_focus(w, result)
            return 0
        if args.focus == "attached":
            _attached_focus(w, result, profile=args.profile, recovery=not args.skip_recovery)
            return 0
        say("CEC local engine (run_job per partition, in this process, no Spark)")
        result["cec_local"] = local = measure_cec_local(w)
        say(f"  {local['tuples_per_s']:>9,.0f} tuples/s, {local['results']:,} window results")

        say(
            f"Spark native (applyInPandasWithState, RocksDB state store), driver in a child process, {w.master}"
        )
        result["spark_native"] = measure_native(w)
        result["recovery"] = {}
        say("Spark native: driver SIGKILLed at half the input, restarted from its checkpoint")
        result["recovery"]["spark_native"] = measure_native_recovery(w, result["spark_native"]["native_plan"])

        measure_cec_on_spark(w, result)

        # Same workload everywhere: the same window results as CEC's local engine.
        checks = {
            "spark_native_recovered": result["recovery"]["spark_native"],
            "cec_host": result["cec_host"],
        }
        for label in ("native_plan", "native_one_batch"):
            for i, run in enumerate(result["spark_native"][label]["runs"]):
                checks[f"spark_{label}.{i}"] = run
        for i, run in enumerate(result["recovery"]["cec_host"]["runs"]):
            checks[f"cec_host_recovered.{i}"] = run
        if result.get("cec_attached"):
            checks["cec_attached"] = result["cec_attached"]
        result["same_results_as_local_engine"] = {k: _same(v, local) for k, v in checks.items()}
        bad = [k for k, ok in result["same_results_as_local_engine"].items() if not ok]
        say("results match CEC's local engine everywhere" if not bad else f"RESULTS DIFFER: {bad}")
        result["throughput_ratio_to_spark_native"] = _ratios(result)
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)

    result["loadavg_end"] = os.getloadavg()
    result["seconds"] = time.perf_counter() - started
    OUT_JSON.parent.mkdir(exist_ok=True)
    OUT_JSON.write_text(json.dumps(result, indent=2))
    plot(result, OUT_PNG)
    say(
        "throughput / Spark native: "
        + ", ".join(
            f"{k} {v:.2f}" for k, v in result["throughput_ratio_to_spark_native"].items() if v is not None
        )
    )
    say(f"done in {result['seconds']:.0f} s: benchmarks/out/spark.json, benchmarks/spark.png")
    return 0


ATTACHED_JSON = "spark-attached-{keys}.json"
ATTACHED_PNG = ROOT / "benchmarks" / "spark-attached.png"


def _attached_focus(
    w: Workload, result: dict[str, Any], profile: bool = False, recovery: bool = True
) -> None:
    """`--focus attached`: the reference (CEC local engine), Spark native's plan runs and CEC attached's
    failure-free runs interleaved (`measure_interleaved`), then (unless `recovery` is off) both recoveries;
    JSON per key count, one plot over all of them. The throughput ratio is the median of the per-pair
    ratios (the ratio of the best runs is kept beside it)."""
    started = time.perf_counter()
    say("CEC local engine (the reference results)")
    result["cec_local"] = local = measure_cec_local(replace(w, repeats=1))
    say(f"  {local['tuples_per_s']:>9,.0f} tuples/s, {local['results']:,} window results")
    say(
        "Spark native (applyInPandasWithState, RocksDB state store) and CEC attached (cec_aggregate), "
        f"failure-free, interleaved, each run in a driver process of its own, {w.master}"
    )
    result["spark_native"], result["cec_attached"], pairs = measure_interleaved(w)
    attached = result["cec_attached"]
    result["pair_ratios_attached_to_native"] = pairs
    sink = None
    if profile:
        say("CEC attached again, its driver-side sink under cProfile (a figure of its own: slower)")
        profiled = measure_attached(replace(w, repeats=1), profile=True)
        result["cec_attached_profiled"] = profiled
        sink = profiled.get("driver_sink")
    if sink:
        say(
            f"  driver-side sink: {sink['seconds']:.2f} s in {sink['calls']} calls, of which toArrow() (the "
            f"micro-batch's execution) {sink['toArrow_cumulative_s']:.2f} s, driver Python "
            f"{sink['driver_python_s']:.2f} s (cProfile adds overhead; see the JSON)"
        )
    native_plan = result["spark_native"]["native_plan"]  # None with --skip-native
    checks = {"cec_attached": attached}
    if native_plan is not None:
        checks["spark_native"] = native_plan
    for i, run in enumerate(native_plan["runs"] if native_plan is not None else []):
        checks[f"spark_native.{i}"] = run
    for i, run in enumerate(attached["runs"]):
        checks[f"cec_attached.{i}"] = run
    for name, other in [*attached.get("others", {}).items(), *attached.get("before", {}).items()]:
        for i, run in enumerate(other["runs"]):
            checks[f"{name}.{i}"] = run
    for i, run in enumerate(result["spark_native"].get("tws_plan", {}).get("runs", [])):
        checks[f"spark_native_tws.{i}"] = run
    if recovery:
        say("Spark native: driver SIGKILLed at half the input, restarted from its checkpoint")
        native_rec = measure_native_recovery(w, result["spark_native"]["native_plan"])
        result["recovery"] = {"spark_native": native_rec}
        checks["spark_native_recovered"] = native_rec
        # Each attached system (one per input reader) is killed and restarted through its own reader,
        # against its own failure-free run.
        for system, reader in _attached_systems(w).items():
            failure_free = attached if system == "attached" else attached["others"][system]
            say(
                f"CEC {system} ({reader or 'cec-kafka'}): driver SIGKILLed at half the input, restarted "
                "(recovers from its output logs)"
            )
            try:
                rec = measure_attached_recovery(w, failure_free, reader=reader, system=system)
            except RuntimeError as exc:  # a driver that failed: the other systems' figures are kept
                say(f"  NO FIGURE: {exc}")
                result["recovery"][f"cec_{system}"] = {"input_reader": reader, "error": str(exc)}
                continue
            result["recovery"][f"cec_{system}"] = rec
            checks[f"cec_{system}_recovered"] = rec
            if native_rec["recovery_seconds"] > 0:
                result[f"recovery_ratio_{system}_to_native"] = (
                    rec["recovery_seconds"] / native_rec["recovery_seconds"]
                )
            result[f"cold_recovery_ratio_{system}_to_native"] = (
                rec["recovery_with_cold_driver_seconds"] / native_rec["recovery_with_cold_driver_seconds"]
            )
    else:
        result["recovery"] = None
    result["same_results_as_local_engine"] = {k: _same(v, local) for k, v in checks.items()}
    bad = [k for k, ok in result["same_results_as_local_engine"].items() if not ok]
    say("results match CEC's local engine everywhere" if not bad else f"RESULTS DIFFER: {bad}")
    base = native_plan["tuples_per_s"] if native_plan is not None else math.nan
    result["throughput_ratio_best_attached_to_best_native"] = attached["tuples_per_s"] / base
    result["throughput_ratio_attached_to_native"] = _median(pairs)
    result["steady_ratio_attached_to_native"] = _median(attached["steady_pair_ratios"])
    if attached.get("tws_pair_ratios"):
        result["throughput_ratio_attached_to_native_tws"] = statistics.median(attached["tws_pair_ratios"])
        result["steady_ratio_attached_to_native_tws"] = statistics.median(attached["tws_steady_pair_ratios"])
    result["seconds"] = time.perf_counter() - started
    result["loadavg_end"] = os.getloadavg()
    OUT_JSON.parent.mkdir(exist_ok=True)
    for name, other in attached.get("others", {}).items():
        result[f"throughput_ratio_{name}_to_native"] = _median(other["pair_ratios"])
        result[f"steady_ratio_{name}_to_native"] = _median(other["steady_pair_ratios"])
        say(
            f"{name} / Spark native throughput: {result[f'throughput_ratio_{name}_to_native']:.2f} (median of "
            f"pairs {', '.join(f'{r:.2f}' for r in other['pair_ratios'])}); steady state "
            f"{result[f'steady_ratio_{name}_to_native']:.2f}"
        )
    if w.before_tree:
        _before_after_summary(w, result)
    path = OUT_JSON.parent / ATTACHED_JSON.format(keys=w.keys)
    if w.attached_readers:
        path = OUT_JSON.parent / CONNECTOR_JSON.format(keys=w.keys)
    if w.before_tree:  # a file of its own, outside the plots' globs
        path = OUT_JSON.parent / BEFORE_AFTER_JSON.format(keys=w.keys)
    if w.attached_writers != "executors":
        result.setdefault("label", f"writers={w.attached_writers}")
        path = path.with_name(f"{path.stem}-{w.attached_writers}-writers{path.suffix}")
    path.write_text(json.dumps(result, indent=2))
    if w.before_tree:
        pass  # the plots know one tree's systems only
    elif w.attached_readers:
        plot_connector(OUT_JSON.parent, CONNECTOR_PNG)
    else:
        plot_attached(sorted(OUT_JSON.parent.glob(ATTACHED_JSON.format(keys="*"))), ATTACHED_PNG)
    recovered = result["recovery"]
    say(
        f"CEC attached / Spark native throughput: {result['throughput_ratio_attached_to_native']:.2f} (median "
        f"of pairs {', '.join(f'{r:.2f}' for r in pairs)}; best runs {attached['tuples_per_s']:,.0f} vs "
        f"{base:,.0f} tuples/s); steady state (batches after the first) "
        f"{result['steady_ratio_attached_to_native']:.2f}"
        + (
            "; recovery after a driver kill: "
            + ", ".join(
                f"{name.removeprefix('cec_')} {row.get('recovery_seconds', math.nan):.2f} s"
                for name, row in recovered.items()
                if name != "spark_native"
            )
            + f", native {recovered['spark_native']['recovery_seconds']:.2f} s"
            if recovered
            else "; recovery not measured (--skip-recovery)"
        )
        + (
            f"; vs native under transformWithStateInPandas {result['throughput_ratio_attached_to_native_tws']:.2f}"
            f" (steady {result['steady_ratio_attached_to_native_tws']:.2f})"
            if "throughput_ratio_attached_to_native_tws" in result
            else ""
        )
        + f"; {path}"
    )


def _before_after_summary(w: Workload, result: dict[str, Any]) -> None:
    """--before-tree: per attached system, the medians of its per-repeat ratios after / before and of each
    tree's attached / native (every ratio within one repeat), into `result["before_after"]`."""
    attached = result["cec_attached"]
    after_rows = {"attached": attached, **attached.get("others", {})}
    summary: dict[str, Any] = {"before_tree": str(w.before_tree), "after_tree": str(ROOT)}
    for name, row in after_rows.items():
        before = attached["before"][f"before_{name}"]
        figures = {
            "after_before": row["after_before_pair_ratios"],
            "after_before_steady": row["after_before_steady_pair_ratios"],
            "after_to_native": row["pair_ratios"],
            "before_to_native": before["pair_ratios"],
            "after_to_native_steady": row["steady_pair_ratios"],
            "before_to_native_steady": before["steady_pair_ratios"],
        }
        if row.get("after_before_cpu_pair_ratios"):
            figures["after_before_cpu"] = row["after_before_cpu_pair_ratios"]
        summary[name] = {
            "input_reader": row.get("input_reader"),
            **{f"{k}_per_repeat": v for k, v in figures.items()},
            **{f"{k}_median": _median(v) for k, v in figures.items()},
        }
        m = summary[name]
        say(
            f"{name} ({row.get('input_reader')}) after / before: {m['after_before_median']:.2f} (median of "
            f"{', '.join(f'{r:.2f}' for r in figures['after_before'])}; steady "
            f"{m['after_before_steady_median']:.2f}); attached / native after {m['after_to_native_median']:.2f}, "
            f"before {m['before_to_native_median']:.2f} (steady {m['after_to_native_steady_median']:.2f}, "
            f"{m['before_to_native_steady_median']:.2f})"
            + (
                f"; CPU seconds before / after {m['after_before_cpu_median']:.2f} (median of "
                f"{', '.join(f'{r:.2f}' for r in figures['after_before_cpu'])})"
                if "after_before_cpu" in figures
                else ""
            )
        )
    result["before_after"] = summary


BEFORE_AFTER_JSON = "before-after-spark-attached-{keys}.json"
RECOVERY_JSON = "spark-attached-recovery-{keys}.json"
CONNECTOR_JSON = "spark-connector-{keys}.json"
CONNECTOR_RECOVERY_JSON = "spark-connector-recovery-{keys}.json"
CONNECTOR_PNG = ROOT / "benchmarks" / "spark-connector.png"


def _recovery_json(w: Workload) -> str:
    name = RECOVERY_JSON.format(keys=w.keys)
    if w.attached_readers:  # --attached-readers: the connector section's files
        name = CONNECTOR_RECOVERY_JSON.format(keys=w.keys)
    if w.attached_resume:
        name = name.replace(".json", "-resume.json")
    if w.checkpoint_deleted:
        name = name.replace(".json", "-ckpt-deleted.json")
    return name if w.recovery_target is None else name.replace(".json", f"-rto-{w.recovery_target}.json")


def _recovery_focus(w: Workload, result: dict[str, Any]) -> None:
    """`--focus attached --recovery-only`: recovery after a driver SIGKILL at half the input, CEC attached vs
    Spark native, in the same run. Per repeat i: one failure-free run of each system (the baseline its
    recovery_seconds subtracts), then each system's kill and restart (`measure_native_recovery`,
    `measure_attached_recovery`); the order of the systems rotates by one per repeat, so that a drift of
    the shared machine's load falls on every side. The ratios are per pair (each attached system against
    the native run of the same repeat), the medians reported."""
    started = time.perf_counter()
    say("CEC local engine (the reference results)")
    result["cec_local"] = local = measure_cec_local(replace(w, repeats=1))
    attached_systems = _attached_systems(w)
    if w.attached_resume:  # --attached-resume: each attached system also resumes its checkpoint
        attached_systems = {**attached_systems, **{f"{s}_resume": r for s, r in attached_systems.items()}}
    systems = ["native", *attached_systems]
    pairs: list[dict[str, Any]] = []
    for i in range(w.repeats):
        order = systems[i % len(systems) :] + systems[: i % len(systems)]
        pair: dict[str, Any] = {"order": list(order)}
        for system in order:
            if system == "native":
                say(f"repeat {i}: Spark native failure-free, then driver SIGKILLed at half the input")
                ff = measure_native(replace(w, repeats=1), one_batch=False)["native_plan"]
                pair["native_failure_free"] = ff
                pair["native"] = measure_native_recovery(w, ff)
            else:
                reader = attached_systems[system]
                resume = system.endswith("_resume")
                say(f"repeat {i}: CEC {system} failure-free, then driver SIGKILLed at half the input")
                alone = replace(w, repeats=1, attached_readers=(reader,) if reader else ())
                ff = measure_attached(alone, resume=resume)
                pair[f"{system}_failure_free"] = ff
                pair[system] = measure_attached_recovery(w, ff, reader=reader, system=system, resume=resume)
            say(f"  load {os.getloadavg()[0]:.1f}")
        for side in systems:
            pair[f"{side}_same_results"] = _same(pair[side], local) and _same(
                pair[f"{side}_failure_free"], local
            )
        nat = pair["native"]
        for system in attached_systems:
            att = pair[system]
            suffix = "" if system == "attached" else f"_{system}"
            pair[f"ratio_recovery_attached_to_native{suffix}"] = (
                att["recovery_seconds"] / nat["recovery_seconds"] if nat["recovery_seconds"] > 0 else math.nan
            )
            pair[f"ratio_cold_recovery_attached_to_native{suffix}"] = (
                att["recovery_with_cold_driver_seconds"] / nat["recovery_with_cold_driver_seconds"]
                if nat["recovery_with_cold_driver_seconds"] > 0
                else math.nan
            )
            pair[f"ratio_total_overhead_attached_to_native{suffix}"] = (
                att["total_overhead_seconds"] / nat["total_overhead_seconds"]
                if nat["total_overhead_seconds"] > 0
                else math.nan
            )
            if system.endswith("_resume"):  # the resume path against the log path of the same reader
                logs = pair[system.removesuffix("_resume")]
                pair[f"ratio_recovery_resume_to_from_logs{suffix}"] = (
                    att["recovery_seconds"] / logs["recovery_seconds"]
                    if logs["recovery_seconds"] > 0
                    else math.nan
                )
                path = (att.get("restart_cec_recovery") or {}).get("path")
                say(f"repeat {i}: {system} restarted on path {path!r}")
            plan = att.get("restart_plan") or {}
            say(
                f"repeat {i}: recovery {system} {att['recovery_seconds']:.2f} s (plan "
                f"{plan.get('seconds', math.nan):.2f} s, {plan.get('ec_windows', '?')} windows, driver rows "
                f"{plan.get('driver_rows', '?')}) vs native {nat['recovery_seconds']:.2f} s: "
                f"{pair[f'ratio_recovery_attached_to_native{suffix}']:.2f}; with a cold driver "
                f"{pair[f'ratio_cold_recovery_attached_to_native{suffix}']:.2f}; results "
                f"{'match' if pair['native_same_results'] and pair[f'{system}_same_results'] else 'DIFFER'}"
            )
        pairs.append(pair)
        # Written after every pair: a run stopped early (the shared machine, a deadline) keeps its pairs.
        result["pairs"] = pairs
        OUT_JSON.parent.mkdir(exist_ok=True)
        (OUT_JSON.parent / _recovery_json(w)).write_text(json.dumps(result, indent=2))
    result["pairs"] = pairs
    for system in attached_systems:
        suffix = "" if system == "attached" else f"_{system}"
        for name in ("ratio_recovery_attached_to_native", "ratio_cold_recovery_attached_to_native",
                     "ratio_total_overhead_attached_to_native"):  # fmt: skip
            # A pair whose native figure is <= 0 (its restart as fast as its failure-free run) has no ratio.
            defined = [p[f"{name}{suffix}"] for p in pairs if not math.isnan(p[f"{name}{suffix}"])]
            result[f"median_{name}{suffix}"] = statistics.median(defined) if defined else math.nan
            result[f"pairs_with_{name}{suffix}"] = len(defined)
        if system.endswith("_resume"):
            defined = [
                p[f"ratio_recovery_resume_to_from_logs{suffix}"]
                for p in pairs
                if not math.isnan(p[f"ratio_recovery_resume_to_from_logs{suffix}"])
            ]
            result[f"median_ratio_recovery_resume_to_from_logs{suffix}"] = (
                statistics.median(defined) if defined else math.nan
            )
    result["same_results_as_local_engine"] = all(p[f"{side}_same_results"] for p in pairs for side in systems)
    result["seconds"] = time.perf_counter() - started
    result["loadavg_end"] = os.getloadavg()
    OUT_JSON.parent.mkdir(exist_ok=True)
    path = OUT_JSON.parent / _recovery_json(w)
    path.write_text(json.dumps(result, indent=2))
    if w.attached_readers:
        plot_connector(OUT_JSON.parent, CONNECTOR_PNG)
    say(
        f"recovery after a driver kill, attached / native (median of the "
        f"{result['pairs_with_ratio_recovery_attached_to_native']} of {len(pairs)} pairs with a ratio): "
        f"{result['median_ratio_recovery_attached_to_native']:.2f} (warm driver), "
        f"{result['median_ratio_cold_recovery_attached_to_native']:.2f} (cold driver); results "
        f"{'match' if result['same_results_as_local_engine'] else 'DIFFER'}; {path}"
    )


def _recovery_pane(
    right: Any, runs: list[dict[str, Any]], labels: list[str], native: list[float], attached: list[float]
) -> None:
    xs = range(len(runs))
    width = 0.38
    b1 = right.bar(
        [x - width / 2 for x in xs], native, width, label="Spark native (checkpoint)", color="#888888"
    )
    b2 = right.bar(
        [x + width / 2 for x in xs], attached, width, label="CEC attached (output logs)", color="#3b75af"
    )
    right.bar_label(b1, fmt="%.1f s")
    right.bar_label(b2, fmt="%.1f s")
    right.set_xticks(list(xs), labels)
    right.set_ylabel("recovery after a driver SIGKILL at half the input (s, warm driver)")
    right.legend(loc="upper left")


def _recovery_label(system: str, row: dict[str, Any]) -> str:
    """A recovery bar's label: Spark native, or CEC attached with the input reader it restarted through."""
    if system in ("native", "spark_native"):
        return "Spark native"
    return f"CEC attached ({row.get('input_reader', system)})"


def plot_connector(folder: Path, out: Path) -> None:
    """The connector section's chart: per key count, throughput of Spark native (Kafka source and sink,
    RocksDB + changelog checkpointing) and CEC attached through each input reader (median of the runs,
    with the median per-pair ratio), and recovery after a driver SIGKILL (the run's own kills, else the
    median of a --recovery-only file's pairs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # The glob also matches the recovery files (spark-connector-recovery-*.json): no throughput there.
    loaded = (json.loads(p.read_text()) for p in folder.glob(CONNECTOR_JSON.format(keys="*")))
    runs = sorted((r for r in loaded if "cec_attached" in r), key=lambda r: r["keys"])
    # Recovery per key count, as {system: recovery_seconds}: from a throughput run that measured it (one
    # kill per system, the same run as its throughput), else the median of a --recovery-only file's pairs.
    recoveries: dict[int, dict[str, float]] = {}
    for path in folder.glob(CONNECTOR_RECOVERY_JSON.format(keys="*")):
        r = json.loads(path.read_text())
        systems = list(r["pairs"][0]["order"])
        recoveries[r["keys"]] = {
            _recovery_label(s, r["pairs"][0][s]): statistics.median(
                p[s]["recovery_seconds"] for p in r["pairs"]
            )
            for s in systems
        }
    for r in runs:
        if r.get("recovery"):
            recoveries[r["keys"]] = {
                _recovery_label(name, row): row.get("recovery_seconds", math.nan)
                for name, row in r["recovery"].items()
            }
    tuples_of = {r["keys"]: r["tuples"] for r in runs}
    if not runs and not recoveries:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 6))
    colors = {"native": "#888888", "attached": "#3b75af", "other": "#55a868"}
    for x, r in enumerate(runs):
        attached = r["cec_attached"]
        bars = [("Spark native", r["spark_native"]["native_plan"], None, colors["native"])]
        reader = r["attached_readers"][0]
        bars.append(
            (
                f"CEC attached\n({reader})",
                attached,
                (r["throughput_ratio_attached_to_native"], r["steady_ratio_attached_to_native"]),
                colors["attached"],
            )
        )
        for name, other in attached.get("others", {}).items():
            label = name.removeprefix("attached_").replace("_", "-")
            ratios = (r[f"throughput_ratio_{name}_to_native"], r[f"steady_ratio_{name}_to_native"])
            bars.append((f"CEC attached\n({label})", other, ratios, colors["other"]))
        width = 0.8 / len(bars)
        for k, (label, row, ratio, color) in enumerate(bars):
            rate = statistics.median(run["tuples_per_s"] for run in row["runs"])
            bar = left.bar(
                x - 0.4 + width * (k + 0.5), rate, width, color=color, label=label if x == 0 else None
            )
            text = f"{rate:,.0f}/s" + (f"\n{ratio[0]:.2f}x\n(steady {ratio[1]:.2f}x)" if ratio else "")
            left.bar_label(bar, labels=[text], fontsize=8)
    left.set_xticks(range(len(runs)), [f"{r['keys']:,} keys, {r['tuples']:,} tuples" for r in runs])
    left.set_ylabel("tuples/s (median of interleaved runs; label: median per-pair ratios to native)")
    left.set_ylim(0, left.get_ylim()[1] * 1.2)
    left.legend(loc="upper left", fontsize=8)
    for x, (_keys, seconds) in enumerate(sorted(recoveries.items())):
        width = 0.8 / len(seconds)
        for k, label in enumerate(sorted(seconds, key=lambda name: name != "Spark native")):
            secs = seconds[label]
            color = colors[
                "native" if label == "Spark native" else "attached" if "spark-kafka" in label else "other"
            ]
            bar = right.bar(
                x - 0.4 + width * (k + 0.5), secs, width, color=color, label=label if x == 0 else None
            )
            right.bar_label(bar, fmt="%.1f s", fontsize=8)
    right.set_xticks(
        range(len(recoveries)),
        [
            f"{k:,} keys" + (f", {tuples_of[k]:,} tuples" if k in tuples_of else "")
            for k in sorted(recoveries)
        ],
    )
    right.set_ylabel("recovery after a driver SIGKILL at half the input (s, warm driver)")
    highest = max(
        (v for seconds in recoveries.values() for v in seconds.values() if not math.isnan(v)), default=1
    )
    right.set_ylim(0, highest * 1.3)  # room for the legend above the bars' labels
    right.legend(loc="upper left", fontsize=8)
    fig.suptitle(
        "CEC attached vs Spark native with Spark's Kafka connector (Kafka source and sink, RocksDB state store, "
        "changelog checkpointing)"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=90)


def plot_attached(paths: list[Path], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # The glob also matches the --recovery-only files (spark-attached-recovery-*.json): no throughput there.
    loaded = (json.loads(p.read_text()) for p in paths)
    runs = sorted(
        (r for r in loaded if "throughput_ratio_attached_to_native" in r),
        key=lambda r: (r["keys"], r.get("label", "")),
    )
    if not runs:
        return
    # A run without the recovery measurement (--skip-recovery) has no recovery bars; with none, no pane.
    native = [(r["recovery"] or {}).get("spark_native", {}).get("recovery_seconds", math.nan) for r in runs]
    attached = [(r["recovery"] or {}).get("cec_attached", {}).get("recovery_seconds", math.nan) for r in runs]
    with_recovery = not all(math.isnan(x) for x in [*native, *attached])
    if with_recovery:
        fig, (left, right) = plt.subplots(1, 2, figsize=(19, 8))
    else:
        fig, left = plt.subplots(1, 1, figsize=(10, 8))
    # A run's "label" (added by hand to a copied JSON, e.g. the code before a change) tells runs apart.
    labels = [f"{r.get('label', 'attached')}: {r['keys']:,} keys, {r['tuples']:,} tuples" for r in runs]
    ratios = [r["throughput_ratio_attached_to_native"] for r in runs]
    # Runs with --tws-baseline also have the ratio against native under transformWithStateInPandas.
    tws = [r.get("throughput_ratio_attached_to_native_tws", math.nan) for r in runs]
    at = range(len(runs))
    half = 0.38 if any(not math.isnan(x) for x in tws) else 0.0
    bars = left.bar(
        [x - half / 2 for x in at], ratios, half or 0.6, color="#3b75af", label="vs applyInPandasWithState"
    )
    left.bar_label(bars, fmt="%.2fx")
    if half:
        bars = left.bar(
            [x + half / 2 for x in at], tws, half, color="#55a868", label="vs transformWithStateInPandas"
        )
        left.bar_label(bars, fmt="%.2fx")
    left.set_xticks(list(at), labels)
    left.axhline(1.0, color="black", linewidth=0.8)
    left.axhline(1.5, color="#c44e52", linewidth=0.8, linestyle="--", label="target 1.5x")
    left.set_ylim(0, max([*ratios, *(x for x in tws if not math.isnan(x)), 1.5]) * 1.25)
    left.set_ylabel("CEC attached / Spark native throughput (median of same-run pairs)")
    left.legend(loc="upper right")
    axes = [left]
    if with_recovery:
        _recovery_pane(right, runs, labels, native, attached)
        axes.append(right)
    for axis in axes:
        axis.tick_params(axis="x", labelrotation=35, labelsize=8)
        for tick in axis.get_xticklabels():
            tick.set_horizontalalignment("right")
    fig.suptitle(
        "CEC attached (cec_aggregate) vs Spark native (RocksDB state store, AvailableNow, same triggers)"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=90)


if __name__ == "__main__":
    sys.exit(main())
