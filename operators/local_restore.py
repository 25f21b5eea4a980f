"""The local host's restore path: its own reader of the output log, the eventual checkpoint rebuilt and loaded
into the operator instance, the input sought to the replay start, and the figures of the restart.

Kept apart from the loop (`operators.runtime`), as Kafka Streams keeps its restore path apart from the task
that processes: the loop asks `restore()` once before the first tuple and otherwise only asks this object
for a closed window's sequence number and to catch the index up. Whether recovery is over is not decided
here: the instance's phase (`operators.engine.phase`) makes the one RESTORING -> RUNNING transition and
tells `caught_up()`.

While a fresh host's stream index is still being rebuilt (deferred, `queuestore.output`), the closed-window
directory recovery read back answers for it (`recovery.closed_directory`), until the index holds the whole
log again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cec import progress as progress_tasks
from cec.rates import MeasuredRates
from cec.records import AvroCodec, RecordCodec
from operators.base import Operator
from operators.engine import OperatorInstance, Phase, RunStats
from operators.local_sink import OutputQueueSink
from operators.progress_log import Progress
from operators.sources import InputSource
from queuestore.base import PartitionReader
from queuestore.output import OutputQueue
from recovery.closed_directory import ClosedWindowDirectory
from recovery.cut_tuple import results_at_end
from recovery.manager import LiveStates, RecoveryManager
from recovery.standby import LogFollower
from recovery.timeline import RestartTimeline

if TYPE_CHECKING:
    from cec.metrics import OperatorMetrics  # prometheus_client: imported only by a run that serves metrics

__all__ = ["LocalRestore"]


class LocalRestore:
    """Restores one operator instance from its output log and accounts for the restart (module doc)."""

    def __init__(
        self,
        operator: Operator,
        source: InputSource,
        output: OutputQueue,
        instance: OperatorInstance,
        sink: OutputQueueSink,
        codec: RecordCodec,
        *,
        stats: RunStats,
        rates: MeasuredRates,
        metrics: OperatorMetrics | None,
        progress: Progress,
        timeline: RestartTimeline | None,
        followed: LogFollower | None = None,
        replica: LiveStates | None = None,
    ) -> None:
        """`followed`: what a standby followed of the output log before it took over (`recovery.standby`):
        recovery starts from it. `replica`: the standby's replica of the instance (`operators.replica`),
        whose window states at the crash point replace the EC load and the replay where they check out."""
        self.operator = operator
        self.source = source
        self.output = output
        self.instance = instance
        self.sink = sink
        self.codec = codec
        self.stats = stats
        self.rates = rates
        self.metrics = metrics
        self.progress = progress
        self._timeline = timeline
        self._followed = followed
        self._replica = replica
        self.replay_task: progress_tasks.Task | None = None  # shows the replay while it runs
        # A fresh host's closed-window directory while its index catches up (`recovery.closed_directory`).
        self._directory: ClosedWindowDirectory | None = None

    @property
    def timeline(self) -> RestartTimeline:
        """The restart's phases; a host that marked none gets one that starts at its first mark."""
        if self._timeline is None:
            self._timeline = RestartTimeline()
        return self._timeline

    def last_closed_seq(self, key: str) -> int | None:
        """The instance's `closed_seq`: the directory recovery read back while the index catches up, else
        the index."""
        if self._directory is not None:
            return self._directory.last_closed_seq(key)
        return self.output.index.last_closed_seq(key)

    def _phase(self, name: str) -> None:
        """A phase of recovery begins: the timeline's mark and the metrics' phase."""
        self.timeline.mark(name)
        if self.metrics is not None:
            self.metrics.phase(name)

    def _results_at_end(self, reader: PartitionReader, crash_pos: Sequence[int]) -> list[dict[str, Any]]:
        """The results of the records at the log's end that carry the crash point's `pos` (the records of the
        tuple the crash cut, if any, are among them), for an operator with `unique_results`; else none."""
        if not self.operator.unique_results:
            return []
        results = AvroCodec(self.operator.result_schema)
        return [results.decode(payload) for payload in results_at_end(reader, self.codec, crash_pos)]

    def restore(self) -> bool:
        """Restore the instance from the eventual checkpoint and seek the input to the replay start; False
        if the operator had already finished."""
        progress = Progress(f"{self.operator.name} recovery", enabled=self.progress.enabled)
        scan: progress_tasks.Task | None = None

        def scanned(read: int, found: int, n: int) -> None:
            nonlocal scan
            progress(f"EC scan: {read:,} records read, {found:,}/{n:,} windows")
            if scan is None:
                scan = progress_tasks.task(f"{self.progress.label} EC scan", n, "windows")
            scan.update(found, total=n)

        output = self.output
        with output.store.reader(output.topic, output.partition) as reader:
            # The log's end as the index (reconciled, or deferred to catch up with it) knew it at the start: on
            # Kafka the end is found by consuming from this hint, and 0 would read the whole log again.
            reader.hint_end(output.log_end)
            manager = RecoveryManager(
                reader,
                self.operator.decode_state if self.operator.stateful else (lambda b: None),
                codec=self.codec,
                progress=scanned,
                on_phase=self._phase,
                decode_states=self.operator.decode_states if self.operator.stateful else None,
            )
            try:
                recovery = manager.recover(
                    self.source.partitions,
                    cache=output.ec_cache,
                    followed=self._followed,
                    replica=self._replica,
                )
            finally:
                if scan is not None:
                    scan.close()
            # The writer fenced the log's earlier writers while the log was read (`OutputQueue.fence_later`):
            # what was read is the whole log only if none of them added to it meanwhile.
            output.settle_fence(reader, recovery.checkpoint.end_offset)
            crash_pos = recovery.checkpoint.crash_pos
            logged = [] if crash_pos is None else self._results_at_end(reader, crash_pos)
        self.timeline.mark("restore")
        note = recovery.report.ec_cache_note
        if (
            output.ec_cache is not None
            and recovery.report.ec_source == "log"
            and note not in ("", "no EC cache")
        ):
            # Derived data found wanting: said once, in one line (the report keeps it as `ec_cache_note`).
            self.progress(
                f"EC cache not used ({note}): the log was read back; the cache is written again", force=True
            )
        if output.ec_cache is not None and recovery.forward is not None and not recovery.complete:
            forward = recovery.forward  # the cache goes on from the checkpoint recovery decided on
            output.ec_cache.adopt(
                forward.parts, forward.last, forward.next_offset, stored=recovery.forward_stored
            )
        if output.index.deferred and recovery.needed:
            ec = recovery.checkpoint
            recovery.report.index_deferred = output.log_end - output.index.next_offset
            self._directory = ClosedWindowDirectory(
                lambda: output.store.reader(output.topic, output.partition),
                output.index,
                scanned_from=ec.scanned_from,
                closed=ec.closed,
                codec=self.codec,
            )
        if self.metrics is not None:
            replaying = recovery.needed and not recovery.complete and not recovery.at_crash_point
            self.metrics.phase("replay" if replaying else "idle")
        if not recovery.needed:
            # What a restart of this run will pay before its EC work, as this start paid it (process start,
            # store open, index): planned with from the first G-check on, not only after a first recovery.
            self.rates.observe_restart(self.timeline.startup_seconds())
            self.progress("empty log: nothing to recover, starting from the input's start", force=True)
            self.source.seek(self.instance.positions)
            return True
        ec, plan = recovery.checkpoint, recovery.plan
        assert ec.crash_pos is not None
        self.sink.floor(ec.crash_pos)  # pos continues from the crash point (recovery.contract)
        if not recovery.complete and not recovery.at_crash_point and plan.replay_span > 0:
            self.replay_task = progress_tasks.task(
                f"{self.progress.label} replay", plan.replay_span, "tuples"
            )
        self.instance.restore(recovery, where=f"{output.topic}[{output.partition}]", logged_results=logged)
        then = (
            f"the standby's replica at the crash point {list(ec.crash_pos)}: nothing to replay"
            if recovery.at_crash_point
            else f"replay from {list(plan.start)} to crash point {list(ec.crash_pos)}"
        )
        self.progress(
            f"recovered: extent {ec.extent_size:,} records, {recovery.report.ec_windows:,} windows "
            f"(EC build {ec.build_seconds * 1000:.1f} ms, load {recovery.report.ec_load_seconds * 1000:.1f} ms), "
            f"{then}",
            force=True,
        )
        if self._replica is not None and not recovery.at_crash_point:
            # Said once: the replica was there and the takeover replays anyway (still exact, only slower).
            self.progress(f"standby replica not used ({recovery.report.replica}): replaying", force=True)
        if recovery.complete:
            return False
        self.source.seek(self.instance.positions)  # the replay start, or the crash point (a replica's states)
        self.timeline.mark("replay")
        return True

    def replayed(self, positions: Sequence[int]) -> None:
        """The input is at `positions`: the replay's progress while it runs."""
        contract = self.instance.contract
        if self.replay_task is not None and contract is not None:
            self.replay_task.update(sum(positions) - sum(contract.start))

    def caught_up(self) -> None:
        """Told by the instance when recovery is over (`operators.engine.phase`): the restart's figures."""
        if self.metrics is not None:
            self.metrics.phase("idle")
        report = self.stats.recovery
        if report is not None:
            timeline = self.timeline
            now = timeline.clock()
            report.phases = timeline.durations(now)
            report.recovery_seconds = now - timeline.started
            report.startup_seconds = timeline.startup_seconds(now)
            report.catch_up_seconds = report.phases.get("restore", 0.0) + report.phases.get("replay", 0.0)
            if self._directory is not None:
                report.directory_records_read = self._directory.records_read
            # What the next restart pays before its EC work: the recovery-time policy plans with it.
            self.rates.observe_restart(report.startup_seconds)
            if self.metrics is not None:
                self.metrics.restart(report.phases, report.recovery_seconds)
            self.progress(
                f"caught up with the crash point: {report.tuples_replayed:,} tuples replayed, "
                f"{report.tuples_skipped:,} skipped",
                force=True,
            )
        if self.replay_task is not None:
            self.replay_task.update(self.replay_task.total or 0)
            self.close_replay_task()

    def catch_up_index(self, max_records: int | None) -> None:
        """A deferred index rebuild (`queuestore.output`), a slice at a time once recovery is over (not
        while restoring: the replay is what a recovery target bounds). Once the index holds the whole log
        it answers for the closed-window directory again."""
        if self.instance.phase is Phase.RESTORING or not self.output.index.deferred:
            return
        if self.output.catch_up_index(max_records):
            self.close_directory()

    def close_replay_task(self) -> None:
        if self.replay_task is not None:
            self.replay_task.close()
            self.replay_task = None

    def close_directory(self) -> None:
        directory, self._directory = self._directory, None
        if directory is not None:
            directory.close()
