"""Checkpoint intensity of the attached operator: the same `cec.Checkpointing` and the same policies as the
local runtime (`cec.policy`), fed per state partition with rates measured where the work happens.

The local runtime owns one operator instance and looks at its policy every few tuples. Under
transformWithStateInPandas (`operators.spark.processor`) a state partition's work comes in micro-batches and
its G-checks from a processing-time timer that fires between them, so this module adapts the *inputs* of
the policies, never their rules:

- **Replay and extent per window.** A window records `fp_clock`, the partition's input position (next
  offset per input partition) when its latest footprint was made, and `fp_out`, the partition's count of
  records emitted in this run then. The oldest live window's view is u = input read since its `fp_clock`,
  q = records emitted since its `fp_out` (`WindowView`). A window loaded from the EC has `fp_out` 0: the
  records before this start are not counted (q is a lower bound until it is G-checked once).
- **Look-ahead.** The policy is asked about the window as it will be at the next chance to G-check it, one
  micro-batch later: u and q plus what the last micro-batch added (`PartitionControl.lookahead_in/out`).
  That is what makes "u <= U" hold at a crash between two timers, not only at the timer.
- **Rates** (`cec.rates.MeasuredRates`, kept in the partition's state so they survive micro-batches):
  input tuples/s and records per input from the partition's own micro-batches (input counted as the
  advance of the input position, all partitions of the input: that is what a recovery replays); the replay
  rate as that advance per second of run time between micro-batch ends (a replay pays every micro-batch's
  overhead, not only the task's work: `PartitionControl.observe_batch`), the processing rate per second of
  the partition's task; the restart's fixed cost from this start (`take_planned`); G-check cost from the
  G-checks the timer made; EC load from `handleInitialState` (windows decoded and installed per second, on this executor); EC build from the recovery planning of
  this start (`operators.spark.planning`: records read back per second, per output partition, the
  partitions read in parallel). Until measured: `MeasuredRates`' stated defaults (cec.rates).
- **Budget.** The policy's `budget()` (a recovery target picks its own) sets the duty of the task's
  `CheckpointSchedule` (CI of every CP), as in the local runtime.
- **Saying so.** `problem()` and `note()` of the policy, and a Q below the partition's open windows, are
  logged once per state partition (the partition's state remembers what it said) and kept in
  `PartitionControl.said`, which the driver can read back (`read_controls`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cec.config import Checkpointing
from cec.policy import CheckpointPolicy, WindowView, make_policy
from cec.rates import MeasuredRates
from cec.schedule import CheckpointSchedule

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "GCheckSpec",
    "PartitionControl",
    "PlannedRecovery",
    "WindowMark",
    "choose_gchecks",
    "read_controls",
]

log = logging.getLogger(__name__)


@dataclass
class PlannedRecovery:
    """What the recovery planning of this start measured, per output partition (`cec.rates.RecoveryFigures`:
    the EC build part; EC load and replay are measured by the partition itself)."""

    records_read: int = 0
    ec_windows: int = 0
    ec_build_seconds: float = 0.0
    ec_load_seconds: float = 0.0
    tuples_replayed: int = 0
    catch_up_seconds: float = 0.0
    started_wall: float = 0.0  # wall time (time.time) when this start began: `cec_aggregate()` was called


@dataclass(frozen=True)
class GCheckSpec:
    """The attached operator's checkpointing: the user's `Checkpointing`, how often a partition's timer
    looks (CP), and the planning's figures (`PlannedRecovery`); picklable (shipped inside the processor)."""

    checkpointing: Checkpointing
    interval_ms: int
    planned: PlannedRecovery = field(default_factory=PlannedRecovery)

    @classmethod
    def from_checkpointing(
        cls, checkpointing: Checkpointing, planned: PlannedRecovery | None = None
    ) -> GCheckSpec | None:
        """None when nothing asks for G-checks (G-open only: no timers at all)."""
        if not checkpointing.checkpoints:
            return None
        return cls(checkpointing, max(1, int(checkpointing.cp_ms)), planned or PlannedRecovery())

    def policy(self, rates: MeasuredRates) -> CheckpointPolicy:
        return make_policy(self.checkpointing, rates)

    def schedule(self, clock: Callable[[], float]) -> CheckpointSchedule:
        c = self.checkpointing
        return CheckpointSchedule(c.ci_ms, c.cp_ms, clock=clock)


