"""Recovery time end to end (issue 26): the report's `recovery time`, the metrics and `--recovery-target`
cover the whole restart, process start -> store open -> index -> EC build -> EC load -> restore -> replay,
each phase shown; the time before the store opens is the recovery's too."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cec.cli.common import checkpoint_lines, recovery_lines
from cec.config import Checkpointing
from operators.job import JobSpec, run_job
from recovery.timeline import PHASES, RestartTimeline, process_age, process_started


def test_each_phase_lasts_from_its_mark_to_the_next_on_the_injected_clock() -> None:
    now = [100.0]
    timeline = RestartTimeline(clock=lambda: now[0], started=40.0)  # the process started 60 s earlier
    for phase, at in (("store_open", 101.0), ("index", 101.5), ("ec_build", 104.0), ("ec_load", 104.25)):
        now[0] = at
        timeline.mark(phase)
    now[0] = 104.5
    timeline.mark("store_open")  # marked again (a writer's open retried): it goes on from its first mark
    timeline.mark("restore")
    now[0] = 106.0
    timeline.mark("replay")
    now[0] = 107.0
    assert timeline.durations() == {
        "process_start": 61.0,
        "store_open": 0.5,
        "index": 2.5,
        "ec_build": 0.25,
        "ec_load": 0.25,
        "restore": 1.5,
        "replay": 1.0,
    }
    assert timeline.elapsed() == 67.0 == sum(timeline.durations().values())
    assert timeline.startup_seconds() == 64.0
    with pytest.raises(ValueError, match="unknown restart phase"):
        timeline.mark("coffee")


def test_the_process_start_is_read_from_the_kernel() -> None:
    age = process_age()
    assert age is not None and age > 0  # this test process started before this line
    assert process_started() <= time.perf_counter() - age + 0.05


def _spec(tmp_path: Path) -> JobSpec:
    return JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "sum",
            "window_count": 10,
        },
        source={"type": "generator", "count": 30_000, "keys": 200, "seed": 3, "partitions": 3},
        store={"type": "sqlite", "root": str(tmp_path / "store")},
        output_topic="agg",
        checkpointing={"recovery_target": "5s"},
        batch_size=64,
    )


def test_a_restart_whose_process_started_long_before_its_store_opened_misses_its_target(
    tmp_path: Path,
) -> None:
    spec = _spec(tmp_path)
    first = run_job(spec, max_inputs=15_000)  # stopped there: the log a crash would leave
    assert first.recovery is None
    stats = run_job(spec, started=time.perf_counter() - 100.0)  # as if the process took 100 s to get here
    rec = stats.recovery
    assert rec is not None and stats.completed
    assert list(rec.phases) == list(PHASES)
    assert rec.phases["process_start"] >= 100.0
    assert rec.startup_seconds >= 100.0 and rec.recovery_seconds >= rec.startup_seconds
    assert rec.recovery_seconds == pytest.approx(sum(rec.phases.values()))
    assert rec.catch_up_seconds == pytest.approx(rec.phases["restore"] + rec.phases["replay"])
    assert 0 < rec.install_seconds <= rec.phases["restore"]  # planned as EC load (cec.rates)
    assert stats.rates["restart_seconds"] >= 100.0  # what the policy plans the next restart with
    lines = recovery_lines(stats.as_dict()["recovery"]) + checkpoint_lines(
        stats.as_dict(), Checkpointing(recovery_target=5.0)
    )
    shown = "\n".join(lines)
    assert "from the restart's start to caught up with the crash point" in shown
    assert "restart phases:        process start 1" in shown  # 100,xxx.x ms
    for name in ("store open", "index", "EC build", "EC load", "restore", "replay"):
        assert f", {name} " in shown
    assert "recovery target:       5000 ms: MISSED" in shown


def test_a_first_run_plans_its_target_with_the_start_up_it_paid(tmp_path: Path) -> None:
    """The fixed part of the next restart is known from the first start on: a run whose process took 100 s
    to reach its store plans with it before any recovery, and says at once that 5 s cannot be met."""
    stats = run_job(_spec(tmp_path), max_inputs=15_000, started=time.perf_counter() - 100.0)
    assert stats.recovery is None
    assert stats.rates["restart_seconds"] >= 100.0
    refusal = stats.checkpoint_refusal or ""
    assert "recovery target 5 s cannot be met: restarting (100." in refusal, refusal
