"""The attached query's input, packed by its source into a few rows of arrays per state partition.

Why: transformWithStateInPandas hands a group's rows to Python one row at a time (PySpark turns each Arrow
batch into pandas, walks it with `itertuples` and builds a new DataFrame from the tuples), and Spark costs
per row between the source and the processor (Arrow to rows, the key projection, the shuffle). The
attached query has one group per state partition (`partitioning.partition_groups`), so its input travels
as a few rows of arrays instead: the data source ("cec-kafka" or "cec-topic", given the `cec.pack`
option) computes each tuple's key in the aggregate's canonical form (`operators.aggregate.canonical_key`)
and its state partition (`partitioning.KeyGrouper`, Spark's own hash computed in Python), and emits per
chunk it reads one row per state partition whose other columns are arrays (`Packer`); the processor
flattens them back in input order (`unpack`). Only the columns the aggregate needs are built.
Measured in benchmarks/RESULTS.md ("Packed input").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import ArrayType, DataType, LongType, StringType, StructField, StructType

from cec.exceptions import BadTupleError, ConfigError
from operators.aggregate import canonical_key
from operators.spark.partitioning import KeyGrouper

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

__all__ = ["PACK_OPTION", "PackSpec", "Packer", "kept_packer", "packed_schema", "unpack"]

# The data source option that asks for packed rows (JSON of `PackSpec`).
PACK_OPTION = "cec.pack"
GROUP_COLUMN = "cec_group"
QS_COLUMN = "cec_qs"


@dataclass(frozen=True)
class PackSpec:
    """What the attached query asks its source to pack: the output partitions of every generation (the
    current one last) and which fields are the key, value and time (a CEC-format input reads its payload's
    fields by these names; every format names the key by it in dead letters)."""

    partitions: tuple[int, ...]
    key: str | None = None
    value: str | None = None
    time: str | None = None

    def to_option(self) -> str:
        return json.dumps(
            {"partitions": list(self.partitions), "key": self.key, "value": self.value, "time": self.time}
        )

    @classmethod
    def from_option(cls, text: str) -> PackSpec:
        try:
            raw = json.loads(text)
            partitions = tuple(int(p) for p in raw["partitions"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"option {PACK_OPTION} must be the JSON of a PackSpec, got {text!r}") from exc
        if not partitions or min(partitions) < 1:
            raise ConfigError(f"option {PACK_OPTION}: partitions must be >= 1, got {list(partitions)}")
        return cls(partitions, raw.get("key"), raw.get("value"), raw.get("time"))


def packed_schema(
    value_type: DataType, time_type: DataType | None, *, errors: bool, generations: int
) -> StructType:
    """The packed rows' schema: the grouping value, then per tuple its input position (cec_j, cec_o), key,
    value, time (if the aggregate has one), dead-letter reason (formats that decode in the source) and,
    across generations, its output partition in each (cec_qs)."""
    fields = [
        StructField(GROUP_COLUMN, LongType(), False),
        StructField("cec_j", ArrayType(LongType(), False), False),
        StructField("cec_o", ArrayType(LongType(), False), False),
        StructField("cec_key", ArrayType(StringType(), True), False),
        StructField("cec_v", ArrayType(value_type, True), False),
    ]
    if time_type is not None:
        fields.append(StructField("cec_time", ArrayType(time_type, True), False))
    if errors:
        fields.append(StructField("cec_error", ArrayType(StringType(), True), False))
    if generations > 1:
        fields.append(StructField(QS_COLUMN, ArrayType(ArrayType(LongType(), False), False), False))
    return StructType(fields)


class Packer:
    """Packs the tuples a source read from one chunk of one input partition (module doc). Lives in one
    executor process; remembers up to `remember` keys it has seen (raw value -> canonical key, group,
    partitions): Spark's hash in Python costs microseconds per key."""

    remember = 1 << 18

    def __init__(self, spec: PackSpec, schema: StructType) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.spec = spec
        self.arrow_schema = to_arrow_schema(schema)
        names = schema.fieldNames()
        self.has_time = "cec_time" in names
        self.has_errors = "cec_error" in names
        self.has_qs = QS_COLUMN in names
        self.field = spec.key or "key"
        self.grouper = KeyGrouper(spec.partitions)
        self._known: dict[Any, tuple[str | None, int, list[int], str | None]] = {}

    def _learn(self, raw: Any) -> tuple[str | None, int, list[int], str | None]:
        """(canonical key, group, output partitions, dead-letter reason) of a raw key value not known yet,
        remembered under (type, value): True == 1, but their keys differ."""
        try:
            key, error = canonical_key(raw, self.field), None
        except BadTupleError as exc:
            if not self.has_errors:
                raise
            key, error = None, exc.reason
        group, qs = self.grouper(key)
        if len(self._known) >= self.remember:
            self._known.clear()
        known = self._known[(type(raw), raw)] = (key, group, qs, error)
        return known

    def pack(
        self,
        partition: int,
        offsets: Sequence[int],
        raw_keys: Sequence[Any],
        values: Sequence[Any],
        times: Sequence[Any] | None = None,
        errors: Sequence[str | None] | None = None,
    ) -> pa.RecordBatch:
        """One row per state partition met among these tuples (in input order within each)."""
        import pyarrow as pa

        known = self._known
        members: dict[int, list[int]] = {}
        keys: list[str | None] = []
        qs_column: list[list[int]] = []
        reasons: list[str | None] = list(errors) if errors is not None else [None] * len(offsets)
        for i, raw in enumerate(raw_keys):
            key, group, qs, error = known.get((type(raw), raw)) or self._learn(raw)
            if error is not None and reasons[i] is None:
                reasons[i] = error
            keys.append(key)
            qs_column.append(qs)
            rows = members.get(group)
            if rows is None:
                members[group] = [i]
            else:
                rows.append(i)
        groups = sorted(members)
        order: list[int] = []
        bounds = [0]
        for group in groups:
            order.extend(members[group])
            bounds.append(len(order))
        take = pa.array(order, type=pa.int64())
        flat: list[Sequence[Any]] = [[partition] * len(offsets), offsets, keys, values]
        if self.has_time:
            flat.append(times if times is not None else [None] * len(offsets))
        if self.has_errors:
            flat.append(reasons)
        if self.has_qs:
            flat.append(qs_column)
        offsets_array = pa.array(bounds, type=pa.int32())
        columns: list[pa.Array] = [pa.array(groups, type=pa.int64())]
        for values_of, field in zip(flat, list(self.arrow_schema)[1:], strict=True):
            column = pa.array(values_of, type=field.type.value_type).take(take)
            columns.append(pa.ListArray.from_arrays(offsets_array, column, type=field.type))
        return pa.RecordBatch.from_arrays(columns, schema=self.arrow_schema)


