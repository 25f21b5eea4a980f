"""Hopping and session windows in the attached query's processor, without a JVM: the processor driven
directly over three micro-batches of tuples packed by the topic source's own code makes the results the
engine makes over the same tuples in one local instance (the Spark host only adapts: one state value per
partition between calls, its windows loaded only when their key is met, a hopping part's panes and a
session's folded slices kept across calls); and `cec_aggregate`'s window keywords are read and checked
on the driver (`aggregate_form.window_form`)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from cec.exceptions import ConfigError
from cec.records import AvroCodec, Kind
from operators.base import InputTuple
from operators.hopping import HoppingAggregate, PaneRun
from operators.multi_state import ColumnState, MultiState
from operators.sessions import SessionAggregate
from operators.spark.aggregate_form import aggregate_form, window_form
from operators.spark.packing import PackSpec
from operators.spark.partitioning import partition_groups
from operators.spark.processor import AggregateSpec, CecAggregateProcessor
from operators.spark.stamping import log_order
from operators.spark.state_partition import PartitionState, flat_state, state_of
from operators.spark.topic_reader import TopicOptions, TupleBatches
from tests.helpers.engine_runs import engine_results
from tests.helpers.flight_queues import result_bits
from tests.operators.spark.test_processor import _RecordingHandle, _Timers

AGGS = (("avg", "arr_delay"), ("max", "dep_delay"), ("count", "*"))
KEY = ("carrier", "origin")


def _options() -> TopicOptions:
    return TopicOptions(
        topic="flights",
        bootstrap="unused:9092",
        fmt="json",
        key="carrier",
        value=None,
        time="ts",
        pack=PackSpec((1,), "carrier", None, "ts"),
        key_fields=KEY,
        value_fields=("arr_delay", "dep_delay"),
        key_array=True,
    )


def _tuples(count: int) -> list[InputTuple]:
    """Two input partitions, each carrier on one, event times rising per partition with gaps (sessions of
    a 25 ms gap break now and then); some values missing."""
    out = []
    t = [0, 0]
    for i in range(count):
        j = i % 2
        t[j] += 1 + (i * 7919) % 14
        value: dict[str, Any] = {
            "carrier": ["AA", "UA"][j],
            "origin": ["JFK", "SFO", "ORD"][i % 3],
            "ts": t[j],
        }
        if i % 5:
            value["arr_delay"] = i / 7
        if i % 4:
            value["dep_delay"] = i % 9
        out.append(InputTuple(j, i // 2, value))
    return out


def _spec(window: str, watermarks: bool) -> AggregateSpec:
    lateness = 0 if watermarks else None
    if window == "hopping":
        return AggregateSpec("carrier", None, "avg", None, 100, "ts", json_values=True, allowed_lateness=lateness,
                             key_fields=KEY, aggs=AGGS, slide=25)  # fmt: skip
    return AggregateSpec("carrier", None, "avg", None, None, "ts", json_values=True, allowed_lateness=lateness,
                         key_fields=KEY, aggs=AGGS, session_gap=25)  # fmt: skip


@pytest.mark.parametrize("watermarks", [False, True], ids=["per-key", "watermarks"])
@pytest.mark.parametrize("window", ["hopping", "session"])
def test_the_processor_over_micro_batches_makes_the_local_engines_results(
    window: str, watermarks: bool
) -> None:
    spec = _spec(window, watermarks)
    assert isinstance(spec.build(), HoppingAggregate if window == "hopping" else SessionAggregate)
    assert spec.several and spec.key_array and spec.by_window == (window == "hopping" or watermarks)
    groups = partition_groups(1)
    processor = CecAggregateProcessor(spec, [[(0, 0)]], 0, None, groups)
    handle = _RecordingHandle()
    processor.init(handle)  # type: ignore[arg-type]
    tuples = _tuples(600)
    batches = TupleBatches(_options())
    out: list[pd.DataFrame] = []
    for third in (tuples[:200], tuples[200:400], tuples[400:]):
        frames = [batches.of(j, [t for t in third if t.partition == j]).to_pandas() for j in (0, 1)]
        out.extend(processor.handleInputRows((groups[0],), iter(frames), _Timers()))  # type: ignore[arg-type]
    records = pd.concat(out, ignore_index=True)
    operator = spec.build()
    codec = AvroCodec(operator.result_schema)
    rs = records[records["cec_kind"] == Kind.R.value]["cec_payload"]
    got = result_bits([codec.decode(bytes(p)) for p in rs if p is not None])
    # The engine in one local instance, over the tuples in each micro-batch's order (per partition).
    ordered = [t for third in (tuples[:200], tuples[200:400], tuples[400:]) for j in (0, 1) for t in third
               if t.partition == j]  # fmt: skip
    want = result_bits(engine_results(spec.build(), ordered))
    assert len(want) > 40 and got == want
    if window == "session" and watermarks:
        assert any(p is None for p in rs)  # slices folded into a later one: an R without a result
        folds = records[(records["cec_kind"] == Kind.GCHECK.value)]
        assert len(folds) > 0  # the receiving slices' G-checks, made by tuples (no timer here)
    # In the log order both sinks write, no footprint of a window follows its R (a fold's G-check keeps
    # its place among its tuple's records: before the giving slice's R and the receiving slice's own).
    closed: set[tuple[str, int]] = set()
    for batch in out:  # each micro-batch's rows, as the sink orders them
        for row in log_order([tuple(r) for r in batch.itertuples(index=False)]):
            if row[4] == Kind.R.value and row[5] is not None:
                closed.add((row[5], row[6]))
            elif row[4] in (Kind.GOPEN.value, Kind.GCHECK.value):
                assert (row[5], row[6]) not in closed, row
    if window == "hopping":
        gopens = records[records["cec_kind"] == Kind.GOPEN.value]["cec_key"]
        assert len(gopens) == len(set(gopens))  # one G-open per (key, period): not one per window
    state = PartitionState.load(handle.states["cec_partition"].value)
    assert state.open_count() > 0


def test_a_hopping_parts_panes_survive_the_partitions_plain_form() -> None:
    panes = [MultiState(2, p, p + 3, [ColumnState(1, 5 << 64, 1.5, 1.5)]) for p in (0, 25, 75)]
    assert state_of(flat_state(PaneRun(panes))) == PaneRun(panes)


def test_window_keywords_are_read_into_ms() -> None:
    hop = window_form(window_count=None, window_time="1h", slide="15m", session_gap=None, time="ts")
    assert (hop.window_ms, hop.slide_ms, hop.session_gap_ms, hop.several) == (3_600_000, 900_000, None, True)
    session = window_form(window_count=None, window_time=None, slide=None, session_gap=1800, time="ts")
    assert (session.session_gap_ms, session.several) == (1800, True)
    tumbling = window_form(window_count=10, window_time=None, slide=None, session_gap=None, time=None)
    assert not tumbling.several
    one = aggregate_form("carrier", "arr_delay", "avg", several=True)
    assert (
        one.aggs == (("avg", "arr_delay"),)
        and one.several_keys is None
        and one.value_columns == ("arr_delay",)
    )


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"window_time": "15m", "slide": "1h"}, "slide (3600000 ms) is larger than window_time (900000 ms)"),
        ({"window_time": "1h", "slide": "7m"}, "must divide window_time"),
        ({"window_count": 5, "slide": "1m"}, "slide goes with window_time"),
        ({"slide": "1m"}, "slide needs window_time"),
        ({"slide": True, "window_time": "1h"}, "slide must be a duration"),
        ({"session_gap": "30m", "time": None}, "session_gap needs time="),
        ({"session_gap": "30m", "window_count": 3}, "session_gap is a window of its own"),
        ({"session_gap": -1}, "session_gap must be at least 1 ms"),
        ({"slide": "1m", "window_time": "1h", "input_format": "cec"}, "not a cec queue"),
    ],
)
def test_bad_window_keywords_are_one_line(keywords: dict[str, Any], message: str) -> None:
    given: dict[str, Any] = {"window_count": None, "window_time": None, "slide": None, "session_gap": None,
                             "time": "ts", **keywords}  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        window_form(**given)
    assert message in str(caught.value) and "\n" not in str(caught.value)
