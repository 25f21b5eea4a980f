"""Hopping windows (`cec run --window-time D --slide S`, `operators.hopping`): results against a plain-Python
truth (CSV; a 3-partition JSON topic on the broker), exact recovery under SIGKILL with keys spread over 3
input partitions, the state's bytes, and the flags' mistakes (one line, exit 2, before any work)."""

from __future__ import annotations

import csv
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cec.config import Checkpointing
from cec.exceptions import BadTupleError, ConfigError
from cec.records import Kind, RecordCodec
from operators.aggregate import canonical_key
from operators.base import InputTuple
from operators.hopping import HoppingAggregate, PaneRun, decode_panes, encode_panes
from operators.job import JobSpec, aggregate_operator, build_operator, run_job
from operators.multi_state import ColumnState, MultiState
from queuestore.base import RecordMeta
from queuestore.sqlite import SqliteQueueStore
from tests.brokers import Broker
from tests.helpers import cec
from tests.helpers.crash_plans import run_after_crashes
from tests.helpers.engine_runs import ROW, every_record
from tests.helpers.flight_queues import flight_schema, logged_result_bits, write_partitions
from tests.helpers.truth import csv_results, hopping_truth
from tests.topic_data import create_topic, produce

MINUTE = 60_000
AGGS = ["avg:delay", "sum:delay", "min:delay", "max:delay", "count:delay", "count:*"]


def flights(n: int, seed: int, *, in_order: bool) -> list[dict[str, Any]]:
    """Flights over 2 hours: 4 carriers x 3 origins, delays with nulls; in time order, or with tuples up to
    90 minutes behind (late ones among them under a watermark)."""
    rnd = random.Random(seed)
    rows = []
    t = 0
    for _ in range(n):
        t += rnd.randrange(0, 40_000)
        ts = t if in_order else max(0, t - rnd.choice([0, 0, 0, 0, rnd.randrange(90 * MINUTE)]))
        rows.append(
            {
                "carrier": rnd.choice(["AA", "UA", "DL", "B6"]),
                "origin": rnd.choice(["JFK", "SFO", "ORD"]),
                "delay": None if rnd.random() < 0.1 else rnd.randrange(-4000, 40000) / 8,
                "ts": ts,
            }
        )
    return rows


def write_flights(path: Path, rows: list[dict[str, Any]]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["carrier", "origin", "delay", "ts"])
        for r in rows:
            writer.writerow(
                [r["carrier"], r["origin"], "" if r["delay"] is None else repr(r["delay"]), r["ts"]]
            )
    return path


