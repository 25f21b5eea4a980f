"""A job: one operator instance with its input, output queue and checkpoint policy, as typed data.

`JobSpec` holds typed specs (`operators.specs`: the operator, the source, the store; `cec.Checkpointing`)
and takes their dict forms as well. Specs are JSON-able so the same job runs in this process, in a child
process (`python -m operators.worker SPEC.json`, which tests and the CLI SIGKILL), or inside a Spark task.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cec.config import Checkpointing
from cec.exceptions import ConfigError
from cec.metrics import OperatorMetrics, serve
from cec.policy import make_policy
from cec.schedule import CheckpointSchedule
from cec.spec_form import check_known, json_object
from operators.aggregate import parse_duration_ms, parse_lateness_ms
from operators.base import Operator
from operators.crash_after import CrashAfter
from operators.engine.trimming import TrimPace
from operators.runtime import OperatorRuntime, Progress, RunStats
from operators.sinks import RESULTS_TOPIC
from operators.sources import CsvSource, InputSource, PurchaseGenerator, QueueSource
from operators.specs import INPUT_PARTITIONS, SCHEMAS, FilterSpec, OperatorSpec, SourceSpec, StoreSpec
from queuestore.base import QueueStore
from queuestore.exceptions import PartitionLockedError, WriterResetError
from queuestore.factory import open_store
from queuestore.output import OutputQueue
from recovery.identity import bind_log, check_log, record_source
from recovery.timeline import RestartTimeline

if TYPE_CHECKING:
    from operators.standby import Standby

__all__ = [
    "INPUT_PARTITIONS",
    "SCHEMAS",
    "JobSpec",
    "aggregate_operator",
    "build_operator",
    "build_source",
    "check_input",
    "instance_spec",
    "job_source_spec",
    "open_output",
    "pin_source",
    "purchase_filter",
    "run_job",
    "source_partitions",
]

_LOCK_POLL_S = 0.05
# An output index further behind its log than this many records (a fresh host: the state directory lost)
# is not rebuilt before recovery: it catches up while the operator runs (`queuestore.output`), so that a
# restart reads the log's extent, not its history (issue 26).
INDEX_DEFER_ABOVE = 8192
log = logging.getLogger(__name__)


@dataclass
class JobSpec:
    """One operator instance's job. `operator`, `source` and `store` are typed specs; their dict forms
    (`{"type": "aggregate", ...}`) are accepted too and read into them (`from_dict`), as are job files
    written by earlier releases (`from_json`: their `extra` field)."""

    operator: OperatorSpec
    source: SourceSpec
    store: StoreSpec
    output_topic: str
    output_partition: int = 0
    output_partitions: int = 1
    checkpointing: Checkpointing = field(default_factory=Checkpointing)
    batch_size: int = 512
    progress: bool = False
    stats_path: str | None = None
    footprints: bool = True  # False: results only, no fault tolerance (the baseline CEC is measured against)
    trim_every: int | None = None  # trim the output log every this many appended records (None: never)
    # A registered consumer the operator waits for at each trim (back-pressure: `cec run`'s results writer)
    trim_pace: TrimPace | None = None
    # Serve Prometheus metrics (cec.metrics) on metrics_port + output_partition; None: no endpoint.
    metrics_port: int | None = None
    # Also publish every result as a plain JSON record to this Kafka topic, in the output log's
    # transactions (`cec run --results-topic`, `operators.sinks.ResultsTopicOutput`); None: no such topic.
    results_topic: str | None = None
    # Keep the EC cache beside the stream index (design S0, `queuestore.ec_cache`): a restart that finds it
    # reads only the log's tail instead of the extent. Off by default (`cec run --ec-cache on`: with it): at
    # 100,000 keys a restart with it was measured no faster than reading the extent back (docs/recovery.md).
    ec_cache: bool = False

    def __post_init__(self) -> None:
        self.operator = OperatorSpec.from_dict(self.operator)
        self.source = SourceSpec.from_dict(self.source)
        self.store = StoreSpec.from_dict(self.store)
        self.trim_pace = TrimPace.from_dict(self.trim_pace)
        if isinstance(self.checkpointing, Mapping):  # from JSON
            self.checkpointing = Checkpointing.from_dict(dict(self.checkpointing))
        if not isinstance(self.checkpointing, Checkpointing):
            raise ConfigError(f"checkpointing must be a cec.Checkpointing, got {self.checkpointing!r}")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: every spec as its dict form."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if hasattr(value, "to_dict") else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """A job from its JSON form; one written before `results_topic` was a field carries it in `extra`."""
        data = dict(data)
        extra = data.pop("extra", None) or {}
        if not isinstance(extra, Mapping) or set(extra) - {RESULTS_TOPIC}:
            raise ConfigError(f"unknown job extra field(s): {extra!r}")
        if extra.get(RESULTS_TOPIC) is not None:
            data.setdefault("results_topic", extra[RESULTS_TOPIC])
        check_known(data, (f.name for f in fields(cls)), "job")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        return cls.from_dict(json_object(text, "a job spec"))


def purchase_filter() -> FilterSpec:
    """The operator of the paper's first stage (`cec demo`, the benchmarks): purchases with a price."""
    return FilterSpec(field="item_price", op=">", value=0, schema="purchase", time_field="item_time")


