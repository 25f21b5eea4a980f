"""`cec_aggregate`'s `key=` and `agg=` read into the aggregate they describe, checked on the driver.

    key="item_id", value="item_price", agg="avg"            one key, one aggregate (KeyedAggregate)
    key=["carrier", "origin"], agg=[("avg", "arr_delay"), ("max", "dep_delay"), ("count", "*")]

The second is the several-aggregate form, the operator `cec run --key carrier,origin --agg avg:arr_delay
...` runs (`operators.multi_aggregate.MultiAggregate`, the same class on both hosts). As with `cec run`'s
flags (`operators.aggregate_flags`), one key and a plain string `agg` keep the single aggregate, whose
logs and results are exactly as before; a list of keys or a list of (FUNC, COLUMN) pairs gives the
several-aggregate form. A composite key with a plain string `agg` is that one aggregate over `value`.
Hopping and session windows (`window_form`: `window_time="1h", slide="15m"`, `session_gap="30m"`) are of
the several-aggregate form whatever the key and agg (`operators.hopping`, `operators.sessions`): one key
and a plain string agg then give MultiAggregate's columns for one aggregate (`key`, `value`, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cec.exceptions import ConfigError
from operators.aggregate import parse_duration_ms
from operators.multi_aggregate import ALL_ROWS, result_columns

__all__ = ["AggregateForm", "WindowForm", "aggregate_form", "window_form"]


@dataclass(frozen=True)
class AggregateForm:
    """What `key=`/`value=`/`agg=` describe: the key fields, the single aggregate's name, and for the
    several-aggregate form the composite key (`several_keys`, None for one field) and the (FUNC, COLUMN)
    pairs (`aggs`, None for the single form)."""

    key_fields: tuple[str, ...]
    agg: str
    several_keys: tuple[str, ...] | None
    aggs: tuple[tuple[str, str], ...] | None

    @property
    def value_columns(self) -> tuple[str, ...]:
        """The columns the several aggregates read numbers from (count:* reads none)."""
        if self.aggs is None:
            return ()
        return tuple(dict.fromkeys(column for _, column in self.aggs if column != ALL_ROWS))


def _key_fields(key: Any) -> tuple[str, ...]:
    if isinstance(key, str):
        fields: tuple[Any, ...] = (key,)
    elif isinstance(key, Sequence) and not isinstance(key, (bytes, bytearray)):
        fields = tuple(key)
    else:
        raise ConfigError(f"key must be a column name or a list of column names, got {key!r}")
    if not fields or not all(isinstance(f, str) and f.strip() for f in fields):
        raise ConfigError(f"key must be a column name or a list of column names, got {key!r}")
    if len(set(fields)) != len(fields):
        raise ConfigError(f"key {list(fields)!r} names a column twice")
    return fields


def _pairs(agg: Sequence[Any]) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    for item in agg:
        if (
            isinstance(item, (str, bytes))
            or not isinstance(item, Sequence)
            or len(item) != 2
            or not all(isinstance(part, str) for part in item)
        ):
            raise ConfigError(
                f"agg takes (FUNC, COLUMN) pairs such as ('avg', 'arr_delay') or ('count', '*'), got {item!r}"
            )
        pairs.append((item[0], item[1]))
    return tuple(pairs)


def aggregate_form(key: Any, value: Any, agg: Any, *, several: bool = False) -> AggregateForm:
    """The aggregate `key=`, `value=` and `agg=` describe (module doc). ConfigError (one line) for a key
    that is not column names, an agg that is neither a function name nor (FUNC, COLUMN) pairs, an unknown
    function, a missing or repeated column, a column that is also a key. `several`: the several-aggregate
    form even for one key and a plain string agg (hopping and session windows)."""
    fields = _key_fields(key)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ConfigError(f"value must be a column name, got {value!r}")
    if isinstance(agg, str):
        if value is None:
            raise ConfigError(
                f"agg={agg!r} aggregates value=COLUMN: give value=, or agg=[({agg!r}, COLUMN), ...]"
            )
        if value in fields:
            raise ConfigError("key, value and time must be different columns")
        if len(fields) == 1 and not several:
            result_columns([(agg, value)])  # an unknown function: the same line as the pairs' form
            return AggregateForm(fields, agg, None, None)
        aggs: tuple[tuple[str, str], ...] = ((agg, value),)
    elif isinstance(agg, Sequence) and not isinstance(agg, bytes):
        if value is not None:
            raise ConfigError(
                "value= goes with agg given as a function name; agg=[(FUNC, COLUMN), ...] names its columns"
            )
        aggs = _pairs(agg)
    else:
        raise ConfigError(f"agg must be a function name or a list of (FUNC, COLUMN) pairs, got {agg!r}")
    result_columns(aggs)  # unknown function, empty or repeated column, '*' for other than count
    for func, column in aggs:
        if column in fields:
            raise ConfigError(f"agg ({func!r}, {column!r}): {column!r} is a key column")
    return AggregateForm(fields, aggs[0][0], fields if len(fields) > 1 else None, aggs)


@dataclass(frozen=True)
class WindowForm:
    """The windows `window_count=`, `window_time=`, `slide=` and `session_gap=` describe, in ms."""

    window_count: int | None
    window_ms: int | None
    slide_ms: int | None
    session_gap_ms: int | None

    @property
    def several(self) -> bool:
        """Hopping or session windows: the several-aggregate form (module doc)."""
        return self.slide_ms is not None or self.session_gap_ms is not None


def _duration(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{name} must be a duration such as '15m' or whole milliseconds, got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ConfigError(f"{name} must be at least 1 ms, got {value}")
        return value
    return parse_duration_ms(value, name)


def window_form(
    *,
    window_count: Any,
    window_time: Any,
    slide: Any,
    session_gap: Any,
    time: str | None,
    input_format: str = "json",
) -> WindowForm:
    """`cec_aggregate`'s window keywords read and checked on the driver, each mistake one ConfigError line
    in the keywords' own names: a slide needs window_time (not window_count) and at most its size; a
    session_gap needs time= and goes with no other window; both read an ordinary topic (the
    several-aggregate form's input), not a cec queue."""
    # As before slide= existed: an int is ms as given (the aggregate's own check says what is wrong with it).
    window_ms = None
    if window_time is not None:
        window_ms = window_time if isinstance(window_time, int) else parse_duration_ms(window_time)
    slide_ms = _duration(slide, "slide")
    gap_ms = _duration(session_gap, "session_gap")
    if gap_ms is not None:
        if window_count is not None or window_ms is not None or slide_ms is not None:
            raise ConfigError(
                "session_gap is a window of its own: give no window_count, window_time or slide with it"
            )
        if time is None:
            raise ConfigError("session_gap needs time= (sessions are in event time)")
    if slide_ms is not None:
        if window_count is not None:
            raise ConfigError("slide goes with window_time (hopping time windows), not with window_count")
        if window_ms is None:
            raise ConfigError("slide needs window_time (e.g. window_time='1h', slide='15m')")
        if slide_ms > window_ms:
            raise ConfigError(f"slide ({slide_ms} ms) is larger than window_time ({window_ms} ms)")
        if window_ms % slide_ms:
            raise ConfigError(
                f"slide ({slide_ms} ms) must divide window_time ({window_ms} ms): windows are combined from "
                "slide-wide panes"
            )
    form = WindowForm(window_count, window_ms, slide_ms, gap_ms)
    if form.several and input_format == "cec":
        raise ConfigError(
            "slide and session_gap windows read an ordinary topic (input_format json, avro, registry or csv), "
            "not a cec queue"
        )
    return form
