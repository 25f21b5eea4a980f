"""Input frames as the attached query hands them to its processor: rows packed by `RowPacker` (several
packed rows per call, in no particular order, as Spark's shuffle delivers them)."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import ArrayType, DoubleType, LongType, StringType, StructField, StructType

from operators.spark.packing import RowPacker, packed_schema
from operators.spark.processor import GROUP_COLUMN, QS_COLUMN

_FLAT = StructType(
    [
        StructField("cec_j", LongType(), False),
        StructField("cec_o", LongType(), True),
        StructField("cec_key", StringType(), True),
        StructField("cec_v", DoubleType(), True),
        StructField(QS_COLUMN, ArrayType(LongType(), True), True),
        StructField(GROUP_COLUMN, LongType(), True),
    ]
)


def packed_frames(
    tuples: list[tuple[int, int, str, float]], *, with_qs: bool = True, chunk: int = 7
) -> list[pd.DataFrame]:
    """(j, o, key, value) tuples of one group, packed `chunk` rows at a time; last chunk first."""
    schema = _FLAT if with_qs else StructType([f for f in _FLAT.fields if f.name != QS_COLUMN])
    packer = RowPacker(schema, GROUP_COLUMN)
    out_schema = to_arrow_schema(packed_schema(schema, GROUP_COLUMN))
    frames = []
    for start in range(0, len(tuples), chunk):
        part = tuples[start : start + chunk]
        columns = {
            "cec_j": [t[0] for t in part],
            "cec_o": [t[1] for t in part],
            "cec_key": [t[2] for t in part],
            "cec_v": [t[3] for t in part],
        }
        if with_qs:
            columns[QS_COLUMN] = [[0] for _ in part]
        columns[GROUP_COLUMN] = [0] * len(part)
        batch = pa.RecordBatch.from_pydict(columns, schema=to_arrow_schema(schema))
        frames.append(packer.pack(batch, out_schema).to_pandas())
    return frames[::-1]
