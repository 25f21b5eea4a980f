"""Several aggregates over composite keys, over the same tumbling windows as `operators.aggregate`.

`MultiAggregate` is what `cec run --key carrier,origin --agg avg:arr_delay --agg count:*` runs: one
window per (composite key, window), closed by exactly the rules of `KeyedAggregate` (a count window on its
N-th tuple; a time window when its key's next tuple is at or past its end, or when the watermark passes
it with an allowed lateness), and on closing one result row with every aggregate.

Aggregates follow SQL's null rule: a value column that is null, missing or empty text in a tuple is
skipped by the aggregates over that column (`count:COLUMN` counts the tuples where it is present;
`avg`, `sum`, `min` and `max` are null in a window where it never is); `count:*` counts every tuple of the
window. A value that is present but not a number (or not finite) makes the tuple a dead letter, as it does
for the single aggregate. A composite key is refused (dead letter) when any of its fields is missing;
each field follows the one key rule (`operators.aggregate.canonical_key`).

`sum` and `avg` are exact and order-independent (`operators.exact_sum`): the window's result is the same
double whatever order its tuples came in, so windows over keys spread across input partitions are
exact under recovery. `avg` is the exactly rounded sum divided by the count. `min` and `max` order -0.0
below 0.0 so that they too do not depend on the order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cec.exceptions import BadTupleError, ConfigError
from operators import exact_sum
from operators.aggregate import _EXACT_INT, AGGREGATES, _number, canonical_key, open_window_of, plain_key
from operators.base import InputTuple, Operator, OperatorContext
from operators.multi_state import ColumnState, MultiState, decode_state, empty_column, encode_state
from operators.windows import CountWindows, TumblingTimeWindows, windows_for

__all__ = [
    "ALL_ROWS",
    "AggregateColumn",
    "ColumnState",
    "MultiAggregate",
    "MultiState",
    "parse_agg",
    "result_columns",
]

ALL_ROWS = "*"  # `count:*`: every tuple of the window, nulls included
_AVRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True, slots=True)
class AggregateColumn:
    """One aggregate of the result: `func` over `column` (`*` for count:*), named `name` in the results."""

    func: str
    column: str
    name: str


def parse_agg(text: str, default_column: str | None) -> tuple[str, str]:
    """`--agg FUNC[:COLUMN]` as (func, column); COLUMN defaults to `default_column` (`--value`)."""
    func, sep, column = text.partition(":")
    func, column = func.strip(), column.strip()
    # argparse's words, as when --agg took one of its choices and --value was required.
    if func not in AGGREGATES:
        raise ConfigError(f"argument --agg: invalid choice: {func!r} (choose from {', '.join(AGGREGATES)})")
    if not sep:
        if default_column is None:
            raise ConfigError(
                f"the following arguments are required: --value (or name the column: --agg {func}:COLUMN)"
            )
        column = default_column
    if not column:
        raise ConfigError(f"--agg {text!r} names an empty column")
    if column == ALL_ROWS and func != "count":
        raise ConfigError(f"--agg {text!r}: only count takes '*' (every tuple)")
    return func, column


def result_columns(aggs: Sequence[tuple[str, str]]) -> list[AggregateColumn]:
    """The aggregates with their result column names: `value` for a single aggregate, else `FUNC_COLUMN`
    (`count` for count:*). ConfigError for an unknown function, a repeated aggregate or a bad name."""
    if not aggs:
        raise ConfigError("give at least one aggregate")
    out: list[AggregateColumn] = []
    for func, column in aggs:
        if func not in AGGREGATES:
            raise ConfigError(f"unknown aggregate {func!r}; choose one of {', '.join(AGGREGATES)}")
        if not isinstance(column, str) or not column:
            raise ConfigError(f"aggregate {func!r} needs a column name, got {column!r}")
        if column == ALL_ROWS and func != "count":
            raise ConfigError(f"only count takes '*' (every tuple), not {func}")
        name = "value" if len(aggs) == 1 else "count" if column == ALL_ROWS else f"{func}_{column}"
        if any(a.name == name for a in out):
            raise ConfigError(f"aggregate {func}:{column} is given twice")
        out.append(AggregateColumn(func, column, name))
    return out


class MultiAggregate(Operator):
    """Several aggregates (`aggs`: (func, column) pairs) per composite key (`key_fields`) over tumbling
    count or time windows; see the module doc for the rules."""

    name = "aggregate"

    def __init__(
        self,
        *,
        key_fields: Sequence[str],
        aggs: Sequence[tuple[str, str]],
        window_count: int | None = None,
        window_ms: int | None = None,
        time_field: str | None = None,
        allowed_lateness: int | None = None,
    ) -> None:
        if isinstance(key_fields, str) or not key_fields:
            raise ConfigError("give at least one key field (a list of field names)")
        if any(not isinstance(f, str) or not f.strip() for f in key_fields):
            raise ConfigError(f"key fields must be non-empty names, got {list(key_fields)!r}")
        if len(set(key_fields)) != len(key_fields):
            raise ConfigError(f"a key field is named twice in {','.join(key_fields)}")
        self.aggregates = result_columns([(f, c) for f, c in aggs])
        self.windows: CountWindows | TumblingTimeWindows = windows_for(
            window_count=window_count,
            window_ms=window_ms,
            time_field=time_field,
            allowed_lateness=allowed_lateness,
        )
        self.key_fields = list(key_fields)
        self.value_fields = list(dict.fromkeys(a.column for a in self.aggregates if a.column != ALL_ROWS))
        for field in self.value_fields:
            if field in self.key_fields or field == time_field:
                raise ConfigError(f"column {field!r} cannot be both a key (or the time) and aggregated")
        self._column_at = {field: i for i, field in enumerate(self.value_fields)}
        self.window_count = window_count
        self.window_ms = window_ms
        self.time_field = time_field
        self.allowed_lateness = allowed_lateness
        # With watermarks every time window is a part of its own, keyed by (key, start): it closes only
        # when the watermark passes its end, never by its key's next tuple, so which tuples it holds
        # depends only on the input, not on how input partitions interleave (keys spread over them).
        self.by_window = self.windows.closed_by_watermark
        # The key field of `_process_plain`: one key field, windows of their key (no watermark) only.
        self._plain_key = key_fields[0] if len(key_fields) == 1 and not self.by_window else None
        self.result_schema = self._result_schema()
        # What `state_fields` shows of a window (the log holds `operators.multi_state`'s bytes).
        self.state_schema = {
            "type": "record",
            "name": "MultiAggregateStateFields",
            "namespace": "cec.operators",
            "fields": [
                {"name": "count", "type": "long"},
                {"name": "start", "type": "long"},
                {"name": "last", "type": "long"},
                *(
                    {"name": f"{what}_{field}", "type": "long" if what == "n" else ["null", "double"]}
                    for field in self.value_fields
                    for what in ("n", "sum", "min", "max")
                ),
            ],
        }

    def _result_schema(self) -> dict[str, Any]:
        keys = ["key"] if len(self.key_fields) == 1 else self.key_fields
        fields: list[dict[str, Any]] = [{"name": k, "type": "string"} for k in keys]
        fields.append({"name": "window", "type": "long"})
        single = len(self.aggregates) == 1
        for a in self.aggregates:
            if a.name == "count" and not single:
                continue  # count:* is the `count` column every result has
            kind: Any = "long" if a.func == "count" and not single else ["null", "double"]
            fields.append({"name": a.name, "type": kind})
        fields += [
            {"name": "count", "type": "long"},
            {"name": "start", "type": "long"},
            {"name": "end", "type": "long"},
        ]
        names = [f["name"] for f in fields]
        for name in names:
            if not _AVRO_NAME.match(name):
                raise ConfigError(
                    f"result column {name!r} is not a valid column name (letters, digits and _, not first a digit)"
                )
        clash = sorted({n for n in names if names.count(n) > 1})
        if clash:
            raise ConfigError(f"result column {clash[0]!r} would appear twice (rename a key field)")
        return {
            "type": "record",
            "name": "MultiAggregateResult",
            "namespace": "cec.operators",
            "fields": fields,
        }

    def describe(self) -> str:
        aggs = ", ".join(f"{a.func}({a.column})" for a in self.aggregates)
        return f"{aggs} by {','.join(self.key_fields)}, {self.windows.describe()}"

    def key_of(self, value: Mapping[str, Any]) -> str | None:
        """The id of the window part the tuple goes to. Per-key windows: a single key as `canonical_key`
        makes it, a composite key as the JSON array of its fields' keys (unambiguous whatever the fields
        hold). With watermarks (`by_window`): the JSON array of the key's fields and the window's start.
        BadTupleError names a missing field."""
        fields = self.key_fields
        if len(fields) == 1 and not self.by_window:
            return canonical_key(value.get(fields[0]), fields[0])
        parts: list[str | int] = []
        for field in fields:
            part = canonical_key(value.get(field), field)
            if part is None:
                raise BadTupleError(f"missing key {field!r}")
            parts.append(part)
        if self.by_window:
            t = self.event_time(value)
            assert t is not None
            parts.append(self.windows.start_of(t))
        return json.dumps(parts, ensure_ascii=False, separators=(",", ":"))

    def event_time(self, value: Mapping[str, Any]) -> int | None:
        return self.windows.event_time(value)

    def _values(self, value: Mapping[str, Any]) -> list[float | None]:
        out: list[float | None] = []
        for field in self.value_fields:
            raw = value.get(field)
            if type(raw) is float and raw - raw == 0.0:  # the common case: a finite double (nan, inf: not)
                out.append(raw)
            elif type(raw) is int and -_EXACT_INT <= raw <= _EXACT_INT:
                out.append(float(raw))
            elif raw is None or (isinstance(raw, str) and not raw.strip()):
                out.append(None)  # SQL: the aggregates over this column skip the tuple
            else:
                out.append(_number(raw, f"value {field!r}"))
        return out

    def process(self, tup: InputTuple, ctx: OperatorContext) -> None:
        if self._plain_key is not None and self._process_plain(tup, ctx, self._plain_key):
            return
        self._process(tup, ctx)

    def _process_plain(self, tup: InputTuple, ctx: OperatorContext, field: str) -> bool:
        """`_process` for a per-key window (no watermark) of one key field when the key is plain ASCII text
        or an int and the tuple neither closes its key's window nor would overflow a sum: the same checks
        and effects in fewer steps (the per-tuple path of throughput, as `KeyedAggregate._process_count`).
        False, with nothing changed, for any other tuple: `_process` then decides (and raises its errors)."""
        value = tup.value
        assert value is not None
        key = plain_key(value.get(field))
        if key is None:
            return False
        xs = self._values(value)
        t = self.event_time(value) if self.time_field else tup.offset
        assert t is not None
        windows = self.windows
        window = ctx.registry.get(key)
        exact = exact_sum.exact
        if window is None:
            if windows.closes_before(t, None, None):
                return False
            columns = [empty_column() if x is None else ColumnState(1, exact(x), x, x) for x in xs]
            window = ctx.open_window(key, MultiState(1, windows.start_of(t), t, columns))
            state = window.state
        else:
            state = window.state
            if windows.closes_before(t, state.start, None):
                return False  # its key's window closes first: `_process`
            scaled = [None if x is None else exact(x) for x in xs]
            limit = exact_sum.OVERFLOW
            for si, col in zip(scaled, state.columns, strict=True):
                if si is not None and abs(col.total + si) >= limit:
                    return False  # `_process` dead-letters it
            state.count += 1
            state.last = t
            for x, si, col in zip(xs, scaled, state.columns, strict=True):
                if si is not None:
                    assert x is not None
                    col.add(x, si)
        if windows.is_full(state.count):
            ctx.close_window(key, self._result(key, window.seq, state))
        return True

    def _process(self, tup: InputTuple, ctx: OperatorContext) -> None:
        assert tup.value is not None
        key = self.key_of(tup.value)
        if key is None:
            raise BadTupleError(f"missing key {self.key_fields[0]!r}")
        xs = self._values(tup.value)
        t = self.event_time(tup.value) if self.time_field else tup.offset
        assert t is not None
        windows = self.windows
        window, closes = open_window_of(ctx, key, t, windows, by_watermark=self.by_window)
        exact = exact_sum.exact
        scaled = [None if x is None else exact(x) for x in xs]
        if window is not None and not closes:
            limit = exact_sum.OVERFLOW
            for i, col in enumerate(window.state.columns):
                si = scaled[i]
                if si is not None and abs(col.total + si) >= limit:
                    raise BadTupleError(f"value {self.value_fields[i]!r} would overflow its window's sum")
        # Every check is done: from here on the tuple changes state and cannot fail.
        if closes:
            assert window is not None
            ctx.close_window(key, self._result(key, window.seq, window.state))
            window = None
        state: MultiState
        if window is None:
            columns = [
                empty_column() if x is None or si is None else ColumnState(1, si, x, x)
                for x, si in zip(xs, scaled, strict=True)
            ]
            window = ctx.open_window(key, MultiState(1, windows.start_of(t), t, columns))
            state = window.state
        else:
            state = window.state
            state.count += 1
            state.last = t
            for x, si, col in zip(xs, scaled, state.columns, strict=True):
                if x is not None and si is not None:
                    col.add(x, si)
        if windows.is_full(state.count):
            ctx.close_window(key, self._result(key, window.seq, state))

    def window_end(self, state: MultiState) -> int | None:
        return self.windows.watermark_end(state.start)

    def expire(self, key: str, seq: int, state: MultiState) -> dict[str, Any]:
        return self._result(key, seq, state)

    def _aggregate(self, agg: AggregateColumn, state: MultiState) -> float | int | None:
        if agg.column == ALL_ROWS:
            return state.count if len(self.aggregates) > 1 else float(state.count)
        col = state.columns[self._column_at[agg.column]]
        if agg.func == "count":
            return col.n if len(self.aggregates) > 1 else float(col.n)
        if col.n == 0:
            return None  # SQL: no value in the window
        if agg.func == "sum":
            return exact_sum.rounded(col.total)
        if agg.func == "avg":
            return exact_sum.rounded(col.total) / col.n
        return col.lo if agg.func == "min" else col.hi

    def _result(self, key: str, seq: int, state: MultiState) -> dict[str, Any]:
        if len(self.key_fields) == 1 and not self.by_window:
            out: dict[str, Any] = {"key": key}
        else:
            parts = json.loads(key)
            if self.by_window:
                parts.pop()  # the window's start, which `start` holds
            names = ["key"] if len(self.key_fields) == 1 else self.key_fields
            out = dict(zip(names, parts, strict=True))
        # Per-key windows are numbered per key; a window of its own (watermarks) by its start / size.
        windows = self.windows
        out["window"] = (
            windows.index(state.start) if isinstance(windows, TumblingTimeWindows) and self.by_window else seq
        )
        for agg in self.aggregates:
            out[agg.name] = self._aggregate(agg, state)
        out["count"] = state.count
        out["start"] = state.start
        out["end"] = windows.end_of(state.start, state.last)
        return out

    def state_fields(self, state: MultiState) -> dict[str, Any]:
        """A window's state as flat named fields (`cec state --as-of`): the tuple count, its bounds, and
        per value column the tuples with a value, their exactly rounded sum, min and max (null when none)."""
        out: dict[str, Any] = {"count": state.count, "start": state.start, "last": state.last}
        for field, col in zip(self.value_fields, state.columns, strict=True):
            some = col.n > 0
            out[f"n_{field}"] = col.n
            out[f"sum_{field}"] = exact_sum.rounded(col.total) if some else None
            out[f"min_{field}"] = col.lo if some else None
            out[f"max_{field}"] = col.hi if some else None
        return out

    def encode_state(self, state: MultiState) -> bytes:
        return encode_state(state)

    def decode_state(self, data: bytes) -> MultiState:
        return decode_state(data, len(self.value_fields))
