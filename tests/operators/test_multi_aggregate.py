"""Several aggregates and composite keys (operators.multi_aggregate), against a plain-Python truth.

The sum behind `sum`/`avg` is exact (operators.exact_sum): any order of a window's tuples gives the same
double, so keys spread over several input partitions recover exactly under SIGKILL with watermarks.
"""

from __future__ import annotations

import csv
import json
import math
import struct
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cec.config import Checkpointing
from cec.exceptions import ConfigError
from cec.records import Kind, OutputRecord
from operators import exact_sum
from operators.aggregate import RESULT_SCHEMA, KeyedAggregate
from operators.base import InputTuple
from operators.job import JobSpec, aggregate_operator, build_operator, run_job
from operators.multi_aggregate import MultiAggregate, parse_agg
from operators.sinks import iter_payloads
from queuestore.sqlite import SqliteQueueStore
from tests.helpers.crash_plans import run_after_crashes
from tests.helpers.engine_runs import ANY_VALUE, ROW, AvroResults, engine_results, every_record, open_counts
from tests.helpers.flight_queues import flight_schema, logged_result_bits, write_partitions

FINITE = st.floats(allow_nan=False, allow_infinity=False, width=64)
FLIGHT_SCHEMA = flight_schema("tests.breadth", ["arr_delay", "dep_delay"])


def _bits(x: float | None) -> bytes | None:
    return None if x is None else struct.pack("<d", x)


# -- the exact sum ----------------------------------------------------------------------------------------


@given(st.lists(FINITE, max_size=40), st.randoms())
def test_the_exact_sum_is_fsum_in_any_order(xs: list[float], rnd: Any) -> None:
    shuffled = list(xs)
    rnd.shuffle(shuffled)
    totals = [sum(map(exact_sum.exact, order)) for order in (xs, shuffled)]
    assert totals[0] == totals[1]
    assume_finite = abs(totals[0]) < exact_sum.OVERFLOW
    if assume_finite:
        assert exact_sum.rounded(totals[0]) == math.fsum(xs)
    assert exact_sum.unpack(*exact_sum.pack(totals[0])) == totals[0]


# -- through the engine: one key's tuples over two input partitions ---------------------------------------


def _split_runs(xs: list[float], cut: int, first: str) -> list[InputTuple]:
    """The tuples of key "k" (window [0, 10)) on two partitions, then one at t=10 on each, which close it
    (by the watermark, or for the per-key window by the key's next tuple): the first `cut` values on
    partition 0, the rest on partition 1, fed partition `first`'s tuples first."""
    p0 = [InputTuple(0, o, {"k": "k", "v": x, "t": 1}) for o, x in enumerate(xs[:cut])]
    p1 = [InputTuple(1, o, {"k": "k", "v": x, "t": 1}) for o, x in enumerate(xs[cut:])]
    runs = p0 + p1 if first == "0" else p1 + p0
    ends = [
        InputTuple(0, len(p0), {"k": "k", "v": 0.0, "t": 10}),
        InputTuple(1, len(p1), {"k": "k", "v": 0.0, "t": 10}),
    ]
    return [*runs, *ends]


def _sum_avg(aggs: list[tuple[str, str]]) -> MultiAggregate:
    return MultiAggregate(key_fields=["k"], aggs=aggs, window_ms=10, time_field="t", allowed_lateness=0)


@settings(max_examples=60, deadline=None)
@given(st.lists(FINITE.filter(lambda x: abs(x) < 1e300), min_size=2, max_size=30), st.data())
def test_sum_avg_min_max_do_not_depend_on_how_partitions_interleave(xs: list[float], data: Any) -> None:
    cut = data.draw(st.integers(1, len(xs) - 1))
    operator = _sum_avg([("sum", "v"), ("avg", "v"), ("min", "v"), ("max", "v"), ("count", "*")])
    a = engine_results(operator, _split_runs(xs, cut, "0"))
    b = engine_results(_sum_avg(operator_aggs(operator)), _split_runs(xs, cut, "1"))
    assert len(a) == len(b) == 1
    for name in ("sum_v", "avg_v", "min_v", "max_v"):
        assert _bits(a[0][name]) == _bits(b[0][name]), name
    assert a[0]["sum_v"] == math.fsum(xs)
    assert a[0]["count"] == len(xs)


