"""Session windows (operators.sessions): per key, tuples less than the gap apart share a session
[first, last + gap), closed by the key's next tuple at or past its end; against a plain-Python truth
(sort each key's tuples by time, cut where two neighbours are a gap or more apart), and exact under SIGKILL
with keys over three input partitions."""

from __future__ import annotations

import csv
import itertools
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cec.config import Checkpointing
from cec.exceptions import BadTupleError, ConfigError
from cec.records import AvroCodec, Kind, OutputRecord, RecordCodec
from operators.base import DEAD_LETTER_SCHEMA, InputTuple
from operators.engine.instance import OperatorInstance
from operators.job import JobSpec, aggregate_operator, build_operator, run_job
from operators.local_sink import OutputQueueSink
from operators.sessions import SessionAggregate, SessionWindows
from operators.sinks import iter_payloads
from queuestore.sqlite import SqliteQueueStore
from recovery.manager import RecoveryManager
from tests.helpers.crash_plans import crash_during_recovery, run_after_crashes
from tests.helpers.engine_runs import ROW, AvroResults, MemoryQueue, every_record, open_counts
from tests.helpers.flight_queues import (
    flight_schema,
    log_kinds,
    logged_result_bits,
    result_bits,
    write_partitions,
)
from tests.helpers.truth import session_truth, watermark_session_truth

GAP = 30
AGGS = [("avg", "arr_delay"), ("max", "dep_delay"), ("count", "*"), ("count", "arr_delay")]
KEYS = [(c, o) for c in ("AA", "UA", "DL", "B6") for o in ("JFK", "SFO", "ORD")]


def session_rows(seed: int, n: int, longest: int = 8) -> list[dict[str, Any]]:
    """Flights in each key's time order but for some tuples a third of a gap back (never back past the
    key's previous session): sessions of 1 to `longest` tuples, steps below the gap inside one, a gap or more
    between two; keys interleaved at random."""
    rnd = random.Random(seed)
    clock: dict[tuple[str, str], dict[str, int]] = {}
    rows = []
    for i in range(n):
        key = rnd.choice(KEYS)
        c = clock.setdefault(key, {"last": rnd.randrange(0, 50), "floor": -(10**9), "left": 0})
        if c["left"] == 0:  # the next session: a gap or more after the key's previous tuples
            c["floor"] = c["last"] + GAP
            t = c["floor"] + rnd.randrange(0, 3 * GAP)
            c["left"] = rnd.randrange(1, longest + 1)
        elif rnd.random() < 0.2 and c["last"] - GAP // 3 >= c["floor"]:
            t = c["last"] - GAP // 3  # back, inside the open session (it may move its first tuple back)
        else:
            t = c["last"] + rnd.randrange(0, GAP)
        c["left"] -= 1
        c["last"] = max(c["last"], t)
        h = rnd.randrange(1 << 30)
        rows.append(
            {
                "carrier": key[0],
                "origin": key[1],
                "arr_delay": None if h % 11 == 0 else ((h % 2001) - 1000) * 10.0 ** (h % 13 - 6),
                "dep_delay": None if h % 13 == 0 else float(h % 300) / 3,
                "ts": t,
                "i": i,
            }
        )
    return rows


def truth(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per key: its tuples sorted by time, cut where two neighbours are a gap or more apart; each key's
    last session stays open (`tests.helpers.truth`: plain Python, SQL's null rule, no cec code)."""
    return session_truth(rows, GAP, AGGS)


def _sorted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["carrier"], r["origin"], r["start"]))


# -- the rule ----------------------------------------------------------------------------------------------


def test_a_tuple_joins_closes_or_is_late_against_the_open_session() -> None:
    w = SessionWindows(10, "t")
    assert w.admits(14, 5, 5) and w.admits(-4, 5, 5)  # less than the gap either side
    assert not w.admits(15, 5, 5)  # at the end [5, 15): closes it
    with pytest.raises(BadTupleError, match="late tuple: time -5 is a gap or more before"):
        w.admits(-5, 5, 5)
    assert w.end_of(0, 7) == 17


