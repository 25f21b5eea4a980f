"""`cec_aggregate`'s default (`resume_checkpoint=True`): a restart after a driver SIGKILL resumes Spark's
own checkpoint when it agrees with the output logs, and recovers from the logs otherwise
(`operators.spark.resume`), on a real broker and local Spark, through Spark's Kafka source, over the 3-partition JSON topic of
test_attach_topic.py (bad and hostile records among the good ones). Every restart's output, read with
read_results, equals the plain-Python aggregation (the failure-free output), each dead letter once.

1. the driver's process group SIGKILLed by a write task half way through a micro-batch (part of batch B+1
   durable beyond the last committed batch B), and SIGKILLed from outside right after a commit: the restart
   resumes the checkpoint (`path` "resumed-checkpoint"), no eventual checkpoint is read from the logs;
2. the checkpoint deleted: the restart recovers from the logs (`path` "from-logs").

The checkpoints that must never be resumed (another run's, another partition count, one behind the logs)
are test_attach_resume_refused.py's, which uses this module's helpers (a file of its own, so that CI's
`--dist loadfile` can run the two halves on two workers).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cec.records import Kind
from operators.base import DEAD_LETTER_SCHEMA
from operators.sinks import iter_payloads
from operators.spark.connector import has_kafka_connector
from operators.spark.generations import list_generations
from operators.spark.kafka_input import SPARK_KAFKA
from operators.spark.resume import FROM_LOGS, RESUMED, latest_checkpoint
from queuestore.kafka import KafkaQueueStore
from tests.helpers import child_env, process_group_gone, wait_for
from tests.helpers.attached import run_to_end
from tests.operators.spark.test_attach import _killed_driver
from tests.operators.spark.test_attach_topic import (
    JsonTopic,
    _args,
    _assert_equal,
    _kinds,
    _reference,
    _results,
    json_topic,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from operators.spark.query import CecAggregateQuery

__all__ = ["json_topic"]  # the module-scoped fixture, shared with test_attach_topic.py


@pytest.fixture(scope="module", autouse=True)
def _connector(spark: SparkSession) -> None:
    if has_kafka_connector(spark):
        return
    why = "Spark's Kafka connector is not on the classpath: run `make spark-kafka-jars`"
    if os.environ.get("CI") or os.environ.get("CEC_TEST_SPARK_KAFKA") == "required":
        pytest.fail(why, pytrace=False)
    pytest.skip(why)


def _resume_args(data: JsonTopic, root: Path, output: str, **extra: Any) -> dict[str, Any]:
    """The query of these tests: Spark's Kafka source, `resume_checkpoint` left at its default (True)."""
    return _args(data, root, output, input_reader=SPARK_KAFKA, **extra)


def _killed_after_commit(args: dict[str, Any], work: Path, batch: int) -> None:
    """Run the driver script in a child process and SIGKILL its process group (driver, JVM, Python
    workers) from here as soon as Spark has committed micro-batch `batch` (the run's `commits/<batch>`)."""
    work.mkdir(parents=True, exist_ok=True)
    done = work / "done.json"
    spec = work / "args.json"
    spec.write_text(json.dumps({**args, "done": str(done)}))
    location = Path(args["checkpoint_location"])
    before = latest_checkpoint(location)
    err = work / "stderr.txt"  # a file, not a pipe: nobody reads it while waiting, a full pipe would block
    with err.open("wb") as sink:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.operators.spark.attach_driver", str(spec)],
            env=child_env(None),
            stdout=subprocess.DEVNULL,
            stderr=sink,
            start_new_session=True,
        )

    def committed() -> bool:
        assert child.poll() is None, f"the driver ended first: {err.read_text()[-3000:]}"
        run = latest_checkpoint(location)
        return (
            run is not None and (run != before or before is None) and (run / "commits" / str(batch)).exists()
        )

    try:
        wait_for(committed, timeout=600, interval=0.005)
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
        wait_for(process_group_gone(child.pid), timeout=300, interval=0.05)
    finally:
        if child.poll() is None or not process_group_gone(child.pid)():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
    assert not done.exists(), "the kill came after the run had ended"


