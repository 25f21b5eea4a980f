"""The G-check controller: when an instance's oldest windows get a G-check (paper III.A), on every host.

One controller per operator instance owns the policy (`cec.policy`: whether the oldest window should get
a G-check), the schedule (`cec.schedule`: the operator time G-checks may take), the measured rates the
policies plan with (`cec.rates`), the targets in force and what it says about them, each thing said once.
The host ticks it:
- the local loop every `check_every` tuples and between batches (`look`): the rates are measured here, in
  intervals of `MEASURE_S` of the injected clock, from the instance's own counts; the credit is the
  schedule's (CI of every CP, capped at one CI);
- the Spark state partition from its processing-time timer between micro-batches (`timer`): the rates
  come from its micro-batches (`operators.spark.checkpointing.PartitionControl`), and since it looks once
  per micro-batch, not every few tuples, its allowance is the budget's share of the time since its last
  look, less what that look overspent (`debt`).
Both spend the same way (`_spend`): while the policy wants the front window and there is credit, G-check
the oldest windows (a run of them at once where the host can write runs: `Candidates.run`), then
re-measure. The host's windows are seen through `Candidates`, oldest footprint first.

What is said (logged once per instance, kept in `ControllerMemory.said` as "topic: message"): the policy's
`problem()` and `note()`; a Q below the open windows ("Q must be >= N": no budget can help); and, once the
targets are missed for `OVER_LOOKS` looks in a row with the budget spent, why: the policy's own
`shortfall()` with the measured u and q, or the duty that would meet them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from cec.policy import CheckpointPolicy, WindowView
from cec.rates import MeasuredRates
from cec.schedule import CheckpointSchedule

if TYPE_CHECKING:
    from recovery.manager import RecoveryReport

__all__ = ["MEASURE_S", "OVER_LOOKS", "Candidates", "ControllerMemory", "GCheckController"]

log = logging.getLogger(__name__)

MEASURE_S = 0.25  # measurement interval: rates, the policy's choices, the check that targets are met
OVER_LOOKS = 4  # consecutive intervals a target must be missed, budget spent, before saying so
_POLL_EVERY = 32  # G-checks between two services of the output's completions


class Candidates(Protocol):
    """The host's open windows as the controller sees them, oldest footprint first."""

    def count(self) -> int:
        """How many windows may be G-checked in this look (each at most once)."""

    def front(self) -> WindowView | None:
        """The view of the oldest window not G-checked yet in this look, or None when there is none."""

    def run(self, most: int) -> int:
        """How many of the oldest windows (1 to `most`) one-at-a-time G-checks from now would take in a row
        (the policy wants the front one already)."""

    def gcheck(self, count: int) -> None:
        """G-check the `count` oldest windows not G-checked yet in this look."""

    def poll(self) -> None:
        """Serve the output's completions (not G-check work: its time is not charged to the budget)."""


@dataclass
class ControllerMemory:
    """What a controller keeps between looks; pickled with a Spark state partition."""

    said: list[str] = field(default_factory=list)  # "topic: message", each topic once
    over: int = 0  # consecutive looks with a target missed and the budget spent
    budget_short: bool = False  # the budget ran out while the policy still wanted G-checks
    debt: float = 0.0  # G-check seconds spent beyond the last allowance (paid by the next)
    gchecks: int = 0
    gcheck_seconds: float = 0.0
    targets: tuple[int | None, int | None] = (None, None)  # (Q, U) in force at the last look
    duty: float | None = None  # the budget in force at the last look

    def first(self, topic: str) -> str | None:
        prefix = f"{topic}: "
        return next((s[len(prefix) :] for s in self.said if s.startswith(prefix)), None)


