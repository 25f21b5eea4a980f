"""Whether the oldest open window should get a G-check now (paper III.A). Never affects correctness.

The operator keeps its open windows ordered by their last footprint; a G-check of the oldest moves the
replay start forward by `gap_in` input tuples and the extent start by `gap_out` records (to the next
oldest footprint). Policies:
- `GOpenOnly`: never (minimum overhead, longest recovery);
- `TargetPolicy`: while the extent size q > Q or the replay size u > U (the paper's method);
- `RecoveryTimePolicy`: a recovery-time objective; picks U, Q and the checkpoint budget from the measured
  rates (`cec.rates`) so that a crash at any moment recovers within the target;
- `CostBenefitPolicy` (the paper's future work): only when the recovery time a G-check saves, weighted by
  the chance of a crash while the saving lasts, is worth the operator time it costs;
- `AnyOf`: several at once (e.g. cost-benefit bounded by a recovery target).
How much operator time G-checks may take is the schedule's business (`cec.schedule`).
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass

from cec.config import Checkpointing
from cec.exceptions import ConfigError
from cec.rates import MeasuredRates
from cec.schedule import MAX_DUTY, RTO_MAX_DUTY, CheckpointSchedule

__all__ = [
    "AnyOf",
    "CheckpointPolicy",
    "CheckpointSchedule",
    "CostBenefitPolicy",
    "GOpenOnly",
    "RecoveryTimePolicy",
    "TargetPolicy",
    "WindowView",
    "make_policy",
]


@dataclass(frozen=True, slots=True)
class WindowView:
    """What a policy sees of the operator when it decides about the oldest window."""

    extent_size: int  # q: records from the oldest footprint to now
    replay_size: int  # u: input tuples processed since the oldest footprint
    open_windows: int = 0  # N
    gap_in: int = 0  # input tuples from the oldest footprint to the next oldest: what a G-check saves of u
    gap_out: int = 0  # records likewise: what it saves of q


class CheckpointPolicy(abc.ABC):
    checkpoints = True  # False: never wants a G-check (the runtime skips the machinery)

    @abc.abstractmethod
    def wants_checkpoint(self, extent_size: int, replay_size: int) -> bool:
        """Should the oldest open window get a G-check now, given q and u?"""

    def wants_oldest(self, view: WindowView) -> bool:
        """The same question with everything the runtime knows; policies that need more than q and u
        override this."""
        return self.wants_checkpoint(view.extent_size, view.replay_size)

    def observe(self, rates: MeasuredRates, open_windows: int) -> None:  # noqa: B027 - optional hook
        """New measurements (called every measurement interval)."""

    def thresholds(self) -> tuple[int | None, int | None] | None:
        """(Q, U) when this policy wants the oldest window exactly while q > Q or u > U (a None is not
        checked), so the runtime can pick a run of G-checks without a view per window; else None."""
        return None

    def budget(self) -> float | None:
        """The duty this policy wants as checkpoint budget; None keeps the configured CI/CP."""
        return None

    def targets(self) -> tuple[int | None, int | None]:
        """(Q, U) in force now, for reports and the check that they are met."""
        return (None, None)

    def problem(self) -> str | None:
        """Why the policy's goal cannot be met whatever the budget, if it cannot."""
        return None

    def note(self) -> str | None:
        """Something the operator should say once about the plan (not a failure), e.g. a budget above the
        usual cap."""
        return None

    def shortfall(self) -> str | None:
        """Why, by the policy's own model, its targets may not hold within its budget. A model is not a
        measurement: the runtime says it only when the targets are then really missed."""
        return None

    @abc.abstractmethod
    def describe(self) -> str: ...


class GOpenOnly(CheckpointPolicy):
    """Only the footprints correctness needs: G-open at window open, R at close."""

    checkpoints = False

    def wants_checkpoint(self, extent_size: int, replay_size: int) -> bool:
        return False

    def describe(self) -> str:
        return "G-open only"


@dataclass(frozen=True)
class TargetPolicy(CheckpointPolicy):
    """Checkpoint the oldest window while q > Q or u > U. A target of None is not checked."""

    q_target: int | None = None
    u_target: int | None = None

    def __post_init__(self) -> None:
        for name, value in (("Q", self.q_target), ("U", self.u_target)):
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be a positive number of tuples, got {value}")

    def wants_checkpoint(self, extent_size: int, replay_size: int) -> bool:
        return (self.q_target is not None and extent_size > self.q_target) or (
            self.u_target is not None and replay_size > self.u_target
        )

    def targets(self) -> tuple[int | None, int | None]:
        return (self.q_target, self.u_target)

    def thresholds(self) -> tuple[int | None, int | None] | None:
        return (self.q_target, self.u_target)

    def describe(self) -> str:
        return f"targets Q={self.q_target} U={self.u_target}"


