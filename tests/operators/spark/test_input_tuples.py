"""A state partition's input rows as the engine's tuples (`operators/spark/input_tuples.py`).

A batch of rows gives the tuples its rows give one by one, for any values: pandas' floats (NaN for a
missing value), numpy scalars, None, JSON text of the cec-topic source, and records the source could not
read (their reason, and the record as read for the dead letter's `raw`).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.base import InputTuple
from operators.spark.aggregate_spec import AggregateSpec
from operators.spark.input_tuples import input_tuples, part_ids, plain_value

PLAIN = AggregateSpec("item", "price", "avg", 10, None, None)
TIMED = AggregateSpec("item", "price", "avg", None, 60_000, "ts")
TOPIC = AggregateSpec("item", "price", "avg", 10, None, None, json_values=True)

PLAIN_VALUE = (
    st.none()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(-(1 << 60), 1 << 60)
    | st.floats(allow_nan=True).map(np.float64)
    | st.integers(-(1 << 60), 1 << 60).map(np.int64)
)
JSON_VALUE = (
    st.none() | st.floats(allow_nan=False, allow_infinity=False) | st.integers() | st.text(max_size=5)
)


def _columns(values: list[Any], times: list[Any] | None = None) -> dict[str, list[Any]]:
    n = len(values)
    columns = {
        "cec_j": [i % 2 for i in range(n)],
        "cec_o": list(range(n)),
        "cec_key": [f"k{i % 3}" for i in range(n)],
        "cec_v": values,
    }
    if times is not None:
        columns["cec_time"] = times
    return columns


def _one_by_one(
    spec: AggregateSpec, columns: dict[str, list[Any]], errors: list[str | None]
) -> list[InputTuple]:
    out: list[InputTuple] = []
    for i in range(len(columns["cec_j"])):
        out += input_tuples(spec, {name: [column[i]] for name, column in columns.items()}, [errors[i]])
    return out


def _same(a: list[InputTuple], b: list[InputTuple]) -> bool:
    # NaN never equals itself: compare the JSON-ish text of each tuple, NaN spelled out.
    return repr(a) == repr(b)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(PLAIN_VALUE, PLAIN_VALUE), max_size=20))
def test_a_batch_gives_the_tuples_of_its_rows_one_by_one(rows: list[tuple[Any, Any]]) -> None:
    for spec, times in ((PLAIN, None), (TIMED, [t for _, t in rows])):
        columns = _columns([v for v, _ in rows], times)
        errors: list[str | None] = [None] * len(rows)
        batch = input_tuples(spec, columns, errors)
        assert _same(batch, _one_by_one(spec, columns, errors))
        for tup, (v, t) in zip(batch, rows, strict=True):
            assert tup.value is not None
            value = tup.value["price"]
            expected = plain_value(v)
            assert type(value) is type(expected)
            assert value == expected  # NaN (pandas' missing value) is None for the operator
            if isinstance(v, float) and math.isnan(v):
                assert value is None
            if spec is TIMED:
                assert tup.value["ts"] == plain_value(t)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(JSON_VALUE, st.none() | st.text(max_size=10)), max_size=20))
def test_topic_rows_and_unreadable_records(rows: list[tuple[Any, str | None]]) -> None:
    # One aggregate from the cec-topic source: the value column is the value's JSON text.
    values = [json.dumps(v) if err is None else f"raw {v}" for v, err in rows]
    columns = _columns(values)
    errors = [err for _, err in rows]
    batch = input_tuples(TOPIC, columns, errors)
    assert _same(batch, _one_by_one(TOPIC, columns, errors))
    for tup, (v, err), text in zip(batch, rows, values, strict=True):
        if err is not None:
            assert tup.value is None and tup.error == err and tup.raw == text.encode()
        else:
            assert tup.value == {"item": tup.value["item"], "price": v} and tup.value["item"].startswith("k")


def test_part_ids_are_the_operators_keys_and_none_for_a_refused_tuple() -> None:
    spec = AggregateSpec(
        "item", None, "count", 10, None, None, key_fields=("item", "shop"), aggs=(("count", "*"),)
    )
    tuples = [
        InputTuple(0, 0, {"item": "a", "shop": "x"}),
        InputTuple(0, 1, None, "unreadable"),
        InputTuple(0, 2, {"item": "a", "shop": b"\xff"}),  # bytes that are not UTF-8: the operator refuses it
    ]
    ids = part_ids(spec.build(), tuples)
    assert ids[0] is not None and json.loads(ids[0]) == ["a", "x"]
    assert ids[1:] == [None, None]
