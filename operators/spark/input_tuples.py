"""A state partition's input rows as the engine's input tuples (`operators.spark.processor`).

The processor unpacks a micro-batch's packed frames into columns in input order
(`operators.spark.packing.unpack`); here they become `InputTuple`s: for one aggregate the value dict
{key field: key, value field: value[, time field: time]}, for several aggregates the JSON object of the
fields the operator reads (`operators.spark.topic_reader.TupleBatches`). A record the source could not read
(the cec-topic source's `cec_error`) becomes a tuple without a value, its reason and the record as read
(its dead letter's `raw`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from cec.exceptions import BadTupleError
from operators.base import InputTuple, Operator
from operators.spark.aggregate_spec import AggregateSpec

__all__ = ["input_tuples", "part_ids", "plain_value"]


def plain_value(value: Any) -> Any:
    """pandas hands nullable integer columns over as float64 with NaN; the operator expects None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if hasattr(value, "item"):  # numpy scalar -> Python scalar
        return value.item()
    return value


def _from_json(text: Any) -> Any:
    return None if text is None else json.loads(text)


def part_ids(operator: Operator, tuples: Sequence[InputTuple]) -> list[str | None]:
    """Each tuple's part id as the engine keys its windows (`Operator.key_of`); None for a tuple the
    operator refuses (its dead letter comes from the engine, with the operator's reason)."""
    key_of = operator.key_of
    out: list[str | None] = []
    for tup in tuples:
        key = None
        if tup.value is not None:
            try:
                key = key_of(tup.value)
            except BadTupleError:
                key = None
        out.append(key)
    return out


def input_tuples(
    spec: AggregateSpec, columns: dict[str, list[Any]], errors: Sequence[str | None]
) -> list[InputTuple]:
    """The partition's input tuples, in input order. A record the source could not read carries its
    reason, and the record as read in the value column (its dead letter's `raw`)."""
    js, os_, ks = columns["cec_j"], columns["cec_o"], columns["cec_key"]
    n = len(js)
    decode = _from_json if spec.json_values else plain_value
    raw_values = columns["cec_v"]
    times = [decode(t) for t in columns["cec_time"]] if spec.time else [None] * n
    key_field, value_name, time_field = spec.key, str(spec.value), spec.time
    several, plain = spec.several, not spec.json_values
    out: list[InputTuple] = []
    append = out.append
    for j, o, k, v, t, err in zip(js, os_, ks, raw_values, times, errors, strict=True):
        if err is not None:
            # As bytes: the text the source made of them (`raw_text`) is the dead letter's raw as is.
            append(InputTuple(j, o, None, err, v.encode() if isinstance(v, str) else None))
            continue
        # Several aggregates: the JSON object of the fields the operator reads (topic_reader's doc).
        if several:
            value: dict[str, Any] = decode(v)
        elif plain and type(v) is float and v == v:  # `plain_value` of a float that is not NaN: itself
            value = {key_field: k, value_name: v}
        else:
            value = {key_field: k, value_name: decode(v)}
        if time_field:
            value[time_field] = t
        append(InputTuple(j, o, value))
    return out
