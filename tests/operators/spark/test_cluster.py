"""CEC attached to a PySpark aggregation on a Spark standalone cluster the test starts (tests/operators/spark/cluster.py:
a master and two workers on 127.0.0.1, 1 core each, separate work dirs), over an ordinary JSON topic on the
fixture broker:

1. `cec_aggregate` against `spark://127.0.0.1:P` with a U target gives exactly Spark's own aggregation of
   the same records, computed on the same cluster (and the plain-Python per-key one); the output log holds
   G-checks; executors ran on both workers with the Python that has cec installed; and the embedded
   SQLite store is refused on this non-local master with one clear line;
2. SIGKILLing one worker's executor (its JVM, Python daemon and workers, found through the worker's work
   dir) while the query runs still gives exactly the per-key aggregation, and the query is never
   restarted: the run that was running at the kill (its `runId`) is the one that ends, with more
   micro-batches: Spark reruns the lost partitions' tasks (the state store reloaded from the checkpoint,
   the write task's transaction fencing the lost attempt's writer).

One driver process (tests/operators/spark/cluster_driver.py) runs both as jobs of one application: Spark allows one
SparkContext per process (the suite's `spark` fixture is a local one), and starting executors is the slow
part here. The second job waits for a go file, so that its test is watching when it starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from operators.aggregate import RESULT_SCHEMA
from operators.sinks import count_kinds, iter_payloads
from queuestore.kafka import KafkaQueueStore
from tests.brokers import Broker
from tests.helpers import child_env, process_group_gone, wait_for
from tests.operators.spark.cluster import SparkCluster, Worker, executor_processes
from tests.topic_data import as_json, create_topic, make_purchases, produce

COUNT = 4000
KEYS = 60
WINDOW = 7
PARTITIONS = 2
TRIGGER_ROWS = 1400  # 3 micro-batches: an executor can be killed after the first with two still ahead
U = 300  # the U target of the first job: small enough that windows get G-checked within this input
# A hang guard, not a performance bound: at load 15-20 on the 2 shared cores, starting the executors of the
# application alone took 2 minutes and each job 1-3 more.
JOB_TIMEOUT_S = 900.0

Windows = dict[tuple[str, int], tuple[float, int]]  # (key, window) -> (value, count)


@dataclass
class JsonInput:
    bootstrap: str
    topic: str
    records_file: Path  # [partition, offset, record] of every record, for Spark's own aggregation
    reference: Windows  # the plain-Python per-key count-window average


@pytest.fixture(scope="module")
def json_input(spark_kafka_broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> JsonInput:
    """Purchases {"item", "price", "ts"} as JSON by a plain producer; each item lives in one partition."""
    bootstrap = spark_kafka_broker.bootstrap
    topic = f"cluster-json-{uuid.uuid4().hex[:8]}"
    purchases = make_purchases(COUNT, KEYS, PARTITIONS, seed=23)
    create_topic(bootstrap, topic, PARTITIONS)
    produce(bootstrap, topic, [(p, None, as_json(rec)) for p, rec in purchases])
    offsets = [0] * PARTITIONS
    records = []
    for p, rec in purchases:  # one idempotent producer, no transactions: offsets are dense, in order
        records.append((p, offsets[p], rec))
        offsets[p] += 1
    per_key: dict[str, list[float]] = {}
    for _p, _o, rec in sorted(records, key=lambda r: (r[0], r[1])):
        per_key.setdefault(str(rec["item"]), []).append(float(rec["price"]))
    reference: Windows = {}
    for key, prices in per_key.items():
        for w in range(len(prices) // WINDOW):
            reference[(key, w)] = (sum(prices[w * WINDOW : (w + 1) * WINDOW]) / WINDOW, WINDOW)
    assert len(reference) > 400
    path = tmp_path_factory.mktemp("cluster-input") / "records.json"
    path.write_text(json.dumps(records))
    return JsonInput(bootstrap, topic, path, reference)


@dataclass
class Job:
    work: Path
    output: str

    @property
    def status_path(self) -> Path:
        return self.work / "status.json"

    @property
    def result_path(self) -> Path:
        return self.work / "result.json"

    @property
    def go(self) -> Path:
        return self.work / "go"

    def status(self) -> dict[str, Any]:
        path = self.status_path
        return dict(json.loads(path.read_text())) if path.exists() else {"batches": 0, "active": False}


@dataclass
class ClusterApp:
    """The driver process and its two jobs."""

    child: subprocess.Popen[bytes]
    log: Path
    checked: Job
    killed: Job

    def result(self, job: Job) -> dict[str, Any]:
        def done() -> bool:
            if job.result_path.exists():
                return True
            if self.child.poll() is not None:
                raise AssertionError(f"the cluster driver exited {self.child.returncode}:\n{self.log_tail()}")
            return False

        wait_for(done, timeout=JOB_TIMEOUT_S, interval=0.1)
        result = dict(json.loads(job.result_path.read_text()))
        assert "error" not in result, f"{result['error']}\n{result.get('traceback', '')}"
        return result

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""


def _aggregate(data: JsonInput, job: Job, **extra: Any) -> dict[str, Any]:
    return {
        "input_topic": data.topic,
        "input_format": "json",
        "bootstrap_servers": data.bootstrap,
        "output_topic": job.output,
        "key": "item",
        "value": "price",
        "agg": "avg",
        "window_count": WINDOW,
        "state_dir": str(job.work / "state"),
        "checkpoint_location": str(job.work / "checkpoints"),
        "partitions": PARTITIONS,
        "max_records_per_trigger": TRIGGER_ROWS,
        **extra,
    }


def _job_args(job: Job, aggregate: dict[str, Any], **extra: Any) -> dict[str, Any]:
    job.work.mkdir(parents=True, exist_ok=True)
    return {
        "aggregate": aggregate,
        "status": str(job.status_path),
        "result": str(job.result_path),
        **extra,
    }


@pytest.fixture(scope="module")
def cluster_app(
    spark_cluster: SparkCluster, json_input: JsonInput, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClusterApp]:
    root = tmp_path_factory.mktemp("cluster-app")
    checked = Job(root / "checked", f"cluster-avg-{uuid.uuid4().hex[:8]}")
    killed = Job(root / "killed", f"cluster-kill-{uuid.uuid4().hex[:8]}")
    checkpointing = {"u_target": U, "ci_ms": 100, "cp_ms": 100}
    args = {
        "master": spark_cluster.master_url,
        "conf": {
            "spark.executor.cores": "1",
            "spark.executor.memory": "1g",
            "spark.cores.max": "2",  # one executor per worker
            "spark.task.maxFailures": "4",
            "spark.sql.shuffle.partitions": str(PARTITIONS),
        },
        "jobs": [
            _job_args(
                checked,
                _aggregate(json_input, checked, checkpointing=checkpointing),
                refusals=str(root / "refusals"),
                native={
                    "records": str(json_input.records_file),
                    "key": "item",
                    "value": "price",
                    "window": WINDOW,
                },
            ),
            _job_args(killed, _aggregate(json_input, killed), go=str(killed.go)),
        ],
    }
    spec = root / "args.json"
    spec.write_text(json.dumps(args))
    env = child_env()
    # Executors run the driver's PYSPARK_PYTHON (tests/operators/spark/cluster.py): this venv, where cec is installed.
    env["PYSPARK_PYTHON"] = sys.executable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    log = root / "driver.log"
    with log.open("wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.operators.spark.cluster_driver", str(spec)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: the driver JVM and its Python go with it
        )
    try:
        yield ClusterApp(child, log, checked, killed)
    finally:
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
        wait_for(process_group_gone(child.pid), timeout=60, interval=0.05)


def _cec_windows(bootstrap: str, output: str, probe: Path) -> Windows:
    store = KafkaQueueStore(bootstrap, probe)
    try:
        rows = list(iter_payloads(store, output, RESULT_SCHEMA))
    finally:
        store.close()
    got: Windows = {}
    for row in rows:
        wid = (str(row["key"]), int(row["window"]))
        assert wid not in got, f"window {wid} has more than one result"
        got[wid] = (float(row["value"]), int(row["count"]))
    return got


def _kinds(bootstrap: str, output: str, probe: Path) -> dict[str, int]:
    store = KafkaQueueStore(bootstrap, probe)
    try:
        return dict(count_kinds(store, output))
    finally:
        store.close()


def _assert_same(got: Windows, want: Windows) -> None:
    assert got.keys() == want.keys()
    for wid, (value, count) in want.items():
        assert got[wid] == (pytest.approx(value, rel=1e-12), count), wid


def test_cluster_aggregate_equals_sparks_own_aggregation_with_gchecks(
    spark_cluster: SparkCluster, json_input: JsonInput, cluster_app: ClusterApp, tmp_path: Path
) -> None:
    result = cluster_app.result(cluster_app.checked)
    # Refused on a cluster, in one line, before anything runs.
    refused = result["refusals"].get("sqlite_host", "")
    assert "embedded SQLite store needs a local[...] master" in refused and "\n" not in refused, refused
    assert not result["resumed"] and result["batches"] >= COUNT // TRIGGER_ROWS
    native: Windows = {(k, w): (v, c) for k, w, v, c in result["native"]}
    got = _cec_windows(json_input.bootstrap, cluster_app.checked.output, tmp_path)
    _assert_same(got, native)
    _assert_same(native, json_input.reference)  # Spark's own aggregation is the plain per-key one
    kinds = _kinds(json_input.bootstrap, cluster_app.checked.output, tmp_path)
    assert kinds["R"] == len(got) and kinds.get("GCHECK", 0) > 0, kinds
    # Both workers ran an executor of the application, with the venv's Python (cec importable there).
    for worker in spark_cluster.workers:
        assert list(worker.work_dir.glob("app-*/*/stderr")), f"no executor ran on {worker.work_dir}"
    assert Path(result["executor_python"]) == Path(sys.executable)


def _live_executor(worker: Worker) -> tuple[str, list[int]] | None:
    """A running executor of the application on `worker`: (`<app-id>/<executor-id>`, its pids)."""
    for name, pids in executor_processes(worker).items():
        if pids:
            return name, pids
    return None


def test_exact_after_an_executor_is_sigkilled_mid_run(
    spark_cluster: SparkCluster, json_input: JsonInput, cluster_app: ClusterApp, tmp_path: Path
) -> None:
    job, victim = cluster_app.killed, spark_cluster.workers[0]
    job.go.touch()

    # Mid-run: a micro-batch has completed, the query is still running, and worker 0 has an executor.
    def ready() -> bool:
        if cluster_app.child.poll() is not None or job.result_path.exists():
            raise AssertionError(f"the job ended before the kill:\n{cluster_app.log_tail()}")
        status = job.status()
        return bool(status["active"] and status["batches"] >= 1 and _live_executor(victim))

    wait_for(ready, timeout=JOB_TIMEOUT_S, interval=0.02)
    found = _live_executor(victim)
    assert found is not None
    executor, pids = found
    at_kill = job.status()
    for pid in pids:  # the executor JVM first, then its Python daemon and workers
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    result = cluster_app.result(job)
    assert at_kill["active"] and at_kill["batches"] < result["batches"], (at_kill, result["batches"])
    assert result["run_id"] == at_kill["run_id"], "the query was restarted, not its lost partitions' tasks"
    assert all(_dead(pid) for pid in pids), f"executor {executor} survived SIGKILL"
    _assert_same(_cec_windows(json_input.bootstrap, job.output, tmp_path), json_input.reference)


def _dead(pid: int) -> bool:
    """Exited (a zombie not yet reaped by its parent counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"