def test_session_aggregate_refuses_what_is_not_a_session() -> None:
    with pytest.raises(ConfigError, match="at least 1 ms"):
        SessionAggregate(key_fields=["k"], aggs=[("sum", "v")], gap_ms=0, time_field="t")
    with pytest.raises(ConfigError, match="needs a time field"):
        SessionAggregate(key_fields=["k"], aggs=[("sum", "v")], gap_ms=5, time_field=None)
    with pytest.raises(ConfigError, match="not both"):
        build_operator(aggregate_operator("k", "v", "sum", window_count=3, time="t", session_gap="5ms"))
    with pytest.raises(ConfigError, match="allowed lateness must be >= 0"):
        SessionAggregate(key_fields=["k"], aggs=[("sum", "v")], gap_ms=5, time_field="t", allowed_lateness=-1)


# -- a CSV file, against plain Python --------------------------------------------------------------------


def write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    names = ["carrier", "origin", "arr_delay", "dep_delay", "ts"]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(names)
        for r in rows:
            w.writerow(
                ["" if r[n] is None else repr(r[n]) if isinstance(r[n], float) else r[n] for n in names]
            )
    return path


def bad_rows(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """`rows` with three dead letters put in: a late tuple (a gap before its key's open session), a value
    that is not a number and a composite key with a missing field; and their reasons."""
    last = rows[-1]
    first = min(r["ts"] for r in rows if (r["carrier"], r["origin"]) == (last["carrier"], last["origin"]))
    late = {**last, "arr_delay": 1.0, "i": -1, "ts": first - GAP}
    nan = {**last, "arr_delay": "late", "i": -2}
    no_origin = {**last, "origin": None, "i": -3}
    return [*rows, late, nan, no_origin], [
        "late tuple",
        "missing key 'origin'",
        "value 'arr_delay' is not a number: 'late'",
    ]


def _csv_job(root: Path, data: Path, **ckpt: Any) -> JobSpec:
    return JobSpec(
        operator=aggregate_operator(
            "carrier",
            None,
            "avg",
            time="ts",
            session_gap=f"{GAP}ms",
            key_fields=["carrier", "origin"],
            aggs=AGGS,
        ),
        source={"type": "csv", "path": str(data)},
        store={"type": "sqlite", "root": str(root)},
        output_topic="agg",
        checkpointing=Checkpointing(**ckpt) if ckpt else Checkpointing(),
        batch_size=8,
    )


def test_sessions_of_several_aggregates_over_a_composite_key_match_plain_python(tmp_path: Path) -> None:
    rows = session_rows(1, 600)
    with_bad, reasons = bad_rows(rows)
    data = write_csv(tmp_path / "flights.csv", with_bad)
    spec = _csv_job(tmp_path / "run", data, u_target=50, ci_ms=5.0, cp_ms=10.0)
    stats = run_job(spec)
    operator = build_operator(spec.operator)
    assert isinstance(operator, SessionAggregate)
    assert operator.describe().endswith("session gap=30ms")
    store = SqliteQueueStore(tmp_path / "run")
    got = _sorted(list(iter_payloads(store, "agg", operator.result_schema)))
    want = truth(rows)
    assert len(want) > 100
    assert any(r["count"] > 3 for r in want)
    assert got == want
    dead = sorted(r["reason"] for r in iter_payloads(store, "agg", DEAD_LETTER_SCHEMA, Kind.DEAD))
    assert [d.split(":")[0] for d in dead] == [r.split(":")[0] for r in reasons]
    assert stats.gchecks > 0  # the G-checks carried sessions whose first tuple moved back, too


def test_one_aggregate_keeps_the_key_and_value_columns() -> None:
    op = build_operator(aggregate_operator("k", "v", "sum", time="t", session_gap="1m"))
    assert isinstance(op, SessionAggregate) and op.session_gap_ms == 60_000
    assert [f["name"] for f in op.result_schema["fields"]] == [
        "key",
        "window",
        "value",
        "count",
        "start",
        "end",
    ]


# -- SIGKILL: three input partitions, each key on one ------------------------------------------------------

FLIGHT_SCHEMA = flight_schema("tests.sessions", ["arr_delay", "dep_delay"])


def partition_of(row: dict[str, Any], partitions: int = 3) -> int:
    return KEYS.index((row["carrier"], row["origin"])) % partitions


def write_queue(root: Path, rows: list[dict[str, Any]], partitions: int = 3) -> None:
    """An upstream cec queue of `rows`, each key's rows on one partition in their order."""
    parts = [[r for r in rows if partition_of(r, partitions) == p] for p in range(partitions)]
    write_partitions(root, parts, FLIGHT_SCHEMA)


def _queue_job(root: Path) -> JobSpec:
    return JobSpec(
        operator=aggregate_operator(
            "carrier",
            None,
            "avg",
            time="ts",
            session_gap=f"{GAP}ms",
            key_fields=["carrier", "origin"],
            aggs=AGGS,
        ),
        source={"type": "queue", "topic": "flights", "schema": FLIGHT_SCHEMA},
        store={"type": "sqlite", "root": str(root)},
        output_topic="agg",
        checkpointing=Checkpointing(u_target=60, ci_ms=5.0, cp_ms=10.0),
        batch_size=16,
    )


@pytest.mark.parametrize("during_recovery", [False, True], ids=["while-processing", "while-recovering"])
def test_sigkill_over_three_partitions_gives_the_failure_free_sessions_bit_for_bit(
    tmp_path: Path, during_recovery: bool
) -> None:
    rows = session_rows(7, 3000, longest=40)  # long sessions: their G-checks are in the EC
    reference = tmp_path / "reference"
    write_queue(reference, rows)
    run_job(_queue_job(reference))
    schema = build_operator(_queue_job(reference).operator).result_schema
    want = logged_result_bits(reference, schema)
    assert want == result_bits(truth(rows))
    assert len(want) > 100
    assert log_kinds(reference).count(Kind.GCHECK) > 100

    root = tmp_path / "crashed"
    write_queue(root, rows)
    spec = _queue_job(root)
    if during_recovery:
        crash_during_recovery(spec, tmp_path / "spec.json")
    assert run_after_crashes(spec, tmp_path / "spec.json", [("runtime.after_input", 1000)]) == 1
    assert logged_result_bits(root, schema) == want


# -- any value: a result or a dead letter, never an exception; in one run or tuple by tuple alike ---------


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), ROW), max_size=25), st.booleans())
def test_any_input_is_a_session_result_or_a_dead_letter_the_same_in_one_run_or_one_by_one(
    rows: list[tuple[int, dict[str, Any]]], watermarks: bool
) -> None:
    offsets = [0, 0]
    tuples = []
    for j, value in rows:
        tuples.append(InputTuple(j, offsets[j], value))
        offsets[j] += 1

    def build() -> SessionAggregate:
        return SessionAggregate(
            key_fields=["a", "b"],
            aggs=[("avg", "v"), ("sum", "w"), ("min", "v"), ("max", "w"), ("count", "v"), ("count", "*")],
            gap_ms=7,
            time_field="t",
            allowed_lateness=0 if watermarks else None,
        )

    operator = build()
    batch = every_record(operator, tuples, one_by_one=False)
    assert batch == every_record(build(), tuples, one_by_one=True)
    # Every tuple is in exactly one place: a closed session's count, an open slice's or session's, or a
    # dead letter (a slice closed without a result is in its session's count).
    results = AvroResults(operator)
    closed = sum(
        results(OutputRecord(Kind.R, 0, (), 0, payload=r[4]))["count"]
        for r in batch
        if r[0] is Kind.R and r[4] is not None
    )
    dead = sum(1 for r in batch if r[0] is Kind.DEAD)
    assert closed + dead + open_counts(operator, tuples) == len(tuples)
    for state in (operator.decode_state(r[3]) for r in batch if r[0] in (Kind.GOPEN, Kind.GCHECK)):
        assert state.start <= state.last  # a footprint's session is [first, last + gap)


