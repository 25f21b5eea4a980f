"""What a job's specs build: its operator (`build_operator`, the CLI's flags as a spec: `aggregate_operator`),
its input source (`build_source`, `source_partitions`, `pin_source`) and the spec of one instance of a
partitioned stage (`instance_spec`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from cec.exceptions import ConfigError
from operators.aggregate import parse_duration_ms, parse_lateness_ms
from operators.base import Operator
from operators.job_spec import JobSpec
from operators.sources import CsvSource, InputSource, PurchaseGenerator, QueueSource
from operators.specs import INPUT_PARTITIONS, SCHEMAS, FilterSpec, OperatorSpec, SourceSpec
from queuestore.base import QueueStore

__all__ = [
    "aggregate_operator",
    "build_operator",
    "build_source",
    "instance_spec",
    "job_source_spec",
    "pin_source",
    "purchase_filter",
    "source_partitions",
]


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
            rate=spec.get("rate"),
            arrival_epoch=spec.get("arrival_epoch"),
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
