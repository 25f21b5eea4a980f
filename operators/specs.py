"""Typed specs of a job's operator, input source and queue store: what `operators.job.JobSpec` holds.

    AggregateSpec(key_field, value_field, agg="avg", window_count=None, window_ms=None, time_field=None,
                  allowed_lateness_ms=None)
    FilterSpec(field, op, value, schema, time_field=None)
    SourceSpec(type="csv" | "generator" | "queue" | "topic", ...)   StoreSpec(type="sqlite" | "kafka", ...)

Frozen and validated on construction, like `cec.config.Checkpointing`: a mistake is one `ConfigError`
line, said before anything runs. Each has a dict form, the one job files, worker processes and the Spark
hosts pass around and the one a log records (`recovery.identity`): `from_dict` reads it (an unknown field
is an error), `to_dict` writes it back. A spec read from a dict writes back exactly that dict's fields,
so a log written by an earlier release resumes against the same spec, and a name derived from a spec
(`cec run`'s output topics) does not change.

A spec also reads as the mapping of its dict form (`spec.store["root"]`, `spec.source.get("type")`,
`open_store(spec.store)`): the functions that take a spec's dict form take the spec itself.
"""

from __future__ import annotations

import operator as _op
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from cec.exceptions import ConfigError
from cec.spec_form import SpecForm, check_count, check_needs, check_text
from operators.aggregate import AGGREGATES, KeyedAggregate
from operators.aggregate import RESULT_SCHEMA as AGG_RESULT_SCHEMA
from operators.base import DEAD_LETTER_SCHEMA, Operator
from operators.sources import PURCHASE_SCHEMA
from operators.stateless import Filter
from queuestore.factory import StoreSpec

__all__ = [
    "COMPARISONS",
    "INPUT_PARTITIONS",
    "SCHEMAS",
    "AggregateSpec",
    "FilterSpec",
    "OperatorSpec",
    "SourceSpec",
    "StoreSpec",
]

# The payload schemas a spec names (a filter's input, a queue source's records).
SCHEMAS: dict[str, dict[str, Any]] = {
    "purchase": PURCHASE_SCHEMA,
    "aggregate": AGG_RESULT_SCHEMA,
    "dead_letter": DEAD_LETTER_SCHEMA,
}
# Source-spec field: the input partitions one instance of a partitioned stage reads (default: all of them).
INPUT_PARTITIONS = "input_partitions"
COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    ">": _op.gt,
    ">=": _op.ge,
    "<": _op.lt,
    "<=": _op.le,
    "==": _op.eq,
    "!=": _op.ne,
}


# -- operators --------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class OperatorSpec(SpecForm):
    """The operator of a job; `OperatorSpec.from_dict` reads any kind (`{"type": "aggregate", ...}`)."""

    kind_name: ClassVar[str] = "operator"
    type: ClassVar[str]

    @classmethod
    def from_dict(cls, data: OperatorSpec | Mapping[str, Any]) -> OperatorSpec:
        if isinstance(data, OperatorSpec):
            return data
        kind = data.get("type") if isinstance(data, Mapping) else None
        for spec_class in (AggregateSpec, FilterSpec):
            if kind == spec_class.type:
                return spec_class._read(data, type=kind)
        raise ConfigError(f"unknown operator type {kind!r}")

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()  # read from a dict: its `type` is among the fields it gave
        return out if self._given is not None else {"type": self.type, **out}

    def build(self) -> Operator:
        """The operator this spec describes."""
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class AggregateSpec(OperatorSpec):
    """A keyed windowed aggregate (`operators.aggregate.KeyedAggregate`): a count window of
    `window_count` tuples or a time window of `window_ms` over `time_field`, per key. With `key_fields` (a
    composite key) or `aggs` ((func, column) pairs) it is the several-aggregate form
    (`operators.multi_aggregate.MultiAggregate`); `value_field` may then be None."""

    type: ClassVar[str] = "aggregate"
    key_field: str
    value_field: str | None
    agg: str = "avg"
    window_count: int | None = None
    window_ms: int | None = None
    time_field: str | None = None
    allowed_lateness_ms: int | None = None  # event-time watermarks (time windows only)
    key_fields: list[str] | None = None  # a composite key (more than one field)
    aggs: list[list[str]] | None = None  # several aggregates: [func, column] pairs
    slide_ms: int | None = None  # hopping windows (`operators.hopping`): the slide of the time window
    session_gap_ms: int | None = None  # session windows (operators.sessions) instead of window_*

    def __post_init__(self) -> None:
        check_text(self.key_field, "key_field")
        check_text(self.value_field, "value_field", optional=self.aggs is not None)
        check_text(self.time_field, "time_field", optional=True)
        if self.agg not in AGGREGATES:
            raise ConfigError(f"unknown aggregate {self.agg!r}; choose one of {', '.join(AGGREGATES)}")
        check_count(self.window_count, "window_count")
        check_count(self.window_ms, "window_ms")
        check_count(self.allowed_lateness_ms, "allowed_lateness_ms", least=0)
        check_count(self.slide_ms, "slide_ms")
        check_count(self.session_gap_ms, "session_gap_ms")
        self.build()  # the operator's own checks (one window, a time field for a time window, ...)

    def to_dict(self) -> dict[str, Any]:
        if self._given is not None:
            return super().to_dict()
        # The form `cec run` has always written (and digested into its output topic names): every field
        # but a later one that is unset.
        out: dict[str, Any] = {"type": self.type, **{n: getattr(self, n) for n in self._names()}}
        for later in ("allowed_lateness_ms", "key_fields", "aggs", "slide_ms", "session_gap_ms"):
            if out[later] is None:
                del out[later]
        return out

    def build(self) -> Operator:
        if self.session_gap_ms is not None:
            from operators.sessions import SessionAggregate

            if self.window_count is not None or self.window_ms is not None:
                raise ConfigError("give a session gap or a count or time window, not both")
            return SessionAggregate(
                key_fields=self.key_fields or [self.key_field],
                aggs=[(f, c) for f, c in self.aggs or [[self.agg, self.value_field or ""]]],
                gap_ms=self.session_gap_ms,
                time_field=self.time_field,
                allowed_lateness=self.allowed_lateness_ms,
            )
        if self.slide_ms is not None:
            from operators.hopping import HoppingAggregate

            return HoppingAggregate(
                key_fields=self.key_fields or [self.key_field],
                aggs=[(f, c) for f, c in self.aggs or [[self.agg, self.value_field or ""]]],
                window_ms=self.window_ms,
                slide_ms=self.slide_ms,
                time_field=self.time_field,
                allowed_lateness=self.allowed_lateness_ms,
            )
        if self.key_fields is not None or self.aggs is not None:
            from operators.multi_aggregate import MultiAggregate

            return MultiAggregate(
                key_fields=self.key_fields or [self.key_field],
                aggs=[(f, c) for f, c in self.aggs or [[self.agg, self.value_field or ""]]],
                window_count=self.window_count,
                window_ms=self.window_ms,
                time_field=self.time_field,
                allowed_lateness=self.allowed_lateness_ms,
            )
        assert self.value_field is not None  # checked on construction
        return KeyedAggregate(
            key_field=self.key_field,
            value_field=self.value_field,
            agg=self.agg,
            window_count=self.window_count,
            window_ms=self.window_ms,
            time_field=self.time_field,
            allowed_lateness=self.allowed_lateness_ms,
        )