def aggregate_operator(
    key: str,
    value: str,
    agg: str,
    *,
    window_count: int | None = None,
    window_time: str | None = None,
    time: str | None = None,
    allowed_lateness: str | None = None,
    key_fields: Sequence[str] | None = None,
    aggs: Sequence[tuple[str, str]] | None = None,
    slide: str | None = None,
    session_gap: str | None = None,
) -> dict[str, Any]:
    """The operator spec of a keyed windowed aggregate as the CLI's flags describe it (`window_time` a
    duration such as "5m", parsed here so that every entry point reads it the same way). `key_fields`
    (a composite key) and `aggs` ((func, column) pairs) make it the several-aggregate form
    (`operators.multi_aggregate`); without them the spec is the single aggregate's, as before. `slide` (a
    duration) makes the time window hopping (`operators.hopping`); `session_gap` (a duration) makes session
    windows (`operators.sessions`) in place of a window."""
    spec: dict[str, Any] = {
        "type": "aggregate",
        "key_field": key,
        "value_field": value,
        "agg": agg,
        "window_count": window_count,
        "window_ms": parse_duration_ms(window_time) if window_time else None,
        "time_field": time,
    }
    if key_fields is not None and len(key_fields) > 1:
        spec["key_fields"] = list(key_fields)
    if aggs is not None:
        spec["aggs"] = [list(a) for a in aggs]
    if slide is not None:
        spec["slide_ms"] = parse_duration_ms(slide)
    if session_gap is not None:
        spec["session_gap_ms"] = parse_duration_ms(session_gap, "session gap")
    if allowed_lateness is not None:
        # Only then: a log records its operator's spec, and one written before watermarks existed must
        # still resume against the same flags.
        spec["allowed_lateness_ms"] = _lateness_ms(allowed_lateness)
    return spec


def _lateness_ms(text: str | None) -> int | None:
    """`--allowed-lateness`: a duration, or 0 (no lateness allowed, still event-time watermarks)."""
    return None if text is None else parse_lateness_ms(text)


def build_operator(spec: OperatorSpec | Mapping[str, Any]) -> Operator:
    """The operator of an operator spec, typed or in its dict form (as a log records it)."""
    return OperatorSpec.from_dict(spec).build()


def build_source(spec: SourceSpec | Mapping[str, Any], store: QueueStore) -> InputSource:
    spec = SourceSpec.from_dict(spec)
    kind = spec.type
    subset = spec.get(INPUT_PARTITIONS)
    if kind == "csv":
        if subset not in (None, [0], (0,)):
            raise ConfigError("a CSV file has one partition, 0")
        return CsvSource(spec["path"])
    if kind == "generator":
        return PurchaseGenerator(
            spec["count"],
            spec["keys"],
            seed=spec.get("seed", 1),
            partitions=spec.get("partitions", 1),
            bad_every=spec.get("bad_every", 0),
            invalid_every=spec.get("invalid_every", 0),
            only=subset,
            interleave=spec.get("interleave"),
        )
    if kind == "queue":
        schema = spec["schema"]  # a name in SCHEMAS, or the payload's Avro schema itself
        return QueueSource(
            store, spec["topic"], SCHEMAS[schema] if isinstance(schema, str) else schema, subset
        )
    if kind == "topic":  # a user's own Kafka topic (operators.topic_source)
        from operators.topic_source import open_topic_source

        return open_topic_source(spec.to_dict(), SCHEMAS)
    raise ConfigError(f"unknown source type {kind!r}")


