"""`cec_aggregate`'s `key=` and `agg=` read into the aggregate they describe, checked on the driver.

    key="item_id", value="item_price", agg="avg"            one key, one aggregate (KeyedAggregate)
    key=["carrier", "origin"], agg=[("avg", "arr_delay"), ("max", "dep_delay"), ("count", "*")]

The second is the several-aggregate form, the operator `cec run --key carrier,origin --agg avg:arr_delay
...` runs (`operators.multi_aggregate.MultiAggregate`, the same class on both hosts). As with `cec run`'s
flags (`operators.aggregate_flags`), one key and a plain string `agg` keep the single aggregate, whose
logs and results are exactly as before; a list of keys or a list of (FUNC, COLUMN) pairs gives the
several-aggregate form. A composite key with a plain string `agg` is that one aggregate over `value`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cec.exceptions import ConfigError
from operators.multi_aggregate import ALL_ROWS, result_columns

__all__ = ["AggregateForm", "aggregate_form"]


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


def aggregate_form(key: Any, value: Any, agg: Any) -> AggregateForm:
    """The aggregate `key=`, `value=` and `agg=` describe (module doc). ConfigError (one line) for a key
    that is not column names, an agg that is neither a function name nor (FUNC, COLUMN) pairs, an unknown
    function, a missing or repeated column, a column that is also a key."""
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
        if len(fields) == 1:
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
