"""The operator's checkpoint schedule, driven by an injected clock (no wall-clock dependence).

A fake clock advances by a fixed cost per input tuple (in the operator) and per G-check (in the codec),
so the operator "takes" exactly that much time and the duty, the targets and the refusals are exact
functions of the run.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from cec.policy import CheckpointPolicy, TargetPolicy
from cec.records import Kind, OutputRecord, RecordCodec
from cec.schedule import CheckpointSchedule
from operators.aggregate import KeyedAggregate
from operators.base import InputTuple, OperatorContext
from operators.runtime import OperatorRuntime, RunStats
from operators.sources import PurchaseGenerator
from queuestore.output import OutputQueue
from queuestore.sqlite import SqliteQueueStore


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TimedAggregate(KeyedAggregate):
    """The count-window average, taking `tuple_s` of (fake) time per tuple."""

    def __init__(self, clock: FakeClock, tuple_s: float, window: int) -> None:
        super().__init__(key_field="item_id", value_field="item_price", window_count=window)
        self.clock = clock
        self.tuple_s = tuple_s

    def process(self, tup: InputTuple, ctx: OperatorContext) -> None:
        self.clock.now += self.tuple_s
        super().process(tup, ctx)


class TimedCodec(RecordCodec):
    """Producing a G-check takes `gcheck_s` of (fake) time."""

    def __init__(self, clock: FakeClock, gcheck_s: float) -> None:
        super().__init__()
        self.clock = clock
        self.gcheck_s = gcheck_s

    def encode(self, record: OutputRecord) -> bytes:
        if record.kind is Kind.GCHECK:
            self.clock.now += self.gcheck_s
        return super().encode(record)


class TimedOutput(OutputQueue):
    """Serving completions takes `poll_s` of (fake) time: a Kafka writer's poll may commit its
    transaction (a flush and a round trip to the broker)."""

    def __init__(self, store: SqliteQueueStore, clock: FakeClock, poll_s: float) -> None:
        super().__init__(store, "agg", 0)
        self.clock = clock
        self.poll_s = poll_s

    def poll(self, timeout: float = 0.0) -> int:
        self.clock.now += self.poll_s
        return super().poll(timeout)


def run(
    root: Path,
    policy: CheckpointPolicy,
    *,
    ci_ms: float,
    cp_ms: float = 100.0,
    count: int,
    keys: int,
    window: int = 1000,
    tuple_s: float = 20e-6,
    gcheck_s: float = 30e-6,
    poll_s: float = 0.0,
    batch_size: int = 64,
    max_inputs: int | None = None,
) -> RunStats:
    clock = FakeClock()
    store = SqliteQueueStore(root)
    store.create_topic("agg", 1)
    output = TimedOutput(store, clock, poll_s)
    try:
        runtime = OperatorRuntime(
            TimedAggregate(clock, tuple_s, window),
            PurchaseGenerator(count, keys, seed=3),
            output,
            policy=policy,
            schedule=CheckpointSchedule(ci_ms, cp_ms, clock=clock),
            codec=TimedCodec(clock, gcheck_s),
            batch_size=batch_size,
        )
        return runtime.run(max_inputs=max_inputs)
    finally:
        output.close()
        store.close()


@pytest.mark.parametrize("ci_ms", [5.0, 25.0])
def test_real_duty_is_the_budget_when_the_policy_always_wants_checkpoints(
    tmp_path: Path, ci_ms: float, caplog: pytest.LogCaptureFixture
) -> None:
    # 2,000 long windows and U=500: holding U needs 4 G-checks per tuple, far more than any budget here.
    stats = run(tmp_path, TargetPolicy(u_target=500), ci_ms=ci_ms, count=30_000, keys=2000)
    budget = ci_ms / 100.0
    assert stats.gchecks > 0
    assert stats.checkpoint_budget == pytest.approx(budget)
    assert abs(stats.checkpoint_duty - budget) <= 0.2 * budget, stats.checkpoint_duty
    # ...and the duty is the real one: G-check time over run time, on the injected clock.
    g_time = stats.gchecks * 30e-6
    run_time = stats.inputs * 20e-6 + g_time
    assert stats.checkpoint_seconds == pytest.approx(g_time, rel=0.05)
    assert stats.checkpoint_duty == pytest.approx(g_time / run_time, rel=0.05)


def test_duty_while_the_policy_wants_checkpoints_is_the_budget_after_a_quiet_start(tmp_path: Path) -> None:
    # U=10,000 over 2,000 long windows: nothing is wanted until u first passes U (about the first third
    # of the run), then holding U needs ~0.2 G-check per tuple (~30% of operator time), far above 5%.
    # (2 s of wanting at 5%: the one CI of credit saved before it, a burst the paper allows too, is 5%.)
    stats = run(
        tmp_path,
        TargetPolicy(u_target=10_000),
        ci_ms=5.0,
        count=30_000,
        keys=2000,
        tuple_s=100e-6,
        gcheck_s=150e-6,
    )
    budget = 0.05
    assert stats.gchecks > 0
    assert abs(stats.checkpoint_duty_wanted - budget) <= 0.2 * budget, stats.checkpoint_duty_wanted
    # The whole-run duty also counts the quiet start, so it is well below the budget.
    assert stats.checkpoint_duty < 0.8 * budget, stats.checkpoint_duty
    assert stats.checkpoint_duty_wanted > stats.checkpoint_duty


def test_wanted_time_is_counted_in_the_cp_periods_in_which_the_policy_wanted_checkpoints() -> None:
    clock = FakeClock()
    schedule = CheckpointSchedule(50.0, 1000.0, clock=clock)  # CI 50 ms of every CP of 1 s
    schedule.start()  # period k is [k, k + 1) s after this
    clock.now += 0.5
    schedule.note_wanting(False)
    clock.now += 1.0  # 1.5: wanted from here...
    schedule.note_wanting(True)
    clock.now += 1.0
    schedule.spend(0.1, 10)
    schedule.note_wanting(True)
    clock.now += 1.0  # ...to 3.5: periods 1, 2 and 3
    schedule.note_wanting(False)
    clock.now += 4.0
    assert schedule.wanted_seconds == pytest.approx(3.0)
    assert schedule.wanted_duty() == pytest.approx(0.1 / 3.0)
    assert schedule.real_duty() == pytest.approx(0.1 / 7.5)
    schedule.note_wanting(True)  # 7.5: a burst satisfied within period 7 is owed that period's CI
    schedule.spend(0.05, 5)
    schedule.note_wanting(False)
    assert schedule.wanted_seconds == pytest.approx(4.0)
    schedule.note_wanting(True)
    clock.now += 1.0  # still wanting at 8.5: periods 7 (counted) and 8
    assert schedule.wanted_duty() == pytest.approx(0.15 / 5.0)


def test_a_budget_too_small_for_the_targets_is_said_once_with_the_duty_that_would_meet_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="operators.runtime"):
        stats = run(tmp_path, TargetPolicy(u_target=500), ci_ms=5.0, count=30_000, keys=2000, tuple_s=100e-6)
    said = [r.getMessage() for r in caplog.records if "cannot be met" in r.getMessage()]
    assert len(said) == 1, said
    assert "U=500" in said[0] and "5.0% of operator time" in said[0]
    needed = float(said[0].split("about ")[1].split("%")[0]) / 100
    # Holding U=500 over 2,000 windows takes ~4 G-checks (120 us) per 100 us tuple: ~55% of the time.
    assert 0.3 <= needed <= 0.9, said[0]
    assert stats.checkpoint_refusal == said[0].split(": ", 1)[1]


def test_q_below_the_open_windows_is_refused_whatever_the_budget(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="operators.runtime"):
        stats = run(tmp_path, TargetPolicy(q_target=100), ci_ms=100.0, cp_ms=100.0, count=20_000, keys=500)
    said = [r.getMessage() for r in caplog.records if "below the" in r.getMessage()]
    assert len(said) == 1 and "Q=100" in said[0] and "Q must be >= N" in said[0]
    assert stats.checkpoint_refusal is not None


def test_with_enough_budget_u_and_q_stay_within_their_targets_and_nothing_is_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # 300 windows, U=3,000 and Q=900: about 0.1 G-check per tuple, ~15% of operator time; budget 40%.
    policy = TargetPolicy(q_target=900, u_target=3000)
    with caplog.at_level(logging.WARNING, logger="operators.runtime"):
        stats = run(tmp_path, policy, ci_ms=40.0, count=40_000, keys=300, gcheck_s=30e-6)
    assert stats.gchecks > 1000
    assert stats.max_replay <= 3000 + 32, stats.max_replay  # + check_every tuples between looks
    assert stats.max_extent <= 900 + 32, stats.max_extent
    assert stats.checkpoint_refusal is None and not caplog.records
    assert 0 < stats.checkpoint_duty < 0.4  # only what the targets needed, not the whole budget


def test_time_serving_the_output_is_not_charged_to_g_checks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The runtime serves the output every 32 G-checks; a poll that commits a transaction takes 2 ms here.
    # That is output work, not checkpointing: charged to the G-checks it made each cost ~30x what it does,
    # the budget ran out and u went far past U (the 1,000-key recovery of benchmarks/RESULTS.md).
    # 3,000 windows and U=1,500: two G-checks per tuple, so each look makes dozens of them in a row
    # (60 us of G-checks per 200 us tuple: ~23% of operator time; budget 40%).
    policy = TargetPolicy(u_target=1500)
    with caplog.at_level(logging.WARNING, logger="operators.runtime"):
        stats = run(
            tmp_path, policy, ci_ms=40.0, count=30_000, keys=3000, tuple_s=200e-6, gcheck_s=30e-6, poll_s=2e-3
        )
    assert stats.gchecks > 20_000
    assert stats.checkpoint_seconds == pytest.approx(stats.gchecks * 30e-6, rel=0.05)
    assert stats.rates["gcheck_seconds"] == pytest.approx(30e-6, rel=0.05)
    assert stats.max_replay <= 1500 + 32, stats.max_replay
    assert stats.checkpoint_refusal is None and not caplog.records


@pytest.mark.parametrize("stop_after", [9_000, 17_345])
def test_tuples_replayed_at_a_crash_stay_within_u_plus_a_batch(tmp_path: Path, stop_after: int) -> None:
    kwargs: dict[str, Any] = dict(ci_ms=40.0, count=25_000, keys=300, batch_size=64)
    first = run(tmp_path, TargetPolicy(u_target=2000), max_inputs=stop_after, **kwargs)
    assert not first.completed and first.gchecks > 0
    second = run(tmp_path, TargetPolicy(u_target=2000), **kwargs)  # recovers from the log the first left
    assert second.completed and second.recovery is not None
    assert 0 < second.recovery.tuples_replayed <= 2000 + 64


class ModelledTargets(TargetPolicy):
    """Targets whose own model says they cannot be held (as a recovery-time policy's does when its
    measured rates say U needs more than its budget cap)."""

    def shortfall(self) -> str | None:
        return "U=500 cannot be held by this model"


def test_a_policys_shortfall_is_said_only_when_the_targets_are_really_missed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Enough budget (as in the test above): u stays within U, and the model's verdict is never said.
    with caplog.at_level(logging.WARNING, logger="operators.runtime"):
        held = run(tmp_path / "held", ModelledTargets(u_target=3000), ci_ms=40.0, count=30_000, keys=300)
    assert held.max_replay <= 3000 + 32, held.max_replay
    assert held.checkpoint_refusal is None and not caplog.records
    # Too little budget: u stays above U, and then the model's reason is said once, with the measured u.
    with caplog.at_level(logging.WARNING, logger="operators.runtime"):
        missed = run(
            tmp_path / "missed",
            ModelledTargets(u_target=500),
            ci_ms=5.0,
            count=30_000,
            keys=2000,
            tuple_s=100e-6,
        )
    said = [r.getMessage() for r in caplog.records if "cannot be held" in r.getMessage()]
    assert len(said) == 1, said
    assert "measured: u=" in said[0]
    u = re.search(r"measured: u=([\d,]+), q=", said[0])
    assert u is not None and int(u.group(1).replace(",", "")) > 500 * 1.05, said[0]
    assert missed.checkpoint_refusal == said[0].split(": ", 1)[1]