class RecoveryTimePolicy(CheckpointPolicy):
    """A recovery-time objective: U, Q and the budget chosen so a crash at any moment recovers in time.

    Model (rates from `MeasuredRates`; N open windows): a crash with replay size u and extent q recovers
    in about S + q/B + N/L + u/R (S: the host's fixed restart cost, 0 for the local runtime, the query's
    start for the attached operator on Spark). Holding u <= U keeps about one footprint of every open
    window within the last U tuples, so q <= N + r*U (r: records other than G-checks per input tuple).
    Hence
        recovery(U) = S + N/B + N/L + U * (r/B + 1/R) <= safety * target
    gives the largest U that meets the target (the cheapest: G-checks fall as 1/U), and Q is the extent
    the remaining time can read. Holding U takes at most N/U G-checks per input tuple, i.e. the share of
    run time `MeasuredRates.gcheck_share(N/U)` (g * N * input_rate / U while the operator has time to
    spare, less when G-checks would slow its input down); the budget is that times `headroom`. Other policies
    stay under MAX_DUTY; a recovery target is what the user asked for, so when holding U needs more, the
    budget goes up to `max_duty` (RTO_MAX_DUTY) and `note()` says so once (measured at the paper's scale
    under load: a 50% cap left u at twice U and missed a 3 s target by a second). When not even that would
    hold U, the budget stays at MAX_DUTY (more would only starve the input) and `shortfall()` says U is
    out of reach at the measured rates (the runtime repeats it only if u then really stays above U).
    G-checks are still made only while u > U or q > Q: the budget is a ceiling, not a spend.
    If restarting, rebuilding and loading the N windows alone take longer than the target, no U can meet it:
    `problem()` says so, and U keeps the replay within the (1 - safety) share of the target.
    """

    def __init__(
        self,
        target_s: float,
        *,
        q_cap: int | None = None,
        u_cap: int | None = None,
        safety: float = 0.8,
        headroom: float = 1.5,
        min_u: int = 64,
        max_duty: float = RTO_MAX_DUTY,
        rates: MeasuredRates | None = None,
    ) -> None:
        if not (target_s > 0 and math.isfinite(target_s)):
            raise ConfigError(f"recovery target must be a positive duration, got {target_s!r}")
        self.target_s = target_s
        self.q_cap = q_cap
        self.u_cap = u_cap
        self.safety = safety
        self.headroom = headroom
        self.min_u = min_u
        self.max_duty = max_duty
        self.rates = rates or MeasuredRates()
        self.open_windows = 0
        self.u_target = 0
        self.q_target = 0
        self.duty: float | None = None
        self._problem: str | None = None
        self._note: str | None = None
        self._shortfall: str | None = None
        self.observe(self.rates, 0)

    def observe(self, rates: MeasuredRates, open_windows: int) -> None:
        self.rates = rates
        self.open_windows = n = open_windows
        allowed = self.safety * self.target_s
        fixed = rates.restart_seconds + n / rates.ec_build_rate + n / rates.ec_load_rate
        per_u = rates.outputs_per_input / rates.ec_build_rate + 1.0 / rates.replay_rate
        if fixed >= allowed:
            known = {"ec_build_rate", "ec_load_rate"} <= rates.measured
            basis = (
                "measured"
                if known
                else "calibrated (at startup, until a recovery measures them)"
                if rates.calibrated
                else "assumed (until a recovery measures them)"
            )
            restart = (
                f"restarting ({rates.restart_seconds:.2f} s, measured at this start) plus "
                if rates.restart_seconds > 0
                else ""
            )
            self._problem = (
                f"recovery target {self.target_s:g} s cannot be met: {restart}rebuilding and loading the "
                f"{n:,} open windows alone takes about {fixed:.2f} s at the "
                f"{basis} rates "
                f"({rates.ec_build_rate:,.0f} records/s EC build, {rates.ec_load_rate:,.0f} windows/s EC load)"
            )
            # Best effort: the fixed part cannot shrink, so keep what replay adds to it small (the share
            # of the target the safety margin leaves) rather than spend the whole budget on G-checks.
            u = max(self.min_u, int((1.0 - self.safety) * self.target_s / per_u))
        else:
            self._problem = None
            u = max(self.min_u, int((allowed - fixed) / per_u))
        if self.u_cap is not None:
            u = min(u, self.u_cap)
        self.u_target = u
        q = int((allowed - n / rates.ec_load_rate - u / rates.replay_rate) * rates.ec_build_rate)
        q = max(q, n + self.min_u)  # an extent holds a footprint of every open window: Q < N is unattainable
        if self.q_cap is not None:
            q = min(q, self.q_cap)
        self.q_target = q
        self._note = None  # the plan of this interval, not of the first one (the rates move)
        self._shortfall = None
        # With the assumed G-check cost until one is measured (MeasuredRates' default is above what was
        # measured on every host): waiting for a measurement left the first look at the usual CI/CP, and on
        # Spark the first look, after a micro-batch had opened thousands of windows at once, could not
        # reach the oldest of them (the replay then started at the input's start).
        if rates.input_rate > 0:
            need = rates.gcheck_share(max(n, 1) / u)
            wanted = self.headroom * need
            if wanted <= MAX_DUTY:
                self.duty = max(wanted, 0.001)
            elif need <= self.max_duty:
                self.duty = min(wanted, self.max_duty)
                self._note = (
                    f"recovery target {self.target_s:g} s: holding U={u:,} over {n:,} open windows needs "
                    f"up to about {need:.0%} of operator time for G-checks, above the {MAX_DUTY:.0%} a checkpoint "
                    f"budget normally stays under; taking up to {self.duty:.0%} for the target"
                )
            else:
                # Not even max_duty would hold U: spending it would only starve the input (measured under
                # load: 86% duty, input down to 280 tuples/s, and the target still missed). Keep the usual
                # cap; the runtime says so if u then really stays above U (`shortfall`).
                self.duty = MAX_DUTY
                self._shortfall = (
                    f"recovery target {self.target_s:g} s: U={u:,} cannot be held over {n:,} open windows at "
                    f"the measured rates: it needs up to about {need:.0%} of operator time for G-checks, more than "
                    f"the {self.max_duty:.0%} a recovery target may take; keeping {MAX_DUTY:.0%}, so a crash "
                    f"may replay more than U"
                )

    def wants_checkpoint(self, extent_size: int, replay_size: int) -> bool:
        return replay_size > self.u_target or extent_size > self.q_target

    def thresholds(self) -> tuple[int | None, int | None] | None:
        return (self.q_target, self.u_target)

    def budget(self) -> float | None:
        return self.duty

    def targets(self) -> tuple[int | None, int | None]:
        return (self.q_target, self.u_target)

    def problem(self) -> str | None:
        return self._problem

    def note(self) -> str | None:
        return self._note

    def shortfall(self) -> str | None:
        return self._shortfall

    def estimate_seconds(self) -> float:
        """Recovery time the model expects for a crash now, with the chosen targets held."""
        return self.rates.recovery_seconds(
            extent=min(self.q_target, self.open_windows + self.rates.outputs_per_input * self.u_target),
            windows=self.open_windows,
            replay=self.u_target,
        )

    def describe(self) -> str:
        return (
            f"recovery target {self.target_s:g} s (now U={self.u_target:,} Q={self.q_target:,}, "
            f"expected {self.estimate_seconds():.2f} s)"
        )


