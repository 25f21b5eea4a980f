"""Long-running CEC operator tasks on Spark (operators.spark.host): exact recovery when Spark relaunches a
task whose Python worker was SIGKILLed, when a partition exhausts its task attempts (the host resubmits
the job), and when the driver itself is SIGKILLed and run again.

Invariant (DESIGN-NOTES section 2): the results in the logs, control tuples dropped, equal those of a
failure-free run, per key and in order (keys live in one partition each; partitions interleave freely).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cec.exceptions import ConfigError
from cec.records import Kind
from operators.sources import PurchaseGenerator
from operators.spark.host import SparkOperatorHost, pid_file_name
from queuestore.sqlite import SqliteQueueStore
from tests.helpers import child_env, log_records, per_key, process_group_gone, results, wait_for
from tests.operators.spark.pipelines import AGGREGATED, FILTERED, filter_aggregate, run_reference

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KEYS = 200


def _log_end(root: Path, topic: str, partition: int) -> int:
    store = SqliteQueueStore(root)
    try:
        if not store.topic_exists(topic):
            return 0
        with store.reader(topic, partition) as reader:
            return reader.end_offset()
    finally:
        store.close()


def _assert_same_results(run_root: Path, ref_root: Path, partitions: int = 2) -> None:
    run, ref = SqliteQueueStore(run_root), SqliteQueueStore(ref_root)
    try:
        got, want = results(run, AGGREGATED), results(ref, AGGREGATED)
        assert len(got) == len(want) > 0
        assert per_key(got) == per_key(want)
        for p in range(partitions):
            # The filter's output: the same records in the same order (one filter partition reads one input
            # partition, so its order is deterministic).
            got_f = [r.payload for r in log_records(run, FILTERED, p) if r.kind is Kind.R]
            want_f = [r.payload for r in log_records(ref, FILTERED, p) if r.kind is Kind.R]
            assert got_f == want_f and got_f, p
            for topic in (FILTERED, AGGREGATED):
                kinds = [r.kind for r in log_records(run, topic, p)]
                assert kinds.count(Kind.EOS) == 1 and kinds[-1] is Kind.EOS, (topic, p)
    finally:
        run.close()
        ref.close()


class _Killer(threading.Thread):
    """SIGKILLs partition 0's Python worker at each of `attempts` once its aggregate log has grown by
    `growth` records since the previous kill: always mid-run, never before recovery made progress."""

    def __init__(self, root: Path, pid_dir: Path, attempts: list[tuple[int, int]], growth: int) -> None:
        super().__init__(daemon=True)
        self.root, self.pid_dir, self.attempts, self.growth = root, pid_dir, attempts, growth
        self.killed: list[int] = []
        self.error: BaseException | None = None

    def _grown_past(self, target: int) -> bool:
        return _log_end(self.root, AGGREGATED, 0) >= target

    def run(self) -> None:
        try:
            mark = 0
            for job_attempt, task_attempt in self.attempts:
                pid_file = self.pid_dir / pid_file_name("chain", job_attempt, 0, task_attempt)
                wait_for(pid_file.exists, timeout=600)
                wait_for(partial(self._grown_past, mark + self.growth), timeout=600)
                pid = int(pid_file.read_text())
                os.kill(pid, signal.SIGKILL)
                self.killed.append(pid)
                mark = _log_end(self.root, AGGREGATED, 0)
        except BaseException as exc:  # reported by the test
            self.error = exc


def _run_with_kills(
    spark: SparkSession, tmp_path: Path, count: int, attempts: list[tuple[int, int]], growth: int
) -> tuple[Any, _Killer]:
    root, pid_dir = tmp_path / "run", tmp_path / "pids"
    pid_dir.mkdir()
    pipeline = filter_aggregate({"type": "sqlite", "root": str(root)}, count=count, keys=KEYS)
    host = SparkOperatorHost(spark, pipeline, pid_dir=pid_dir)
    killer = _Killer(root, pid_dir, attempts, growth)
    killer.start()
    result = host.run()
    killer.join(timeout=5)
    assert killer.error is None, repr(killer.error)
    assert len(killer.killed) == len(attempts)
    run_reference(filter_aggregate({"type": "sqlite", "root": str(tmp_path / "ref")}, count=count, keys=KEYS))
    _assert_same_results(root, tmp_path / "ref")
    return result, killer


def test_generator_partitions_cover_the_generator_exactly() -> None:
    whole = PurchaseGenerator(1001, 37, seed=3, partitions=3)
    expected = {
        (t.partition, t.offset): t.value for batch in iter(lambda: whole.poll(64), None) for t in batch
    }
    got: dict[tuple[int, int], Any] = {}
    for p in range(3):
        part = PurchaseGenerator(1001, 37, seed=3, partitions=3, only=[p])
        part.seek([5])
        assert all(t.offset >= 5 for t in part.poll(10) or [])
        part.seek([0])
        while (batch := part.poll(64)) is not None:
            got.update({(p, t.offset): t.value for t in batch if t.partition == 0})
    assert got == expected


def test_killed_task_is_relaunched_and_recovers_exactly(spark: SparkSession, tmp_path: Path) -> None:
    result, _ = _run_with_kills(spark, tmp_path, count=40_000, attempts=[(1, 0)], growth=1500)
    assert result.job_attempts == {"chain": 1}
    agg0 = result.instance(1, 0)
    assert agg0.task_attempt == 1 and agg0.resumed  # Spark relaunched it; it recovered from its log
    assert agg0.stats["inputs"] > 0 and agg0.stats["recovery"]["ec_windows"] > 0
    assert result.instance(1, 1).task_attempt == 0 and not result.instance(1, 1).resumed


def test_exhausted_task_attempts_resubmit_the_job(spark: SparkSession, tmp_path: Path) -> None:
    # local[2,3]: three crashes of one partition fail the job; the host resubmits it and it completes.
    host = SparkOperatorHost(
        spark, filter_aggregate({"type": "sqlite", "root": str(tmp_path / "x")}, count=1, keys=1)
    )
    assert host.task_max_failures == 3
    result, _ = _run_with_kills(spark, tmp_path, count=50_000, attempts=[(1, 0), (1, 1), (1, 2)], growth=800)
    assert result.job_attempts == {"chain": 2}
    assert len(result.failures) == 1
    assert result.instance(1, 0).job_attempt == 2 and result.instance(1, 0).resumed
    # The partition that never crashed was cancelled with the failed job and resumed from its log too.
    assert result.instance(1, 1).job_attempt == 2


def test_driver_killed_and_restarted_resumes_exactly(tmp_path: Path) -> None:
    root, pid_dir, out = tmp_path / "run", tmp_path / "pids", tmp_path / "result.json"
    pid_dir.mkdir()
    count = 50_000
    args = [
        sys.executable,
        "-m",
        "tests.operators.spark.driver_script",
        str(root),
        str(count),
        str(KEYS),
        str(pid_dir),
        str(out),
    ]
    # Its own session (process group): the driver's JVM and Python workers are its descendants.
    first = subprocess.Popen(
        args, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        wait_for(lambda: first.poll() is not None or _log_end(root, AGGREGATED, 0) >= 2000, timeout=600)
        assert first.poll() is None, "the driver finished before it could be killed"
        assert not out.exists()
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=300)
        # The driver's JVM exits when its stdin (the dead driver) closes, and takes its workers with it.
        wait_for(process_group_gone(first.pid), timeout=300, interval=0.05)
    finally:
        if first.poll() is None or not process_group_gone(first.pid)():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(first.pid, signal.SIGKILL)
        assert first.stderr is not None
        first.stderr.close()
    partial = _log_end(root, AGGREGATED, 0)
    assert partial >= 2000

    second = subprocess.run(args, env=child_env(), capture_output=True, timeout=900)
    assert second.returncode == 0, second.stderr.decode()[-3000:]
    report = json.loads(out.read_text())
    resumed = [i for i in report["instances"] if i["stats"]["resumed"]]
    assert {(i["stage"], i["partition"]) for i in resumed} >= {(1, 0)}
    run_reference(filter_aggregate({"type": "sqlite", "root": str(tmp_path / "ref")}, count=count, keys=KEYS))
    _assert_same_results(root, tmp_path / "ref")


def test_per_stage_mode_runs_stages_as_concurrent_jobs(spark: SparkSession, tmp_path: Path) -> None:
    wide = filter_aggregate({"type": "sqlite", "root": str(tmp_path / "wide")}, count=1000, keys=10)
    with pytest.raises(
        ConfigError, match="slots"
    ):  # 2 stages x 2 partitions > local[2] slots: would deadlock
        SparkOperatorHost(spark, wide, mode="per-stage").run()
    pipeline = filter_aggregate(
        {"type": "sqlite", "root": str(tmp_path / "run")}, count=30_000, keys=50, partitions=1
    )
    result = SparkOperatorHost(spark, pipeline, mode="per-stage").run()
    assert result.job_attempts == {"stage0": 1, "stage1": 1}
    assert all(i.completed for i in result.instances)
    run_reference(
        filter_aggregate(
            {"type": "sqlite", "root": str(tmp_path / "ref")}, count=30_000, keys=50, partitions=1
        )
    )
    run, ref = SqliteQueueStore(tmp_path / "run"), SqliteQueueStore(tmp_path / "ref")
    try:
        got = results(run, AGGREGATED)
        assert got == results(ref, AGGREGATED) and got  # one partition: the exact sequence
    finally:
        run.close()
        ref.close()


def test_host_applies_a_checkpointing_to_every_stage(spark: SparkSession, tmp_path: Path) -> None:
    from cec import Checkpointing

    pipeline = filter_aggregate({"type": "sqlite", "root": str(tmp_path)}, count=10, keys=2)
    wanted = Checkpointing(u_target=123, recovery_target="2s")
    host = SparkOperatorHost(spark, pipeline, checkpointing=wanted)
    assert [spec.checkpointing for spec in host.pipeline] == [wanted, wanted]
    assert pipeline[1].checkpointing != wanted  # the caller's specs are left as they were
    assert SparkOperatorHost(spark, pipeline).pipeline[1].checkpointing == pipeline[1].checkpointing
    with pytest.raises(ConfigError):
        SparkOperatorHost(spark, pipeline, checkpointing={"u_target": 5})  # type: ignore[arg-type]


def test_a_pipeline_resumed_against_another_input_fails_once_on_the_driver(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Not in every task attempt of every job submission: the driver looks at each log before any task."""
    from dataclasses import replace

    from recovery.exceptions import InputMismatchError

    store = {"type": "sqlite", "root": str(tmp_path)}
    run_reference(filter_aggregate(store, count=2000, keys=KEYS))
    before = results(SqliteQueueStore(tmp_path), AGGREGATED)
    pipeline = filter_aggregate(store, count=2000, keys=KEYS)
    pipeline[0] = replace(pipeline[0], source=replace(pipeline[0].source, seed=8))
    host = SparkOperatorHost(spark, pipeline)
    with pytest.raises(
        InputMismatchError, match=rf"{FILTERED}\[0\] in .* was built from another input \(input.seed"
    ):
        host.run()
    assert results(SqliteQueueStore(tmp_path), AGGREGATED) == before
