"""The configuration of an attached aggregation (`operators.spark.attach.cec_aggregate`): which operator
the executors build (`AggregateSpec.build`), picklable so that it ships to the Python workers inside the
processor (`operators.spark.processor.CecAggregateProcessor`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cec.exceptions import ConfigError
from operators.aggregate import KeyedAggregate
from operators.hopping import HoppingAggregate
from operators.multi_aggregate import MultiAggregate
from operators.sessions import SessionAggregate

__all__ = ["AggregateSpec"]

# KeyedAggregate's keyword for each of AggregateSpec's fields, in AggregateSpec.build's order.
_OPERATOR_ARGUMENTS = ("key_field", "value_field", "agg", "window_count", "window_ms", "time_field",
                       "allowed_lateness")  # fmt: skip


@dataclass(frozen=True)
class AggregateSpec:
    """The aggregate's configuration; picklable (shipped to the Python workers inside the processor).
    `json_values`: the value and time columns hold JSON text (the cec-topic source), decoded here.
    `allowed_lateness`: event-time watermarks (ms), as `cec run --allowed-lateness`.

    With `key_fields` (a composite key) or `aggs` ((func, column) pairs) it is the several-aggregate form,
    the operator `cec run --key a,b --agg FUNC:COLUMN` runs (`operators.multi_aggregate.MultiAggregate`):
    then `key` is the first key field, `value` may be None, and each tuple's value column holds the JSON
    object of the fields the operator reads (`operators.spark.topic_reader.TupleBatches`). `slide` (ms,
    with `window_ms`): hopping windows (`operators.hopping.HoppingAggregate`); `session_gap` (ms):
    session windows (`operators.sessions.SessionAggregate`); both are of the several-aggregate form, the
    classes `cec run --slide` / `--session-gap` runs."""

    key: str
    value: str | None
    agg: str
    window_count: int | None
    window_ms: int | None
    time: str | None
    json_values: bool = False
    allowed_lateness: int | None = None
    key_fields: tuple[str, ...] | None = None
    aggs: tuple[tuple[str, str], ...] | None = None
    slide: int | None = None
    session_gap: int | None = None

    @property
    def several(self) -> bool:
        """The several-aggregate form (class doc)."""
        return (
            self.key_fields is not None
            or self.aggs is not None
            or self.slide is not None
            or self.session_gap is not None
        )

    @property
    def by_window(self) -> bool:
        """Whether a part id is the JSON array of the key's fields and a time number (the window's start
        under watermarks, a hopping part's period, a session's slice under watermarks), which
        `operators.spark.partitioning.part_partition_key` takes off to find the key's partition."""
        operator = self.build()
        if isinstance(operator, HoppingAggregate):
            return True
        if isinstance(operator, SessionAggregate):
            return operator.by_slice
        return isinstance(operator, MultiAggregate) and operator.by_window

    @property
    def forget_closed(self) -> bool:
        """Whether a part never opens again once closed, so a partition need not keep its next seq: a
        window of its own under watermarks (its tuples are late after its close), a session's slice (late
        once the watermark passed it). Not a hopping part: a later pane of its period may still come after
        its last window closed, and opens it again with the next seq."""
        operator = self.build()
        if isinstance(operator, HoppingAggregate):
            return False
        if isinstance(operator, SessionAggregate):
            return operator.by_slice
        return isinstance(operator, MultiAggregate) and operator.by_window

    @property
    def key_array(self) -> bool:
        """Whether the packed key is the JSON array of the key fields' keys
        (`operators.spark.partitioning.partition_key`): a composite key, or parts per window."""
        return self.several and (len(self.key_fields or ()) > 1 or self.by_window)

    def build(self) -> KeyedAggregate | MultiAggregate:
        if self.several:
            key_fields = list(self.key_fields or (self.key,))
            aggs = list(self.aggs or ((self.agg, self.value or ""),))
            if self.session_gap is not None:
                if self.window_count is not None or self.window_ms is not None:
                    raise ConfigError("give session_gap or a count or time window, not both")
                return SessionAggregate(
                    key_fields=key_fields,
                    aggs=aggs,
                    gap_ms=self.session_gap,
                    time_field=self.time,
                    allowed_lateness=self.allowed_lateness,
                )
            if self.slide is not None:
                return HoppingAggregate(
                    key_fields=key_fields,
                    aggs=aggs,
                    window_ms=self.window_ms,
                    slide_ms=self.slide,
                    time_field=self.time,
                    allowed_lateness=self.allowed_lateness,
                )
            return MultiAggregate(
                key_fields=key_fields,
                aggs=aggs,
                window_count=self.window_count,
                window_ms=self.window_ms,
                time_field=self.time,
                allowed_lateness=self.allowed_lateness,
            )
        values = (self.key, self.value, self.agg, self.window_count, self.window_ms, self.time,
                  self.allowed_lateness)  # fmt: skip
        arguments: dict[str, Any] = dict(zip(_OPERATOR_ARGUMENTS, values, strict=True))
        return KeyedAggregate(**arguments)
