"""Checkpoint intensity of the attached operator: the engine's G-check controller
(`operators.engine.controller`: the same `cec.Checkpointing`, policies, budget and messages as the local
runtime), fed per state partition with rates measured where the work happens.

The local runtime owns one operator instance and ticks the controller every few tuples. Under
transformWithStateInPandas (`operators.spark.processor`) a state partition's work comes in micro-batches and
its G-checks from a processing-time timer that fires between them, so this module adapts the *inputs* of
the controller, never its rules:

- **Replay and extent per window** (`WindowMark`, `MarkedWindows`: the controller's candidates). A window
  records `fp_clock`, the partition's input position (next offset per input partition) when its latest
  footprint was made, and `fp_out`, the partition's count of records emitted in this run then. Its view
  is u = input read since its `fp_clock`, q = records emitted since its `fp_out` (`WindowView`), oldest
  (most input since) first. A window loaded from the EC has `fp_out` 0: the records before this start are
  not counted (q is a lower bound until it is G-checked once).
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
  `CheckpointSchedule` (CI of every CP), as in the local runtime; the allowance of a timer is the budget's
  share of the time since the previous one (`GCheckController.timer`).
- **Saying so.** What the controller says is logged once per state partition and kept in its memory
  (`ControllerMemory`, in `PartitionControl`), which the driver reads back (`read_controls`) and the
  partition reports with its rows.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cec.config import Checkpointing
from cec.policy import CheckpointPolicy, WindowView, make_policy
from cec.rates import MeasuredRates
from cec.schedule import CheckpointSchedule
from operators.engine.controller import ControllerMemory, GCheckController

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "GCheckSpec",
    "MarkedWindows",
    "PartitionControl",
    "PlannedRecovery",
    "WindowMark",
    "choose_gchecks",
    "read_controls",
    "uses_timers",
]


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
    install_seconds: float = 0.0  # the partitions install their windows lazily, as keys are met
    started_wall: float = 0.0  # wall time (time.time) when this start began: `cec_aggregate()` was called


@dataclass(frozen=True)
class GCheckSpec:
    """The attached operator's checkpointing: the user's `Checkpointing`, how often a partition's timer
    looks (CP), and the planning's figures (`PlannedRecovery`); picklable (shipped inside the processor).

    `in_batch`: the partition looks right after a micro-batch's input rows, in the same call, instead of
    from a processing-time timer (`uses_timers`)."""

    checkpointing: Checkpointing
    interval_ms: int
    planned: PlannedRecovery = field(default_factory=PlannedRecovery)
    in_batch: bool = False

    @classmethod
    def from_checkpointing(
        cls, checkpointing: Checkpointing, planned: PlannedRecovery | None = None
    ) -> GCheckSpec | None:
        """None when nothing asks for G-checks (G-open only: no timers at all)."""
        if not checkpointing.checkpoints:
            return None
        interval = max(1, int(checkpointing.cp_ms))
        return cls(checkpointing, interval, planned or PlannedRecovery(), in_batch=_in_batch(checkpointing))

    @property
    def timers(self) -> bool:
        """Whether the query runs under timeMode "ProcessingTime" (`uses_timers`)."""
        return not self.in_batch

    def policy(self, rates: MeasuredRates) -> CheckpointPolicy:
        return make_policy(self.checkpointing, rates)

    def schedule(self, clock: Callable[[], float]) -> CheckpointSchedule:
        c = self.checkpointing
        return CheckpointSchedule(c.ci_ms, c.cp_ms, clock=clock)


def _in_batch(checkpointing: Checkpointing) -> bool:
    """Whether the G-checks of `checkpointing` are made in the micro-batch whose input makes them due
    rather than from a processing-time timer: so for the default a host applies when given none
    (`Checkpointing.default()`, a U in tuples; an equal checkpointing given explicitly is the same).

    Why: a processing-time timer makes Spark plan a no-data micro-batch after every micro-batch
    (TransformWithStateExec.shouldRunAnotherBatch): with the default's timers on every attached query
    its throughput measured 0.36-0.95x of the tree without them (benchmarks/RESULTS.md, the no-data
    batches a likely cause), and a bounded run ended on a no-data batch of its own. A count target only becomes
    due through input (u and q grow with tuples and records, never with time), so the call that applied
    the tuples is the first moment a G-check can be due, and the earliest one to make it: its footprint
    is one micro-batch fresher than a timer's, and nothing is planned besides the data. The allowance is
    still the budget's share of the run time since the partition's previous look (`choose_gchecks`).
    Explicit policies keep their timers (what their tests and measurements were made with); G-open only
    (`Checkpointing.gopen_only()`) has neither."""
    return checkpointing == Checkpointing.default()


def uses_timers(checkpointing: Checkpointing) -> bool:
    """Whether an attached query with `checkpointing` has G-check timers, and so a no-data micro-batch
    after every micro-batch (`_in_batch`): what `CecAggregateQuery` waits and stops around."""
    spec = GCheckSpec.from_checkpointing(checkpointing)
    return spec is not None and spec.timers


@dataclass
class PartitionControl:
    """A state partition's measurements and its controller's memory (pickled with the partition's state)."""

    rates: MeasuredRates = field(default_factory=MeasuredRates)
    out: int = 0  # records this partition emitted in this run (G-checks included)
    seen: tuple[int, ...] | None = None  # input position at the end of the last micro-batch
    last_wall: float | None = None  # clock at the end of the last micro-batch
    lookahead_in: int = 0  # input position advance of the last micro-batch
    lookahead_out: int = 0  # records the last micro-batch emitted
    memory: ControllerMemory = field(default_factory=ControllerMemory)  # what the controller said, spent
    planned: bool = False  # the planning's EC build rate is taken
    last_timer_wall: float | None = None  # clock at the partition's last timer
    first_wall: float | None = None  # clock at the partition's first task of this start (`take_planned`)
    reported: dict[str, Any] | None = None  # the summary the last `report` told

    @property
    def said(self) -> list[str]:
        return self.memory.said

    @property
    def gchecks(self) -> int:
        return self.memory.gchecks

    @property
    def targets(self) -> tuple[int | None, int | None]:
        return self.memory.targets

    @property
    def debt(self) -> float:
        return self.memory.debt

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
        memory = self.memory
        q_target, u_target = memory.targets
        return {
            "partition": partition,
            "q_target": q_target,
            "u_target": u_target,
            "budget": memory.duty,
            "gchecks": memory.gchecks,
            "gcheck_seconds": round(memory.gcheck_seconds, 6),
            "messages": list(memory.said),
        }

    def report(self, partition: int) -> bytes | None:
        """The summary as JSON if it changed since the last report (None: nothing new to tell)."""
        summary = self.summary(partition)
        if summary == self.reported:
            return None
        self.reported = summary
        return json.dumps(summary).encode()


@dataclass(frozen=True)
class WindowMark:
    """A live open window as the policy sees it: `u` input read and `q` records emitted since its latest
    footprint."""

    key: Any
    u: int
    q: int


class MarkedWindows:
    """A state partition's live windows as the controller's candidates (module doc): the ones with input
    since their footprint (u > 0: a G-check of the others would only repeat it), oldest first, each seen
    with the look-ahead; `gcheck(key)` makes one."""

    def __init__(
        self,
        windows: Sequence[WindowMark],
        open_windows: int,
        lookahead: tuple[int, int],
        gcheck: Callable[[Any], None],
    ) -> None:
        self.ordered = sorted((w for w in windows if w.u > 0), key=lambda w: w.u, reverse=True)
        self.open_windows = open_windows
        self.ahead_in, self.ahead_out = lookahead
        self._gcheck = gcheck
        self.done = 0

    def count(self) -> int:
        return len(self.ordered)

    def front(self) -> WindowView | None:
        ordered, i = self.ordered, self.done
        if i >= len(ordered):
            return None
        w = ordered[i]
        after = ordered[i + 1] if i + 1 < len(ordered) else None
        return WindowView(
            extent_size=w.q + self.ahead_out,
            replay_size=w.u + self.ahead_in,
            open_windows=self.open_windows,
            gap_in=w.u - (after.u if after is not None else 0),
            gap_out=w.q - (after.q if after is not None else 0),
        )

    def run(self, most: int) -> int:
        return 1

    def gcheck(self, count: int) -> None:
        for _ in range(count):
            self._gcheck(self.ordered[self.done].key)
            self.done += 1

    def poll(self) -> None:
        pass


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
    """One timer of a state partition: the controller G-checks its live windows oldest first while the
    policy wants the front one, within the allowance; `gcheck(key)` makes one. Returns the G-checks made.

    `lookahead`: the micro-batch that fired the timer read input, so the next one probably will too (a
    no-data micro-batch, e.g. the ones a processing-time timer makes Spark plan, looks at the windows as
    they are). `elapsed`: run time since the partition's previous timer, whose share the budget allows
    (measured: with one CI per micro-batch a 2 s recovery target at 2,000 keys replayed the whole input,
    benchmarks/RESULTS.md); None: the schedule's own credit."""
    ahead = (control.lookahead_in, control.lookahead_out) if lookahead else (0, 0)
    controller = GCheckController(
        policy,
        schedule,
        control.rates,
        clock=clock,
        label=f"cec_aggregate state partition {partition}",
        memory=control.memory,
    )
    done = controller.timer(
        MarkedWindows(windows, open_windows, ahead, gcheck),
        open_windows=open_windows,
        elapsed=elapsed,
        lookahead=ahead,
    )
    control.out += done
    return done


def read_controls(spark: SparkSession, checkpoint: str, state_name: str) -> dict[int, PartitionControl]:
    """Each state partition's `PartitionControl` as of the last committed micro-batch of a run's Spark
    checkpoint (Spark's state data source), keyed by output partition: what the executors measured,
    planned and said. A driver-side read for reports and tests; it runs a Spark job."""
    from operators.spark.state_partition import PartitionState  # the state's one codec (imports this module)

    rows = (
        spark.read.format("statestore")
        .option("stateVarName", state_name)
        .load(checkpoint)
        .select("value.blob")
        .collect()
    )
    controls: dict[int, PartitionControl] = {}
    for row in rows:
        part = PartitionState.load(row)
        controls[part.q] = part.control
    return controls
