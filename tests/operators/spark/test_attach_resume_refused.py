"""`cec_aggregate`'s default (`resume_checkpoint=True`): a Spark checkpoint that does not belong to the
restart is never resumed; the restart recovers from the output logs instead (`operators.spark.resume`, `path` "from-logs"),
on a real broker and local Spark, through Spark's Kafka source, over the 3-partition JSON topic of
test_attach_topic.py. Every restart's output equals the plain-Python aggregation (the failure-free output),
each dead letter once:

1. a checkpoint of another run (another output topic's, copied in) and a restart with another partition
   count: never resumed;
2. a checkpoint behind the logs (an older copy restored after a later run went on): detected, from the logs.

The restarts that do resume are test_attach_resume.py's (whose helpers this module uses).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from operators.spark.resume import FROM_LOGS, latest_checkpoint
from tests.helpers.attached import run_to_end
from tests.operators.spark.test_attach import _killed_driver
from tests.operators.spark.test_attach_resume import _assert_exact, _connector, _recovery, _resume_args
from tests.operators.spark.test_attach_topic import JsonTopic, json_topic

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["_connector", "json_topic"]  # the module-scoped fixtures, shared with test_attach_resume.py


def test_another_runs_checkpoint_is_never_resumed(
    spark: SparkSession, json_topic: JsonTopic, tmp_path: Path
) -> None:
    """Run A's checkpoint directory copied under run B's checkpoint_location (the newest there): B's
    restart after a driver SIGKILL refuses it (another output topic), recovers from B's logs, exactly."""
    a_out, b_out = f"avg-resume-a-{uuid.uuid4().hex[:8]}", f"avg-resume-b-{uuid.uuid4().hex[:8]}"
    a_args = _resume_args(json_topic, tmp_path / "a", a_out)
    b_args = _resume_args(json_topic, tmp_path / "b", b_out)
    # A's checkpoint is only the foreign one B must refuse, whatever state A left it in: A runs to the end
    # in this process instead of in a killed driver (a JVM start saved); B is the run killed and restarted.
    run_to_end(spark, a_args)
    _killed_driver(b_args, tmp_path / "b" / "driver", hit=3)
    a_run = latest_checkpoint(tmp_path / "a" / "checkpoints")
    assert a_run is not None
    b_location = tmp_path / "b" / "checkpoints"
    # A's run directory named as B's newest (run ids sort by start time: a later one).
    shutil.copytree(a_run, b_location / "run-9999999999999999999-00000000")

    query = run_to_end(spark, b_args)
    rec = _recovery(query)
    assert rec["path"] == FROM_LOGS and f"this start writes {b_out}" in rec["reason"], rec
    _assert_exact(spark, json_topic, tmp_path / "b", b_out)


def test_a_restart_with_another_partition_count_is_never_resumed(
    spark: SparkSession, json_topic: JsonTopic, tmp_path: Path
) -> None:
    output = f"avg-resume-p-{uuid.uuid4().hex[:8]}"
    args = _resume_args(json_topic, tmp_path, output)
    _killed_driver(args, tmp_path / "driver", hit=3)

    query = run_to_end(spark, {**args, "partitions": 2})
    rec = _recovery(query)
    assert rec["path"] == FROM_LOGS and "partitions" in rec["reason"], rec
    assert query.generation.partitions == 2 and query.generation.index == 1
    _assert_exact(spark, json_topic, tmp_path, output)


def test_a_checkpoint_behind_the_logs_is_detected_and_recovered_from_the_logs(
    spark: SparkSession, json_topic: JsonTopic, tmp_path: Path
) -> None:
    """Killed in batch 2 (run 1); a copy of the checkpoint kept; the restart resumes it and is killed again
    in its 2nd batch, so the logs went past the copy by a whole committed batch and part of the next. The
    copy restored over the checkpoint is behind the logs: not resumed (its rerun batch's records are in the
    logs, and so are later batches' records, which a resumed query would write a second time: the
    sink's prefix check stops a rerun batch that finds more than its own records, so resuming would fail
    the query rather than be exact), recovered from the logs, exactly."""
    output = f"avg-resume-behind-{uuid.uuid4().hex[:8]}"
    args = _resume_args(json_topic, tmp_path, output)
    _killed_driver(args, tmp_path / "driver1", hit=2)
    run = latest_checkpoint(tmp_path / "checkpoints")
    assert run is not None
    older = tmp_path / "older-copy"
    shutil.copytree(run, older)
    _killed_driver(args, tmp_path / "driver2", hit=2)
    assert latest_checkpoint(tmp_path / "checkpoints") == run  # run 2 resumed it (and went on)
    shutil.rmtree(run)
    shutil.copytree(older, run)

    query = run_to_end(spark, args)
    rec = _recovery(query)
    assert rec["path"] == FROM_LOGS and "behind the logs" in rec["reason"], rec
    _assert_exact(spark, json_topic, tmp_path, output)