# -- cec run over a CSV ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "aggs", "lateness"),
    [
        (["carrier", "origin"], AGGS, None),
        (["carrier", "origin"], AGGS, "0"),
        (["carrier"], ["avg:delay"], "5m"),
        (["origin"], ["max:delay", "count:*"], None),
    ],
)
def test_cec_run_csv_gives_every_hopping_window_of_the_truth(
    tmp_path: Path, keys: list[str], aggs: list[str], lateness: str | None
) -> None:
    rows = flights(600, seed=len(keys) + len(aggs), in_order=lateness is None)
    data = write_flights(tmp_path / "flights.csv", rows)
    more = [] if lateness is None else ["--allowed-lateness", lateness]
    agg_flags = [a for agg in aggs for a in ("--agg", agg)]
    out = cec(
        "run", str(data), "--key", ",".join(keys), *agg_flags, "--time", "ts", "--window-time", "1h",
        "--slide", "15m", *more, "--results", str(tmp_path / "out.csv"),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    lateness_ms = None if lateness is None else {"0": 0, "5m": 5 * MINUTE}[lateness]
    want = hopping_truth(rows, keys, 60 * MINUTE, 15 * MINUTE, aggs, lateness_ms)
    got = csv_results(tmp_path / "out.csv")
    assert len(want) > 20
    assert got == want
    # Late tuples are counted dead letters, not lost (the out-of-order input has some under a watermark).
    dead = list(csv.DictReader((tmp_path / "out.dead-letters.csv").open()))
    accepted = sum(1 for _ in rows) - len(dead)
    assert accepted > 0 and all("late" in d["reason"] for d in dead)
    if lateness == "0":
        assert dead


def test_single_aggregate_keeps_the_value_column_and_counts_print_as_integers(tmp_path: Path) -> None:
    rows = [{"carrier": "AA", "origin": "JFK", "delay": 1.5 * i, "ts": i * 7 * MINUTE} for i in range(20)]
    data = write_flights(tmp_path / "f.csv", rows)
    out = cec(
        "run", str(data), "--key", "carrier", "--value", "delay", "--agg", "count", "--time", "ts",
        "--window-time", "30m", "--slide", "10m", "--results", str(tmp_path / "out.csv"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    header = (tmp_path / "out.csv").read_text().splitlines()[0]
    assert header == "key,window,value,count,start,end"
    got = csv_results(tmp_path / "out.csv")
    want = hopping_truth(rows, ["carrier"], 30 * MINUTE, 10 * MINUTE, ["count:delay"], None)
    assert [r["count"] for r in got] == [r["count"] for r in want]
    assert all(r["value"] == r["count"] for r in got)  # `count` prints as an integer


# -- bad flags: one clear line, exit 2, before any work ------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--window-time", "15m", "--slide", "1h"],
            "the slide (3600000 ms) is larger than the window (900000 ms)",
        ),
        (["--window-count", "5", "--slide", "1m"], "--slide needs --window-time"),
        (
            ["--window-time", "1h", "--slide", "7m"],
            "the slide (420000 ms) must divide the window (3600000 ms)",
        ),
        (["--window-time", "1h", "--slide", "soon"], "soon"),
    ],
)
def test_a_bad_slide_is_one_line_and_exit_2_before_any_work(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    data = write_flights(tmp_path / "f.csv", flights(10, 1, in_order=True))
    store = tmp_path / "store"
    out = cec(
        "run", str(data), "--key", "carrier", "--value", "delay", "--time", "ts", *flags,
        "--results", str(tmp_path / "out.csv"), "--store-dir", str(store),
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr
    assert not (tmp_path / "out.csv").exists()
    assert not store.exists() or not any(store.iterdir())


# -- the engine, tuple by tuple --------------------------------------------------------------------------


def _operator(lateness: int | None = None) -> HoppingAggregate:
    return HoppingAggregate(
        key_fields=["k"], aggs=[("sum", "v"), ("count", "*")], window_ms=60, slide_ms=20,
        time_field="ts", allowed_lateness=lateness,
    )  # fmt: skip


def _run(
    operator: HoppingAggregate, tuples: list[dict[str, Any]], kinds: list[str] | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """The results and dead letters of `tuples`; `kinds`, if given, gets every record's kind in log order."""
    from cec.records import AvroCodec
    from operators.engine.instance import OperatorInstance
    from operators.local_sink import OutputQueueSink

    class Queue:
        def __init__(self) -> None:
            self.stored: list[tuple[bytes, RecordMeta]] = []

        def append(self, value: bytes, meta: RecordMeta) -> None:
            self.stored.append((value, meta))

    queue = Queue()
    codec = RecordCodec()
    instance = OperatorInstance(operator, OutputQueueSink(queue, codec, 1), 1)  # type: ignore[arg-type]
    instance.apply_run([InputTuple(0, i, v) for i, v in enumerate(tuples)])
    results = AvroCodec(operator.result_schema)
    rows, dead = [], []
    for value, meta in queue.stored:
        record = codec.decode(value, meta)
        if kinds is not None:
            kinds.append(meta.kind)
        if meta.kind == Kind.R.value:
            rows.append(results.decode(record.payload))
        elif meta.kind == Kind.DEAD.value:
            dead.append(meta.kind)
    return rows, dead


def test_one_g_open_per_key_and_period_and_one_record_per_result() -> None:
    # Key "a": one tuple every 10 ms for 300 ms: 5 periods of 60 ms, k = 3 windows per time.
    tuples = [{"k": "a", "v": 1.0, "ts": t} for t in range(0, 300, 10)]
    operator = _operator()
    kinds: list[str] = []
    rows, _ = _run(operator, tuples, kinds)
    counts = Counter(kinds)
    assert counts["GOPEN"] == 5  # one per period, not one per window (3 per period)
    # Windows ending by 290 (the last tuple): ends 20, 40, ..., 280: 14 results, one record each.
    assert [(r["start"], r["count"]) for r in rows] == [
        (s, len(range(max(s, 0), s + 60, 10))) for s in range(-40, 230, 20)
    ]
    assert counts["R"] == len(rows) == 14


def test_a_late_tuple_is_a_dead_letter_and_goes_into_no_window() -> None:
    tuples = [{"k": "a", "v": 1.0, "ts": 0}, {"k": "a", "v": 1.0, "ts": 45}, {"k": "a", "v": 100.0, "ts": 10}]
    tuples.append({"k": "a", "v": 1.0, "ts": 200})
    rows, dead = _run(_operator(), tuples)
    assert len(dead) == 1  # ts 10: its pane [0, 20) ended before 45, so window [-40, 20) had closed
    assert all(r["sum_v"] < 100 for r in rows)

    # Under a watermark a tuple goes into its windows still open: at watermark 45 the one at 10 misses
    # [-40, 20) and [-20, 40), which closed, and joins [0, 60); at watermark 130 every window of 10 has closed.
    late = [*tuples[:3], {"k": "a", "v": 1.0, "ts": 130}, {"k": "a", "v": 1000.0, "ts": 10}, tuples[3]]
    rows, dead = _run(_operator(lateness=0), late)
    assert len(dead) == 1
    sums = {r["start"]: r["sum_v"] for r in rows}
    assert sums[-40] == 1.0 and sums[-20] == 1.0 and sums[0] == 102.0 and sums[20] == 1.0


@given(
    st.lists(
        st.lists(
            st.one_of(
                st.none(), st.floats(allow_nan=False, allow_infinity=False, width=64).filter(lambda x: x != 0)
            ),
            min_size=1,
            max_size=4,
        ),
        min_size=1,
        max_size=5,
    )
)
def test_a_pane_run_decodes_to_what_was_encoded(columns_per_pane: list[list[float | None]]) -> None:
    from operators import exact_sum
    from operators.multi_state import empty_column

    width = len(columns_per_pane[0])
    panes = []
    for i, xs in enumerate(columns_per_pane):
        xs = (xs + [None] * width)[:width]
        cols = [empty_column() if x is None else ColumnState(1, exact_sum.exact(x), x, x) for x in xs]
        panes.append(MultiState(1, i * 20 - 40, i * 20 - 35, cols))
    run = PaneRun(panes)
    assert decode_panes(encode_panes(run), width) == run
    data = encode_panes(run)
    for cut in range(len(data)):
        with pytest.raises(ValueError):
            decode_panes(data[:cut], width)


@given(st.binary(max_size=80), st.integers(min_value=0, max_value=3))
def test_any_bytes_decode_to_a_pane_run_or_a_value_error(data: bytes, columns: int) -> None:
    for head in (b"", b"\x03", b"\x04", b"\x03\x01"):
        try:
            run = decode_panes(head + data, columns)
        except ValueError:
            continue
        assert run.panes and all(len(p.columns) == columns for p in run.panes)
        assert decode_panes(encode_panes(run), columns) == run


def test_bad_configurations_are_refused() -> None:
    with pytest.raises(ConfigError, match="larger than the window"):
        build_operator(aggregate_operator("k", "v", "avg", window_time="1m", time="ts", slide="2m"))
    with pytest.raises(ConfigError, match="needs a time window"):
        HoppingAggregate(key_fields=["k"], aggs=[("avg", "v")], window_ms=None, slide_ms=5, time_field="ts")
    with pytest.raises(BadTupleError):
        _operator().key_of({"v": 1.0, "ts": 3})


# -- SIGKILL: 3 input partitions, keys spread over all of them, watermarks ---------------------------------

FLIGHT_SCHEMA = flight_schema("tests.hopping", ["delay"])


def _queue_parts(partitions: int, *, spread: bool) -> list[list[dict[str, Any]]]:
    """Per input partition, flights with event times rising; `spread`: every key on every partition, else
    each carrier on one partition."""
    parts = []
    for p in range(partitions):
        rows = []
        for i in range(1200):
            h = ((i * partitions + p) * 2654435761) % 2**32
            carrier = ["AA", "UA", "DL", "B6"][h % 4] if spread else ["AA", "UA", "DL"][p]
            rows.append(
                {
                    "carrier": carrier,
                    "origin": ["JFK", "SFO", "ORD"][(h >> 5) % 3],
                    # Magnitudes far apart: float `+` rounds differently in another order.
                    "delay": None if h % 17 == 0 else ((h % 2001) - 1000) * 10.0 ** ((h >> 9) % 24 - 8),
                    "ts": i * 4 + p,
                }
            )
        parts.append(rows)
    return parts


def _queue_job(root: Path, lateness: str | None) -> JobSpec:
    return JobSpec(
        operator=aggregate_operator(
            "carrier",
            None,
            "avg",
            window_time="100ms",
            slide="25ms",
            time="ts",
            allowed_lateness=lateness,
            key_fields=["carrier", "origin"],
            aggs=[("avg", "delay"), ("sum", "delay"), ("max", "delay"), ("count", "*")],
        ),
        source={"type": "queue", "topic": "flights", "schema": FLIGHT_SCHEMA},
        store={"type": "sqlite", "root": str(root)},
        output_topic="agg",
        checkpointing=Checkpointing(u_target=200, ci_ms=5.0, cp_ms=10.0),
        batch_size=16,
    )


@pytest.mark.parametrize(
    ("lateness", "crashes"),
    [
        ("0", [("runtime.after_input", 1400)]),
        ("0", [("runtime.before_append", 700), ("external", 1800), ("runtime.replaying", 150)]),
        (None, [("runtime.after_input", 1500), ("runtime.replaying", 100)]),
    ],
)
def test_sigkill_during_processing_and_recovery_gives_the_failure_free_results_bit_for_bit(
    tmp_path: Path, lateness: str | None, crashes: list[tuple[str, int]]
) -> None:
    parts = _queue_parts(3, spread=lateness is not None)  # without a watermark: a key on one partition
    reference = tmp_path / "reference"
    write_partitions(reference, parts, FLIGHT_SCHEMA)
    run_job(_queue_job(reference, lateness))
    schema = build_operator(_queue_job(reference, lateness).operator).result_schema
    want = logged_result_bits(reference, schema)
    assert len(want) > 300

    root = tmp_path / "crashed"
    write_partitions(root, parts, FLIGHT_SCHEMA)
    assert run_after_crashes(_queue_job(root, lateness), tmp_path / "spec.json", crashes) >= 1
    assert logged_result_bits(root, schema) == want


# -- a 3-partition JSON topic on the broker --------------------------------------------------------------


def test_cec_run_on_a_three_partition_json_topic_gives_the_truth(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    # `cec run --input-topic` runs one instance per input partition: each (carrier, origin) lives on one
    # partition (as a producer keyed by it puts it), event times rise, some rows come up to 30 minutes late.
    partitions = 3
    rnd = random.Random(5)
    keys = [(c, o) for c in ("AA", "UA", "DL") for o in ("JFK", "SFO")]
    records: list[tuple[int, bytes | None, bytes | None]] = []
    per_partition: list[list[dict[str, Any]]] = [[] for _ in range(partitions)]
    for i in range(1200):
        carrier, origin = rnd.choice(keys)
        p = keys.index((carrier, origin)) % partitions
        late = rnd.random() < 0.1
        row = {
            "carrier": carrier,
            "origin": origin,
            "delay": None if rnd.random() < 0.05 else rnd.randrange(-400, 4000) / 4,
            "ts": max(0, i * 7_000 - (rnd.randrange(30 * MINUTE) if late else 0)),
        }
        per_partition[p].append(row)
        records.append((p, f"{carrier}|{origin}".encode(), json.dumps(row).encode()))
    topic = f"flights-{random.Random().randrange(1 << 30)}"
    create_topic(kafka_broker.bootstrap, topic, partitions)
    produce(kafka_broker.bootstrap, topic, records)
    aggs = ["avg:delay", "max:delay", "count:delay", "count:*"]
    out = cec(
        "run", "--input-topic", topic, "--bootstrap-servers", kafka_broker.bootstrap, "--format", "json",
        "--key", "carrier,origin", *[a for agg in aggs for a in ("--agg", agg)], "--time", "ts",
        "--window-time", "10m", "--slide", "2m", "--allowed-lateness", "1m", "--results", str(tmp_path / "out.csv"),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    want = sorted(
        (
            r
            for rows in per_partition
            for r in hopping_truth(rows, ["carrier", "origin"], 10 * MINUTE, 2 * MINUTE, aggs, MINUTE)
        ),
        key=lambda r: json.dumps(r, sort_keys=True),
    )
    assert len(want) > 150
    assert csv_results(tmp_path / "out.csv") == want
    dead = list(csv.DictReader((tmp_path / "out.dead-letters.csv").open()))
    assert dead and all("late" in d["reason"] for d in dead)


# -- a crash that cut a tuple's records: the log ends inside them -------------------------------------------


def _cut_log(root: Path, topic: str, before: int) -> None:
    """Keep only the first `before` records of the output log (a SQLite partition), as if the writer had
    made only that prefix durable when the operator died."""
    import sqlite3

    conn = sqlite3.connect(root / topic / "0.sqlite", isolation_level=None)
    try:
        conn.execute("DELETE FROM log WHERE offset >= ?", (before,))
    finally:
        conn.close()


@pytest.mark.parametrize("lateness", ["0", None])
def test_a_log_cut_inside_a_tuples_records_recovers_to_the_failure_free_results(
    tmp_path: Path, lateness: str | None
) -> None:
    import shutil

    reference = tmp_path / "reference"
    write_partitions(reference, _queue_parts(3, spread=lateness is not None), FLIGHT_SCHEMA)
    run_job(_queue_job(reference, lateness))
    schema = build_operator(_queue_job(reference, lateness).operator).result_schema
    want = logged_result_bits(reference, schema)
    # Cut points inside a tuple's records: after a result (of a window or a part) that a later record of
    # the same tuple follows (same pos), at both kinds: results that close no part, and a part's R.
    codec = RecordCodec()
    with SqliteQueueStore(reference).reader("agg", 0) as reader:
        records = reader.read_forward(0, 1 << 20)
    decoded = [codec.decode(r.value, r.meta) for r in records]
    inside = [
        i + 1
        for i in range(len(decoded) - 1)
        if decoded[i].kind is Kind.R
        and decoded[i + 1].kind is Kind.R
        and decoded[i].pos == decoded[i + 1].pos
    ]
    by_part = [i for i in inside if decoded[i - 1].key is not None]
    plain = [i for i in inside if decoded[i - 1].key is None]
    assert by_part and plain
    cuts = [
        *by_part[len(by_part) // 3 :: max(1, len(by_part) // 3)][:2],
        *plain[len(plain) // 2 :: len(plain)][:2],
    ]
    for cut in cuts:
        root = tmp_path / f"cut-{cut}"
        shutil.copytree(reference, root)
        _cut_log(root, "agg", cut)
        run_job(_queue_job(root, lateness))
        assert logged_result_bits(root, schema) == want, f"cut at {cut}"


# -- any input: a result or a dead letter, never an exception; in one run or tuple by tuple alike ---------


@settings(max_examples=120, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 1), ROW), max_size=25),
    st.booleans(),
)
def test_any_input_is_a_result_or_a_dead_letter_the_same_in_one_run_or_one_by_one(
    rows: list[tuple[int, dict[str, Any]]], watermarks: bool
) -> None:
    offsets = [0, 0]
    tuples = []
    for j, value in rows:
        tuples.append(InputTuple(j, offsets[j], value))
        offsets[j] += 1

    def build() -> HoppingAggregate:
        return HoppingAggregate(
            key_fields=["a", "b"],
            aggs=[("avg", "v"), ("sum", "w"), ("min", "v"), ("max", "w"), ("count", "v"), ("count", "*")],
            window_ms=20, slide_ms=5, time_field="t", allowed_lateness=0 if watermarks else None,
        )  # fmt: skip

    batch = every_record(build(), tuples, one_by_one=False)
    assert batch == every_record(build(), tuples, one_by_one=True)


# -- a part's id: the key's fields as json.dumps writes them, whatever text they hold ----------------------


_KEY_TEXT = st.one_of(
    st.text(max_size=8),
    st.sampled_from(['a"b', "a\\b", "tab\there", "\x7f", "é", "k1", " k ", "[1]", '","']),
    st.integers(min_value=-(10**6), max_value=10**6),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_KEY_TEXT, min_size=1, max_size=3))
def test_a_parts_key_is_what_json_dumps_writes_for_any_key_text(values: list[object]) -> None:
    """The part ids in the log must not change with the shorter path for plain ASCII keys: every key is
    json.dumps's array of its fields' canonical keys, or the same one-line error for a missing field."""
    fields = [f"k{i}" for i in range(len(values))]
    op = HoppingAggregate(key_fields=fields, aggs=[("count", "*")], window_ms=20, slide_ms=5, time_field="t")
    row = dict(zip(fields, values, strict=True))
    try:
        parts = [canonical_key(row[f], f) for f in fields]
    except BadTupleError as exc:
        with pytest.raises(BadTupleError) as raised:
            op._key_json(row)
        assert raised.value.reason == exc.reason
        return
    if any(p is None for p in parts):
        with pytest.raises(BadTupleError, match="missing key"):
            op._key_json(row)
        return
    assert op._key_json(row) == json.dumps(parts, ensure_ascii=False, separators=(",", ":"))
