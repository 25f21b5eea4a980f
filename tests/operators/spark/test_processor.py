"""`operators.spark.processor`: the attached operator keeps a state partition's keys in one state value.

1. Driven directly (no JVM: a recording stand-in for Spark's StatefulProcessorHandle), one call per state
   partition and micro-batch makes exactly one state read and one state write however many keys it
   touches, and its records over two micro-batches are the windows a plain per-key count-window average
   gives (the second micro-batch continues the windows the first one left open).
2. The grouping values `partition_groups` chooses land on the intended state partition under Spark's own
   shuffle hash (`pmod(hash(g), P)`), and `spark_hash_long` is Spark's `hash()` of a long.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest

from cec.records import AvroCodec, Kind
from operators.aggregate import RESULT_SCHEMA
from operators.spark.processor import (
    EMIT_COLUMNS,
    AggregateSpec,
    CecAggregateProcessor,
    partition_groups,
    spark_hash_long,
)
from tests.operators.spark.packed import packed_frames

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

WINDOW = 3


class _RecordingValueState:
    def __init__(self) -> None:
        self.value: tuple[Any, ...] | None = None
        self.calls: list[str] = []

    def exists(self) -> bool:
        self.calls.append("exists")
        return self.value is not None

    def get(self) -> tuple[Any, ...] | None:
        self.calls.append("get")
        return self.value

    def update(self, value: tuple[Any, ...]) -> None:
        self.calls.append("update")
        self.value = value


class _RecordingHandle:
    def __init__(self) -> None:
        self.states: dict[str, _RecordingValueState] = {}

    def getValueState(self, name: str, schema: Any) -> _RecordingValueState:
        return self.states.setdefault(name, _RecordingValueState())


class _Timers:
    def getCurrentProcessingTimeInMs(self) -> int:
        return 0


def _reference(tuples: list[tuple[int, int, str, float]]) -> dict[tuple[str, int], float]:
    per_key: dict[str, list[float]] = defaultdict(list)
    for _, _, key, value in sorted(tuples):
        per_key[key].append(value)
    return {
        (key, w): sum(values[w * WINDOW : (w + 1) * WINDOW]) / WINDOW
        for key, values in per_key.items()
        for w in range(len(values) // WINDOW)
    }


def test_one_state_read_and_write_per_partition_and_batch_and_windows_continue() -> None:
    spec = AggregateSpec("item", "price", "avg", WINDOW, None, None)
    groups = partition_groups(1)
    processor = CecAggregateProcessor(spec, [[(0, 0)]], 0, None, groups)
    handle = _RecordingHandle()
    processor.init(handle)  # type: ignore[arg-type]
    keys = [f"k{i}" for i in range(200)]
    # Two input partitions, each key in one; 5 tuples per key, split 2 + 3 over the two micro-batches, and
    # handed over out of order (Spark does not order a group's rows).
    tuples = [(i % 2, 1000 * n + i, key, float(i * 7 + n)) for n in range(5) for i, key in enumerate(keys)]
    first = [t for t in tuples if t[1] < 2000]
    second = [t for t in tuples if t[1] >= 2000]
    state = handle.states["cec_partition"]
    out: list[pd.DataFrame] = []
    for batch in (first, second):
        state.calls.clear()
        frames = packed_frames(batch[::-1])
        out.extend(processor.handleInputRows((groups[0],), iter(frames), _Timers()))  # type: ignore[arg-type]
        assert state.calls == ["get", "update"], state.calls
    records = pd.concat(out, ignore_index=True)
    assert list(records.columns) == EMIT_COLUMNS
    codec = AvroCodec(RESULT_SCHEMA)
    results = {
        (r["key"], r["window"]): r["value"]
        for r in (codec.decode(bytes(p)) for p in records[records["cec_kind"] == Kind.R.value]["cec_payload"])
    }
    assert results == pytest.approx(_reference(tuples))
    # Every key opened two windows (one closed after 3 tuples, one still open after 2): two G-opens each.
    assert (records["cec_kind"] == Kind.GOPEN.value).sum() == 2 * len(keys)
    # Per key the records follow its input order.
    for _, rows in records.groupby("cec_key"):
        positions = list(zip(rows["cec_j"], rows["cec_o"], rows["cec_i"], strict=True))
        assert positions == sorted(positions)


def test_spark_hash_long_is_sparks_hash() -> None:
    # Murmur3_x86_32.hashLong(v, 42), values computed by Spark 4.3's `hash(CAST(v AS BIGINT))`.
    assert [spark_hash_long(v) for v in (0, 1, -1)] == [-1670924195, -1712319331, -939490007]


def test_partition_groups_land_on_their_state_partition(spark: SparkSession) -> None:
    from pyspark.sql import functions as F

    for partitions in (1, 2, 3, 5, 8):
        groups = partition_groups(partitions)
        row = (
            spark.range(1)
            .select(*[F.pmod(F.hash(F.lit(g).cast("long")), F.lit(partitions)) for g in groups])
            .collect()[0]
        )
        assert list(row) == list(range(partitions)), (partitions, groups)
    values = [0, 1, -1, 123456789012, -987654321098, (1 << 40) + 7]
    hashed = spark.createDataFrame([(v,) for v in values], "v long").select("v", F.hash("v").alias("h"))
    assert {r["v"]: r["h"] for r in hashed.collect()} == {v: spark_hash_long(v) for v in values}


def test_one_generation_needs_no_per_row_partitions() -> None:
    """With one generation a key's crash point is its state partition's, so the query sends no per-row
    `cec_qs` column: a replay over a crash point gives the same records with and without it."""
    spec = AggregateSpec("item", "price", "avg", WINDOW, None, None)
    groups = partition_groups(1)
    tuples = [(i % 2, i // 2, f"k{i % 3}", float(i)) for i in range(24)]
    outputs = []
    for with_qs in (True, False):
        processor = CecAggregateProcessor(spec, [[(4, 6)]], 0, None, groups)  # crashed at o=4 / o=6
        processor.init(_RecordingHandle())  # type: ignore[arg-type]
        frames = packed_frames(tuples, with_qs=with_qs)
        out = pd.concat(list(processor.handleInputRows((groups[0],), iter(frames), _Timers())))  # type: ignore[arg-type]
        outputs.append(out[out["cec_kind"] != "CTRL"].reset_index(drop=True))
    with_qs_rows, without_rows = outputs
    pd.testing.assert_frame_equal(with_qs_rows, without_rows)
    # Below the crash point nothing is emitted again (the log holds it); above it the windows go on.
    assert len(with_qs_rows) and (with_qs_rows["cec_o"] >= 4).all()
    assert ((with_qs_rows["cec_j"] == 1) & (with_qs_rows["cec_o"] < 6)).sum() == 0
