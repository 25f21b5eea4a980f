"""Recovery planning of the attached aggregation on the executors (operators.spark.planning), on a real
broker and real local Spark:

1. a restart plans on the executors: the driver collects per output partition one summary plus each loaded
   window's key and footprint pos, never a window's state, and builds no DataFrame from Python rows; the
   initial state the executors produced is exactly what the recovery owner (`recovery.eventual`) finds in
   each log, plus the next window seq from the closed-window directory; the restart writes nothing twice;
2. the merge across generations (a restart with another partition count) keeps per key the open window
   with the highest seq (the later generation's on a tie) unless that window closed in a later generation.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.sql import functions as F

from operators.spark.attach import cec_aggregate
from operators.spark.planning import _merged
from operators.spark.processor import INIT_SCHEMA
from queuestore.index import StreamIndex
from queuestore.kafka import KafkaQueueStore
from recovery.eventual import EventualCheckpointBuilder
from tests.helpers.attached import run_to_end
from tests.operators.spark.test_attach import (  # the module's input topic (and its plain-Python truth)
    Purchases,
    _args,
    _kinds,
    _results,
    purchases,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["purchases"]  # the fixture re-used from test_attach


class DriverPulls:
    """What the driver pulls out of Spark: the columns of every collected frame, and the Python rows turned
    into DataFrames."""

    def __init__(self) -> None:
        self.collected: list[list[str]] = []
        self.created = 0

    def spy(self, monkeypatch: pytest.MonkeyPatch, spark: SparkSession) -> None:
        # The classes the session really uses (pyspark 4: pyspark.sql.classic.* override the public ones).
        frame, session = type(spark.range(0)), type(spark)

        def pulling(name: str) -> Callable[..., Any]:
            original = getattr(frame, name)

            def pull(df: Any, *args: Any, **kwargs: Any) -> Any:
                self.collected.append(list(df.columns))
                return original(df, *args, **kwargs)

            return pull

        for name in ("collect", "toArrow", "toPandas", "toLocalIterator", "take", "head", "first"):
            monkeypatch.setattr(frame, name, pulling(name))
        create = session.createDataFrame

        def created(spark: Any, *args: Any, **kwargs: Any) -> Any:
            self.created += 1
            return create(spark, *args, **kwargs)

        monkeypatch.setattr(session, "createDataFrame", created)


def _driver_side_plan(bootstrap: str, root: Path, topic: str, partitions: int) -> dict[str, tuple[Any, ...]]:
    """The initial state as the recovery owner gives it, read on the driver: per key (seq, open, state,
    pos_w) from each log's EC, else (last closed seq + 1, closed) from the rebuilt index."""
    out: dict[str, tuple[Any, ...]] = {}
    store = KafkaQueueStore(bootstrap, root)
    try:
        for q in range(partitions):
            with store.reader(topic, q) as reader:
                ec = EventualCheckpointBuilder(reader).build()
                with StreamIndex(root / f"index-{q}", identity=f"{topic}/{q}") as index:
                    index.reconcile(reader)
                    closed = dict(index.closed_windows())
            for key, fp in ec.windows.items():
                out[key] = (fp.record.seq, True, fp.record.state, list(fp.record.pos))
            for key, seq in closed.items():
                out.setdefault(key, (seq + 1, False, None, None))
    finally:
        store.close()
    return out


