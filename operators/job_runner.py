"""Running a job (`run_job`): its output queue opened (`open_output`), its input checked against the log
(`check_input`), the operator run under CEC, and recovered in this process after a writer reset."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cec.policy import make_policy
from cec.schedule import CheckpointSchedule
from operators.crash_after import CrashAfter
from operators.job_builders import build_source, job_source_spec
from operators.job_spec import JobSpec
from operators.runtime import OperatorRuntime, Progress, RunStats
from operators.sources import InputSource
from queuestore.base import QueueStore
from queuestore.exceptions import PartitionLockedError, WriterResetError
from queuestore.factory import open_store
from queuestore.output import OutputQueue
from recovery.identity import bind_log, check_log, record_source
from recovery.timeline import RestartTimeline

if TYPE_CHECKING:
    from cec.metrics import OperatorMetrics
    from operators.replica import StandbyReplica
    from operators.standby import Standby

__all__ = ["INDEX_DEFER_ABOVE", "check_input", "open_output", "run_job"]

_LOCK_POLL_S = 0.05
# An output index further behind its log than this many records (a fresh host: the state directory lost)
# is not rebuilt before recovery: it catches up while the operator runs (`queuestore.output`), so that a
# restart reads the log's extent, not its history (issue 26).
INDEX_DEFER_ABOVE = 8192
log = logging.getLogger("operators.job")  # the name its log lines had before the split


def open_output(
    store: QueueStore,
    topic: str,
    partition: int,
    *,
    lock_wait_s: float = 0.0,
    results: tuple[str, dict[str, Any]] | None = None,
    defer_index_above: int | None = None,
    on_index: Callable[[], None] | None = None,
    ec_cache: bool = False,
    while_locked: Callable[[], None] | None = None,
    fence_later: bool = False,
) -> OutputQueue:
    """The partition's output queue, waiting up to `lock_wait_s` for a previous writer to let go.

    After a SIGKILL the kernel releases the writer's lock at once, but a relaunched instance can start
    while its predecessor is still shutting down (a cancelled Spark job, a driver that takes its executors
    down a moment later). Two writers would break the log; waiting keeps it exclusive without failing.
    `results` (results topic, result schema): also publish every result there as plain JSON, in the
    output log's transactions (`operators.sinks.ResultsTopicOutput`). `defer_index_above`, `on_index`,
    `ec_cache`, `fence_later`: see `OutputQueue`. `while_locked`: called each time another writer still holds the
    partition, instead of waiting up to `lock_wait_s` (a standby follows the log there until the
    primary's lock is released, `operators.standby`); it raises to give up.
    """
    deadline = time.monotonic() + lock_wait_s
    while True:
        try:
            if results is not None:
                from operators.sinks import ResultsTopicOutput

                return ResultsTopicOutput(
                    store,
                    topic,
                    partition,
                    results_topic=results[0],
                    result_schema=results[1],
                    defer_index_above=defer_index_above,
                    on_index=on_index,
                    ec_cache=ec_cache,
                    fence_later=fence_later,
                )
            return OutputQueue(
                store,
                topic,
                partition,
                defer_index_above=defer_index_above,
                on_index=on_index,
                ec_cache=ec_cache,
                fence_later=fence_later,
            )
        except PartitionLockedError:
            if while_locked is not None:
                while_locked()
                continue
            if time.monotonic() >= deadline:
                raise
            time.sleep(_LOCK_POLL_S)


def check_input(spec: JobSpec) -> None:
    """Raise `InputMismatchError` now if the instance's log exists, is not empty and was built from another
    input than the spec's: the check `run_job` makes, for a host that can look before it starts tasks
    (the Spark driver) and would otherwise see every task attempt fail the same way. Read-only."""
    store = open_store(spec.store)
    try:
        if not store.topic_exists(spec.output_topic):
            return
        with store.reader(spec.output_topic, spec.output_partition) as reader:
            log_end = reader.end_offset()
        if log_end == 0:
            return
        source = build_source(spec.source, store)
        try:
            _recorded_input(spec, store, source, log_end)
        finally:
            source.close()
    finally:
        store.close()


def _recorded_input(
    spec: JobSpec, store: QueueStore, source: InputSource, log_end: int
) -> dict[str, Any] | None:
    """The input identity the job's log recorded, read-only (`recovery.identity.check_log`: raises
    `InputMismatchError` if the log was built from another input or operator); None for an empty log."""
    return check_log(
        store,
        spec.output_topic,
        spec.output_partition,
        log_end=log_end,
        input_identity=source.identity(),
        operator=spec.operator.to_dict(),
        pinned=source.pinned_fields,
    )


def _metrics(spec: JobSpec) -> OperatorMetrics | None:
    if spec.metrics_port is None:
        return None
    from cec.metrics import OperatorMetrics, serve  # prometheus_client only for a run that serves metrics

    serve(spec.metrics_port + spec.output_partition)
    return OperatorMetrics(spec.output_topic, spec.output_partition)


# A writer that failed in a way a new producer resolves (a commit in doubt, a producer that failed
# mid-transaction: `WriterResetError`) has fenced its own producer: the log is final, and the instance
# recovers from it in this process. Bounded: this many in a row with no transaction committed in between
# stop it instead (a broker that fails every transaction is the user's to see).
IN_DOUBT_LIMIT = 5


@dataclass
class _Attempt:
    commits: int = 0  # transactions the attempt's output writer committed


def run_job(
    spec: JobSpec,
    *,
    stop: Callable[[], bool] | None = None,
    max_inputs: int | None = None,
    lock_wait_s: float = 0.0,
    crash_after: int | None = None,
    started: float | None = None,
    standby: Standby | None = None,
) -> RunStats:
    """Run one operator instance, recovering from its log first, to the end of its input (or until
    `stop()` / `max_inputs`, see `OperatorRuntime.run`). A log built from another input than the spec's
    is refused (`recovery.identity.bind_log`: `InputMismatchError`) before anything is read or written.
    A writer failure that a new producer resolves is recovered from here, from the log (`IN_DOUBT_LIMIT`).
    `crash_after`: SIGKILL this process once that many input tuples were applied (`--crash-after`,
    `operators.crash_after`). `started`: when this start began, on `time.perf_counter`'s scale: a recovery's
    time counts from there (`recovery.timeline`; a process that starts to run this job passes
    `recovery.timeline.process_started()`); default: now. `standby`: run as the standby of the
    partition's writer (`operators.standby`): follow its log until the writer's lock is released, then
    take over (recovering from what was followed) and go on as the writer."""
    in_doubt = 0
    while True:
        attempt = _Attempt()
        try:
            return _run_once(
                spec,
                attempt,
                stop=stop,
                max_inputs=max_inputs,
                lock_wait_s=lock_wait_s,
                crash_after=crash_after,
                timeline=RestartTimeline(started=started),
                standby=standby,
            )
        except WriterResetError as exc:
            in_doubt = 1 if attempt.commits else in_doubt + 1
            if in_doubt >= IN_DOUBT_LIMIT or (stop is not None and stop()):
                raise
            log.warning("%s: recovering in this process", exc)
            started = None  # the next attempt's recovery starts now


def _replica(spec: JobSpec, store: QueueStore, source_spec: dict[str, Any]) -> StandbyReplica:
    """A standby's replica of the instance (`operators.replica`): the operator and its own reader of the
    input, which commits no positions to the primary's monitoring group and adopts the input identity the
    log recorded (read-only: the primary holds the writer) before its first read."""
    from operators.replica import StandbyReplica

    own = {k: v for k, v in source_spec.items() if k != "group_id"}
    source = build_source(own, store)

    def pin() -> None:
        with store.reader(spec.output_topic, spec.output_partition) as reader:
            recorded = _recorded_input(spec, store, source, reader.end_offset())
        if recorded is not None:
            source.pin(recorded)

    return StandbyReplica(spec.operator.build(), source, batch_size=spec.batch_size, prepare=pin)


def _on_index(timeline: RestartTimeline, standby: Standby | None) -> None:
    """The writer is open (`OutputQueue`): a standby's restart starts now, at its takeover."""
    if standby is not None:
        timeline.begin_takeover()
    timeline.mark("index")