@dataclass
class PartitionControl:
    """A state partition's measurements and what it said (pickled with the partition's state)."""

    rates: MeasuredRates = field(default_factory=MeasuredRates)
    out: int = 0  # records this partition emitted in this run (G-checks included)
    seen: tuple[int, ...] | None = None  # input position at the end of the last micro-batch
    last_wall: float | None = None  # clock at the end of the last micro-batch
    lookahead_in: int = 0  # input position advance of the last micro-batch
    lookahead_out: int = 0  # records the last micro-batch emitted
    gchecks: int = 0
    gcheck_seconds: float = 0.0
    said: list[str] = field(default_factory=list)
    targets: tuple[int | None, int | None] = (None, None)  # (Q, U) in force at the last timer
    duty: float | None = None  # the budget in force at the last timer
    planned: bool = False  # the planning's EC build rate is taken
    last_timer_wall: float | None = None  # clock at the partition's last timer
    first_wall: float | None = None  # clock at the partition's first task of this start (`take_planned`)
    debt: float = 0.0  # G-check seconds spent beyond the last timer's allowance (paid by the next)
    reported: dict[str, Any] | None = None  # the summary the last `report` told

    def take_planned(self, planned: PlannedRecovery, partitions: int, now_wall: float | None = None) -> None:
        """The EC build rate of this start's planning, once: records read back per second, this partition's
        share (the partitions are read in parallel); and the start's fixed cost, from `cec_aggregate()` to
        this partition's first task (`now_wall`) less the EC build: what a restart pays before its
        recovery work (`MeasuredRates.restart_seconds`, which a recovery target plans with)."""
        if self.planned:
            return
        self.planned = True
        self.first_wall = now_wall
        if now_wall is not None and planned.started_wall > 0:
            ec_build = planned.ec_build_seconds if planned.records_read > 0 else 0.0
            self.rates.observe_restart(now_wall - planned.started_wall - ec_build)
        if planned.records_read > 0:
            share = PlannedRecovery(
                records_read=max(1, planned.records_read // max(partitions, 1)),
                ec_build_seconds=planned.ec_build_seconds,
            )
            self.rates.observe_recovery(share)

    def observe_load(self, windows: int, seconds: float) -> None:
        """EC load measured here: `windows` decoded and installed in `seconds` (handleInitialState)."""
        self.rates.observe_recovery(PlannedRecovery(ec_windows=windows, ec_load_seconds=seconds))

    def observe_batch(self, *, now: float, task_seconds: float, seen: Sequence[int], emitted: int) -> None:
        """End of a micro-batch's rows: `seen` the input position reached (0: a partition not read),
        `task_seconds` the partition task's time so far, `emitted` records produced.

        The replay rate is the input's advance per second of run time between micro-batch ends, not per
        second of the task: a restart replays through the same micro-batches, and each pays Spark's
        planning, state commit and the sink's write besides the task (measured at 100,000 keys: 25-30k
        tuples per task-second, a replay of 6,001 tuples in 6.1 s; planned with the task rate, a 3 s
        target chose a U above the whole input). Under a backlog (catching up, AvailableNow) that is the
        pipeline's rate; with idle time between batches it is lower, which errs towards checkpointing
        more."""
        current = tuple(seen)
        if self.seen is None:
            advance = 0  # the first micro-batch of this run: where it started from is not known here
        else:
            advance = sum(s - p for s, p in zip(current, self.seen, strict=True) if s > p)
        if self.last_wall is not None and advance > 0:
            seconds = max(now - self.last_wall, 1e-6)
            self.rates.observe_run(
                seconds=seconds,
                busy_seconds=max(task_seconds, 1e-6),
                inputs=advance,
                outputs=emitted,
                gchecks=0,
                replay_seconds=seconds,
            )
        if advance > 0 or self.seen is None:
            self.lookahead_in = advance
            self.lookahead_out = emitted
        merged = (
            current
            if self.seen is None
            else tuple(max(s, p) for s, p in zip(current, self.seen, strict=True))
        )
        self.seen = merged
        self.last_wall = now
        self.out += emitted

    def summary(self, partition: int) -> dict[str, Any]:
        """What this partition planned and said, as the query's progress shows it (`checkpointing`)."""
        q_target, u_target = self.targets
        return {
            "partition": partition,
            "q_target": q_target,
            "u_target": u_target,
            "budget": self.duty,
            "gchecks": self.gchecks,
            "gcheck_seconds": round(self.gcheck_seconds, 6),
            "messages": list(self.said),
        }

    def report(self, partition: int) -> bytes | None:
        """The summary as JSON if it changed since the last report (None: nothing new to tell)."""
        summary = self.summary(partition)
        if summary == self.reported:
            return None
        self.reported = summary
        return json.dumps(summary).encode()

    def say_once(self, topic: str, message: str, partition: int) -> None:
        if any(s.startswith(f"{topic}: ") for s in self.said):
            return
        self.said.append(f"{topic}: {message}")
        log.warning("cec_aggregate state partition %d: %s", partition, message)


@dataclass(frozen=True)
class WindowMark:
    """A live open window as the policy sees it: `u` input read and `q` records emitted since its latest
    footprint."""

    key: Any
    u: int
    q: int


def choose_gchecks(
    control: PartitionControl,
    policy: CheckpointPolicy,
    schedule: CheckpointSchedule,
    windows: Sequence[WindowMark],
    open_windows: int,
    gcheck: Callable[[Any], None],
    clock: Callable[[], float],
    partition: int,
    lookahead: bool = True,
    elapsed: float | None = None,
) -> int:
    """G-check the partition's live windows oldest footprint first while the policy wants the front one,
    within the schedule's credit; `gcheck(key)` makes one. Re-plans first with the partition's rates and
    says once what the policy cannot do. Returns the number of G-checks made.

    `lookahead`: the micro-batch that fired the timer read input, so the next one probably will too (a
    no-data micro-batch, e.g. the ones a processing-time timer makes Spark plan, looks at the windows as
    they are). A window with no input since its footprint (u = 0) is never G-checked: its state is its
    footprint's, and the replay it holds back is none.

    `elapsed`: run time since the partition's previous timer. The partition looks once per micro-batch,
    not every few tuples as the local runtime does, so the schedule's credit (capped at one CI per look)
    would allow one CI per micro-batch; with `elapsed` the allowance is the budget's share of that time,
    duty x elapsed, less what the previous timer overspent (measured: with one CI per micro-batch a 2 s
    recovery target at 2,000 keys replayed the whole input, benchmarks/RESULTS.md)."""
    policy.observe(control.rates, open_windows)
    duty = policy.budget()
    if duty is not None:
        schedule.set_duty(duty)
    control.duty = schedule.duty
    control.targets = policy.targets()
    problem = policy.problem()
    if problem:
        control.say_once("problem", problem, partition)
    note = policy.note()
    if note:
        control.say_once("note", note, partition)
    q_target = control.targets[0]
    if q_target is not None and q_target < open_windows:
        control.say_once(
            "q-below-n",
            f"Q={q_target:,} is below the {open_windows:,} open windows of this partition: an extent holds a "
            "footprint of every open window, so q <= Q cannot hold at any checkpoint budget (Q must be >= N)",
            partition,
        )
    # Oldest footprint first: the most input since.
    ordered = sorted((w for w in windows if w.u > 0), key=lambda w: w.u, reverse=True)
    ahead_in, ahead_out = (control.lookahead_in, control.lookahead_out) if lookahead else (0, 0)
    done = 0
    spent = 0.0
    allowance = None
    if elapsed is not None and not schedule.unlimited:
        allowance = schedule.duty * max(elapsed, 0.0) - control.debt
    for i, w in enumerate(ordered):
        after = ordered[i + 1] if i + 1 < len(ordered) else None
        view = WindowView(
            extent_size=w.q + ahead_out,
            replay_size=w.u + ahead_in,
            open_windows=open_windows,
            gap_in=w.u - (after.u if after is not None else 0),
            gap_out=w.q - (after.q if after is not None else 0),
        )
        wants = policy.wants_oldest(view)
        schedule.note_wanting(wants)
        if not wants:
            break
        if (allowance is not None and allowance <= spent) or (allowance is None and schedule.credit() <= 0):
            break
        started = clock()
        gcheck(w.key)
        took = clock() - started
        schedule.spend(took, 1)
        spent += took
        done += 1
    if allowance is not None:
        control.debt = max(spent - allowance, 0.0)
    shortfall = policy.shortfall()
    u_target = control.targets[1]
    if (
        shortfall
        and u_target is not None
        and done < len(ordered)
        and ordered[done].u > u_target * 1.05 + ahead_in
    ):
        # The policy's model said U is out of its budget's reach, and the front window is indeed past it.
        control.say_once("budget", f"{shortfall} (measured: u={ordered[done].u:,})", partition)
    if done:
        control.rates.observe_gchecks(spent, done)
        control.gchecks += done
        control.gcheck_seconds += spent
        control.out += done
    return done


def read_controls(spark: SparkSession, checkpoint: str, state_name: str) -> dict[int, PartitionControl]:
    """Each state partition's `PartitionControl` as of the last committed micro-batch of a run's Spark
    checkpoint (Spark's state data source), keyed by output partition: what the executors measured,
    planned and said. A driver-side read for reports and tests; it runs a Spark job."""
    from operators.spark.processor import _PartitionState  # the state's one codec (imports this module)

    rows = (
        spark.read.format("statestore")
        .option("stateVarName", state_name)
        .load(checkpoint)
        .select("value.blob")
        .collect()
    )
    controls: dict[int, PartitionControl] = {}
    for row in rows:
        part = _PartitionState.load(row)
        controls[part.q] = part.control
    return controls