def operator_aggs(operator: MultiAggregate) -> list[tuple[str, str]]:
    return [(a.func, a.column) for a in operator.aggregates]


def test_negative_control_plain_float_addition_depends_on_the_interleaving() -> None:
    xs = [1e16, -1e16, 1.0]
    # The single aggregate sums with float `+`: 1e16 + -1e16 + 1 is 1, 1 + 1e16 + -1e16 is 0.
    legacy = [
        engine_results(
            KeyedAggregate(key_field="k", value_field="v", agg="sum", window_ms=10, time_field="t"),
            _split_runs(xs, 2, first),
        )[0]["value"]
        for first in "01"
    ]
    assert legacy[0] != legacy[1]
    exact = [
        engine_results(_sum_avg([("sum", "v")]), _split_runs(xs, 2, first))[0]["value"] for first in "01"
    ]
    assert exact == [1.0, 1.0]


def test_min_and_max_order_negative_zero_below_zero_whatever_comes_first() -> None:
    for xs in ([0.0, -0.0], [-0.0, 0.0]):
        got = engine_results(_sum_avg([("min", "v"), ("max", "v")]), _split_runs(xs, 1, "0"))[0]
        assert _bits(got["min_v"]) == _bits(-0.0)
        assert _bits(got["max_v"]) == _bits(0.0)


# -- cec run's job over a CSV file, against plain Python ------------------------------------------------

ROWS: list[dict[str, str]] = []
for i in range(400):
    h = (i * 2654435761) % 2**32
    ROWS.append(
        {
            "carrier": ["AA", "UA", "DL"][h % 3],
            "origin": ["JFK", "SFO"][(h >> 4) % 2],
            "arr_delay": "" if h % 11 == 0 else f"{(h % 1000) / 7 - 40:.6f}",
            "dep_delay": "" if h % 13 == 0 else str((h >> 8) % 90 - 10),
            "ts": str(i * 7),
        }
    )
ROWS[50]["arr_delay"] = "late"  # not a number: a dead letter
ROWS[60]["origin"] = ""  # a composite key with a missing field: a dead letter
AGGS = [("avg", "arr_delay"), ("max", "dep_delay"), ("count", "*"), ("count", "arr_delay")]
WINDOW_MS = 200