# -- with watermarks: keys spread over input partitions, merges, results whatever the interleaving ---------

LATENESS = 5


def engine_records(operator: SessionAggregate, tuples: list[InputTuple], partitions: int) -> list[Any]:
    """(kind, result or None) of every R and DEAD record of the real engine over `tuples` in that order."""
    queue = MemoryQueue()
    codec = RecordCodec()
    instance = OperatorInstance(operator, OutputQueueSink(queue, codec, partitions), partitions)  # type: ignore[arg-type]
    instance.apply_run(tuples)
    results = AvroCodec(operator.result_schema)
    out: list[Any] = []
    for value, meta in queue.stored:
        record = codec.decode(value, meta)
        if record.kind is Kind.R:
            out.append(("R", None if record.payload is None else results.decode(record.payload)))
        elif record.kind is Kind.DEAD:
            out.append(("DEAD", None))
    return out


def _watermark_op(gap: int = GAP) -> SessionAggregate:
    return SessionAggregate(
        key_fields=["carrier", "origin"], aggs=AGGS, gap_ms=gap, time_field="ts", allowed_lateness=LATENESS
    )


def test_a_tuple_between_two_open_sessions_merges_them_in_any_order() -> None:
    def row(t: int, carrier: str = "AA") -> dict[str, Any]:
        return {"carrier": carrier, "origin": "JFK", "arr_delay": 1.5, "dep_delay": None, "ts": t}

    # [0, 30) on partition 0 and [50, 80) on partition 1; 25 on partition 2 is less than the gap from both.
    apart = [(0, row(0)), (1, row(50))]
    ends = [(j, row(500, "UA")) for j in range(3)]  # move the watermark past both
    for order in itertools.permutations([*apart, (2, row(25))]):
        offsets = [0, 0, 0]
        tuples = []
        for j, value in [*order, *ends]:
            tuples.append(InputTuple(j, offsets[j], value))
            offsets[j] += 1
        got = engine_records(_watermark_op(), tuples, 3)
        # One result for the merged session; the slice it took in ends with an R that carries none.
        assert [r for k, r in got if k == "R" and r is not None] == [
            {"carrier": "AA", "origin": "JFK", "window": 0, "avg_arr_delay": 1.5, "max_dep_delay": None,
             "count_arr_delay": 3, "count": 3, "start": 0, "end": 80}
        ]  # fmt: skip
        assert [k for k, r in got] == ["R", "R"]
    tuples = [InputTuple(j, 0, value) for j, value in apart] + [InputTuple(j, 1, v) for j, v in ends[:2]]
    tuples.append(InputTuple(2, 0, ends[2][1]))
    without = [r for k, r in engine_records(_watermark_op(), tuples, 3) if r is not None]
    assert [(r["start"], r["end"], r["count"]) for r in without] == [(0, 30, 1), (50, 80, 1)]