def source_partitions(spec: SourceSpec | Mapping[str, Any], store: QueueStore) -> int:
    """How many partitions the stream behind a source spec has (before any `input_partitions` subset)."""
    kind = spec.get("type")
    if kind == "generator":
        return int(spec.get("partitions", 1))
    if kind == "queue":
        return store.partitions(spec["topic"])
    if kind == "csv":
        return 1
    if kind == "topic":
        from operators.topic_source import topic_partition_count

        return topic_partition_count(spec["bootstrap_servers"], spec["topic"], spec.get("config"))
    raise ConfigError(f"unknown source type {kind!r}")


def job_source_spec(spec: JobSpec) -> dict[str, Any]:
    """The job's source spec; a Kafka topic source commits its positions (monitoring only) to a consumer
    group named after the job's output topic unless the spec names one."""
    source = spec.source.to_dict()
    if source.get("type") == "topic":
        source.setdefault("group_id", f"cec-{spec.output_topic}")
    return source


def pin_source(source: SourceSpec | Mapping[str, Any]) -> SourceSpec:
    """`source` with whatever a restart must see unchanged resolved now: a bounded Kafka topic source's
    start and end offsets (`operators.topic_source.pin_bounds`). Call once when a job first starts, before
    its spec is handed to instances, and keep the result with the job's log."""
    spec = SourceSpec.from_dict(source)
    if spec.type != "topic":
        return spec
    from operators.topic_source import pin_bounds

    return SourceSpec.from_dict(pin_bounds(spec.to_dict()))


def instance_spec(template: JobSpec, partition: int) -> JobSpec:
    """Instance `partition` of a partitioned stage: reads input partition p, writes output partition p."""
    if not 0 <= partition < template.output_partitions:
        raise ConfigError(f"partition {partition} outside 0..{template.output_partitions - 1}")
    source = template.source.to_dict()
    source.setdefault(INPUT_PARTITIONS, [partition])
    return replace(template, source=SourceSpec.from_dict(source), output_partition=partition)


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
) -> OutputQueue:
    """The partition's output queue, waiting up to `lock_wait_s` for a previous writer to let go.

    After a SIGKILL the kernel releases the writer's lock at once, but a relaunched instance can start
    while its predecessor is still shutting down (a cancelled Spark job, a driver that takes its executors
    down a moment later). Two writers would break the log; waiting keeps it exclusive without failing.
    `results` (results topic, result schema): also publish every result there as plain JSON, in the
    output log's transactions (`operators.sinks.ResultsTopicOutput`). `defer_index_above`, `on_index`,
    `ec_cache`: see `OutputQueue`. `while_locked`: called each time another writer still holds the
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
                )
            return OutputQueue(
                store,
                topic,
                partition,
                defer_index_above=defer_index_above,
                on_index=on_index,
                ec_cache=ec_cache,
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
            check_log(
                store,
                spec.output_topic,
                spec.output_partition,
                log_end=log_end,
                input_identity=source.identity(),
                operator=spec.operator.to_dict(),
                pinned=source.pinned_fields,
            )
        finally:
            source.close()
    finally:
        store.close()


def _metrics(spec: JobSpec) -> OperatorMetrics | None:
    if spec.metrics_port is None:
        return None
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
            )
            stats = runtime.run(stop, max_inputs=max_inputs)
        finally:
            attempt.commits = int(getattr(output.writer, "commits", 0))
            source.close()
            output.close()
    finally:
        store.close()
    if spec.stats_path:
        tmp = Path(spec.stats_path + ".tmp")
        tmp.write_text(json.dumps(stats.as_dict()))
        tmp.replace(spec.stats_path)
    return stats
