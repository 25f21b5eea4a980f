"""The attached query's input rows, packed into a few rows of arrays on their way to the processor.

Why: transformWithStateInPandas hands a group's rows to Python one row at a time (PySpark turns each Arrow
batch into pandas, walks it with `itertuples` and builds a new DataFrame from the tuples), and Spark's
shuffle has a cost per row. The attached query has one group per state partition (`partition_groups`),
so its input can travel as a few rows of arrays instead: `RowPacker`, a `mapInArrow` step right after the
source, turns each Arrow batch into one row per grouping value whose other columns are arrays (vectorised:
no Python code runs per input row), and the processor flattens them back (`unpack`), in input order.
Measured in benchmarks/RESULTS.md ("Packed input rows").
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import ArrayType, LongType, StructField, StructType

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

__all__ = ["RowPacker", "packed_schema", "unpack"]


def packed_schema(schema: StructType, group: str) -> StructType:
    """`schema` packed: `group` (a long) first, every other column as an array of its values."""
    fields = [StructField(group, LongType(), False)]
    fields += [
        StructField(f.name, ArrayType(f.dataType, f.nullable), False)
        for f in schema.fields
        if f.name != group
    ]
    return StructType(fields)


class RowPacker:
    """The `mapInArrow` function that packs rows (module doc); picklable, shipped to the executors."""

    def __init__(self, schema: StructType, group: str) -> None:
        self.group = group
        self.names = [f.name for f in schema.fields if f.name != group]
        self.packed_json = packed_schema(schema, group).json()

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark.sql.pandas.types import to_arrow_schema

        out_schema = to_arrow_schema(StructType.fromJson(_loads(self.packed_json)))
        for batch in batches:
            if batch.num_rows:
                yield self.pack(batch, out_schema)

    def pack(self, batch: pa.RecordBatch, out_schema: pa.Schema) -> pa.RecordBatch:
        """One row per grouping value of `batch`, its rows' values as arrays in their order in `batch`."""
        import pyarrow as pa
        import pyarrow.compute as pc

        groups = batch.column(self.group)
        order = pc.sort_indices(groups)  # stable: a group's rows keep their order
        ordered = batch.take(order)
        runs = pc.value_counts(ordered.column(self.group))  # in order of first appearance: sorted here
        counts = runs.field("counts").to_pylist()
        offsets = [0]
        for count in counts:
            offsets.append(offsets[-1] + count)
        bounds = pa.array(offsets, type=pa.int32())
        columns: list[pa.Array] = [runs.field("values").cast(pa.int64())]
        for name, field in zip(self.names, list(out_schema)[1:], strict=True):
            values = ordered.column(name).cast(field.type.value_type)
            columns.append(pa.ListArray.from_arrays(bounds, values, type=field.type))
        return pa.RecordBatch.from_arrays(columns, schema=out_schema)


def _loads(text: str) -> dict[str, Any]:
    import json

    loaded: dict[str, Any] = json.loads(text)
    return loaded


def unpack(frames: Sequence[pd.DataFrame], columns: Sequence[str]) -> dict[str, list[Any]]:
    """The rows of packed `frames` (pandas, as transformWithStateInPandas hands them over), per column as a
    list of plain Python values, ordered by input position (cec_j, cec_o): Spark orders neither a group's
    packed rows nor the batches they came from."""
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

    if isinstance(cell, np.ndarray):
        return cell
    out = np.empty(len(cell), dtype=object)
    for i, value in enumerate(cell):
        out[i] = value
    return out