def test_the_watermark_closes_each_session_at_its_own_end_whatever_the_next_slice_holds() -> None:
    """Two sessions of one key in back-to-back slices (0 and 1, 1 and 2): as Spark's `session_window`, the
    first one's result comes once the watermark is at its end (50), not once the key's slices run out."""

    def row(t: int, carrier: str = "AA") -> dict[str, Any]:
        return {"carrier": carrier, "origin": "JFK", "arr_delay": float(t), "dep_delay": None, "ts": t}

    queue = MemoryQueue()
    codec = RecordCodec()
    operator = _watermark_op()
    instance = OperatorInstance(operator, OutputQueueSink(queue, codec, 3), 3)  # type: ignore[arg-type]
    offsets = [0, 0, 0]
    results = AvroCodec(operator.result_schema)

    def feed(values: list[tuple[int, dict[str, Any]]]) -> list[tuple[int, int, int]]:
        """Apply `values` (partition, row); the (start, end, count) of each result of AA they made."""
        seen = len(queue.stored)
        for j, value in values:
            instance.apply(InputTuple(j, offsets[j], value))
            offsets[j] += 1
        out = []
        for value, meta in queue.stored[seen:]:
            record = codec.decode(value, meta)
            if record.kind is Kind.R and record.payload is not None:
                r = results.decode(record.payload)
                if r["carrier"] == "AA":
                    out.append((r["start"], r["end"], r["count"]))
        return out

    def watermark_to(w: int) -> list[tuple[int, int, int]]:
        return feed([(j, row(w + LATENESS, "UA")) for j in range(3)])

    # [0, 50) in slice 0; [55, 110) in slices 1 and 2 (55 is the gap after 20 or more: a new session).
    assert feed([(0, row(0)), (1, row(20)), (2, row(55)), (0, row(80))]) == []
    assert watermark_to(49) == []
    assert watermark_to(50) == [(0, 50, 2)]  # W at its end: it closes; the slices after it stay open
    assert instance.registry.get(operator._part(["AA", "JFK", 1])) is not None
    assert watermark_to(109) == []
    assert watermark_to(110) == [(55, 110, 2)]
    assert instance.registry.get(operator._part(["AA", "JFK", 2])) is None
    # A tuple in a closed session's slice, behind the watermark: a dead letter, not a second session.
    dead = len(queue.stored)
    assert feed([(1, row(25))]) == []
    assert codec.decode(*queue.stored[dead]).kind is Kind.DEAD


