"""What an executor write task tells the driver (`operators.spark.writer`): per micro-batch and output
partition one "end" row (`PartitionWrite`: the new cursor, the messages found and written, counts per
record kind, the first dead letter's reason, trimming) and the state partition's "ctrl" rows (its
checkpoint controls and extent figures, JSON in `key`). No record, state or payload is in them.

The rows have one layout, declared twice because both sides need it: as a Spark schema (the result of
`mapInArrow`, on the driver) and as an Arrow schema (the batches the task yields); `summary_rows` writes
them and `read_summary` reads an "end" row back, so the columns are named in this module only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cec.records import Kind
from operators.spark.trim import PartitionTrim

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = [
    "SUMMARY_KINDS",
    "PartitionCursor",
    "PartitionWrite",
    "arrow_summary_schema",
    "control_rows",
    "read_summary",
    "summary_rows",
    "summary_schema",
]

SUMMARY_KINDS = (Kind.R.value, Kind.GOPEN.value, Kind.GCHECK.value, Kind.DEAD.value)  # `kinds`' order


@dataclass(frozen=True)
class PartitionCursor:
    """Where one output log stands after the last completed micro-batch: the stamping state the next
    batch continues from, and the offset its records start at (the log end, transaction markers included)."""

    pos: tuple[int, ...]
    n: int
    time: int
    next_offset: int


@dataclass
class PartitionWrite:
    """What one task did to its partition (the driver's whole view of the batch)."""

    q: int
    cursor: PartitionCursor
    found: int  # messages of this batch already in the log (an earlier attempt's)
    written: int  # messages this attempt appended
    kinds: Counter[str]
    reused: bool = False  # appended through this worker's kept writer (no init_transactions, no read)
    dead_reason: str | None = None  # the first dead letter's reason (`operators.spark.dead_letters`)
    trim: PartitionTrim | None = None  # where the partition's trimming stands after this task
    trimmed: int = 0  # offsets this task trimmed from the head of the log


def summary_schema() -> StructType:
    """The rows' layout for Spark (`mapInArrow`'s result schema)."""
    from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

    longs = ArrayType(LongType(), False)
    return StructType(
        [
            StructField("q", LongType(), False),
            # "end": the partition's summary; "ctrl": a control row of its state partition (JSON in key)
            StructField("entry", StringType(), False),
            StructField("pos", longs, True),  # end: the cursor's pos
            StructField("n", LongType(), True),
            StructField("time", LongType(), True),
            StructField("next_offset", LongType(), True),
            StructField("found", LongType(), True),
            StructField("written", LongType(), True),
            StructField("reused", LongType(), True),  # 1: through the worker's kept writer
            StructField("kinds", ArrayType(LongType(), False), True),  # counts in SUMMARY_KINDS order
            StructField("key", StringType(), True),
            StructField("dead_reason", StringType(), True),  # end: the first dead letter's reason
            StructField("trim_looked", LongType(), True),  # end, trimming: `PartitionTrim`
            StructField("trim_covered", LongType(), True),
            StructField("trimmed", LongType(), True),  # end: offsets the task trimmed
        ]
    )


def arrow_summary_schema() -> pa.Schema:
    """The rows' layout for Arrow (the record batches a write task yields)."""
    import pyarrow as pa

    longs = pa.list_(pa.field("element", pa.int64(), nullable=False))
    return pa.schema(
        [
            pa.field("q", pa.int64(), nullable=False),
            pa.field("entry", pa.string(), nullable=False),
            pa.field("pos", longs),
            pa.field("n", pa.int64()),
            pa.field("time", pa.int64()),
            pa.field("next_offset", pa.int64()),
            pa.field("found", pa.int64()),
            pa.field("written", pa.int64()),
            pa.field("reused", pa.int64()),
            pa.field("kinds", longs),
            pa.field("key", pa.string()),
            pa.field("dead_reason", pa.string()),
            pa.field("trim_looked", pa.int64()),
            pa.field("trim_covered", pa.int64()),
            pa.field("trimmed", pa.int64()),
        ]
    )


def control_rows(q: int, reports: Sequence[bytes]) -> list[dict[str, Any]]:
    """The state partition's control rows (its reports, as the processor wrote them)."""
    return [{"q": q, "entry": "ctrl", "key": r.decode(), "dead_reason": None} for r in reports]


def summary_rows(done: PartitionWrite, controls: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The "end" row of what the task did, then its state partition's control rows."""
    c = done.cursor
    t = done.trim
    out: list[dict[str, Any]] = [
        {
            "q": done.q,
            "entry": "end",
            "pos": list(c.pos),
            "n": c.n,
            "time": c.time,
            "next_offset": c.next_offset,
            "found": done.found,
            "written": done.written,
            "reused": int(done.reused),
            "kinds": [done.kinds[k] for k in SUMMARY_KINDS],
            "key": None,
            "dead_reason": done.dead_reason,
            "trim_looked": None if t is None else t.looked,
            "trim_covered": None if t is None else t.covered,
            "trimmed": done.trimmed,
        }
    ]
    out.extend(controls)
    return out


def read_summary(row: Mapping[str, Any]) -> PartitionWrite:
    """An "end" row read back on the driver (`summary_rows`' inverse)."""
    trim = None
    if row["trim_looked"] is not None:
        trim = PartitionTrim(row["trim_looked"], row["trim_covered"])
    return PartitionWrite(
        row["q"],
        PartitionCursor(tuple(row["pos"]), row["n"], row["time"], row["next_offset"]),
        row["found"],
        row["written"],
        Counter(dict(zip(SUMMARY_KINDS, row["kinds"], strict=True))),
        bool(row["reused"]),
        row["dead_reason"],
        trim,
        row["trimmed"],
    )