def _write_csv(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def _truth(rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Per-key tumbling windows closed by the key's next tuple at or past the end (each key's last window
    stays open): plain Python, SQL's null rule, no cec code."""
    groups: dict[tuple[str, str], dict[int, list[dict[str, str]]]] = defaultdict(dict)
    for r in rows:
        if not r["origin"] or r["arr_delay"] == "late":
            continue
        start = int(r["ts"]) // WINDOW_MS * WINDOW_MS
        groups[(r["carrier"], r["origin"])].setdefault(start, []).append(r)
    out = []
    for (carrier, origin), windows in groups.items():
        for seq, start in enumerate(sorted(windows)[:-1]):
            rs = windows[start]
            arr = [float(r["arr_delay"]) for r in rs if r["arr_delay"]]
            dep = [float(r["dep_delay"]) for r in rs if r["dep_delay"]]
            out.append(
                {
                    "carrier": carrier,
                    "origin": origin,
                    "window": seq,
                    "avg_arr_delay": math.fsum(arr) / len(arr) if arr else None,
                    "max_dep_delay": max(dep) if dep else None,
                    "count_arr_delay": len(arr),
                    "count": len(rs),
                    "start": start,
                    "end": start + WINDOW_MS,
                }
            )
    return sorted(out, key=lambda r: (r["carrier"], r["origin"], r["start"]))


def _csv_job(root: Path, data: Path) -> JobSpec:
    return JobSpec(
        operator=aggregate_operator(
            "carrier",
            None,
            "avg",
            window_time="200ms",
            time="ts",
            key_fields=["carrier", "origin"],
            aggs=AGGS,
        ),
        source={"type": "csv", "path": str(data)},
        store={"type": "sqlite", "root": str(root)},
        output_topic="agg",
        batch_size=8,
    )


def test_several_aggregates_over_a_composite_key_match_plain_python(tmp_path: Path) -> None:
    data = _write_csv(tmp_path / "flights.csv", ROWS)
    spec = _csv_job(tmp_path / "run", data)
    run_job(spec)
    operator = build_operator(spec.operator)
    store = SqliteQueueStore(tmp_path / "run")
    got = list(iter_payloads(store, "agg", operator.result_schema))
    assert [f["name"] for f in operator.result_schema["fields"]] == [
        "carrier", "origin", "window", "avg_arr_delay", "max_dep_delay", "count_arr_delay", "count", "start", "end"
    ]  # fmt: skip
    assert sorted(got, key=lambda r: (r["carrier"], r["origin"], r["start"])) == _truth(ROWS)
    dead = sorted(r["reason"] for r in iter_payloads(store, "agg", _dead_schema(), Kind.DEAD))
    assert dead == ["missing key 'origin'", "value 'arr_delay' is not a number: 'late'"]


def _dead_schema() -> dict[str, Any]:
    from operators.base import DEAD_LETTER_SCHEMA

    return DEAD_LETTER_SCHEMA


def test_one_key_and_one_aggregate_keep_the_key_and_value_columns(tmp_path: Path) -> None:
    op = build_operator(
        aggregate_operator("carrier", None, "avg", window_count=3, aggs=[("avg", "arr_delay")])
    )
    assert [f["name"] for f in op.result_schema["fields"]] == [
        "key",
        "window",
        "value",
        "count",
        "start",
        "end",
    ]
    legacy = build_operator(aggregate_operator("carrier", "arr_delay", "avg", window_count=3))
    assert isinstance(legacy, KeyedAggregate) and legacy.result_schema == RESULT_SCHEMA


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("median:x", "invalid choice: 'median'"),
        ("avg", "required: --value"),
        ("sum:*", "only count takes '*'"),
    ],
)
def test_a_bad_agg_is_one_clear_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_agg(text, None)
    assert "\n" not in str(info.value)


def test_bad_configurations_are_refused_before_any_work() -> None:
    with pytest.raises(ConfigError, match="given twice"):
        MultiAggregate(key_fields=["k"], aggs=[("avg", "v"), ("avg", "v")], window_count=2)
    with pytest.raises(ConfigError, match="would appear twice"):
        MultiAggregate(key_fields=["count", "k"], aggs=[("avg", "v"), ("count", "*")], window_count=2)
    with pytest.raises(ConfigError, match="not a valid column name"):
        MultiAggregate(key_fields=["k"], aggs=[("avg", "v-1"), ("max", "v")], window_count=2)


# -- SIGKILL: 3 input partitions, keys spread over all of them, watermarks ---------------------------------


def _flight_rows(partitions: int) -> list[list[dict[str, Any]]]:
    """Per input partition, flights: every key on every partition, event times rising per partition."""
    parts = []
    for p in range(partitions):
        rows = []
        for i in range(1500):
            h = ((i * partitions + p) * 2654435761) % 2**32
            rows.append(
                {
                    "carrier": ["AA", "UA", "DL", "B6"][h % 4],
                    "origin": ["JFK", "SFO", "ORD"][(h >> 5) % 3],
                    # Magnitudes far apart: float `+` rounds differently in another order.
                    "arr_delay": None if h % 17 == 0 else ((h % 2001) - 1000) * 10.0 ** ((h >> 9) % 24 - 8),
                    "dep_delay": None if h % 19 == 0 else float((h >> 12) % 300) / 3,
                    "ts": i * 4 + p,
                }
            )
        parts.append(rows)
    return parts