# Packers kept in this (reused) Python worker: each remembers the keys it has hashed.
_PACKERS: dict[tuple[str, str], Packer] = {}


def kept_packer(spec: PackSpec, schema: StructType) -> Packer:
    """This worker's packer for `spec` and `schema` (a new one the first time)."""
    key = (spec.to_option(), schema.json())
    packer = _PACKERS.get(key)
    if packer is None:
        if len(_PACKERS) >= 8:
            _PACKERS.clear()
        packer = _PACKERS[key] = Packer(spec, schema)
    return packer


def unpack(frames: Sequence[pd.DataFrame], columns: Sequence[str]) -> dict[str, list[Any]]:
    """The tuples of packed `frames` (pandas, as transformWithStateInPandas hands them over), per column as
    a list of plain Python values, ordered by input position (cec_j, cec_o): Spark orders neither a
    group's packed rows nor the chunks they came from."""
    import numpy as np

    flat: dict[str, Any] = {}
    for name in ("cec_j", "cec_o", *columns):
        if name in flat:
            continue
        cells = [cell for frame in frames for cell in frame[name].tolist()]
        flat[name] = np.concatenate([_array(cell) for cell in cells]) if cells else np.empty(0)
    order = np.lexsort((flat["cec_o"], flat["cec_j"]))
    return {name: values[order].tolist() for name, values in flat.items()}


def _array(cell: Any) -> Any:
    """One packed cell as a 1-d numpy array (an array of arrays stays an object array of them)."""
    import numpy as np

    if isinstance(cell, np.ndarray) and cell.ndim == 1:
        return cell
    out = np.empty(len(cell), dtype=object)
    for i, value in enumerate(cell):
        out[i] = value
    return out
