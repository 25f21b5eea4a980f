"""The rows an executor write task hands the driver (`operators.spark.write_summary`): what the task did to
its partition comes back as it was, through the Arrow batch the task yields, and the Spark schema the
driver reads them with has the Arrow schema's columns."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from operators.spark.trim import PartitionTrim
from operators.spark.write_summary import (
    SUMMARY_KINDS,
    PartitionCursor,
    PartitionWrite,
    arrow_summary_schema,
    control_rows,
    read_summary,
    summary_rows,
    summary_schema,
)


@pytest.mark.parametrize(
    "done",
    [
        PartitionWrite(
            1, PartitionCursor((4, 0, 9), 12, 1_700_000_000_000, 40), 3, 7, Counter({"R": 2, "GOPEN": 1, "DEAD": 1}),
            True, "late: window closed", PartitionTrim(30, 25), 11,
        ),
        PartitionWrite(0, PartitionCursor((0,), 0, 0, 0), 0, 0, Counter(), False, None, None, 0),
    ],
)  # fmt: skip
def test_an_end_row_reads_back_as_what_the_task_did(done: PartitionWrite) -> None:
    controls = control_rows(done.q, [b'{"open": 3}'])
    batch = pa.RecordBatch.from_pylist(summary_rows(done, controls), schema=arrow_summary_schema())
    end, ctrl = batch.to_pylist()
    back = read_summary(end)
    assert back == PartitionWrite(
        done.q, done.cursor, done.found, done.written, Counter({k: done.kinds[k] for k in SUMMARY_KINDS}),
        done.reused, done.dead_reason, done.trim, done.trimmed,
    )  # fmt: skip
    assert ctrl["entry"] == "ctrl" and ctrl["key"] == '{"open": 3}' and ctrl["q"] == done.q


def test_the_spark_and_arrow_layouts_are_one() -> None:
    assert to_arrow_schema(summary_schema()).names == arrow_summary_schema().names
    assert to_arrow_schema(summary_schema()).types == arrow_summary_schema().types