def _queue_job(root: Path) -> JobSpec:
    return JobSpec(
        operator=aggregate_operator(
            "carrier",
            None,
            "avg",
            window_time="100ms",
            time="ts",
            allowed_lateness="0",
            key_fields=["carrier", "origin"],
            aggs=[("avg", "arr_delay"), ("sum", "arr_delay"), ("max", "dep_delay"), ("count", "*")],
        ),
        source={"type": "queue", "topic": "flights", "schema": FLIGHT_SCHEMA},
        store={"type": "sqlite", "root": str(root)},
        output_topic="agg",
        checkpointing=Checkpointing(u_target=200, ci_ms=5.0, cp_ms=10.0),
        batch_size=16,
    )


@pytest.mark.parametrize(
    "crashes",
    [
        [("runtime.after_input", 1400)],
        [("runtime.before_append", 700), ("external", 1800), ("runtime.replaying", 150)],
    ],
)
def test_sigkill_with_keys_over_three_partitions_gives_the_failure_free_results_bit_for_bit(
    tmp_path: Path, crashes: list[tuple[str, int]]
) -> None:
    parts = _flight_rows(3)
    reference = tmp_path / "reference"
    write_partitions(reference, parts, FLIGHT_SCHEMA)
    run_job(_queue_job(reference))
    schema = build_operator(_queue_job(reference).operator).result_schema
    want = logged_result_bits(reference, schema)
    assert len(want) > 100

    root = tmp_path / "crashed"
    write_partitions(root, parts, FLIGHT_SCHEMA)
    assert run_after_crashes(_queue_job(root), tmp_path / "spec.json", crashes) >= 1
    assert logged_result_bits(root, schema) == want


# -- cec state --as-of ------------------------------------------------------------------------------------


def test_state_as_of_shows_every_aggregate_column_of_the_open_windows(tmp_path: Path) -> None:
    from cec.state_as_of import AsOf, state_as_of
    from operators.runtime import OperatorRuntime
    from operators.sources import CsvSource
    from queuestore.output import OutputQueue

    data = _write_csv(tmp_path / "flights.csv", ROWS)
    spec = _csv_job(tmp_path / "run", data)
    run_job(spec)
    k = 230
    operator = build_operator(spec.operator)
    assert isinstance(operator, MultiAggregate)
    reference = SqliteQueueStore(tmp_path / "ref")
    reference.create_topic("ref", 1)
    output = OutputQueue(reference, "ref", 0)
    try:
        runtime = OperatorRuntime(operator, CsvSource(str(data)), output, batch_size=1)
        runtime.run(max_inputs=k)
    finally:
        output.close()
        reference.close()
    want = {(w.key, w.seq): operator.state_fields(w.state) for w in runtime.registry}
    got = {
        (w.key, w.window): w.state
        for w in state_as_of(SqliteQueueStore(tmp_path / "run"), "agg", AsOf(positions=(k,)), input_path=data)
    }
    assert got == want and len(want) == 6
    some = next(iter(got.values()))
    assert set(some) == {
        "count", "start", "last",
        "n_arr_delay", "sum_arr_delay", "min_arr_delay", "max_arr_delay",
        "n_dep_delay", "sum_dep_delay", "min_dep_delay", "max_dep_delay",
    }  # fmt: skip
    json.dumps([w for w in got.values()])  # printable as `cec state --json` prints it


# -- any value: a result or a dead letter, never an exception; in one run or tuple by tuple alike ---------


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), ROW), max_size=25), st.booleans())
def test_any_input_is_a_result_or_a_dead_letter_the_same_in_one_run_or_one_by_one(
    rows: list[tuple[int, dict[str, Any]]], watermarks: bool
) -> None:
    offsets = [0, 0]
    tuples = []
    for j, value in rows:
        tuples.append(InputTuple(j, offsets[j], value))
        offsets[j] += 1

    def build() -> MultiAggregate:
        return MultiAggregate(
            key_fields=["a", "b"],
            aggs=[("avg", "v"), ("sum", "w"), ("min", "v"), ("max", "w"), ("count", "v"), ("count", "*")],
            window_ms=20,
            time_field="t",
            allowed_lateness=0 if watermarks else None,
        )

    operator = build()
    batch = every_record(operator, tuples, one_by_one=False)
    assert batch == every_record(build(), tuples, one_by_one=True)
    # Every tuple is in exactly one place: a closed window's count, an open window's, or a dead letter.
    results = AvroResults(operator)
    closed = sum(
        results(OutputRecord(Kind.R, 0, (), 0, payload=r[4]))["count"] for r in batch if r[0] is Kind.R
    )
    dead = sum(1 for r in batch if r[0] is Kind.DEAD)
    assert closed + dead + open_counts(operator, tuples) == len(tuples)


