"""`cec run`'s aggregate flags as an operator spec (operators.aggregate_flags)."""

from __future__ import annotations

import pytest

from cec.exceptions import ConfigError
from operators.aggregate import RESULT_SCHEMA, KeyedAggregate
from operators.aggregate_flags import aggregate_flags, result_layout, value_columns
from operators.job import aggregate_operator, build_operator
from operators.multi_aggregate import MultiAggregate
from operators.sinks import result_formats


def _spec(key: str, value: str | None, aggs: list[str] | None) -> dict[str, object]:
    return aggregate_operator(**aggregate_flags(key, value, aggs), window_count=5)


def test_one_key_and_one_plain_agg_keep_the_single_aggregate_spec_as_it_was() -> None:
    spec = _spec("item", "price", None)
    assert spec == {
        "type": "aggregate", "key_field": "item", "value_field": "price", "agg": "avg",
        "window_count": 5, "window_ms": None, "time_field": None,
    }  # fmt: skip
    assert isinstance(build_operator(spec), KeyedAggregate)
    schema, columns, _ = result_layout(spec, result_formats(spec))
    assert schema == RESULT_SCHEMA and columns == ["key", "window", "value", "count", "start", "end"]


def test_a_composite_key_and_several_aggs_give_one_column_each() -> None:
    spec = _spec("carrier, origin", None, ["avg:arr_delay", "max:dep_delay", "count:*"])
    operator = build_operator(spec)
    assert isinstance(operator, MultiAggregate)
    schema, columns, formats = result_layout(spec, result_formats(spec))
    assert schema == operator.result_schema
    assert columns == [
        "carrier",
        "origin",
        "window",
        "avg_arr_delay",
        "max_dep_delay",
        "count",
        "start",
        "end",
    ]
    assert formats["avg_arr_delay"](None) == ""  # SQL null: an empty field
    assert formats["avg_arr_delay"](1.5) == "1.5"
    assert value_columns(spec) == ["arr_delay", "dep_delay"]


def test_agg_without_a_column_takes_value() -> None:
    spec = _spec("k", "v", ["sum", "max:w"])
    assert spec["aggs"] == [["sum", "v"], ["max", "w"]]


@pytest.mark.parametrize(
    ("key", "value", "aggs", "message"),
    [
        ("a,,b", "v", None, "empty column name"),
        ("a,a", "v", None, "names a column twice"),
        ("k", None, ["avg"], "required: --value"),
        ("k", "v", ["median"], "invalid choice: 'median'"),
        ("k", "v", ["avg:v", "avg:v"], "given twice"),
        ("k,j", "v", ["avg:j"], "is a --key column"),
    ],
)
def test_bad_flags_are_one_line(key: str, value: str | None, aggs: list[str] | None, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        aggregate_flags(key, value, aggs)
    assert "\n" not in str(info.value)