def partition_rows(seed: int, per_partition: int, partitions: int = 3) -> list[list[dict[str, Any]]]:
    """Per input partition, flights with event times that never decrease there; every key on every
    partition, so sessions take tuples from several partitions and merge."""
    rnd = random.Random(seed)
    out = []
    for p in range(partitions):
        t = rnd.randrange(0, GAP)
        rows = []
        for i in range(per_partition):
            t += rnd.randrange(0, GAP) if rnd.random() < 0.9 else rnd.randrange(GAP, 8 * GAP)
            key = rnd.choice(KEYS[:6])
            h = rnd.randrange(1 << 30)
            rows.append(
                {
                    "carrier": key[0],
                    "origin": key[1],
                    "arr_delay": None if h % 11 == 0 else ((h % 2001) - 1000) * 10.0 ** (h % 13 - 6),
                    "dep_delay": None if h % 13 == 0 else float(h % 300) / 3,
                    "ts": t,
                    "i": p * per_partition + i,
                }
            )
        out.append(rows)
    return out


def watermark_truth(parts: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The sessions closed by the final watermark (`tests.helpers.truth.watermark_session_truth`)."""
    return watermark_session_truth(parts, GAP, LATENESS, AGGS)


def _interleave(parts: list[list[dict[str, Any]]], rnd: random.Random) -> list[InputTuple]:
    cursors = [0] * len(parts)
    out = []
    while True:
        left = [j for j, p in enumerate(parts) if cursors[j] < len(p)]
        if not left:
            return out
        j = rnd.choice(left)
        value = {k: v for k, v in parts[j][cursors[j]].items() if k != "i"}
        out.append(InputTuple(j, cursors[j], value))
        cursors[j] += 1


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6), st.randoms(use_true_random=False))
def test_watermark_sessions_do_not_depend_on_how_partitions_interleave(seed: int, rnd: random.Random) -> None:
    parts = partition_rows(seed, 60)
    runs = []
    for _ in range(2):
        got = engine_records(_watermark_op(), _interleave(parts, rnd), 3)
        assert all(kind == "R" for kind, _ in got)  # times never decrease per partition: nothing is late
        runs.append(result_bits([r for _, r in got if r is not None]))
    assert runs[0] == runs[1] == result_bits(watermark_truth(parts))


def _watermark_job(root: Path) -> JobSpec:
    return JobSpec(
        operator=aggregate_operator(
            "carrier",
            None,
            "avg",
            time="ts",
            session_gap=f"{GAP}ms",
            allowed_lateness=f"{LATENESS}ms",
            key_fields=["carrier", "origin"],
            aggs=AGGS,
        ),
        source={"type": "queue", "topic": "flights", "schema": FLIGHT_SCHEMA},
        store={"type": "sqlite", "root": str(root)},
        output_topic="agg",
        checkpointing=Checkpointing(u_target=60, ci_ms=5.0, cp_ms=10.0),
        batch_size=16,
    )


@pytest.mark.parametrize("during_recovery", [False, True], ids=["while-processing", "while-recovering"])
def test_sigkill_with_keys_over_three_partitions_and_watermarks_gives_the_failure_free_sessions(
    tmp_path: Path, during_recovery: bool
) -> None:
    parts = partition_rows(11, 600)
    reference = tmp_path / "reference"
    write_partitions(reference, parts, FLIGHT_SCHEMA)
    run_job(_watermark_job(reference))
    schema = build_operator(_watermark_job(reference).operator).result_schema
    want = logged_result_bits(reference, schema)
    assert want == result_bits(watermark_truth(parts))
    kinds = log_kinds(reference)
    assert len(want) > 300 and kinds.count(Kind.GCHECK) > 100
    assert kinds.count(Kind.R) - len(want) > 50  # merged sessions' slices: an R without a result each

    root = tmp_path / "crashed"
    write_partitions(root, parts, FLIGHT_SCHEMA)
    spec = _watermark_job(root)
    if during_recovery:
        crash_during_recovery(spec, tmp_path / "spec.json")
    assert run_after_crashes(spec, tmp_path / "spec.json", [("runtime.after_input", 700)]) == 1
    assert logged_result_bits(root, schema) == want


def test_a_log_cut_after_any_record_recovers_the_failure_free_sessions(tmp_path: Path) -> None:
    """Recovery from every prefix of the log (each record a possible crash point), folds cut midway
    included, gives the failure-free sessions: each once, none lost."""
    tuples = _interleave(partition_rows(5, 40), random.Random(1))
    codec = RecordCodec()

    def run(operator: SessionAggregate, feed: list[InputTuple], recovery: Any = None) -> list[OutputRecord]:
        queue = MemoryQueue()
        sink = OutputQueueSink(queue, codec, 3)  # type: ignore[arg-type]
        instance = OperatorInstance(operator, sink, 3)
        if recovery is not None:
            sink.floor(recovery.checkpoint.crash_pos)
            instance.restore(recovery)
        instance.apply_run(feed)
        return [codec.decode(value, meta) for value, meta in queue.stored]

    operator = _watermark_op()
    results = AvroCodec(operator.result_schema)

    def rows(records: list[OutputRecord]) -> list[str]:
        got = [results.decode(r.payload) for r in records if r.kind is Kind.R and r.payload is not None]
        return result_bits(got)

    want = run(operator, tuples)
    folds = sum(1 for r in want if r.kind is Kind.R and r.payload is None)
    assert folds > 5 and len(rows(want)) > 20
    for cut in range(1, len(want)):
        store = SqliteQueueStore(tmp_path / f"cut{cut}")
        store.create_topic("agg", 1)
        with store.writer("agg", 0) as writer:
            for record in want[:cut]:
                writer.append(codec.encode(record), record.meta())
        with store.reader("agg", 0) as reader:
            recovery = RecoveryManager(reader, operator.decode_state).recover(3)
        start = recovery.plan.start
        rest = run(_watermark_op(), [t for t in tuples if t.offset >= start[t.partition]], recovery)
        assert rows(want[:cut] + rest) == rows(want), f"log cut after {cut} records"


def test_a_session_whose_slices_sum_past_the_largest_double_is_exact_and_its_fold_reads_back() -> None:
    big = 1.5e308
    # Three neighbouring slices of one session: their exact sum is `big`, though the first two pass
    # every double.
    values = [(29, big), (31, big), (60, -big)]  # slices 0, 1 and 2, each less than the gap apart
    tuples = [InputTuple(0, o, {"k": "a", "v": v, "t": t}) for o, (t, v) in enumerate(values)]
    tuples.append(InputTuple(1, 0, {"k": "b", "v": 0.0, "t": 1000}))  # the watermark: both partitions'
    tuples.append(InputTuple(0, len(values), {"k": "b", "v": 0.0, "t": 1000}))

    def build() -> SessionAggregate:
        return SessionAggregate(
            key_fields=["k"],
            aggs=[("sum", "v"), ("count", "*")],
            gap_ms=30,
            time_field="t",
            allowed_lateness=0,
        )

    operator = build()
    records = every_record(operator, tuples, one_by_one=False)
    results = AvroResults(operator)
    (row,) = [
        results(OutputRecord(Kind.R, 0, (), 0, payload=r[4])) for r in records if r[0] is Kind.R and r[4]
    ]
    assert (row["sum_v"], row["count"], row["start"], row["end"]) == (big, 3, 29, 90)
    folded = [operator.decode_state(r[3]) for r in records if r[0] is Kind.GCHECK]
    assert [s.count for s in folded] == [2, 3]  # each receiver's footprint reads back, past OVERFLOW too
