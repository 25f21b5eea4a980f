"""Operator semantics, checked against a straightforward reference implementation."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cec.records import Kind
from operators.job import JobSpec, run_job
from operators.sources import PurchaseGenerator
from queuestore.sqlite import SqliteQueueStore
from tests.helpers import log_records, results


def reference(
    rows: list[dict[str, Any]], agg: str, count: int | None, ms: int | None
) -> list[dict[str, Any]]:
    """Per-key tumbling windows, results in closing order."""
    open_: dict[str, list[tuple[float, int]]] = {}
    seqs: dict[str, int] = {}
    out = []

    def close(key: str) -> None:
        xs = [x for x, _ in open_.pop(key)]
        value = {
            "avg": sum(xs) / len(xs),
            "sum": sum(xs),
            "count": float(len(xs)),
            "min": min(xs),
            "max": max(xs),
        }[agg]
        if agg in ("avg", "sum"):  # same summation order as the operator
            total = 0.0
            for x in xs:
                total += x
            value = total / len(xs) if agg == "avg" else total
        seq = seqs.get(key, 0)
        seqs[key] = seq + 1
        out.append({"key": key, "window": seq, "value": value, "count": len(xs)})

    for row in rows:
        key, x, t = str(row["k"]), float(row["v"]), int(row.get("t", 0))
        if ms is not None and key in open_ and t >= open_[key][0][1] - open_[key][0][1] % ms + ms:
            close(key)
        open_.setdefault(key, []).append((x, t))
        if count is not None and len(open_[key]) >= count:
            close(key)
    return out


def _write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, columns)
        w.writeheader()
        w.writerows(rows)


def _run_csv(tmp_path: Path, rows: list[dict[str, Any]], **operator: Any) -> SqliteQueueStore:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "in.csv"
    _write_csv(path, rows, ["k", "v", "t"])
    store_root = tmp_path / "store"
    spec = JobSpec(
        operator={"type": "aggregate", "key_field": "k", "value_field": "v", **operator},
        source={"type": "csv", "path": str(path)},
        store={"type": "sqlite", "root": str(store_root)},
        output_topic="out",
    )
    run_job(spec)
    return SqliteQueueStore(store_root)


rows_strategy = st.lists(
    st.fixed_dictionaries({"k": st.integers(0, 4), "v": st.integers(-100, 100), "dt": st.integers(0, 40)}),
    max_size=120,
)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(
    rows_strategy, st.sampled_from(["avg", "sum", "count", "min", "max"]), st.integers(1, 5), st.booleans()
)
def test_aggregate_matches_reference(
    tmp_path_factory: Any, raw: list[dict[str, int]], agg: str, size: int, timed: bool
) -> None:
    tmp_path = tmp_path_factory.mktemp("agg")
    t, rows = 0, []
    for r in raw:
        t += r["dt"]
        rows.append({"k": r["k"], "v": r["v"], "t": t})
    if timed:
        store = _run_csv(tmp_path, rows, agg=agg, window_ms=size * 10, time_field="t")
        want = reference(rows, agg, None, size * 10)
    else:
        store = _run_csv(tmp_path, rows, agg=agg, window_count=size)
        want = reference(rows, agg, size, None)
    got = [{k: r[k] for k in ("key", "window", "value", "count")} for r in results(store, "out")]
    assert got == want


def test_bad_rows_go_to_dead_letters_and_the_run_goes_on(tmp_path: Path) -> None:
    rows = [
        {"k": "a", "v": "1", "t": 0},
        {"k": "", "v": "2", "t": 1},  # missing key
        {"k": "a", "v": "x", "t": 2},  # not a number
        {"k": "a", "v": "nan", "t": 3},  # not finite
        {"k": "a", "v": "3", "t": 4},
    ]
    store = _run_csv(tmp_path, rows, agg="sum", window_count=2)
    assert [r["value"] for r in results(store, "out")] == [4.0]
    dead = results(store, "out", Kind.DEAD)
    assert [(d["offset"], d["reason"]) for d in dead] == [
        (1, "missing key 'k'"),
        (2, "value 'v' is not a number: 'x'"),
        (3, "value 'v' is not finite: 'nan'"),
    ]


def test_late_tuple_in_a_time_window_is_dead_lettered(tmp_path: Path) -> None:
    rows = [
        {"k": "a", "v": 1, "t": 100},
        {"k": "a", "v": 5, "t": 50},
        {"k": "a", "v": 2, "t": 150},
        {"k": "a", "v": 9, "t": 230},
    ]
    store = _run_csv(tmp_path, rows, agg="sum", window_ms=100, time_field="t")
    assert [(r["value"], r["start"], r["end"]) for r in results(store, "out")] == [(3.0, 100, 200)]
    assert "late tuple" in results(store, "out", Kind.DEAD)[0]["reason"]


def test_footprints_carry_n_pos_and_g_open_is_elided_for_instant_windows(tmp_path: Path) -> None:
    store = _run_csv(
        tmp_path,
        [{"k": "a", "v": 1, "t": 0}, {"k": "b", "v": 1, "t": 0}, {"k": "a", "v": 1, "t": 0}],
        agg="count",
        window_count=2,
    )
    recs = log_records(store, "out")
    assert [(r.kind, r.key, r.seq, r.n, r.pos) for r in recs] == [
        (Kind.GOPEN, "a", 0, 1, (1,)),
        (Kind.GOPEN, "b", 0, 2, (2,)),
        (Kind.R, "a", 0, 1, (3,)),
        (Kind.EOS, None, -1, 1, (3,)),
    ]
    store1 = _run_csv(tmp_path / "one", [{"k": "a", "v": 1, "t": 0}], agg="count", window_count=1)
    assert [r.kind for r in log_records(store1, "out")] == [Kind.R, Kind.EOS]


@pytest.mark.parametrize("partitions", [1, 3])
def test_generator_is_replayable_and_keys_stay_in_one_partition(partitions: int) -> None:
    gen = PurchaseGenerator(300, 17, seed=5, partitions=partitions)
    first: list[Any] = []
    while (batch := gen.poll(64)) is not None:
        first.extend(batch)
    assert len(first) == 300
    for t in first:
        assert t.value is not None and t.value["item_id"] % partitions == t.partition
    gen.seek([5] * partitions)
    again = gen.poll(10 * partitions) or []
    assert all(t.value == gen.tuple_at(t.partition, t.offset) for t in again)
    assert {(t.partition, t.offset) for t in again} <= {(t.partition, t.offset) for t in first}


def test_a_value_that_would_overflow_its_window_is_dead_lettered_before_it_changes_the_window(
    tmp_path: Path,
) -> None:
    rows = [
        {"k": "a", "v": "1e308", "t": 0},
        {"k": "a", "v": "1e308", "t": 1},  # 2e308 is not a double: the window would hold inf
        {"k": "a", "v": "-1", "t": 2},
    ]
    store = _run_csv(tmp_path, rows, agg="sum", window_count=2)
    assert [r["value"] for r in results(store, "out")] == [1e308 - 1]
    assert [(d["offset"], d["reason"]) for d in results(store, "out", Kind.DEAD)] == [
        (1, "value 'v' 1e+308 would overflow its window's sum")
    ]


def test_integer_times_are_exact_beyond_double_precision_and_checked_against_64_bits(tmp_path: Path) -> None:
    big = 2**62 + 1  # not a double: read through a float it would become 2**62
    rows = [
        {"k": "a", "v": 1, "t": big},
        {"k": "a", "v": 2, "t": big + 2},
        {"k": "b", "v": 4, "t": 2**63 - 50},  # a 100 ms window of it would end past 2**63 - 1
        {"k": "b", "v": 8, "t": 2**63 - 1},
    ]
    counted = _run_csv(tmp_path / "count", rows, agg="sum", window_count=2, time_field="t")
    assert [(r["value"], r["start"], r["end"]) for r in results(counted, "out")] == [
        (3.0, big, big + 2),
        (12.0, 2**63 - 50, 2**63 - 1),
    ]
    assert results(counted, "out", Kind.DEAD) == []
    timed = _run_csv(tmp_path / "time", rows, agg="sum", window_ms=100, time_field="t")
    dead = results(timed, "out", Kind.DEAD)
    assert [d["offset"] for d in dead] == [2, 3]
    assert all("beyond the 64-bit range less the window (100 ms)" in d["reason"] for d in dead)


def test_a_footprint_carries_a_first_tuple_state_once() -> None:
    """A G-open's state (count 1, total = lo = hi) is written as the value once with start and span;
    `decode_state` reads it and the full form (what older releases wrote, and every state of more than one
    tuple); `encode_state` keeps STATE_SCHEMA's encoding (what `cec state` decodes)."""
    from cec.records import AvroCodec
    from operators.aggregate import FIRST_TUPLE_TAG, STATE_SCHEMA, AggState, KeyedAggregate

    op = KeyedAggregate(key_field="k", value_field="v", window_count=10)
    full = AvroCodec(STATE_SCHEMA)
    for state, compact in (
        (AggState(1, 12.5, 12.5, 12.5, 91_000, 91_000), True),  # a count window's G-open
        (AggState(1, -0.0, -0.0, -0.0, -(2**62), 2**62 - 1), True),  # a time window's: start, later tuple
        (AggState(1, 1.0, 1.0, 1.0, -(2**62), 2**62), False),  # last - start beyond a long: the full form
        (AggState(1, 3.0, 3.0, 4.0, 5, 5), False),  # count 1 but hi != total: the full form
        (AggState(1, 0.0, -0.0, 0.0, 5, 5), False),  # 0.0 and -0.0 are different values in the log
        (AggState(4, 10.0, 1.0, 4.0, 5, 9), False),
    ):
        data = op.encode_footprint(state)
        assert (data[0] == FIRST_TUPLE_TAG) == compact
        assert op.decode_state(data) == state
        assert str(op.decode_state(data)) == str(state)  # signs of zeros included
        assert op.decode_state(op.encode_state(state)) == state
        assert full.decode(op.encode_state(state)) == dataclasses.asdict(state)
    assert len(op.encode_footprint(AggState(1, 12.5, 12.5, 12.5, 91_000, 91_000))) == 13
    assert len(op.encode_state(AggState(1, 12.5, 12.5, 12.5, 91_000, 91_000))) == 31