@dataclass(frozen=True, eq=False)
class FilterSpec(OperatorSpec):
    """A stateless filter: the tuples whose `field` compares true (`op`, one of `COMPARISONS`) with
    `value`, their payload in the named schema (`SCHEMAS`)."""

    type: ClassVar[str] = "filter"
    field: str
    op: str
    value: Any
    schema: str
    time_field: str | None = None

    def __post_init__(self) -> None:
        check_text(self.field, "field")
        check_text(self.time_field, "time_field", optional=True)
        if self.op not in COMPARISONS:
            raise ConfigError(f"unknown comparison {self.op!r}")
        if self.schema not in SCHEMAS:
            raise ConfigError(f"unknown schema {self.schema!r}; choose one of {', '.join(sorted(SCHEMAS))}")

    def build(self) -> Operator:
        field_name, op, threshold = self.field, self.op, self.value
        compare = COMPARISONS[op]
        return Filter(
            lambda v: bool(compare(v[field_name], threshold)),
            SCHEMAS[self.schema],
            time_field=self.time_field,
            description=f"filter {field_name} {op} {threshold!r}",
        )


# -- sources and stores -----------------------------------------------------------------------------------
# The fields a source of each type must have (every other field is optional).
_SOURCE_NEEDS: dict[str, tuple[str, ...]] = {
    "csv": ("path",),
    "generator": ("count", "keys"),
    "queue": ("topic", "schema"),
    "topic": ("bootstrap_servers", "topic"),  # a user's own Kafka topic (operators.topic_source)
}


@dataclass(frozen=True, eq=False)
class SourceSpec(SpecForm):
    """The input of a job: a CSV file, the purchase generator, an upstream cec queue, or a Kafka topic.
    Which fields a type reads: `operators.job.build_source` (and `operators.topic_source` for topics)."""

    kind_name: ClassVar[str] = "source"
    type: str
    input_partitions: list[int] | None = None  # INPUT_PARTITIONS
    # csv
    path: str | None = None
    # generator (operators.sources.PurchaseGenerator)
    count: int | None = None
    keys: int | None = None
    seed: int | None = None
    partitions: int | None = None
    bad_every: int | None = None
    invalid_every: int | None = None
    interleave: Any = None
    rate: float | None = None  # a live stream: tuples per second (PurchaseGenerator)
    arrival_epoch: float | None = None  # when its first tuple arrives (unix seconds; shared by processes)
    # queue, topic
    topic: str | None = None
    schema: Any = None  # queue: a SCHEMAS name; topic: an Avro schema, or a SCHEMAS name for format cec
    # topic (operators.topic_source)
    bootstrap_servers: str | None = None
    format: str | None = None
    key_field: str | None = None
    value_field: str | None = None
    time_field: str | None = None
    follow: bool | None = None
    schema_registry: str | None = None
    columns: list[str] | None = None
    group_id: str | None = None
    start_offsets: list[int] | None = None
    end_offsets: list[int] | None = None
    config: dict[str, Any] | None = None  # librdkafka settings
    state_dir: str | None = None

    @classmethod
    def from_dict(cls, data: SourceSpec | Mapping[str, Any]) -> SourceSpec:
        return data if isinstance(data, SourceSpec) else cls._read(data)

    def __post_init__(self) -> None:
        check_needs(self, _SOURCE_NEEDS)
        for name in ("count", "seed", "bad_every", "invalid_every"):
            check_count(getattr(self, name), name, least=0)
        check_count(self.keys, "keys")
        check_count(self.partitions, "partitions")
        if self.input_partitions is not None and (
            isinstance(self.input_partitions, (str, bytes))
            or not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in self.input_partitions
            )
        ):
            raise ConfigError(f"input_partitions must be partition numbers, got {self.input_partitions!r}")
