"""When G-checks may be produced: a budget of operator time, CI ms of every CP ms (paper III.A).

The paper spends checkpoint work in slots of CI ms every CP ms. Read as a wall-clock phase, that slot is
hit only when the operator happens to look at the clock inside it: an operator that looks once per batch
(25-40 ms) misses most 5 ms slots and checkpoints far less than CI/CP. Here CI/CP is a *budget*: credit
accrues at CI/CP seconds per second of run time, the operator spends it on G-checks whenever it looks
(every few tuples, inside batches too) and the policy wants them, and the time really spent is measured.
Spending can overshoot by one G-check; the overshoot is a debt the next credit pays first, so over any
stretch in which the policy wants G-checks the real duty converges to CI/CP. Credit saved while the policy
wants nothing is capped at one CI, so a burst after a quiet spell is at most one slot's worth, as in the
paper. CI = CP means no limit: G-checks whenever the policy asks.

Every time decision reads the injected `clock`, so tests drive the schedule without the wall clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cec.exceptions import ConfigError

__all__ = ["MAX_DUTY", "RTO_MAX_DUTY", "CheckpointSchedule"]

MAX_DUTY = 0.5  # a policy that picks its own budget stays under half the operator's time...
RTO_MAX_DUTY = 0.9  # ...except a recovery target that needs more: it takes up to this, and says so


class CheckpointSchedule:
    """The checkpoint budget and the measurement of the duty really delivered."""

    def __init__(
        self, ci_ms: float = 5.0, cp_ms: float = 100.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not (0 < ci_ms <= cp_ms):
            raise ConfigError(f"need 0 < CI <= CP, got CI={ci_ms} ms, CP={cp_ms} ms")
        self.clock = clock
        self.cp = cp_ms / 1000.0
        self.ci = ci_ms / 1000.0
        self._credit = 0.0
        self._last: float | None = None  # clock at the last accrual; None until started
        self._started: float | None = None
        self.spent_seconds = 0.0  # operator time spent producing G-checks
        self.gchecks = 0
        self._wanted_periods = 0  # CP periods in which the policy wanted G-checks
        self._last_period = -1  # the last of them counted
        self._wanting_since: float | None = None

    # -- budget ------------------------------------------------------------------------------------------
    @property
    def duty(self) -> float:
        """The budget: CI/CP, the share of operator time G-checks may take."""
        return self.ci / self.cp

    @property
    def unlimited(self) -> bool:
        return self.ci >= self.cp

    def set_duty(self, duty: float) -> None:
        """A new budget (policies that pick their own); CP stays, CI becomes duty x CP."""
        duty = min(max(duty, 1e-6), 1.0)
        self.ci = duty * self.cp

    def start(self) -> None:
        """Begin accruing (and measuring) now: when the operator may checkpoint, i.e. after recovery."""
        if self._started is None:
            now = self.clock()
            self._started = now
            self._last = now

    @property
    def started(self) -> bool:
        return self._started is not None

    def credit(self) -> float:
        """Seconds of G-check work the budget allows now (accrued up to this instant; may be negative)."""
        self.start()
        if self.unlimited:
            return float("inf")
        now = self.clock()
        assert self._last is not None
        self._credit = min(self._credit + (now - self._last) * self.duty, self.ci)
        self._last = now
        return self._credit

    def spend(self, seconds: float, gchecks: int) -> None:
        """Record `seconds` of operator time spent producing `gchecks` G-checks."""
        if not self.unlimited:
            self._credit -= seconds
        self.spent_seconds += seconds
        self.gchecks += gchecks

    # -- measurement -------------------------------------------------------------------------------------
    def active_seconds(self) -> float:
        """Run time since the schedule started (the time G-checks were allowed)."""
        return 0.0 if self._started is None else max(self.clock() - self._started, 0.0)

    def real_duty(self) -> float:
        """Time spent producing G-checks / run time since the schedule started."""
        active = self.active_seconds()
        return self.spent_seconds / active if active > 0 else 0.0

    def note_wanting(self, wanting: bool) -> None:
        """What the policy wants as of now (told at every look and when spending stops). The budget is
        CI of every CP, so a CP period in which the policy wanted G-checks at all is owed its CI: the
        time from a look that wanted them to the next that did not is counted in whole CP periods (a
        burst that spends one saved CI and is satisfied within a period is that period's CI, as in the
        paper's slots, not a duty of 100%)."""
        now = self.clock()
        if self._wanting_since is not None:
            self._wanted_periods += self._new_periods(self._wanting_since, now)
            self._last_period = self._period(now)
        if wanting:
            self._wanted_periods += self._new_periods(now, now)
            self._last_period = max(self._last_period, self._period(now))
        self._wanting_since = now if wanting else None

    def _period(self, t: float) -> int:
        start = self._started if self._started is not None else t
        return int((t - start) / self.cp + 1e-9)

    def _new_periods(self, since: float, until: float) -> int:
        """CP periods touched by [since, until] that are not counted yet."""
        first = max(self._period(since), self._last_period + 1)
        return max(self._period(until) - first + 1, 0)

    @property
    def wanted_seconds(self) -> float:
        """Run time during which the policy wanted G-checks, in whole CP periods (up to now)."""
        periods = self._wanted_periods
        if self._wanting_since is not None:
            periods += self._new_periods(self._wanting_since, self.clock())
        return periods * self.cp

    def wanted_duty(self) -> float:
        """Time spent producing G-checks / run time while the policy wanted them: the figure that the
        budget promises (the whole-run duty also counts stretches in which the targets held by themselves).
        Every G-check is produced while the policy wants one, so the numerator is all G-check time."""
        wanted = self.wanted_seconds
        return self.spent_seconds / wanted if wanted > 0 else 0.0

    def describe(self) -> str:
        if self.unlimited:
            return f"CI=CP={self.cp * 1000:g} ms (no limit)"
        return f"CI={self.ci * 1000:.3g} ms every CP={self.cp * 1000:g} ms ({self.duty:.1%} of operator time)"