def _generated_spec(root: Path, **checkpointing: Any) -> JobSpec:
    from cec.config import Checkpointing

    return JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "avg",
            "window_count": 10,
        },
        source={"type": "generator", "count": 6_000, "keys": 200, "seed": 3},
        store={"type": "sqlite", "root": str(root)},
        output_topic="agg",
        checkpointing=Checkpointing(**checkpointing),
        batch_size=64,
    )


def _log_bytes(store: SqliteQueueStore, topic: str) -> int:
    with store.reader(topic, 0) as reader:
        return sum(len(r.value) for r in reader.scan_forward(0))


def test_results_are_identical_across_record_versions_and_recover_across_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compact records (version 4, first-tuple states) against the previous release's (version 3, full
    states): the same results and the same records, field by field; and a log the previous release wrote up
    to a crash, resumed by this one, ends with the failure-free results."""
    import operators.runtime
    from cec.records import SCHEMAS, RecordCodec
    from operators.aggregate import KeyedAggregate

    def previous_release() -> contextlib.AbstractContextManager[None]:
        stack = contextlib.ExitStack()
        patch = stack.enter_context(pytest.MonkeyPatch.context())
        patch.setattr(
            operators.runtime, "RecordCodec", lambda: RecordCodec({v: SCHEMAS[v] for v in (1, 2, 3)})
        )
        patch.setattr(KeyedAggregate, "encode_footprint", KeyedAggregate.encode_state)
        return stack

    op = KeyedAggregate(key_field="item_id", value_field="item_price", window_count=10)
    run_job(_generated_spec(tmp_path / "new"))
    with previous_release():
        run_job(_generated_spec(tmp_path / "old"))
    new, old = SqliteQueueStore(tmp_path / "new"), SqliteQueueStore(tmp_path / "old")
    want = results(old, "agg")
    assert len(want) > 500 and results(new, "agg") == want

    def comparable(records: list[Any]) -> list[Any]:
        return [
            dataclasses.replace(r, state=None if r.state is None else op.decode_state(r.state))
            for r in records
        ]

    new_log, old_log = log_records(new, "agg"), log_records(old, "agg")
    assert comparable(new_log) == comparable(old_log)
    with new.reader("agg", 0) as reader:
        assert {r.value[1] for r in reader.scan_forward(0)} == {4}
    assert _log_bytes(new, "agg") < 0.75 * _log_bytes(old, "agg")

    # Upgrade in the middle: the previous release crashes half-way (G-checks too), this one recovers.
    mixed = tmp_path / "mixed"
    with previous_release():
        run_job(_generated_spec(mixed, u_target=200, ci_ms=50.0, cp_ms=100.0), max_inputs=3_000)
    run_job(_generated_spec(mixed, u_target=200, ci_ms=50.0, cp_ms=100.0))
    store = SqliteQueueStore(mixed)
    with store.reader("agg", 0) as reader:
        versions = [r.value[1] for r in reader.scan_forward(0) if r.meta.kind != "PART"]
    assert versions[0] == 3 and versions[-1] == 4
    assert results(store, "agg") == want
