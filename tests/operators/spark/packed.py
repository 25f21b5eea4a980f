"""Input frames as the attached query hands them to its processor: tuples packed by the source's `Packer`
(several packed rows per call, in no particular order, as Spark's shuffle delivers them)."""

from __future__ import annotations

import pandas as pd
from pyspark.sql.types import DoubleType

from operators.spark.packing import Packer, PackSpec, packed_schema


def packed_frames(
    tuples: list[tuple[int, int, str, float]], *, with_qs: bool = False, chunk: int = 7
) -> list[pd.DataFrame]:
    """(j, o, key, value) tuples of one generation of one output partition, packed `chunk` tuples at a
    time, the last chunk first; `with_qs`: with the per-tuple partitions column the query only adds
    across generations."""
    schema = packed_schema(DoubleType(), None, errors=False, generations=2 if with_qs else 1)
    packer = Packer(PackSpec((1,), "k", "v"), schema)
    frames = []
    for start in range(0, len(tuples), chunk):
        part = tuples[start : start + chunk]
        for j in sorted({t[0] for t in part}):  # a source chunk is of one input partition
            mine = [t for t in part if t[0] == j]
            batch = packer.pack(j, [t[1] for t in mine], [t[2] for t in mine], [t[3] for t in mine])
            frames.append(batch.to_pandas())
    return frames[::-1]
