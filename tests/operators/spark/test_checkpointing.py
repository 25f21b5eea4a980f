"""`operators.spark.checkpointing`: the attached operator's G-check choices come from the local runtime's
policies (`cec.policy`), fed with the state partition's own rates; no JVM (injected rates and clocks):

1. targets: with Q/U the front windows are G-checked while q or u (plus one micro-batch of look-ahead)
   passes the target, oldest first, and no further; the budget (CI of every CP on an injected clock) caps
   how many;
2. a recovery target: the U and Q in force are RecoveryTimePolicy's for the partition's rates and open
   windows; a target the EC alone cannot meet is refused out loud, once per partition;
3. cost-benefit: the same decision CostBenefitPolicy makes for the same view;
4. the partition's measurements: rates from its micro-batches (input = advance of the input position),
   the planning's EC build rate as this partition's share, EC load from the initial state;
5. the processor, driven without Spark (a recording handle): its timer G-checks under a Q target, keeps
   `fp_out`/`fp_clock` so a G-checked window leaves the front, and saves its `PartitionControl`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import pytest

from cec.config import Checkpointing
from cec.policy import CostBenefitPolicy, RecoveryTimePolicy, WindowView
from cec.rates import MeasuredRates
from cec.records import Kind
from cec.schedule import CheckpointSchedule
from operators.spark.checkpointing import (
    GCheckSpec,
    PartitionControl,
    PlannedRecovery,
    WindowMark,
    choose_gchecks,
)
from operators.spark.processor import (
    CONTROL_KIND,
    FIGURES_ENTRY,
    AggregateSpec,
    CecAggregateProcessor,
    partition_groups,
)
from operators.spark.state_partition import PartitionState
from tests.operators.spark.packed import packed_frames


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _run(
    checkpointing: Checkpointing,
    windows: list[WindowMark],
    *,
    control: PartitionControl | None = None,
    open_windows: int | None = None,
    cost: float = 0.0,
    clock: FakeClock | None = None,
    schedule: CheckpointSchedule | None = None,
) -> tuple[list[Any], PartitionControl]:
    """Which keys `choose_gchecks` G-checks, each G-check taking `cost` seconds of the injected clock."""
    clock = clock or FakeClock()
    control = control or PartitionControl()
    spec = GCheckSpec.from_checkpointing(checkpointing)
    assert spec is not None
    schedule = schedule or spec.schedule(clock)
    schedule.start()
    done: list[Any] = []

    def gcheck(key: Any) -> None:
        done.append(key)
        clock.now += cost

    n = len(windows) if open_windows is None else open_windows
    choose_gchecks(control, spec.policy(control.rates), schedule, windows, n, gcheck, clock, 0)
    return done, control


def test_u_target_checks_the_front_oldest_first_with_the_lookahead() -> None:
    windows = [
        WindowMark("b", 50, 5),
        WindowMark("a", 400, 40),
        WindowMark("c", 250, 20),
        WindowMark("d", 10, 1),
    ]
    unlimited = Checkpointing(u_target=200, ci_ms=100, cp_ms=100)
    done, control = _run(unlimited, windows)
    assert done == ["a", "c"]  # u > 200; "b" (50) is within U and so is everything after it
    assert control.gchecks == 2 and control.targets == (None, 200)
    # One micro-batch of 180 input tuples ahead: "b" would be at 230 by the next timer, so it goes now too.
    ahead = PartitionControl(lookahead_in=180)
    done, _ = _run(unlimited, windows, control=ahead)
    assert done == ["a", "c", "b"]


def test_q_target_acts_on_records_since_the_footprint() -> None:
    windows = [WindowMark("a", 10, 90), WindowMark("b", 5, 70), WindowMark("c", 1, 30)]
    done, control = _run(Checkpointing(q_target=50, ci_ms=100, cp_ms=100), windows)
    assert done == ["a", "b"] and control.targets == (50, None)


def test_the_budget_caps_gchecks_per_timer() -> None:
    clock = FakeClock()
    schedule = CheckpointSchedule(5.0, 100.0, clock=clock)  # 5% duty, credit capped at one CI (5 ms)
    schedule.start()
    clock.now += 1.0  # a second of run time: the credit is one CI
    windows = [WindowMark(i, 1000 - i, 0) for i in range(20)]
    done, control = _run(Checkpointing(u_target=100), windows, cost=0.002, clock=clock, schedule=schedule)
    # 2 ms per G-check against 5 ms of credit: three (the third overshoots; the debt is paid next time).
    assert done == [0, 1, 2]
    assert control.rates.gcheck_seconds == pytest.approx(0.002)


def test_the_allowance_is_the_budgets_share_of_the_time_since_the_last_timer() -> None:
    """A partition's timer looks once per micro-batch: 1 s since the last one at CI/CP = 5/100 allows 50 ms of
    G-checks (17 of 3 ms: spending may overshoot by one), not the one CI (5 ms) a look every few tuples
    would get; the overshoot is a debt the next timer pays first."""
    spec = GCheckSpec.from_checkpointing(Checkpointing(u_target=100))
    assert spec is not None
    clock = FakeClock()
    control = PartitionControl()
    windows = [WindowMark(i, 1000 - i, 0) for i in range(100)]
    done: list[Any] = []

    def gcheck(key: Any) -> None:
        done.append(key)
        clock.now += 0.003

    schedule = spec.schedule(clock)
    choose_gchecks(control, spec.policy(control.rates), schedule, windows, 100, gcheck, clock, 0, True, 1.0)
    assert len(done) == 17 and control.debt == pytest.approx(0.001)
    # 0.101 s later: 5.05 ms - 1 ms of debt allowed -> 2 G-checks (6 ms), 1.95 ms of debt for the next timer.
    done.clear()
    choose_gchecks(control, spec.policy(control.rates), schedule, windows, 100, gcheck, clock, 0, True, 0.101)
    assert len(done) == 2 and control.debt == pytest.approx(0.00195)


def test_recovery_target_picks_the_policys_targets_for_the_partitions_rates() -> None:
    rates = MeasuredRates(replay_rate=10_000.0, ec_build_rate=100_000.0, ec_load_rate=50_000.0)
    control = PartitionControl(rates=rates)
    windows = [WindowMark(i, 5000 - 10 * i, 100) for i in range(300)]
    done, control = _run(Checkpointing(recovery_target="1s", ci_ms=100, cp_ms=100), windows, control=control)
    expected = RecoveryTimePolicy(1.0, rates=MeasuredRates(**{**rates.as_dict(), "measured": set()}))
    expected.observe(rates, 300)
    assert control.targets == (expected.q_target, expected.u_target)
    assert 1000 < expected.u_target < 10_000  # (0.8 s - the EC of 300 windows) at 10k tuples/s
    assert done == [w.key for w in windows if w.u > expected.u_target]
    assert control.said == []


def test_an_unreachable_recovery_target_is_refused_once(caplog: pytest.LogCaptureFixture) -> None:
    rates = MeasuredRates(ec_build_rate=40_000.0, ec_load_rate=25_000.0)
    control = PartitionControl(rates=rates)
    windows = [WindowMark(i, 100, 1) for i in range(50)]
    with caplog.at_level(logging.WARNING, logger="operators.spark.checkpointing"):
        for _ in range(3):  # three timers: one line
            _run(Checkpointing(recovery_target="100ms"), windows, control=control, open_windows=50_000)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "recovery target 0.1 s cannot be met" in lines[0], lines
    assert "state partition 0" in lines[0]
    assert len(control.said) == 1 and control.said[0].startswith("problem: recovery target 0.1 s")


def test_q_below_the_open_windows_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    control = PartitionControl()
    with caplog.at_level(logging.WARNING, logger="operators.spark.checkpointing"):
        for _ in range(2):
            _run(Checkpointing(q_target=10), [WindowMark("a", 5, 50)], control=control, open_windows=40)
    assert [r.getMessage() for r in caplog.records] == [
        "cec_aggregate state partition 0: Q=10 is below the 40 open windows: an extent holds a footprint of "
        "every open window, so q <= Q cannot hold at any checkpoint budget (Q must be >= N)"
    ]


def test_cost_benefit_makes_the_policys_decision() -> None:
    rates = MeasuredRates(input_rate=5_000.0, replay_rate=20_000.0, gcheck_seconds=1e-3)
    rates.measured.update({"input_rate", "gcheck_seconds"})
    windows = [WindowMark("old", 90_000, 9000), WindowMark("mid", 60_000, 6000), WindowMark("new", 100, 10)]
    done, _ = _run(
        Checkpointing(policy="cost-benefit", mtbf="10min", ci_ms=100, cp_ms=100),
        windows,
        control=PartitionControl(rates=rates),
    )
    policy = CostBenefitPolicy(600.0, rates)
    policy.observe(rates, 3)
    wants = [
        policy.wants_oldest(WindowView(9000, 90_000, 3, 30_000, 3000)),
        policy.wants_oldest(WindowView(6000, 60_000, 3, 59_900, 5990)),
        policy.wants_oldest(WindowView(10, 100, 3, 100, 10)),
    ]
    assert wants == [True, True, False]  # the case is one where the policy draws a line
    assert done == ["old", "mid"]


def test_a_starts_fixed_cost_is_what_a_recovery_target_plans_a_restart_with(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # cec_aggregate() called at t=1,000 s; the planning read 9,000 records in 2 s; this partition's first
    # task at t=1,007 s: the start cost 5 s besides the EC build, and a restart will pay it again.
    control = PartitionControl()
    planned = PlannedRecovery(records_read=9_000, ec_windows=10, ec_build_seconds=2.0, started_wall=1_000.0)
    control.take_planned(planned, 3, now_wall=1_007.0)
    assert control.rates.restart_seconds == pytest.approx(5.0)
    # Planning over empty logs is all fixed cost.
    empty = PartitionControl()
    empty.take_planned(PlannedRecovery(ec_build_seconds=2.0, started_wall=1_000.0), 3, now_wall=1_004.0)
    assert empty.rates.restart_seconds == pytest.approx(4.0)
    # A 4 s target with that 5 s start: refused out loud, naming the restart; a 20 s one is planned with
    # it: U is smaller than the same target would get without the start.
    windows = [WindowMark(i, 100, 1) for i in range(100)]
    with caplog.at_level(logging.WARNING, logger="operators.spark.checkpointing"):
        _run(Checkpointing(recovery_target="4s"), windows, control=control)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "cannot be met: restarting (5.00 s" in said[0], said
    planned_u = RecoveryTimePolicy(20.0, rates=control.rates)
    planned_u.observe(control.rates, 100)
    no_start = dataclasses.replace(control.rates, restart_seconds=0.0)
    without = RecoveryTimePolicy(20.0, rates=no_start)
    without.observe(no_start, 100)
    assert planned_u.problem() is None and planned_u.u_target < without.u_target


def test_partition_measurements() -> None:
    control = PartitionControl()
    control.take_planned(PlannedRecovery(records_read=90_000, ec_windows=10, ec_build_seconds=1.5), 3)
    control.take_planned(PlannedRecovery(records_read=1, ec_build_seconds=100.0), 3)  # once per run
    assert control.rates.ec_build_rate == pytest.approx(30_000 / 1.5)
    control.observe_load(2_000, 0.5)
    assert control.rates.ec_load_rate == pytest.approx(4_000)
    # First micro-batch: no rate yet (where it started from is unknown here), positions noted.
    control.observe_batch(now=10.0, task_seconds=0.4, seen=[100, 0], emitted=30)
    assert "input_rate" not in control.rates.measured and control.seen == (100, 0) and control.out == 30
    # Second: 150 + 50 input tuples in 2 s of run time, 0.5 s of task time; a partition not read keeps its
    # position.
    control.observe_batch(now=12.0, task_seconds=0.5, seen=[250, 50], emitted=40)
    assert control.rates.input_rate == pytest.approx(100.0)
    # A replay runs through micro-batches like these: 100 tuples per second of them, not the 400 per
    # second of the task alone, which is the processing rate.
    assert control.rates.replay_rate == pytest.approx(100.0)
    assert control.rates.process_rate == pytest.approx(400.0)
    assert control.rates.outputs_per_input == pytest.approx(0.2)
    assert (control.lookahead_in, control.lookahead_out, control.out) == (200, 40, 70)
    control.observe_batch(now=13.0, task_seconds=0.1, seen=[0, 60], emitted=0)
    assert control.seen == (250, 60) and control.lookahead_in == 10


# -- the processor, driven without Spark -----------------------------------------------------------------


class _State:
    def __init__(self) -> None:
        self.value: tuple[Any, ...] | None = None

    def get(self) -> tuple[Any, ...] | None:
        return self.value

    def update(self, value: tuple[Any, ...]) -> None:
        self.value = value


class _Handle:
    def __init__(self) -> None:
        self.state = _State()
        self.timers: list[int] = []

    def getValueState(self, name: str, schema: Any) -> _State:
        return self.state

    def registerTimer(self, at: int) -> None:
        self.timers.append(at)


class _Timers:
    def getCurrentProcessingTimeInMs(self) -> int:
        return 0


def test_processor_timer_gchecks_under_a_q_target_and_keeps_its_control() -> None:
    spec = AggregateSpec("item", "price", "avg", 100, None, None)  # windows of 100: all stay open
    gcheck = GCheckSpec.from_checkpointing(Checkpointing(q_target=10, ci_ms=100, cp_ms=100))
    groups = partition_groups(1)
    processor = CecAggregateProcessor(spec, [[(0,)]], 0, gcheck, groups)
    clock, wall = FakeClock(), FakeClock()
    processor.clock, processor.wall = clock, wall
    handle = _Handle()
    processor.init(handle)  # type: ignore[arg-type]
    # Keys k0..k9 open one window each in offset order: 10 G-opens.
    batch = [(0, o, f"k{o}", 1.0) for o in range(10)]
    out = list(processor.handleInputRows((groups[0],), iter(packed_frames(batch)), _Timers()))  # type: ignore[arg-type]
    assert (out[0]["cec_kind"] == Kind.GOPEN.value).sum() == 10
    assert handle.timers, "a live open window arms the partition's timer"
    fired = list(processor.handleExpiredTimer((groups[0],), _Timers(), None))  # type: ignore[arg-type]
    rows = fired[0]
    gchecks = rows[rows["cec_kind"] != CONTROL_KIND]
    # The partition reports its extent figures and its controls after its G-checks (for the query's
    # progress, never written).
    figures, report = (json.loads(p) for p in rows[rows["cec_kind"] == CONTROL_KIND]["cec_payload"])
    # Its figures: the 10 windows' lowest footprint pos, before the G-checks k0's G-open (tuple 0 claims
    # offset 1), after them k9's (offset 10), as the log stamps them (the G-checks claim (0, 10) as well);
    # after its input it also counts the input tuples it was handed (the query's numInputRows). For
    # trimming, the oldest footprint's time in the log (no time field: sum(pos), as the sink stamps it).
    (before,) = (json.loads(p) for p in out[0][out[0]["cec_kind"] == CONTROL_KIND]["cec_payload"])
    assert before == {"partition": 0, "entry": FIGURES_ENTRY, "phase": 0, "open_windows": 10,
                      "footprint_min": [1], "tuples": 10, "footprint_time": 1,
                      "restoring": False}  # fmt: skip
    assert figures == {**before, "phase": 1, "footprint_min": [10], "tuples": 0, "footprint_time": 10}
    assert report == {
        "partition": 0,
        "q_target": 10,
        "u_target": None,
        "budget": 1.0,
        "gchecks": 9,
        "gcheck_seconds": 0.0,
        "messages": [],
    }
    # q of k_i's window = records after its G-open = 9 - i; look-ahead: the last batch emitted 10. So k0..k8
    # want one (q + 10 > 10) and the budget is unlimited: oldest first, once each. k9 had no input since
    # its G-open (u = 0): a G-check would only repeat it.
    assert list(gchecks["cec_key"]) == [f"k{i}" for i in range(9)]
    assert set(gchecks["cec_kind"]) == {Kind.GCHECK.value}
    part = PartitionState.load(handle.state.value)
    control = part.control
    assert control.gchecks == 9 and control.out == 19 and control.targets == (10, None) and not control.said
    # Each G-checked window's footprint moved to its G-check: k0 first (record 11) ... k8 last (record 19);
    # k9's is still its G-open (record 10).
    assert [part.keys[f"k{i}"][9] for i in range(10)] == [*range(11, 20), 10]
    # A no-data micro-batch's timer (nothing read: no look-ahead, u = 0 everywhere) G-checks nothing, and
    # has nothing new to report.
    processor.init(handle)  # type: ignore[arg-type]
    assert list(processor.handleExpiredTimer((groups[0],), _Timers(), None)) == []  # type: ignore[arg-type]


class TickingClock(FakeClock):
    """Advances `tick` seconds at every reading: each G-check (timed by two readings) costs one tick."""

    def __init__(self, tick: float) -> None:
        super().__init__()
        self.tick = tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


@pytest.mark.parametrize("since_first_task", [50.0, 0.0])
def test_the_first_timers_allowance_covers_the_run_since_the_partitions_first_task(
    since_first_task: float,
) -> None:
    # 200 windows opened in the partition's first micro-batch, all wanting a G-check (Q=10); CI/CP = 10/100
    # and each G-check costs a few ticks of 10 us. The first timer may spend 10% of the wall time since the
    # partition's first task of this start: 5 s after 50 s, room for all of them. (Counted from the current
    # task's start, as before, it had a few ms: the first micro-batch's windows stayed out of reach.)
    spec = AggregateSpec("item", "price", "avg", 100, None, None)
    gcheck = GCheckSpec.from_checkpointing(Checkpointing(q_target=10, ci_ms=10, cp_ms=100))
    groups = partition_groups(1)
    processor = CecAggregateProcessor(spec, [[(0,)]], 0, gcheck, groups)
    wall = FakeClock()
    processor.clock, processor.wall = TickingClock(1e-5), wall
    handle = _Handle()
    processor.init(handle)  # type: ignore[arg-type]
    batch = [(0, o, f"k{o}", 1.0) for o in range(200)]
    list(processor.handleInputRows((groups[0],), iter(packed_frames(batch)), _Timers()))  # type: ignore[arg-type]
    wall.now += since_first_task
    processor.init(handle)  # type: ignore[arg-type]  # the next micro-batch's task
    fired = list(processor.handleExpiredTimer((groups[0],), _Timers(), None))  # type: ignore[arg-type]
    made = sum(int((f["cec_kind"] == Kind.GCHECK.value).sum()) for f in fired)
    if since_first_task:
        # Every window the policy wants: k_i has q = 199 - i records since its G-open (no look-ahead: this
        # task read no input), so k0..k188 (q > Q = 10).
        assert made == sum(1 for i in range(200) if 199 - i > 10)
    else:
        assert made < 5


@pytest.mark.parametrize("default", [True, False])
def test_the_default_gchecks_in_the_micro_batch_that_makes_them_due_and_arms_no_timer(
    default: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default checkpointing (its U scaled down to this input) G-checks inside the call that applied
    the tuples, after their records, and registers no timer: so Spark plans no micro-batch besides the
    data's (timeMode "None"). Another checkpointing (here the same U with another budget) keeps the
    processing-time timer, whose G-checks come in a later micro-batch."""
    monkeypatch.setattr("cec.config.DEFAULT_U_TARGET", 5)
    checkpointing = Checkpointing.default() if default else Checkpointing(u_target=5, ci_ms=10, cp_ms=100)
    gcheck = GCheckSpec.from_checkpointing(checkpointing)
    assert gcheck is not None and gcheck.in_batch is default and gcheck.timers is not default
    spec = AggregateSpec("item", "price", "avg", 100, None, None)  # windows of 100: all stay open
    groups = partition_groups(1)
    processor = CecAggregateProcessor(spec, [[(0,)]], 0, gcheck, groups)
    # Each reading of the wall clock is 1 s later: the budget's share of the run so far allows them all.
    processor.clock, processor.wall = FakeClock(), TickingClock(1.0)
    handle = _Handle()
    processor.init(handle)  # type: ignore[arg-type]
    # k0..k9 open a window each at offsets 0..9 and get a second tuple at 10..19: k_i's u = 19 - i > U.
    batch = [(0, o, f"k{o % 10}", 1.0) for o in range(20)]
    (out,) = processor.handleInputRows((groups[0],), iter(packed_frames(batch)), _Timers())  # type: ignore[arg-type]
    kinds = list(out["cec_kind"])
    if not default:
        assert handle.timers and Kind.GCHECK.value not in kinds
        return
    assert not handle.timers, "no timer: Spark would plan a no-data micro-batch for it"
    records = [k for k in kinds if k != CONTROL_KIND]
    assert records == [Kind.GOPEN.value] * 10 + [Kind.GCHECK.value] * 10  # G-checks after the input's records
    gchecks = out[out["cec_kind"] == Kind.GCHECK.value]
    assert list(gchecks["cec_key"]) == [f"k{i}" for i in range(10)]  # oldest footprint first
    # Each claims its key's last tuple (k_i: offset 10 + i); the figures after them: the oldest footprint
    # is now k0's G-check (pos 11), where before them it was k0's G-open (pos 1).
    assert list(gchecks["cec_o"]) == list(range(10, 20))
    figures = [json.loads(p) for p in out[out["cec_kind"] == CONTROL_KIND]["cec_payload"]]
    phases = [f for f in figures if f.get("entry") == FIGURES_ENTRY]
    assert [(f["phase"], f["tuples"], f["footprint_min"]) for f in phases] == [(0, 20, [1]), (1, 0, [11])]
    assert any(f.get("u_target") == 5 and f.get("gchecks") == 10 for f in figures)
    part = PartitionState.load(handle.state.value)
    assert part.timer == -1 and part.control.gchecks == 10