def test_a_restart_plans_on_the_executors_and_no_window_state_reaches_the_driver(
    spark: SparkSession,
    purchases: Purchases,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    output = f"avg-plan-{uuid.uuid4().hex[:8]}"
    args = _args(purchases, tmp_path, output, partitions=2, resume_checkpoint=False)  # the planning path
    run_to_end(spark, args)  # to the end of the input: windows stay open (keys whose count is not a multiple)
    written = _kinds(purchases, tmp_path, output)

    pulls = DriverPulls()
    with monkeypatch.context() as patch:
        pulls.spy(patch, spark)
        query = cec_aggregate(spark, **args)
    try:
        rec = query.recovery
        assert rec.resumed and rec.ec_windows > 0 and rec.closed_keys > 0
        # The driver built no DataFrame from rows, and what it collected carried no state.
        assert pulls.created == 0
        assert pulls.collected and not any("state" in columns for columns in pulls.collected), pulls.collected
        assert rec.driver_rows == 2  # a summary per partition: no window's key or pos

        # The executors' initial state is the recovery owner's EC and closed-window directory.
        assert rec.initial is not None
        got = {
            r["cec_key"]: (r["seq"], r["open"], r["state"], r["pos_w"])
            for r in rec.initial.collect()  # the test's own look; the query never collects it
        }
        want = _driver_side_plan(purchases.bootstrap, tmp_path / "probe-plan", output, 2)
        assert got == want
        assert sum(1 for v in want.values() if v[1]) == rec.ec_windows
        # The extent figures per output partition: its windows and their lowest footprint pos.
        q_of = dict(
            spark.createDataFrame([(k,) for k in want], "k string")
            .select("k", F.pmod(F.hash("k"), F.lit(2)))
            .collect()
        )
        loaded: dict[int, list[tuple[int, ...]]] = {0: [], 1: []}
        for k, v in want.items():
            if v[1]:
                loaded[q_of[k]].append(tuple(v[3]))
        assert rec.partition_windows == [
            (len(p), tuple(min(c) for c in zip(*p, strict=True)) if p else None) for p in loaded.values()
        ]
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None
    assert _results(spark, purchases, output) == purchases.truth
    assert _kinds(purchases, tmp_path, output) == written  # the restart at the end writes nothing


@pytest.fixture
def init_rows(spark: SparkSession) -> Iterator[Callable[[list[tuple[Any, ...]]], dict[str, tuple[Any, ...]]]]:
    """Merge planning rows (key, seq, open, state, generation, pos_w) as the executors' merge does."""

    def merge(rows: list[tuple[Any, ...]]) -> dict[str, tuple[Any, ...]]:
        full = [(k, s, o, st, g if o else -1, p, False, p, -1, -1, -1, -1, None)
                for (k, s, o, st, g, p) in rows]  # fmt: skip
        merged = _merged(spark.createDataFrame(full, INIT_SCHEMA)).collect()
        return {r["cec_key"]: (r["seq"], r["open"], r["state"], r["fp_gen"], r["pos_w"]) for r in merged}

    yield merge


def test_the_merge_across_generations_keeps_each_keys_latest_open_window(
    init_rows: Callable[[list[tuple[Any, ...]]], dict[str, tuple[Any, ...]]],
) -> None:
    merged = init_rows(
        [
            ("a", 3, True, b"a3", 0, [5, 1]),  # open in generation 0 ...
            ("a", 4, False, None, 1, None),  # ... closed in generation 1 (next seq 4): not loaded
            ("b", 2, True, b"b-old", 0, [4, 0]),  # one window, footprints in both: the later one wins
            ("b", 2, True, b"b-new", 1, [9, 2]),
            ("c", 5, True, b"c5", 0, [7, 3]),  # an older window of c closed later elsewhere: c5 stays
            ("c", 3, False, None, 1, None),
            ("d", 1, True, b"d1", 1, [1, 1]),  # the higher seq wins across generations
            ("d", 0, True, b"d0", 0, [0, 0]),
            ("e", 8, False, None, 0, None),  # closed only: the next seq
            ("e", 6, False, None, 1, None),
        ]
    )
    assert merged == {
        "a": (4, False, None, -1, None),
        "b": (2, True, b"b-new", 1, [9, 2]),
        "c": (5, True, b"c5", 0, [7, 3]),
        "d": (1, True, b"d1", 1, [1, 1]),
        "e": (8, False, None, -1, None),
    }