# -- the per-tuple fast path (one key field, windows of their key) does what the full path does -----------


_NUMBER = st.one_of(
    st.floats(min_value=-1e6, max_value=1e6),
    st.integers(-100, 100),
    st.none(),
    st.sampled_from([1.5e308, -0.0]),
)
# Mostly tuples the fast path takes (repeated keys, numbers, times in a few windows), some it leaves.
_FAST_ROW = st.fixed_dictionaries(
    {
        "b": st.sampled_from(["x", "y", 7, 7, "x", None, " ", "é"]),
        "v": st.one_of(_NUMBER, _NUMBER, ANY_VALUE),
        "w": st.one_of(_NUMBER, _NUMBER, ANY_VALUE),
        "t": st.one_of(st.integers(0, 70), st.integers(0, 70), ANY_VALUE),
    }
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 1), _FAST_ROW), max_size=30),
    st.sampled_from([{"window_count": 3}, {"window_ms": 20, "time_field": "t"}]),
)
def test_the_fast_path_makes_every_record_the_full_path_makes(
    rows: list[tuple[int, dict[str, Any]]], windows: dict[str, Any]
) -> None:
    offsets = [0, 0]
    tuples = []
    for j, value in rows:
        tuples.append(InputTuple(j, offsets[j], value))
        offsets[j] += 1

    def build(fast: bool) -> MultiAggregate:
        operator = MultiAggregate(
            key_fields=["b"],
            aggs=[("avg", "v"), ("sum", "w"), ("min", "v"), ("max", "w"), ("count", "v"), ("count", "*")],
            **windows,
        )
        if not fast:
            operator._plain_key = None  # the full path for every tuple
        return operator

    fast = build(True)
    assert fast._plain_key == "b"
    assert every_record(fast, tuples, one_by_one=False) == every_record(
        build(False), tuples, one_by_one=False
    )


def test_the_fast_path_takes_the_common_tuple_and_leaves_the_rest_to_the_full_path() -> None:
    """The shapes it takes (text and int keys, float, int and missing values), the ones it leaves (a closing,
    a key to check, an overflow) with the same records as the full path."""
    big = 1.5e308
    values = [
        {"b": "x", "v": 1.5, "w": 2, "t": 1},
        {"b": 7, "v": None, "w": 2.5, "t": 2},
        {"b": "x", "v": "3", "w": big, "t": 3},
        {"b": "x", "v": 1.0, "w": big, "t": 4},  # sum(w) would overflow: a dead letter
        {"b": " ", "v": 1.0, "w": 1.0, "t": 5},  # a missing key: a dead letter
        {"b": "é", "v": 1.0, "w": 1.0, "t": 6},
        {"b": "x", "v": 2.0, "w": 1.0, "t": 25},  # closes x's window [0, 20)
    ]
    tuples = [InputTuple(0, o, v) for o, v in enumerate(values)]

    def build(fast: bool) -> MultiAggregate:
        operator = MultiAggregate(
            key_fields=["b"], aggs=[("avg", "v"), ("sum", "w"), ("count", "*")], window_ms=20, time_field="t"
        )
        if not fast:
            operator._plain_key = None
        return operator

    got = every_record(build(True), tuples, one_by_one=True)
    assert got == every_record(build(False), tuples, one_by_one=True)
    assert [r[0] for r in got] == [
        Kind.GOPEN,
        Kind.GOPEN,
        Kind.DEAD,
        Kind.DEAD,
        Kind.GOPEN,
        Kind.R,
        Kind.GOPEN,
    ]