class CostBenefitPolicy(CheckpointPolicy):
    """G-check the oldest window only when the recovery time it saves is worth its cost.

    Cost: g, the operator time of one G-check (measured). Saving: a crash after it recovers
    gap_in/R + (gap_out - 1)/B seconds faster (the replay and extent start move to the next oldest
    footprint; the G-check itself adds one record). The saving lasts as long as the window would
    otherwise have kept the front; having kept it for u tuples, it is expected to keep it about as long
    again, u / input_rate seconds, during which a crash comes with probability about that time / MTBF.
    So: G-check when (u / input_rate) / MTBF * saving > g, where the gaps count at least their average
    over the span (u/N, q/N): the front is passed by G-checking its windows one after the other.

    With windows spread evenly over the replay span (gap_in ~ u/N) this holds u near
    sqrt(g * N * input_rate * R * MTBF), the replay size that minimises G-check time plus expected
    recovery time per second of operation (Young's rule for checkpoint intervals).
    """

    def __init__(self, mtbf_s: float, rates: MeasuredRates | None = None) -> None:
        if not (mtbf_s > 0 and math.isfinite(mtbf_s)):
            raise ConfigError(f"MTBF must be a positive duration, got {mtbf_s!r}")
        self.mtbf_s = mtbf_s
        self.rates = rates or MeasuredRates()
        self.open_windows = 0

    def observe(self, rates: MeasuredRates, open_windows: int) -> None:
        self.rates = rates
        self.open_windows = open_windows

    def wants_oldest(self, view: WindowView) -> bool:
        rates = self.rates
        if rates.input_rate <= 0 or view.replay_size <= 0:
            return False  # nothing measured yet, or nothing to save
        # G-checking the front is a sweep over the oldest windows, one after the other: what the sweep
        # saves is the whole span, so each G-check is worth at least the average gap (u/N, q/N). Valued
        # by its own gap only, a dense front (windows opened a tuple apart, as at a job's start) would
        # never look worth passing, and the sparse gaps behind it would never be reached.
        n = max(view.open_windows, 1)
        gap_in = max(view.gap_in, view.replay_size / n)
        gap_out = max(view.gap_out, view.extent_size / n)
        saving = gap_in / rates.replay_rate + (gap_out - 1) / rates.ec_build_rate
        horizon = view.replay_size / rates.input_rate
        return horizon / self.mtbf_s * saving > rates.gcheck_seconds

    def wants_checkpoint(self, extent_size: int, replay_size: int) -> bool:
        n = max(self.open_windows, 1)  # without the gaps: assume windows spread evenly over the span
        return self.wants_oldest(WindowView(extent_size, replay_size, n, replay_size // n, extent_size // n))

    def balance_replay_size(self, open_windows: int) -> float:
        """The replay size u this policy settles at with N windows spread evenly (see the class doc)."""
        r = self.rates
        return math.sqrt(r.gcheck_seconds * open_windows * r.input_rate * r.replay_rate * self.mtbf_s)

    def describe(self) -> str:
        return f"cost-benefit (MTBF {self.mtbf_s:g} s)"


class AnyOf(CheckpointPolicy):
    """G-check when any of several policies wants it; the budget is the largest any of them asks."""

    def __init__(self, *policies: CheckpointPolicy) -> None:
        self.policies = [p for p in policies if p.checkpoints]
        self.checkpoints = bool(self.policies)

    def wants_checkpoint(self, extent_size: int, replay_size: int) -> bool:
        return any(p.wants_checkpoint(extent_size, replay_size) for p in self.policies)

    def wants_oldest(self, view: WindowView) -> bool:
        return any(p.wants_oldest(view) for p in self.policies)

    def observe(self, rates: MeasuredRates, open_windows: int) -> None:
        for p in self.policies:
            p.observe(rates, open_windows)

    def thresholds(self) -> tuple[int | None, int | None] | None:
        # Any of "q > Q_i or u > U_i" is "q > min Q_i or u > min U_i".
        parts = [p.thresholds() for p in self.policies]
        if not parts or any(t is None for t in parts):
            return None
        qs = [t[0] for t in parts if t is not None and t[0] is not None]
        us = [t[1] for t in parts if t is not None and t[1] is not None]
        return (min(qs) if qs else None, min(us) if us else None)

    def budget(self) -> float | None:
        asked = [b for b in (p.budget() for p in self.policies) if b is not None]
        return max(asked) if asked else None

    def targets(self) -> tuple[int | None, int | None]:
        qs = [q for q, _ in (p.targets() for p in self.policies) if q is not None]
        us = [u for _, u in (p.targets() for p in self.policies) if u is not None]
        return (min(qs) if qs else None, min(us) if us else None)

    def problem(self) -> str | None:
        return next((msg for msg in (p.problem() for p in self.policies) if msg), None)

    def note(self) -> str | None:
        return next((msg for msg in (p.note() for p in self.policies) if msg), None)

    def shortfall(self) -> str | None:
        return next((msg for msg in (p.shortfall() for p in self.policies) if msg), None)

    def describe(self) -> str:
        return " + ".join(p.describe() for p in self.policies) or "G-open only"


def make_policy(checkpointing: Checkpointing, rates: MeasuredRates | None = None) -> CheckpointPolicy:
    """The policy a `Checkpointing` configuration asks for."""
    rates = rates or MeasuredRates()
    c = checkpointing
    parts: list[CheckpointPolicy] = []
    if c.recovery_target is not None:
        parts.append(RecoveryTimePolicy(c.recovery_target, q_cap=c.q_target, u_cap=c.u_target, rates=rates))
    elif c.q_target is not None or c.u_target is not None:
        parts.append(TargetPolicy(c.q_target, c.u_target))
    if c.policy == "cost-benefit":
        parts.append(CostBenefitPolicy(c.mtbf, rates))
    if not parts:
        return GOpenOnly()
    return parts[0] if len(parts) == 1 else AnyOf(*parts)
