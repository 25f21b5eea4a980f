"""The policies that plan from measured rates: the recovery-time objective and cost-benefit."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from cec.policy import CostBenefitPolicy, RecoveryTimePolicy, WindowView
from cec.rates import EC_PER_REPLAY, MeasuredRates
from cec.schedule import MAX_DUTY, RTO_MAX_DUTY
from recovery.manager import RecoveryReport


def recovered(**figures: Any) -> RecoveryReport:
    """A recovery's report at the paper's scale, by default 300k records/s EC build, 200k windows/s EC
    load and 50k tuples/s replay; `figures` replace its fields."""
    defaults: dict[str, Any] = {
        "records_read": 90_000,
        "ec_windows": 90_000,
        "ec_build_seconds": 0.3,
        "ec_load_seconds": 0.45,
        "tuples_replayed": 50_000,
        "catch_up_seconds": 1.0,
    }
    return RecoveryReport(**{**defaults, **figures})


def rates(**overrides: float) -> MeasuredRates:
    r = MeasuredRates(
        ec_build_rate=100_000.0,
        ec_load_rate=50_000.0,
        replay_rate=50_000.0,
        gcheck_seconds=20e-6,
        input_rate=40_000.0,
        outputs_per_input=0.2,
    )
    r.measured.update({"gcheck_seconds", "input_rate"})
    for name, value in overrides.items():
        setattr(r, name, value)
    return r


def test_rto_picks_the_largest_u_that_meets_the_target_and_the_budget_that_holds_it() -> None:
    policy = RecoveryTimePolicy(3.0, rates=rates())
    policy.observe(rates(), 10_000)
    # 0.8 * 3 s, minus EC build and load of 10,000 windows (0.1 + 0.2 s), over 0.2/100k + 1/50k s per tuple.
    assert policy.u_target == int(2.1 / (0.2 / 100_000 + 1 / 50_000))  # 95,454
    # The extent the remaining time can read back: N + r*U.
    assert policy.q_target == pytest.approx(10_000 + 0.2 * policy.u_target, abs=2)
    # N/U G-checks per tuple at 40k tuples/s, 20 us each, with 1.5x headroom.
    assert policy.budget() == pytest.approx(1.5 * 20e-6 * 10_000 * 40_000 / policy.u_target)
    assert policy.problem() is None
    assert policy.estimate_seconds() == pytest.approx(0.8 * 3.0, rel=1e-3)
    assert policy.wants_checkpoint(0, policy.u_target + 1) and not policy.wants_checkpoint(0, policy.u_target)
    assert policy.wants_checkpoint(policy.q_target + 1, 0)


def test_rto_tightens_when_the_rates_it_measures_are_slower() -> None:
    policy = RecoveryTimePolicy(3.0, rates=rates())
    policy.observe(rates(), 10_000)
    fast_u, fast_budget = policy.u_target, policy.budget()

    @dataclass
    class Report:
        records_read: int = 30_000
        ec_windows: int = 10_000
        ec_build_seconds: float = 1.0  # 30k records/s: slower than assumed
        ec_load_seconds: float = 0.5
        tuples_replayed: int = 50_000
        catch_up_seconds: float = 2.5  # 20k tuples/s
        install_seconds: float = 0.0
        fixed: float = 0.0

    slower = rates()
    slower.observe_recovery(Report())
    assert (slower.ec_build_rate, slower.ec_load_rate, slower.replay_rate) == (30_000, 20_000, 20_000)
    policy.observe(slower, 10_000)
    assert policy.u_target < fast_u
    budget = policy.budget()
    assert budget is not None and fast_budget is not None and budget > fast_budget
    assert policy.estimate_seconds() <= 0.8 * 3.0 + 1e-6


def test_rto_bounded_by_u_and_capped_duty() -> None:
    policy = RecoveryTimePolicy(3.0, u_cap=5_000, rates=rates())
    policy.observe(rates(), 10_000)
    assert policy.u_target == 5_000
    policy.observe(rates(gcheck_seconds=1e-3), 10_000)  # G-checks so dear that holding U takes > RTO_MAX_DUTY
    # Out of reach: more than the usual cap would only starve the input; it says so.
    assert policy.budget() == MAX_DUTY
    shortfall = policy.shortfall()
    assert shortfall is not None and "cannot be held" in shortfall and "more than the 90%" in shortfall
    assert policy.note() is None  # a model's verdict, said by the runtime only if u then stays above U
    # The rates move: once holding U fits the budget again, the plan says nothing.
    policy.observe(rates(gcheck_seconds=2e-6), 10_000)
    assert policy.shortfall() is None and policy.budget() is not None and policy.budget() < MAX_DUTY


def test_the_share_g_checks_need_counts_the_input_they_slow_down() -> None:
    # Measured before any G-check: 400k tuples/s in, processing at the same rate. Holding U=5,000 over
    # 10,000 windows is 2 G-checks (2 x 2.5 us) per tuple: at 400k tuples/s that alone would be 200% of
    # the run time, which the operator does not have. It slows its input instead: G-checks take 5 us of
    # every 5 + 2.5 us, two thirds of its time; that is what the budget must be, not "out of reach".
    fast = rates(gcheck_seconds=2.5e-6, input_rate=400_000.0, process_rate=400_000.0)
    assert fast.gcheck_share(2.0) == pytest.approx(2.0 / 3.0)
    policy = RecoveryTimePolicy(3.0, u_cap=5_000, rates=fast)
    policy.observe(fast, 10_000)
    assert policy.shortfall() is None
    assert policy.budget() == RTO_MAX_DUTY  # 1.5 x 67% headroom, capped
    note = policy.note()
    assert note is not None and "67% of operator time" in note
    # With time to spare (input at a tenth of the processing rate) the share is the plain product.
    idle = rates(gcheck_seconds=2.5e-6, input_rate=40_000.0, process_rate=400_000.0)
    assert idle.gcheck_share(2.0) == pytest.approx(0.2)


def test_rto_takes_more_than_the_usual_cap_when_its_target_needs_it_and_says_so() -> None:
    # Holding U=5,000 over 10,000 windows at 40k tuples/s: 80,000 G-checks/s. At 8 us each that is 64% of
    # the operator's time (96% with the 1.5x headroom): above MAX_DUTY, so the budget goes to RTO_MAX_DUTY.
    policy = RecoveryTimePolicy(3.0, u_cap=5_000, rates=rates())
    policy.observe(rates(gcheck_seconds=8e-6), 10_000)
    assert policy.budget() == RTO_MAX_DUTY > MAX_DUTY
    note = policy.note()
    assert note is not None and "64% of operator time" in note and "above the 50%" in note
    # Within the usual cap: no note, the budget is what holding U needs times the headroom.
    modest = RecoveryTimePolicy(3.0, u_cap=5_000, rates=rates())
    modest.observe(rates(gcheck_seconds=2e-6), 10_000)
    assert modest.budget() == pytest.approx(1.5 * 0.16) and modest.note() is None
    # A caller can keep the usual cap.
    capped = RecoveryTimePolicy(3.0, u_cap=5_000, max_duty=MAX_DUTY, rates=rates())
    capped.observe(rates(gcheck_seconds=8e-6), 10_000)
    assert capped.budget() == MAX_DUTY


def test_ec_rates_follow_the_live_rate_until_a_recovery_measures_them() -> None:
    r = MeasuredRates()
    r.observe_run(seconds=1.0, busy_seconds=0.5, inputs=40_000, outputs=40_000, gchecks=0)  # 80k tuples/s
    assert r.replay_rate == 80_000
    assert r.ec_build_rate == r.ec_load_rate == EC_PER_REPLAY * 80_000
    slow = MeasuredRates()
    slow.observe_run(seconds=1.0, busy_seconds=1.0, inputs=1_000, outputs=1_000, gchecks=0)
    assert (slow.ec_build_rate, slow.ec_load_rate) == (
        MeasuredRates().ec_build_rate,
        MeasuredRates().ec_load_rate,
    )

    r.observe_recovery(recovered())
    r.observe_run(seconds=1.0, busy_seconds=0.25, inputs=40_000, outputs=40_000, gchecks=0)
    assert (r.ec_build_rate, r.ec_load_rate) == (300_000, 200_000)  # measured: no longer follows


def test_installing_the_loaded_windows_is_planned_as_ec_load_not_replay() -> None:
    """A recovery's window install (part of its catch-up time) is per window like the decode: the load
    rate counts it and the replay rate leaves it out, so a restart that installs 90k windows and replays
    few tuples is not planned as a slow replay."""

    installed = recovered(ec_load_seconds=0.2, catch_up_seconds=0.75, install_seconds=0.25)
    r = MeasuredRates()
    r.observe_recovery(installed)
    assert r.ec_load_rate == pytest.approx(90_000 / 0.45)
    assert r.replay_rate == pytest.approx(50_000 / 0.5)
    without = MeasuredRates()
    without.observe_recovery(replace(installed, install_seconds=0.0))
    assert without.ec_load_rate == pytest.approx(90_000 / 0.2)
    assert without.replay_rate == pytest.approx(50_000 / 0.75)


def test_rto_says_when_no_u_can_meet_it() -> None:
    policy = RecoveryTimePolicy(3.0, rates=rates())
    policy.observe(rates(), 200_000)  # EC build + load of 200k windows: 2 + 4 s > 2.4 s
    problem = policy.problem()
    assert problem is not None and "cannot be met" in problem and "200,000 open windows" in problem
    # Best effort: replay kept within the 20% of the target the safety margin leaves.
    assert policy.u_target == int(0.2 * 3.0 / (0.2 / 100_000 + 1 / 50_000))


def test_rto_starts_from_conservative_defaults_before_measuring() -> None:
    policy = RecoveryTimePolicy(3.0)
    assert policy.budget() is None  # keeps the configured CI/CP until G-check cost and input rate are known
    defaults = MeasuredRates()
    per_u = defaults.outputs_per_input / defaults.ec_build_rate + 1 / defaults.replay_rate
    assert policy.u_target == pytest.approx(2.4 / per_u, abs=1)


def test_cost_benefit_checkpoints_only_when_the_expected_saving_beats_the_cost() -> None:
    policy = CostBenefitPolicy(3600.0)
    policy.observe(rates(), 10_000)
    # Held the front for 1M tuples (25 s at 40k/s): a crash while the saving lasts has p = 25/3600.
    # (An extent of one record per window: a G-check saves nothing of it.)
    cheap_gap = WindowView(extent_size=10_000, replay_size=10**6, open_windows=10_000, gap_in=100, gap_out=1)
    wide_gap = WindowView(extent_size=10_000, replay_size=10**6, open_windows=10_000, gap_in=200, gap_out=1)
    assert not policy.wants_oldest(cheap_gap)  # saves 2 ms * p = 13.9 us < 20 us
    assert policy.wants_oldest(wide_gap)  # saves 4 ms * p = 27.8 us > 20 us
    dearer = rates(gcheck_seconds=40e-6)
    policy.observe(dearer, 10_000)
    assert not policy.wants_oldest(wide_gap)
    assert not CostBenefitPolicy(36_000.0, rates()).wants_oldest(wide_gap)  # failures 10x rarer


def test_cost_benefit_settles_at_youngs_replay_size() -> None:
    policy = CostBenefitPolicy(600.0)
    policy.observe(rates(), 10_000)
    u_star = policy.balance_replay_size(10_000)
    assert u_star == pytest.approx((20e-6 * 10_000 * 40_000 * 50_000 * 600) ** 0.5)
    # With windows spread evenly over the replay span (gap u/N), it checkpoints just above u* only.
    # (An extent of one record per window: the extent saving is nil, as in Young's model.)
    assert policy.wants_checkpoint(10_000, int(u_star * 1.05))
    assert not policy.wants_checkpoint(10_000, int(u_star * 0.95))


def test_cost_benefit_passes_a_dense_front_when_the_span_is_worth_it() -> None:
    """Windows opened a tuple apart (a job's start): each G-check of the front saves one tuple itself, but
    the sweep over them saves the span; above Young's replay size the policy must start it."""
    policy = CostBenefitPolicy(600.0)
    policy.observe(rates(), 10_000)
    u_star = policy.balance_replay_size(10_000)
    dense = WindowView(
        extent_size=10_000, replay_size=int(u_star * 1.05), open_windows=10_000, gap_in=1, gap_out=1
    )
    assert policy.wants_oldest(dense)
    assert not policy.wants_oldest(replace(dense, replay_size=int(u_star * 0.95)))


def test_cost_benefit_does_nothing_before_measuring() -> None:
    assert not CostBenefitPolicy(1.0).wants_oldest(WindowView(10**6, 10**6, 10, 10**5, 10**5))


def test_calibrated_ec_rates_are_planned_with_until_a_recovery_measures_them() -> None:
    r = MeasuredRates()
    r.calibrate(400_000.0, 350_000.0)
    assert r.calibrated and (r.ec_build_rate, r.ec_load_rate) == (400_000.0, 350_000.0)
    # The live rate no longer drags them (80k tuples/s would have put both at EC_PER_REPLAY * 80k).
    r.observe_run(seconds=1.0, busy_seconds=0.5, inputs=40_000, outputs=40_000, gchecks=0)
    assert (r.ec_build_rate, r.ec_load_rate) == (400_000.0, 350_000.0)
    # The controller plans with them, and says which rates it used when they cannot meet the target.
    policy = RecoveryTimePolicy(3.0, rates=r)
    policy.observe(r, 92_000)
    assert policy.problem() is None
    fixed = 92_000 / 400_000 + 92_000 / 350_000
    per_u = r.outputs_per_input / 400_000 + 1 / r.replay_rate
    assert policy.u_target == int((0.8 * 3.0 - fixed) / per_u)
    slow = MeasuredRates()
    slow.calibrate(60_000.0, 60_000.0)
    late = RecoveryTimePolicy(3.0, rates=slow)
    late.observe(slow, 92_000)
    problem = late.problem()
    assert problem is not None and "calibrated (at startup" in problem

    r.observe_recovery(recovered())  # a real recovery's figures replace the calibration...
    assert (r.ec_build_rate, r.ec_load_rate) == (300_000, 200_000)
    r.calibrate(900_000.0, 900_000.0)  # ...and a later calibration does not replace them
    assert (r.ec_build_rate, r.ec_load_rate) == (300_000, 200_000)
    r.calibrate(0.0, 5.0)  # nothing measured: ignored
    assert (r.ec_build_rate, r.ec_load_rate) == (300_000, 200_000)


def test_calibration_runs_the_real_ec_code_over_a_synthetic_extent(monkeypatch: pytest.MonkeyPatch) -> None:
    from recovery import calibrate as calibration
    from recovery.manager import RecoveryManager

    rows = calibration.synthetic_extent(500)
    seen: list[tuple[int, int]] = []
    recover = RecoveryManager.recover

    def spy(self: RecoveryManager, partitions: int) -> object:
        result = recover(self, partitions)
        seen.append((result.report.records_read, result.report.ec_windows))
        return result

    monkeypatch.setattr(RecoveryManager, "recover", spy)
    build, load = calibration.calibrate_ec_rates(rows=rows, backend="sqlite", repeats=2)
    # A warm-up pass over a short extent, then two passes finding every window of the synthetic one.
    assert seen == [(256, 256), (500, 500), (500, 500)]
    assert build > 0 and load > 0


def test_a_fresh_start_with_a_recovery_target_calibrates_its_ec_rates(tmp_path: Path) -> None:
    from cec.config import Checkpointing
    from operators.job import JobSpec, run_job

    def spec(name: str, checkpointing: Checkpointing) -> JobSpec:
        return JobSpec(
            operator={"type": "aggregate", "key_field": "item_id", "value_field": "item_price", "agg": "avg",
                      "window_count": 5},
            source={"type": "generator", "count": 300, "keys": 20, "seed": 1},
            store={"type": "sqlite", "root": str(tmp_path / name)},
            output_topic="agg",
            checkpointing=checkpointing,
        )  # fmt: skip

    rto = run_job(spec("rto", Checkpointing(recovery_target="3s")))
    assert rto.rates["calibrated"] is True
    assert rto.rates["ec_build_rate"] > 0 and rto.rates["ec_load_rate"] > 0
    plain = run_job(spec("plain", Checkpointing()))  # G-open only: nothing plans with the rates
    assert plain.rates == {} or plain.rates.get("calibrated") is False
