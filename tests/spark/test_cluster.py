"""CEC attached to a PySpark aggregation on a Spark standalone cluster the test starts (tests/spark/cluster.py:
a master and two workers on 127.0.0.1, 1 core each, separate work dirs), Kafka via the fixture broker:

1. without failures, `cec_aggregate` against `spark://127.0.0.1:P` gives exactly Spark's own aggregation of
   the same input, computed on the same cluster, and its executors ran on both workers with the Python
   that has cec installed;
2. SIGKILLing one worker's executor (its JVM and Python workers, found through the worker's work dir)
   while the query runs still gives exactly the plain-Python per-key aggregation of the input.

The driver runs in a child process (tests/spark/cluster_driver.py): Spark allows one SparkContext per
process and the suite's `spark` fixture is a local one.
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
from typing import Any

import pytest

from cec.records import AvroCodec, Kind, OutputRecord, RecordCodec
from operators.aggregate import RESULT_SCHEMA
from operators.sinks import count_kinds, iter_payloads
from operators.sources import PurchaseGenerator
from queuestore.kafka import KafkaQueueStore
from tests.brokers import Broker
from tests.helpers import child_env, process_group_gone, wait_for
from tests.spark.cluster import SparkCluster, executor_processes

COUNT = 4000
KEYS = 60
WINDOW = 7
PARTITIONS = 2
TRIGGER_ROWS = 1400  # 3 micro-batches: an executor can be killed after the first with two still ahead
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
DRIVER_TIMEOUT_S = 600.0  # a generous hang guard: at load 20 on 2 cores a run took ~4 minutes

Windows = dict[tuple[str, int], tuple[float, int]]  # (key, window) -> (value, count)


@dataclass
class Purchases:
    bootstrap: str
    topic: str
    reference: Windows  # the plain-Python per-key count-window average of the input
    dead: int  # tuples without a price (dead letters)


@pytest.fixture(scope="module")
def purchases(spark_kafka_broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Purchases:
    """The input topic (CEC R records with Avro payloads, each item in one partition) and its reference."""
    topic = f"cluster-purchases-{uuid.uuid4().hex[:8]}"
    gen = PurchaseGenerator(COUNT, KEYS, seed=23, partitions=PARTITIONS, invalid_every=41)
    codec, payloads = RecordCodec(), AvroCodec(INPUT_SCHEMA)
    open_windows: dict[str, list[int]] = {}
    reference: Windows = {}
    closed: Counter[str] = Counter()
    dead = 0
    store = KafkaQueueStore(spark_kafka_broker.bootstrap, tmp_path_factory.mktemp("cluster-input"))
    try:
        store.create_topic(topic, PARTITIONS)
        for j in range(PARTITIONS):
            with store.writer(topic, j) as writer:
                for o in range(gen.sizes[j]):
                    value = gen.tuple_at(j, o)
                    record = OutputRecord(
                        Kind.R, int(value["item_time"] or 0), (), 0, payload=payloads.encode(value)
                    )
                    writer.append(codec.encode(record), record.meta())
                    price = value["item_price"]
                    if price is None:
                        dead += 1
                        continue
                    key = str(value["item_id"])
                    prices = open_windows.setdefault(key, [])
                    prices.append(price)
                    if len(prices) == WINDOW:
                        reference[(key, closed[key])] = (sum(prices) / WINDOW, WINDOW)
                        closed[key] += 1
                        prices.clear()
    finally:
        store.close()
    assert dead > 0 and len(reference) > 400
    return Purchases(spark_kafka_broker.bootstrap, topic, reference, dead)


@dataclass
class DriverRun:
    result: dict[str, Any]
    output: str
    state_dir: Path
    killed: dict[str, Any] | None = None


def _driver_args(
    cluster: SparkCluster, purchases: Purchases, work: Path, output: str, **aggregate: Any
) -> dict[str, Any]:
    return {
        "master": cluster.master_url,
        "conf": {
            "spark.executor.cores": "1",
            "spark.executor.memory": "1g",
            "spark.cores.max": "2",  # one executor per worker
            "spark.task.maxFailures": "4",
            "spark.sql.shuffle.partitions": str(PARTITIONS),
        },
        "aggregate": {
            "input_topic": purchases.topic,
            "bootstrap_servers": purchases.bootstrap,
            "output_topic": output,
            "key": "item_id",
            "value": "item_price",
            "agg": "avg",
            "window_count": WINDOW,
            "input_schema": INPUT_SCHEMA,
            "state_dir": str(work / "state"),
            "checkpoint_location": str(work / "checkpoints"),
            "partitions": PARTITIONS,
            "max_records_per_trigger": TRIGGER_ROWS,
            **aggregate,
        },
        "status": str(work / "status.json"),
        "result": str(work / "result.json"),
    }


def _start_driver(args: dict[str, Any], work: Path) -> subprocess.Popen[bytes]:
    work.mkdir(parents=True, exist_ok=True)
    spec = work / "args.json"
    spec.write_text(json.dumps(args))
    env = child_env()
    # The executors run the driver's PYSPARK_PYTHON (tests/spark/cluster.py): this venv, where cec is.
    env["PYSPARK_PYTHON"] = sys.executable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark.cluster_driver", str(spec)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=(work / "driver.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own group: the driver JVM and its Python go with it
    )


def _finish(child: subprocess.Popen[bytes], work: Path) -> dict[str, Any]:
    try:
        child.wait(timeout=DRIVER_TIMEOUT_S)
    finally:
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=30)
        wait_for(process_group_gone(child.pid), timeout=60, interval=0.05)
    log = (work / "driver.log").read_text(errors="replace")
    assert child.returncode == 0, f"cluster driver exited {child.returncode}:\n{log[-4000:]}"
    return dict(json.loads((work / "result.json").read_text()))


def _status(work: Path) -> dict[str, Any]:
    path = work / "status.json"
    return dict(json.loads(path.read_text())) if path.exists() else {"batches": 0, "active": False}


def _cec_windows(purchases: Purchases, run: DriverRun) -> Windows:
    store = KafkaQueueStore(purchases.bootstrap, run.state_dir.parent / "probe")
    try:
        rows = list(iter_payloads(store, run.output, RESULT_SCHEMA))
    finally:
        store.close()
    got: Windows = {}
    for row in rows:
        wid = (str(row["key"]), int(row["window"]))
        assert wid not in got, f"window {wid} has more than one result"
        got[wid] = (float(row["value"]), int(row["count"]))
    return got


def _assert_same(got: Windows, want: Windows) -> None:
    assert got.keys() == want.keys()
    for wid, (value, count) in want.items():
        assert got[wid] == (pytest.approx(value, rel=1e-12), count), wid


def _app_dirs(cluster: SparkCluster) -> list[list[str]]:
    """Per worker, the executor directories (`<app-id>/<executor-id>`) its work dir holds."""
    return [
        sorted(str(p.relative_to(w.work_dir)) for p in w.work_dir.glob("app-*/*") if p.is_dir())
        for w in cluster.workers
    ]


@pytest.fixture(scope="module")
def failure_free(
    spark_cluster: SparkCluster, purchases: Purchases, tmp_path_factory: pytest.TempPathFactory
) -> DriverRun:
    work = tmp_path_factory.mktemp("cluster-ff")
    output = f"cluster-avg-{uuid.uuid4().hex[:8]}"
    args = _driver_args(spark_cluster, purchases, work, output)
    args["native"] = {
        "topic": purchases.topic,
        "key": "item_id",
        "value": "item_price",
        "window": WINDOW,
        "options": {"schema": json.dumps(INPUT_SCHEMA)},
    }
    result = _finish(_start_driver(args, work), work)
    assert "error" not in result, result["error"]
    return DriverRun(result, output, work / "state")


def test_cluster_aggregate_equals_sparks_own_aggregation(
    spark_cluster: SparkCluster, purchases: Purchases, failure_free: DriverRun
) -> None:
    result = failure_free.result
    assert not result["resumed"] and result["batches"] >= COUNT // TRIGGER_ROWS
    native: Windows = {(k, w): (v, c) for k, w, v, c in result["native"]}
    got = _cec_windows(purchases, failure_free)
    _assert_same(got, native)
    _assert_same(got, purchases.reference)  # and Spark's own aggregation is the plain per-key one
    store = KafkaQueueStore(purchases.bootstrap, failure_free.state_dir.parent / "kinds")
    try:
        kinds = count_kinds(store, failure_free.output)
    finally:
        store.close()
    assert kinds["R"] == len(got) and kinds["DEAD"] == purchases.dead
    # Both workers ran an executor of the application, and executors ran the venv's Python (cec importable).
    assert all(dirs for dirs in _app_dirs(spark_cluster)), _app_dirs(spark_cluster)
    assert Path(result["executor_python"]) == Path(sys.executable)


def test_exact_after_an_executor_is_sigkilled_mid_run(
    spark_cluster: SparkCluster, purchases: Purchases, tmp_path: Path
) -> None:
    output = f"cluster-kill-{uuid.uuid4().hex[:8]}"
    args = _driver_args(spark_cluster, purchases, tmp_path, output)
    victim = spark_cluster.workers[0]
    before = set(executor_processes(victim))
    child = _start_driver(args, tmp_path)
    try:
        # Mid-run: a micro-batch has completed and the query is still running, with executors on worker 0.
        def ready() -> bool:
            if child.poll() is not None:
                raise AssertionError("the driver ended before the kill")
            status = _status(tmp_path)
            return bool(status["active"] and status["batches"] >= 1 and _new_executor(victim, before))

        wait_for(ready, timeout=DRIVER_TIMEOUT_S, interval=0.02)
        executor, pids = _new_executor(victim, before)
        at_kill = _status(tmp_path)
        for pid in pids:  # the executor JVM first, then its Python daemon and workers
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        raise
    result = _finish(child, tmp_path)
    assert at_kill["active"] and at_kill["batches"] < result["batches"], (at_kill, result["batches"])
    assert all(not Path(f"/proc/{pid}").exists() for pid in pids), f"executor {executor} survived SIGKILL"
    run = DriverRun(result, output, tmp_path / "state")
    _assert_same(_cec_windows(purchases, run), purchases.reference)
    store = KafkaQueueStore(purchases.bootstrap, tmp_path / "kinds")
    try:
        assert count_kinds(store, output)["DEAD"] == purchases.dead  # none lost, none repeated
    finally:
        store.close()


def _new_executor(worker: Any, before: set[str]) -> tuple[str, list[int]] | None:
    """An executor of the running application on `worker` (one that was not there before it started)."""
    for name, pids in executor_processes(worker).items():
        if name not in before and pids:
            return name, pids
    return None