def _recovery(query: CecAggregateQuery) -> dict[str, Any]:
    progress = query.lastProgress
    assert progress is not None
    return dict(progress["cec"]["recovery"])


def _assert_exact(spark: SparkSession, data: JsonTopic, root: Path, output: str) -> None:
    _assert_equal(_results(spark, data, output), _reference(data))
    assert _all_dead_letters(data, root, output) == sorted(data.bad)  # each once, in every generation


def _all_dead_letters(data: JsonTopic, root: Path, output: str) -> list[tuple[int, int]]:
    """The (partition, offset) of every dead letter in every generation of `output`."""
    store = KafkaQueueStore(data.bootstrap, root / "probe")
    try:
        return sorted(
            (d["partition"], d["offset"])
            for g in list_generations(store, output)
            for d in iter_payloads(store, g.topic, DEAD_LETTER_SCHEMA, Kind.DEAD)
        )
    finally:
        store.close()


def test_a_restart_resumes_the_checkpoint_after_a_kill_mid_batch_and_is_exact(
    spark: SparkSession, json_topic: JsonTopic, tmp_path: Path
) -> None:
    """The 3rd of 6 micro-batches: its first write task kills the driver's process group with half of its
    partition's records durable, past the last committed batch's marker. The restart resumes Spark's
    checkpoint (its state store, no eventual checkpoint read from the logs), reruns the batch, whose write
    task finds its durable half and appends only the rest."""
    output = f"avg-resume-{uuid.uuid4().hex[:8]}"
    args = _resume_args(json_topic, tmp_path, output)
    _killed_driver(args, tmp_path / "driver", hit=3)
    partial = _kinds(json_topic, tmp_path, output)
    total = sum(len(v) for v in _reference(json_topic).values())
    assert 0 < partial["R"] < total, (partial, total)
    killed_run = latest_checkpoint(tmp_path / "checkpoints")

    query = run_to_end(spark, args)
    rec = _recovery(query)
    assert rec["path"] == RESUMED, rec
    assert query.checkpoint == killed_run  # Spark's own checkpoint, not a fresh one
    assert rec["resumed"] and rec["ec_windows"] == 0 and rec["ec_records_read"] == 0
    assert query.recovery.checkpoint_batch is not None and query.recovery.checkpoint_batch >= 1
    assert query.recovery.initial is None
    _assert_exact(spark, json_topic, tmp_path, output)


def test_a_restart_resumes_after_a_kill_from_outside_and_is_exact(
    spark: SparkSession, json_topic: JsonTopic, tmp_path: Path
) -> None:
    output = f"avg-resume-out-{uuid.uuid4().hex[:8]}"
    args = _resume_args(json_topic, tmp_path, output)
    _killed_after_commit(args, tmp_path / "driver", batch=1)

    query = run_to_end(spark, args)
    rec = _recovery(query)
    assert rec["path"] == RESUMED, rec
    assert rec["ec_records_read"] == 0
    _assert_exact(spark, json_topic, tmp_path, output)


def test_a_deleted_checkpoint_recovers_from_the_logs_and_is_exact(
    spark: SparkSession, json_topic: JsonTopic, tmp_path: Path
) -> None:
    output = f"avg-resume-del-{uuid.uuid4().hex[:8]}"
    args = _resume_args(json_topic, tmp_path, output)
    _killed_driver(args, tmp_path / "driver", hit=3)
    shutil.rmtree(tmp_path / "checkpoints")

    query = run_to_end(spark, args)
    rec = _recovery(query)
    assert rec["path"] == FROM_LOGS and rec["reason"] == "no earlier checkpoint", rec
    assert rec["resumed"] and rec["ec_windows"] > 0  # the eventual checkpoint, read back from the logs
    _assert_exact(spark, json_topic, tmp_path, output)
