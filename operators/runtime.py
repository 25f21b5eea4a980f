"""The local host: input -> operator instance -> output queue (-> index), in one thread.

The per-tuple procedure of CEC is the engine's (`operators.engine`); this module is the loop around it:
- recovery: before the first tuple, rebuild the eventual checkpoint from the output log (its own reader),
  restore the instance from it and seek the input to the replay start;
- foreground: poll the input in batches and hand them to the instance `check_every` tuples at a time;
  its records go to the output queue through `operators.local_sink.OutputQueueSink`;
- background: between those runs and between batches, tick the G-check controller
  (`operators.engine.controller`), in the operator's thread as in the paper, so no locking. Every time
  decision reads the injected `clock`;
- after each batch: serve the output's completions, trim the log (`operators.local_trim`), sample the
  figures (progress, metrics, extent).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from cec import progress as progress_tasks
from cec.exceptions import ConfigError
from cec.policy import CheckpointPolicy, GOpenOnly
from cec.rates import MeasuredRates
from cec.records import RecordCodec
from cec.registry import WindowRegistry
from cec.schedule import CheckpointSchedule
from operators.base import Operator
from operators.collector import collector_spaced
from operators.engine import GCheckController, OperatorInstance, Phase, RunStats
from operators.engine.candidates import InstanceWindows
from operators.engine.trimming import TrimPace
from operators.local_restore import LocalRestore
from operators.local_sink import OutputQueueSink
from operators.local_trim import LogTrimmer
from operators.progress_log import Progress
from operators.sources import InputSource
from queuestore.output import OutputQueue
from recovery.manager import LiveStates
from recovery.standby import LogFollower
from recovery.timeline import RestartTimeline

if TYPE_CHECKING:
    from cec.metrics import OperatorMetrics  # prometheus_client: imported only by a run that serves metrics

__all__ = ["OperatorRuntime", "Progress", "RunStats"]


class OperatorRuntime:
    def __init__(
        self,
        operator: Operator,
        source: InputSource,
        output: OutputQueue,
        *,
        policy: CheckpointPolicy | None = None,
        schedule: CheckpointSchedule | None = None,
        batch_size: int = 512,
        progress: Progress | None = None,
        codec: RecordCodec | None = None,
        idle_wait_s: float = 0.005,
        footprints: bool = True,
        clock: Callable[[], float] | None = None,
        check_every: int = 32,
        rates: MeasuredRates | None = None,
        trim_every: int | None = None,
        metrics: OperatorMetrics | None = None,
        gcheck_batch: int = 256,
        trim_pace: TrimPace | None = None,
        timeline: RestartTimeline | None = None,
        index_catch_up: int = 4096,
        followed: LogFollower | None = None,
        replica: LiveStates | None = None,
    ) -> None:
        """`footprints=False` writes results only: no fault tolerance, the baseline CEC's cost is measured
        against (the paper's "native" runs). Such a log cannot be recovered from.

        `trim_every`: trim the output log (`operators.local_trim`) each time this many more records were
        appended. None: never trim. `trim_pace`: a registered consumer the operator waits for at each trim
        (back-pressure, `operators.engine.trimming.TrimPace`).

        `clock` (seconds, monotonic) drives every checkpoint decision (default: the schedule's, else
        `time.monotonic`); `check_every` is how many tuples may pass between two looks at the budget,
        which bounds how far u can pass U; `rates` are the measured rates the policies plan with.

        `gcheck_batch`: at most this many G-checks are produced in one go (their states and records
        encoded in one call each, appended in one store call: the same records as one at a time, for a
        fraction of the per-G-check cost); 1 produces them one at a time.

        `timeline`: the restart's phases so far (`recovery.timeline`: the host marks process start, store
        open and index; the runtime marks the rest), on its own clock; default: one that starts at `run`.
        `index_catch_up`: records of a deferred index rebuild (`queuestore.output`) indexed after each batch
        once recovery is over; the rest of it is done at the end of the input. `followed`: what a standby
        followed of the output log before it took over (`recovery.standby`): recovery starts from it;
        `replica`: its replica's states at the crash point (`operators.replica`), which spare the EC load and
        the replay where they check out."""
        if check_every < 1:
            raise ConfigError(f"check_every must be >= 1, got {check_every}")
        if gcheck_batch < 1:
            raise ConfigError(f"gcheck_batch must be >= 1, got {gcheck_batch}")
        if index_catch_up < 1:
            raise ConfigError(f"index_catch_up must be >= 1, got {index_catch_up}")
        if clock is None:
            clock = schedule.clock if schedule is not None else time.monotonic
        self.clock = clock
        schedule = schedule or CheckpointSchedule(clock=clock)
        schedule.clock = clock
        self.operator = operator
        self.source = source
        self.output = output
        self.check_every = check_every
        self.metrics = metrics  # Prometheus (cec.metrics): sampled after each batch, recovery phases
        self.batch_size = batch_size
        self.progress = progress or Progress(operator.name, enabled=False)
        self.codec = codec or RecordCodec()
        self.idle_wait_s = idle_wait_s
        self.footprints = footprints
        self.stats = RunStats()
        rates = rates or MeasuredRates()  # one object: the controller plans with it, a restart adds to it
        self.sink = OutputQueueSink(output, self.codec, source.partitions)
        self.instance = OperatorInstance(
            operator,
            self.sink,
            source.partitions,
            footprints=footprints,
            closed_seq=lambda key: self.restorer.last_closed_seq(key),
            # Dead letters name the stream's own partition, not the instance's local index of it.
            global_partitions=tuple(getattr(source, "global_partitions", range(source.partitions))),
            stats=self.stats,
        )
        self.restorer = LocalRestore(
            operator,
            source,
            output,
            self.instance,
            self.sink,
            self.codec,
            stats=self.stats,
            rates=rates,
            metrics=metrics,
            progress=self.progress,
            timeline=timeline,
            followed=followed,
            replica=replica,
        )
        self.instance.lifecycle.on_running = self.restorer.caught_up
        self.controller = GCheckController(
            policy or GOpenOnly(),
            schedule,
            rates,
            clock=clock,
            label=operator.name,
            run_limit=gcheck_batch if self.sink.batched else 1,
            slack=check_every + batch_size,
        )
        self._windows = InstanceWindows(self.instance, self.controller, output.poll)
        self.trim_every = trim_every
        self._trimmer = (
            None
            if trim_every is None
            else LogTrimmer(
                self.instance,
                source,
                output,
                self.codec,
                trim_every,
                metrics,
                pace=trim_pace,
                stop=lambda: self._stop is not None and self._stop(),
            )
        )
        self._stop: Callable[[], bool] | None = None  # run()'s: a paced trim stops waiting when it says so
        self._started = time.perf_counter()
        self.index_catch_up = index_catch_up

    @property
    def policy(self) -> CheckpointPolicy:
        return self.controller.policy

    @policy.setter
    def policy(self, policy: CheckpointPolicy) -> None:
        self.controller.policy = policy

    @property
    def schedule(self) -> CheckpointSchedule:
        return self.controller.schedule

    @property
    def rates(self) -> MeasuredRates:
        return self.controller.rates

    @property
    def registry(self) -> WindowRegistry:
        """The instance's open windows (read by `cec.state_as_of` after a run)."""
        return self.instance.registry

    @property
    def timeline(self) -> RestartTimeline:
        return self.restorer.timeline

    # -- background: G-checks ---------------------------------------------------------------------------
    def _counts(self) -> tuple[int, int, int, int, int, int, int, int]:
        instance, registry = self.instance, self.instance.registry
        in_count, out_count = instance.in_count, instance.out_count
        oldest = registry.oldest()
        front_in = in_count if oldest is None else oldest.in_mark
        front_out = out_count if oldest is None else oldest.out_mark
        n = registry.n
        return (in_count, out_count, self.stats.gchecks, front_in, front_out, n,
                out_count - front_out, in_count - front_in)  # fmt: skip

    def _background(self, idle: bool = False) -> None:
        """Tick the G-check controller: not while restoring (the windows are not consistent yet), not
        without footprints or a policy that ever wants G-checks. `idle`: after waiting for input."""
        if self.instance.phase is not Phase.RUNNING or not self.footprints or not self.policy.checkpoints:
            return
        controller = self.controller
        if not controller.started:
            controller.start(self.stats.recovery, self._counts())
        controller.look(self._windows, self._counts, idle=idle)

    def _report_checkpointing(self) -> None:
        stats, controller = self.stats, self.controller
        schedule = controller.schedule
        stats.checkpoint_policy = self.policy.describe()
        stats.checkpoint_budget = schedule.duty if self.policy.checkpoints else 0.0
        stats.checkpoint_seconds = schedule.spent_seconds
        stats.checkpoint_duty = schedule.real_duty()
        stats.checkpoint_duty_wanted = schedule.wanted_duty()
        stats.q_target, stats.u_target = self.policy.targets()
        stats.rates = self.rates.as_dict()
        stats.checkpoint_refusal = controller.refusal
        stats.checkpoint_note = controller.note

    # -- main loop -------------------------------------------------------------------------------------
    def run(self, stop: Callable[[], bool] | None = None, *, max_inputs: int | None = None) -> RunStats:
        """Recover, then process until the input ends (EOS), `stop()` is true or `max_inputs` tuples were
        read in this run; the last two leave everything produced so far durable and no EOS, exactly the log
        a crash at that point would leave (checked between batches: use batch_size=1 for an exact count)."""
        with collector_spaced():  # why: operators.collector
            return self._recover_and_run(stop, max_inputs)

    def _recover_and_run(self, stop: Callable[[], bool] | None, max_inputs: int | None) -> RunStats:
        self._started = time.perf_counter()
        self._stop = stop
        self.timeline.mark("ec_build")  # a host that marked nothing: its timeline starts here
        if not self.restorer.restore():
            if self._trimmer is not None:  # a log complete already: trimmed to what recovery needs, too
                self._trimmer.at_rest()
            self.stats.completed = True
            self.stats.seconds = time.perf_counter() - self._started
            return self.stats
        self._calibrate()
        if self._trimmer is not None:
            self._trimmer.register()  # a queue input: register as its consumer from the replay start
        # Only when shown: a CSV's total costs a pass over the file.
        bounds = self.source.progress_bounds() if progress_tasks.active() else None
        inputs = progress_tasks.task(
            f"{self.progress.label} input",
            None if bounds is None else sum(e - s for s, e in zip(*bounds, strict=True)),
            "tuples",
        )
        try:
            return self._run(stop, max_inputs, bounds, inputs)
        finally:
            inputs.close()
            self.restorer.close_replay_task()
            self.restorer.close_directory()

    def _run(
        self,
        stop: Callable[[], bool] | None,
        max_inputs: int | None,
        bounds: tuple[list[int], list[int]] | None,
        inputs: progress_tasks.Task,
    ) -> RunStats:
        instance, stats = self.instance, self.stats
        last_sample = self.clock()
        while (stop is None or not stop()) and (max_inputs is None or stats.inputs < max_inputs):
            batch = self.source.poll(self.batch_size)
            if batch is None:
                break
            if not batch:  # live end of the input: serve completions while waiting
                self.output.poll(self.idle_wait_s)
                self._background(idle=True)
                self.restorer.catch_up_index(self.index_catch_up)
                continue
            k = self.check_every
            for first in range(0, len(batch), k):  # the checkpoint budget is looked at inside batches too
                instance.apply_run(batch[first : first + k])
                self._background()
            self.output.poll()
            if self.output.index.deferred:
                self.restorer.catch_up_index(self.index_catch_up)
            if self._trimmer is not None:
                self._trimmer.after_batch()
            extent = instance.registry.extent_size(instance.out_count)
            stats.max_extent = max(stats.max_extent, extent)
            stats.max_replay = max(stats.max_replay, instance.registry.replay_size(instance.in_count))
            now = self.clock()
            if now - last_sample >= 1.0:
                last_sample = now
                stats.extent_samples.append((instance.in_count, extent))
            if self.metrics is not None:
                self._sample_metrics(extent)
            self.progress(
                f"{stats.inputs:,} tuples in, {stats.outputs:,} records out, N={instance.registry.n:,}, "
                f"extent {extent:,}"
            )
            pos = instance.positions
            if bounds is None:
                inputs.update(stats.inputs)
            else:
                inputs.update(sum(max(0, min(p, e) - s) for p, s, e in zip(pos, *bounds, strict=True)))
            self.restorer.replayed(pos)
        else:
            self._finish(complete=False)
            return stats
        instance.end_of_input()
        self._finish(complete=True)
        return stats

    def _calibrate(self) -> None:
        """Measure the EC build and load rates at startup when a policy will plan with them and no
        recovery of this run measures them (`recovery.calibrate`): a fresh start, or an extent too short
        to time. A recovery's own figures (`MeasuredRates.observe_recovery`) replace these."""
        if not self.footprints or not self.policy.checkpoints or self.rates.calibrated:
            return
        report = self.stats.recovery
        if report is not None and report.ec_build_seconds >= 0.02 and report.ec_load_seconds >= 0.02:
            return
        from recovery.calibrate import calibrate_ec_rates

        name = type(self.output.store).__name__.lower()
        backend = "sqlite" if "sqlite" in name else "kafka" if "kafka" in name else None
        build, load = calibrate_ec_rates(backend=backend, codec=self.codec)
        self.rates.calibrate(build, load)
        self.progress(
            f"EC rates calibrated at startup: build {build:,.0f} records/s, load {load:,.0f} windows/s"
        )

    def _sample_metrics(self, extent: int) -> None:
        assert self.metrics is not None
        stats, registry = self.stats, self.instance.registry
        self.metrics.sample(
            open_windows=registry.n,
            extent=extent,
            replay=registry.replay_size(self.instance.in_count),
            inputs=stats.inputs,
            outputs=stats.outputs,
            gopens=stats.gopens,
            gchecks=stats.gchecks,
            duty=self.schedule.real_duty(),
            dead_letters=stats.dead_letters,
            # A durable end that stands still while the operator runs shows here first (a standby, a
            # downstream reader and a restart see only durable records).
            outstanding=self.output.outstanding,
        )

    def _finish(self, *, complete: bool) -> None:
        self.output.flush()  # fail-stop: raises WriterFailedError if any append failed
        if complete:
            self.restorer.catch_up_index(None)  # the input ended: the index takes the rest of the log now
        if self._trimmer is not None:
            self._trimmer.at_rest()
        if self.metrics is not None:
            self._sample_metrics(self.instance.registry.extent_size(self.instance.out_count))
        self.stats.open_windows = self.instance.registry.n
        self._report_checkpointing()
        self.stats.completed = complete
        self.stats.seconds = time.perf_counter() - self._started