def _run_once(
    spec: JobSpec,
    attempt: _Attempt,
    *,
    stop: Callable[[], bool] | None,
    max_inputs: int | None,
    lock_wait_s: float,
    crash_after: int | None,
    timeline: RestartTimeline,
    standby: Standby | None = None,
) -> RunStats:
    timeline.mark("store_open")
    store = open_store(spec.store)
    try:
        store.create_topic(spec.output_topic, spec.output_partitions)
        store.check_retention(spec.output_topic)  # refused at start, before anything is read or written
        operator = spec.operator.build()
        source_spec = job_source_spec(spec)
        source = build_source(source_spec, store)
        progress = Progress(f"{operator.name}[{spec.output_partition}]", enabled=spec.progress)
        if standby is not None and standby.wants_replica and standby.replica is None:
            standby.attach_replica(_replica(spec, store, source_spec))
        try:
            output = open_output(
                store,
                spec.output_topic,
                spec.output_partition,
                lock_wait_s=lock_wait_s,
                results=(spec.results_topic, operator.result_schema) if spec.results_topic else None,
                defer_index_above=INDEX_DEFER_ABOVE,
                on_index=lambda: _on_index(timeline, standby),
                ec_cache=spec.ec_cache,
                while_locked=None
                if standby is None
                else lambda: standby.while_locked(store, spec.output_topic, spec.output_partition),
                # Fenced while recovery reads the log (the runtime's restore settles it before it appends).
                fence_later=True,
            )
        except BaseException:
            source.close()
            raise
        try:
            # Before recovery reads the log: a log only resumes against the input it was built from.
            recorded = bind_log(
                store,
                spec.output_topic,
                spec.output_partition,
                log_end=output.log_end,
                input_identity=source.identity(),
                operator=spec.operator.to_dict(),
                pinned=source.pinned_fields,
            )
            if source_spec.get("type") == "topic":  # its identity alone cannot read it again (cec state)
                record_source(
                    store,
                    spec.output_topic,
                    spec.output_partition,
                    log_end=output.log_end,
                    source_spec=source_spec,
                )
            source.pin(recorded)
            runtime = OperatorRuntime(
                operator,
                source if crash_after is None else CrashAfter(source, crash_after),
                output,
                policy=make_policy(spec.checkpointing),
                schedule=CheckpointSchedule(spec.checkpointing.ci_ms, spec.checkpointing.cp_ms),
                batch_size=spec.batch_size,
                progress=progress,
                footprints=spec.footprints,
                trim_every=spec.trim_every,
                trim_pace=spec.trim_pace,
                metrics=_metrics(spec),
                timeline=timeline,
                followed=None if standby is None else standby.took_over(),
                replica=None if standby is None else standby.replica,
            )
            stats = runtime.run(stop, max_inputs=max_inputs)
        finally:
            attempt.commits = int(getattr(output.writer, "commits", 0))
            source.close()
            output.close()
            if standby is not None and standby.replica is not None:
                standby.replica.close()
    finally:
        store.close()
    if spec.stats_path:
        tmp = Path(spec.stats_path + ".tmp")
        tmp.write_text(json.dumps(stats.as_dict()))
        tmp.replace(spec.stats_path)
    return stats