class GCheckController:
    """Policy + schedule + measured rates + targets + messages (module doc). `label` prefixes what it
    logs (the operator locally, the state partition on Spark); `slack` is how far u and q may run past
    their targets between two looks without that being a miss (tuples per look plus one batch);
    `run_limit` the most G-checks it makes in one go (1: one at a time)."""

    def __init__(
        self,
        policy: CheckpointPolicy,
        schedule: CheckpointSchedule,
        rates: MeasuredRates,
        *,
        clock: Callable[[], float],
        label: str,
        memory: ControllerMemory | None = None,
        run_limit: int = 1,
        slack: int = 0,
    ) -> None:
        self.policy = policy
        self.schedule = schedule
        self.rates = rates
        self.clock = clock
        self.label = label
        self.memory = memory if memory is not None else ControllerMemory()
        self.run_limit = max(1, run_limit)
        self.slack = slack
        self._gcheck_cost: float | None = None  # measured seconds per G-check of a run (sizes the runs)
        # The local look's measurement interval: (start, inputs, outputs, G-checks, spent, front in, out).
        self._interval: tuple[float, int, int, int, float, int, int] | None = None
        self._busy = 0.0  # time in this interval spent reading and applying input
        self._last_look = 0.0

    @property
    def started(self) -> bool:
        return self._interval is not None

    # -- what it says ----------------------------------------------------------------------------------
    def say_once(self, topic: str, message: str) -> None:
        if self.memory.first(topic) is not None:
            return
        self.memory.said.append(f"{topic}: {message}")
        log.warning("%s: %s", self.label, message)

    @property
    def refusal(self) -> str | None:
        """The first thing said about targets that cannot be met (not the plan's note)."""
        prefix = "note: "
        return next((s.split(": ", 1)[1] for s in self.memory.said if not s.startswith(prefix)), None)

    @property
    def note(self) -> str | None:
        return self.memory.first("note")

    def replan(self, open_windows: int) -> None:
        """The policy plans with the rates as measured now; a budget it picks becomes the schedule's."""
        self.policy.observe(self.rates, open_windows)
        duty = self.policy.budget()
        if duty is not None:
            self.schedule.set_duty(duty)
        self.memory.duty = self.schedule.duty
        self.memory.targets = self.policy.targets()

    def _say_plan(self, open_windows: int) -> None:
        """What no budget can change: the policy's problem and note, and a Q below N."""
        problem = self.policy.problem()
        if problem:
            self.say_once("problem", problem)
        note = self.policy.note()
        if note:
            self.say_once("note", note)
        q_target = self.memory.targets[0]
        if q_target is not None and q_target < open_windows:
            self.say_once(
                "q-below-n",
                f"Q={q_target:,} is below the {open_windows:,} open windows: an extent holds a footprint of "
                "every open window, so q <= Q cannot hold at any checkpoint budget (Q must be >= N)",
            )

    def review(
        self,
        *,
        open_windows: int,
        q: int,
        u: int,
        duty: float,
        needed_in: float | None,
        needed_out: float | None,
    ) -> None:
        """Say once if the targets cannot be met: whatever the budget, or within this budget (then with
        the duty that would meet them).

        The duty that would meet U: with the budget spent, u settles where G-checks free the oldest
        windows as fast as input arrives, and u scales as 1/(G-checks per tuple); so G-check time per
        unit of other work must grow by u/U, times the factor by which the oldest footprint still lags
        the input (`needed_in`: input tuples per tuple of footprint advance, 1 once settled). Likewise
        for Q with q - N and the output count."""
        self._say_plan(open_windows)
        n = open_windows
        q_target, u_target = self.memory.targets
        slack = self.slack
        missed_u = u_target is not None and u > u_target * 1.05 + slack
        missed_q = q_target is not None and q_target > n and q > q_target * 1.05 + slack
        memory = self.memory
        if not ((missed_u or missed_q) and memory.budget_short and not self.schedule.unlimited):
            memory.over = 0
            return
        memory.over += 1
        if memory.over < OVER_LOOKS:
            return
        factors: list[float | None] = []
        if missed_u and u_target is not None:
            factors.append(None if needed_in is None else u / u_target * max(needed_in, 1.0))
        if missed_q and q_target is not None:
            factors.append(None if needed_out is None else (q - n) / (q_target - n) * max(needed_out, 1.0))
        if any(f is None for f in factors) or duty >= 1.0:
            need = "more than the whole operator's time would (the oldest footprint does not advance)"
        else:
            ratio = duty / (1.0 - duty) * max(f for f in factors if f is not None)
            needed = ratio / (1.0 + ratio)
            cp_ms = self.schedule.cp * 1000
            need = (
                f"about {needed:.0%} of operator time (CI={needed * cp_ms:.0f} ms every CP={cp_ms:g} ms) "
                "would meet them"
            )
        self._say_budget(u, q, n, need)

    def _say_budget(self, u: int, q: int, n: int, need: str | None) -> None:
        q_target, u_target = self.memory.targets
        measured = f"u={u:,}, q={q:,} with {n:,} open windows"
        # The policy's own model may already have said why (its budget is capped below what U needs); it
        # is said only now, with the measured u and q behind it: a model alone predicted misses that
        # a quiet run never had.
        shortfall = self.policy.shortfall()
        if shortfall:
            self.say_once("budget", f"{shortfall} (measured: {measured})")
        elif need is not None:
            self.say_once(
                "budget",
                f"checkpoint targets Q={q_target} U={u_target} cannot be met within "
                f"{self.schedule.describe()}: {measured}; {need}",
            )

    # -- the local look --------------------------------------------------------------------------------
    def start(
        self, recovery: RecoveryReport | None, counts: tuple[int, int, int, int, int, int, int, int]
    ) -> None:
        """G-checks become possible (a fresh start, or recovery is over): start the budget and the
        measurements; a recovery this run began with is the best measure of the next one. `counts`: as
        `look` takes them, now."""
        self.schedule.start()
        now = self.clock()
        self._last_look = now
        if recovery is not None:
            self.rates.observe_recovery(recovery)
        inputs, outputs, gchecks, front_in, front_out, n, _, _ = counts
        self.replan(n)
        # What no budget can change is known now (a start-up alone longer than a recovery target allows):
        # said at once, not after the first measurement interval.
        self._say_plan(n)
        self._interval = (now, inputs, outputs, gchecks, 0.0, front_in, front_out)

    def look(
        self,
        windows: Candidates,
        counts: Callable[[], tuple[int, int, int, int, int, int, int, int]],
        *,
        idle: bool = False,
    ) -> None:
        """The local host's tick (module doc). `counts()`: the instance's (inputs, outputs, G-checks,
        front in-mark, front out-mark, N, q, u) now. `idle`: the host waited for input since the last
        look, which is not operator work."""
        assert self._interval is not None, "start() first"
        now = self.clock()
        if not idle:
            self._busy += now - self._last_look
        self._last_look = now
        if now - self._interval[0] >= MEASURE_S:
            self._measure(now, counts())
        front = windows.front()
        wants = front is not None and self.policy.wants_oldest(front)
        self.schedule.note_wanting(wants)
        if wants:
            self._spend(windows, self.schedule.credit())
            self._last_look = self.clock()  # G-check time is not input work

    def _measure(self, now: float, counts: tuple[int, int, int, int, int, int, int, int]) -> None:
        """End of a measurement interval: update the rates, let the policy re-plan, check the targets."""
        assert self._interval is not None
        t0, in0, out0, g0, spent0, front_in0, front_out0 = self._interval
        inputs_now, outputs_now, gchecks_now, front_in, front_out, n, q, u = counts
        seconds = now - t0
        inputs, outputs = inputs_now - in0, outputs_now - out0
        spent = self.schedule.spent_seconds - spent0
        self.rates.observe_run(
            seconds=seconds, busy_seconds=self._busy, inputs=inputs, outputs=outputs, gchecks=gchecks_now - g0
        )
        self.replan(n)
        self.review(
            open_windows=n,
            q=q,
            u=u,
            duty=spent / seconds if seconds > 0 else 0.0,
            needed_in=inputs / (front_in - front_in0) if front_in > front_in0 else None,
            needed_out=outputs / (front_out - front_out0) if front_out > front_out0 else None,
        )
        self._interval = (
            now, inputs_now, outputs_now, gchecks_now, self.schedule.spent_seconds, front_in, front_out,
        )  # fmt: skip
        self._busy = 0.0
        self.memory.budget_short = False

    # -- the Spark timer -------------------------------------------------------------------------------
    def timer(
        self,
        windows: Candidates,
        *,
        open_windows: int,
        elapsed: float | None,
        lookahead: tuple[int, int] = (0, 0),
    ) -> int:
        """The Spark state partition's tick (module doc): re-plan with its rates, say what no budget can
        change, then spend the allowance of the `elapsed` seconds since its last look. `lookahead`: the
        input and records one micro-batch adds, which the windows' views include. Returns the G-checks
        made."""
        self.replan(open_windows)
        self._say_plan(open_windows)
        memory = self.memory
        credit: float | None = None
        if elapsed is not None and not self.schedule.unlimited:
            credit = self.schedule.duty * max(elapsed, 0.0) - memory.debt
        front = windows.front()
        wants = front is not None and self.policy.wants_oldest(front)
        self.schedule.note_wanting(wants)
        done, spent = 0, 0.0
        if wants:
            done, spent = self._spend(windows, self.schedule.credit() if credit is None else credit)
        if credit is not None:
            memory.debt = max(spent - credit, 0.0)
        left = windows.front()
        u_target = memory.targets[1]
        ahead_in, ahead_out = lookahead
        if left is not None and u_target is not None:
            u, q = left.replay_size - ahead_in, left.extent_size - ahead_out
            if u > u_target * 1.05 + ahead_in:
                # The front window is still past U after this look: the policy's model may know why.
                self._say_budget(u, q, open_windows, None)
        return done

    # -- spending ----------------------------------------------------------------------------------------
    def _spend(self, windows: Candidates, credit: float) -> tuple[int, float]:
        """G-check the oldest windows while the policy wants the front one and `credit` (seconds) lasts,
        or until each window was G-checked once (an unattainable target cannot spin). Returns (G-checks,
        seconds spent on them)."""
        if credit <= 0:
            self.memory.budget_short = True
            return 0, 0.0
        clock = self.clock
        now = started = clock()
        done = 0
        polling = 0.0  # time in poll(), which is not G-check work (see below)
        polled_at = 0
        limit = windows.count()
        wants = True
        while done < limit and wants:
            if self.run_limit > 1:
                # Most of a G-check's cost is per call, not per window: take the next oldest windows the
                # policy wants (as many as the credit left should pay for) and write them in one go.
                cost = self._gcheck_cost
                if cost is None:
                    most = 8  # until one run is measured
                elif credit == float("inf") or cost <= 0:
                    most = self.run_limit
                else:
                    most = int((credit - (now - started - polling)) / cost) + 1
                count = windows.run(min(most, self.run_limit, limit - done))
                run_started = now
                windows.gcheck(count)
                done += count
                now = clock()
                self._gcheck_cost = (now - run_started) / count
            else:
                windows.gcheck(1)
                done += 1
            if done - polled_at >= _POLL_EVERY:
                # Serving completions may commit the output's transaction (Kafka: a flush and a round
                # trip, tens of ms on a loaded machine), which the batch's own poll would have done
                # anyway. Charged to the G-checks, it made one measure ~7.5 ms instead of ~0.1 ms under
                # load: the RTO controller then asked for more than its 50% cap and the budget ran out
                # with u far above U (13-15k tuples replayed for U = 4k, benchmarks/RESULTS.md).
                polled_at = done
                polled = clock()
                windows.poll()
                polling += clock() - polled
            now = clock()
            if now - started - polling >= credit:
                self.memory.budget_short = True  # it may be satisfied now; the next look finds out cheaply
                break
            front = windows.front()
            wants = front is not None and self.policy.wants_oldest(front)
        spent = clock() - started - polling
        self.schedule.spend(spent, done)
        self.schedule.note_wanting(wants)  # satisfied (or not) as of the end of this spending
        if done:
            self.rates.observe_gchecks(spent, done)
            self.memory.gchecks += done
            self.memory.gcheck_seconds += spent
        return done, spent
