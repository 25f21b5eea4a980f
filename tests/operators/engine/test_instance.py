"""The engine's contract (`operators/engine/instance.py`), checked identically through both hosts.

Each test runs once per host through the `host` fixture, in the pattern of the queue-store conformance
suite (tests/queuestore/conformance): the local host's path (an `OperatorInstance` whose records go
through the local `OutputQueueSink` into a fake output queue kept in memory) and the Spark host's (the
attached query's `CecAggregateProcessor` for one state partition, driven without a JVM: packed input rows
in, rows out, stamped into records by the sink's own rule). The assertions are on what both hosts promise
alike: which records exist, in which order per key, what results and dead letters hold, which record
claims its tuple, the event-time marks; not on what each stamps its own way (a record's time, N).

Tuples are fed in (j, o) order, the order the Spark processor applies a call's tuples in.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
import pytest
from pyspark.sql.types import StringType

from cec.exceptions import CecError
from cec.records import AvroCodec, Kind, OutputRecord, RecordCodec
from operators.aggregate import RESULT_SCHEMA, KeyedAggregate
from operators.base import DEAD_LETTER_SCHEMA, InputTuple
from operators.engine.instance import OperatorInstance
from operators.engine.phase import Phase
from operators.local_sink import OutputQueueSink
from operators.spark.packing import Packer, PackSpec, packed_schema
from operators.spark.processor import EMIT_COLUMNS, AggregateSpec, CecAggregateProcessor, partition_groups
from operators.spark.sink import _Cursor, split_controls, stamped
from operators.spark.stamping import log_order
from queuestore.base import RecordMeta
from queuestore.sqlite import SqliteQueueStore
from recovery.contract import NO_MARK, PositionStamper, ReplayContract
from recovery.exceptions import ReplayDivergenceError
from recovery.manager import RecoveryManager

PARTITIONS = 2
CODEC = RecordCodec()
RESULTS = AvroCodec(RESULT_SCHEMA)
DEAD = AvroCodec(DEAD_LETTER_SCHEMA)

# One input tuple: (partition, offset, key, value, event time, error, raw).
Row = tuple[int, int, str | None, Any, int | None, str | None, str | None]


def row(j: int, o: int, key: str, value: Any, t: int | None = None) -> Row:
    return (j, o, key, value, t, None, None)


class Host(Protocol):
    name: str

    def feed(self, rows: Sequence[Row]) -> None: ...

    def records(self) -> list[OutputRecord]: ...


# -- the local host -------------------------------------------------------------------------------------
class _MemoryQueue:
    """What the local sink appends to, kept in memory: (value, meta) pairs."""

    def __init__(self) -> None:
        self.stored: list[tuple[bytes, RecordMeta]] = []

    def append(self, value: bytes, meta: RecordMeta) -> None:
        self.stored.append((value, meta))

    def append_run(self, kind: str, time: int, keys: list[str], seqs: list[int], values: list[bytes]) -> None:
        for key, seq, value in zip(keys, seqs, values, strict=True):
            self.stored.append((value, RecordMeta(kind, time, key, seq)))


class LocalHost:
    name = "local"

    def __init__(
        self, operator: KeyedAggregate, *, recovery: Any = None, closed: dict[str, int] | None = None
    ) -> None:
        self.queue = _MemoryQueue()
        self.sink = OutputQueueSink(self.queue, CODEC, PARTITIONS)  # type: ignore[arg-type]
        known = closed or {}  # the stream index's directory of closed windows, locally
        self.instance = OperatorInstance(operator, self.sink, PARTITIONS, closed_seq=known.get)
        if recovery is not None:
            self.sink.floor(recovery.checkpoint.crash_pos)
            self.instance.restore(recovery)

    def feed(self, rows: Sequence[Row]) -> None:
        tuples = []
        for j, o, key, value, t, error, raw in rows:
            if error is not None:
                tuples.append(InputTuple(j, o, None, error, raw))
            else:
                tuples.append(InputTuple(j, o, {"k": key, "v": value, **({} if t is None else {"t": t})}))
        self.instance.apply_run(tuples)

    def records(self) -> list[OutputRecord]:
        return [CODEC.decode(value, meta) for value, meta in self.queue.stored]


# -- the Spark host -------------------------------------------------------------------------------------
class _State:
    def __init__(self) -> None:
        self.value: Any = None

    def get(self) -> Any:
        return self.value

    def update(self, value: Any) -> None:
        self.value = value


class _Handle:
    def __init__(self) -> None:
        self.state = _State()

    def getValueState(self, name: str, schema: Any) -> _State:
        return self.state

    def registerTimer(self, at: int) -> None:
        pass


class _Timers:
    def getCurrentProcessingTimeInMs(self) -> int:
        return 0


def _plain_row(values: Sequence[Any]) -> tuple[Any, ...]:
    """A row as the sink reads it from Arrow: Python ints, lists, None."""
    out: list[Any] = []
    for v in values:
        if v is None or isinstance(v, (bytes, str)):
            out.append(v)
        elif isinstance(v, float) and pd.isna(v):
            out.append(None)
        elif hasattr(v, "tolist"):
            out.append(v.tolist())
        else:
            out.append(v)
    return tuple(out)


class SparkHost:
    name = "spark"

    def __init__(
        self,
        spec: AggregateSpec,
        *,
        crash: tuple[int, ...] | None = None,
        marks: tuple[int, ...] = (),
        end: tuple[int, int] = (0, 0),
        initial: pd.DataFrame | None = None,
    ) -> None:
        crash = crash or (0,) * PARTITIONS
        self.group = partition_groups(1)[0]
        self.processor = CecAggregateProcessor(spec, [[crash]], 0, None, [self.group], [marks], [end[1]])
        self.processor.init(_Handle())  # type: ignore[arg-type]
        if initial is not None:
            self.processor.handleInitialState((self.group,), initial, _Timers())  # type: ignore[arg-type]
        self.packer = Packer(PackSpec((1,), "k", "v", spec.time), packed_schema(
            StringType(), StringType() if spec.time else None, errors=True, generations=1
        ))  # fmt: skip
        self.has_time = spec.time is not None
        self.cursor = _Cursor(PositionStamper(crash), end[0], end[1])
        self.made: list[OutputRecord] = []
        self.controls: list[dict[str, Any]] = []  # the partition's control rows (figures), as reported

    def feed(self, rows: Sequence[Row]) -> None:
        frames = []
        for j in sorted({r[0] for r in rows}):
            mine = [r for r in rows if r[0] == j]
            values = [r[6] if r[5] is not None else json.dumps(r[3]) for r in mine]  # as the topic source
            times = [None if r[4] is None else json.dumps(r[4]) for r in mine] if self.has_time else None
            batch = self.packer.pack(j, [r[1] for r in mine], [r[2] for r in mine], values, times,
                                     [r[5] for r in mine])  # fmt: skip
            frames.append(batch.to_pandas())
        out = list(self.processor.handleInputRows((self.group,), iter(frames[::-1]), _Timers()))  # type: ignore[arg-type]
        table = pd.concat(out, ignore_index=True)
        records, controls = split_controls(
            [_plain_row(r) for r in table[EMIT_COLUMNS].itertuples(index=False, name=None)]
        )
        self.controls.extend(json.loads(c) for c in controls)
        self.made.extend(stamped(log_order(records), self.cursor, self.has_time))

    def records(self) -> list[OutputRecord]:
        return list(self.made)


# -- the suite ------------------------------------------------------------------------------------------
def _spec(**kw: Any) -> AggregateSpec:
    base: dict[str, Any] = {"agg": "sum", "window_count": None, "window_ms": None, "time": None}
    base.update(kw)
    return AggregateSpec("k", "v", base["agg"], base["window_count"], base["window_ms"], base["time"],
                         json_values=True, allowed_lateness=base.get("allowed_lateness"))  # fmt: skip


def _host(kind: str, spec: AggregateSpec) -> Host:
    return LocalHost(spec.build()) if kind == "local" else SparkHost(spec)


@pytest.fixture(params=["local", "spark"])
def host_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _results(records: list[OutputRecord]) -> list[dict[str, Any]]:
    return [RESULTS.decode(r.payload) for r in records if r.kind is Kind.R and r.payload is not None]


def _by_key(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        out.setdefault(r["key"], []).append(r)
    return out


def _per_key(records: list[OutputRecord]) -> dict[str, list[tuple[str, int]]]:
    out: dict[str, list[tuple[str, int]]] = {}
    for r in records:
        if r.key is not None:
            out.setdefault(r.key, []).append((r.kind.value, r.seq))
    return out


def _count_rows() -> list[Row]:
    """Two input partitions, each key in one of them; windows of 3 leave some open at the end."""
    rows = []
    for o in range(14):
        for j in range(PARTITIONS):
            rows.append(row(j, o, f"k{j}{o % 3}", float(10 * j + o)))
    return sorted(rows)


def test_windows_results_and_gopens_are_the_same_on_both_hosts(host_kind: str) -> None:
    host = _host(host_kind, _spec(window_count=3))
    host.feed(_count_rows())
    records = host.records()
    got = sorted((r["key"], r["window"], r["value"], r["count"]) for r in _results(records))
    want = []
    for j in range(PARTITIONS):
        for m in range(3):
            values = [float(10 * j + o) for o in range(14) if o % 3 == m]
            for w in range(len(values) // 3):
                want.append((f"k{j}{m}", w, sum(values[3 * w : 3 * w + 3]), 3))
    assert got == sorted(want)
    # Every window is G-opened by its first tuple (still open after it), then closed by its R, in order.
    per_key = _per_key(records)
    for key, kinds in per_key.items():
        windows = len([k for k in kinds if k[0] == "GOPEN"])
        assert kinds[: 2 * (windows - 1)] == [(k, w) for w in range(windows - 1) for k in ("GOPEN", "R")], key
    assert [r.kind for r in records].count(Kind.GOPEN) == sum(
        1 for kinds in per_key.values() for k in kinds if k[0] == "GOPEN"
    )


def test_a_window_closed_by_its_opening_tuple_has_no_gopen(host_kind: str) -> None:
    host = _host(host_kind, _spec(window_count=1))
    host.feed([row(0, o, "a", 1.0) for o in range(3)])
    assert [r.kind for r in host.records()] == [Kind.R] * 3


def test_the_last_record_of_a_tuple_claims_it(host_kind: str) -> None:
    # A time window rolls over: the tuple at 12 closes [0, 10) (R) and opens [10, 20) (G-open).
    host = _host(host_kind, _spec(window_ms=10, time="t"))
    host.feed([row(0, 0, "a", 1.0, 1), row(0, 1, "a", 2.0, 12)])
    records = host.records()
    assert [(r.kind, r.seq) for r in records] == [(Kind.GOPEN, 0), (Kind.R, 0), (Kind.GOPEN, 1)]
    assert [r.pos[0] for r in records] == [1, 1, 2]  # the R does not claim tuple 1, the G-open does
    assert _results(records) == [{"key": "a", "window": 0, "value": 1.0, "count": 1, "start": 0, "end": 10}]


def test_dead_letters_have_one_form(host_kind: str) -> None:
    host = _host(host_kind, _spec(window_count=5))
    raw = '{"k": "a", "v": 1.0, broken'
    host.feed([
        row(0, 0, "a", 1.0),
        (1, 0, None, None, None, "not JSON: expecting property name", raw),  # the source could not read it
        row(1, 1, "b", "abc"),  # the operator refuses it
    ])  # fmt: skip
    dead = [DEAD.decode(r.payload) for r in host.records() if r.kind is Kind.DEAD and r.payload]
    assert dead == [
        {"partition": 1, "offset": 0, "reason": "not JSON: expecting property name", "raw": raw},
        {"partition": 1, "offset": 1, "reason": "value 'v' is not a number: 'abc'",
         "raw": json.dumps({"k": "b", "v": "abc"})},
    ]  # fmt: skip


def test_watermarks_close_idle_windows_and_refuse_late_tuples(host_kind: str) -> None:
    host = _host(host_kind, _spec(window_ms=10, time="t", allowed_lateness=0))
    rows = [row(0, 0, "idle", 5.0, 1), row(1, 0, "b", 1.0, 3)]
    rows += [row(0, o, "a", 1.0, 10 * o) for o in range(1, 4)] + [row(1, 1, "b", 2.0, 25)]
    rows += [row(1, 2, "late", 9.0, 4)]  # its window [0, 10) ends before the watermark (W = 25 - 0)
    host.feed(sorted(rows))
    records = host.records()
    closed = {(r["key"], r["start"]) for r in _results(records)}
    assert ("idle", 0) in closed  # closed by the watermark: "idle" never came back
    dead = [DEAD.decode(r.payload) for r in records if r.kind is Kind.DEAD and r.payload]
    assert [d["reason"].split(":")[0] for d in dead] == ["late"] and dead[0]["offset"] == 2
    idle = next(r for r in records if r.kind is Kind.R and r.key == "idle")
    assert len(idle.marks) == PARTITIONS and min(idle.marks) > NO_MARK


# -- recovery through both hosts --------------------------------------------------------------------------
def _prefix_store(tmp: Path, records: list[OutputRecord], cut: int) -> SqliteQueueStore:
    store = SqliteQueueStore(tmp)
    store.create_topic("agg", 1)
    with store.writer("agg", 0) as writer:
        for record in records[:cut]:
            writer.append(CODEC.encode(record), record.meta())
    return store


def _recovered(
    host_kind: str, spec: AggregateSpec, store: SqliteQueueStore, prefix: list[OutputRecord]
) -> Host:
    operator = spec.build()
    with store.reader("agg", 0) as reader:
        recovery = RecoveryManager(reader, operator.decode_state).recover(PARTITIONS)
    closed: dict[str, int] = {}
    for r in prefix:
        if r.kind is Kind.R and r.key is not None:
            closed[r.key] = max(closed.get(r.key, -1), r.seq)
    if host_kind == "local":
        return LocalHost(operator, recovery=recovery, closed=closed)
    ec = recovery.checkpoint
    assert ec.crash_pos is not None
    footprints = {key: fp.record for key, fp in ec.windows.items()}
    lines = [(w.key, w.seq, True, operator.encode_state(w.state), 0, list(footprints[w.key].pos),
              footprints[w.key].time) for w in recovery.windows]  # fmt: skip
    lines += [(k, s + 1, False, None, -1, None, None) for k, s in closed.items() if k not in ec.windows]
    initial = pd.DataFrame(lines, columns=["cec_key", "seq", "open", "state", "fp_gen", "pos_w", "fp_time"])
    last = prefix[-1]
    return SparkHost(spec, crash=tuple(ec.crash_pos), marks=tuple(ec.marks), end=(last.n, last.time),
                     initial=initial)  # fmt: skip


@pytest.mark.parametrize("watermarks", [False, True])
def test_a_restored_instance_replays_to_the_failure_free_output(
    host_kind: str, tmp_path: Path, watermarks: bool
) -> None:
    spec = _spec(window_ms=30, time="t", allowed_lateness=0 if watermarks else None)
    # Two drifting partitions: partition 1 runs ahead in offsets, both keep event times increasing.
    rows = sorted([row(0, o, f"a{o % 4}", float(o), 2 * o) for o in range(60)]
                  + [row(1, o, f"b{o % 3}", float(o), o) for o in range(120)])  # fmt: skip
    reference = _host(host_kind, spec)
    reference.feed(rows)
    want = reference.records()
    for cut in (len(want) // 3, (2 * len(want)) // 3):
        prefix = want[:cut]
        store = _prefix_store(tmp_path / f"{host_kind}-{cut}", want, cut)
        recovered = _recovered(host_kind, spec, store, prefix)
        with store.reader("agg", 0) as reader:
            start = RecoveryManager(reader, spec.build().decode_state).recover(PARTITIONS).plan.start
        recovered.feed([r for r in rows if r[1] >= start[r[0]]])
        got = prefix + recovered.records()
        assert _by_key(_results(got)) == _by_key(_results(want)), cut
        assert len(_results(got)) == len(_results(want))


def test_a_replay_that_disagrees_with_the_log_fails(host_kind: str, tmp_path: Path) -> None:
    spec = _spec(window_count=3)
    rows = [row(0, o, "a", 1.0) for o in range(2)] + [row(0, 2, "b", 1.0)]
    reference = _host(host_kind, spec)
    reference.feed(rows)
    want = reference.records()  # a's window holds 2 tuples at the crash point (b's G-open)
    store = _prefix_store(tmp_path, want, len(want))
    recovered = _recovered(host_kind, spec, store, want)
    # Another input below the crash point: a's window would close there, with its R already... nowhere.
    changed = [row(0, 0, "a", 1.0), row(0, 1, "a", 1.0), row(0, 2, "a", 1.0), row(0, 3, "c", 1.0)]
    with pytest.raises(ReplayDivergenceError, match="the log and the replay disagree") as raised:
        recovered.feed(changed)
    assert isinstance(raised.value, CecError)  # one line from the CLI, never a traceback


def test_tuples_held_back_under_a_watermark_go_on_when_offsets_have_gaps() -> None:
    """A Spark state partition sees only its own keys' tuples: after a crash its next tuple on a partition
    may lie well past that partition's crash point (here 4 on partition 0, with the partition's last
    tuple below it at 1). That tuple proves the partition reached its crash point; held back until
    partition 1 reaches its own, it is then applied (before: held for ever, and every later one too)."""
    operator = _spec(window_ms=10, time="t", allowed_lateness=0).build()
    rows = _MemoryQueue()
    instance = OperatorInstance(operator, OutputQueueSink(rows, CODEC, PARTITIONS), PARTITIONS)  # type: ignore[arg-type]
    instance.resume(([0, 0], 0, [0, 0], [], [], True), ReplayContract((0, 0), (3, 2), {}))
    replay = [InputTuple(0, 1, {"k": "a", "v": 1.0, "t": 1})]  # below partition 0's crash point: skipped
    past = [InputTuple(0, 4, {"k": "a", "v": 2.0, "t": 4}), InputTuple(0, 6, {"k": "a", "v": 3.0, "t": 15})]
    instance.apply_run(replay + past)
    assert instance.phase is Phase.RESTORING and not rows.stored  # partition 1 still replays
    instance.apply_run([InputTuple(1, 1, {"k": "b", "v": 1.0, "t": 2})])  # its last tuple below 2: skipped
    assert instance.phase is Phase.RUNNING
    records = [CODEC.decode(v, m) for v, m in rows.stored]
    # The held tuples, in their order: a@4 opens a's window, a@15 closes it and opens the next.
    assert [(r.kind, r.key, r.pos[0]) for r in records] == [
        (Kind.GOPEN, "a", 5),
        (Kind.R, "a", 6),
        (Kind.GOPEN, "a", 7),
    ]


@pytest.mark.parametrize("time_field", [None, "t"])
def test_a_state_partitions_oldest_footprint_time_is_that_footprints_time_in_the_log(
    time_field: str | None,
) -> None:
    """What trimming finds the oldest footprint's offset by (`operators.spark.trim`): the time a state
    partition reports is the logical time the sink stamps on that footprint, with event times that go back
    and forth (the log's time is their running maximum) and without a time field (sum(pos))."""
    spec = _spec(window_ms=30, time="t") if time_field else _spec(window_count=3)
    host = SparkHost(spec)
    times = [50, 20, 70, 65, 10, 90, 120, 80, 200, 130, 60, 300]
    batches = [
        [row(o % 2, o // 2, f"k{o % 5}", 1.0, times[o] if time_field else None) for o in range(b, b + 4)]
        for b in range(0, len(times), 4)
    ]
    for batch in batches:
        host.feed(sorted(batch))
        latest: dict[str, int] = {}  # per key its open window's latest footprint's time, as stamped
        for record in host.made:
            assert record.key is not None or record.kind is Kind.DEAD
            if record.kind in (Kind.GOPEN, Kind.GCHECK) and record.key is not None:
                latest[record.key] = record.time
            elif record.kind is Kind.R and record.key is not None:
                latest.pop(record.key, None)
        figures = [c for c in host.controls if c.get("entry") == "figures"][-1]
        assert figures["footprint_time"] == (min(latest.values()) if latest else None)
        assert figures["restoring"] is False
    assert any(r.kind is Kind.R for r in host.made)  # windows closed on the way, footprints moved on
