"""The CEC operator of an attached aggregation, on the executors (`operators.spark.attach`).

`CecAggregateProcessor` runs under `groupBy(cec_group).transformWithStateInPandas`, where the grouping
value stands for one output partition q of the current generation (`partition_groups`: a value that Spark's
shuffle hash sends to state partition q). So each task calls the processor once per micro-batch with all
the rows of its partition, and the partition's window state is one ValueState holding every key's state
(`_PartitionState`, pickled): one state get and one update per partition and micro-batch, instead of
exists/get/update per key (each a round trip to the JVM's state server) and a pandas frame per key. Spark
still versions that state per micro-batch, so task retries and the exactly-once of the sink are as before.
Within a call the processor drives `operators.aggregate.KeyedAggregate` over the whole partition through
`_PartitionContext` (an `OperatorContext`), so the aggregation math and the state codec are the
operator's. It emits rows for R, G-open and DEAD, each with (j, o, emission index, kind, key, seq,
state/payload bytes, event time, N delta); the sink (`operators.spark.sink`) turns them into records.

Per-key order: Spark does not order a group's rows, so the processor orders the partition's tuples by
(j, o) as it unpacks them (`operators.spark.packing.unpack`), which orders every key's tuples. As in
DESIGN-NOTES section 2, exactness needs each key to live in one input partition.

Replay: the processor applies the replay contract (`recovery.contract.tuple_fate`) per key, with the key's
own crash point C_k (`operators.spark.planning`): with an EC window, apply a tuple only if o >= pos_w[j];
otherwise skip it if o < C_k[j]; a tuple applied below C_k[j] only rebuilds state and emits nothing (not
even DEAD; an R or G-open there means log and replay disagree, and fails the query).

Input: packed rows (`operators.spark.packing`) of the cec-kafka source (typed value and time) or of the
cec-topic source
(`AggregateSpec.json_values`: value and time as JSON text, and `cec_error`, the reason a record could not
be read, which becomes a DEAD record with its partition and offset).

G-checks (`operators.spark.checkpointing`: the user's `Checkpointing` under the local runtime's policies,
Q/U targets, a recovery target, cost-benefit; timeMode "ProcessingTime"):
- each task measures the input with `seen`: per input partition, the next offset after the rows it got
  in this micro-batch (timers fire after a micro-batch's input rows, in the same task and processor);
- a window records `fp_clock`, the pos its latest footprint carries in the log (`pos_w` for a window
  loaded from the EC; computed with the sink's own stamping rule, `operators.spark.stamping`, from the
  partition's `stamp`), and `fp_out`, the partition's records emitted in this run then; its partition has
  one processing-time timer while it holds a live open window, firing every CP ms at most;
- when it fires, the partition's live windows are taken oldest footprint first, and G-checked while the
  policy wants the front one (`choose_gchecks`: u and q of the window plus one micro-batch of look-ahead)
  and the task's budget (`cec.schedule.CheckpointSchedule`, CI of every CP, or what a recovery target
  picked) has credit; the rates the policy plans with are the partition's own (`PartitionControl`, kept
  in the partition's state);
- only a *live* window is G-checked: one whose key had a tuple past its crash point C_k. Before that a
  loaded window may still miss tuples of its key below C_k that later micro-batches replay, and a
  footprint written now would claim them.
The G-check row carries the key's last applied tuple (j, o); its state holds that tuple and all before.

Figures: after its input rows, and again after its G-checks, a state partition reports its open windows
and the lowest footprint pos among them (`_PartitionState.figures`, a control row): the extent figures of
the query's progress come from one small row per partition and micro-batch, never from per-key rows.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle, TimerValues
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from cec.exceptions import BadTupleError
from cec.records import AvroCodec, Kind
from cec.registry import OpenWindow, WindowRegistry
from operators.aggregate import RESULT_SCHEMA, KeyedAggregate
from operators.base import DEAD_LETTER_SCHEMA, InputTuple
from operators.spark.checkpointing import GCheckSpec, PartitionControl, WindowMark, choose_gchecks

# The grouping column (one value per output partition of the current generation: `partition_groups`) and
# per tuple its output partition in every generation (for C_k; only across generations): see packing.
from operators.spark.packing import GROUP_COLUMN, QS_COLUMN, unpack
from operators.spark.partitioning import output_partition, partition_groups, spark_hash_long
from operators.spark.stamping import positions
from recovery.contract import PositionStamper, TupleFate, tuple_fate

__all__ = [
    "CONTROL_KIND",
    "EMIT_COLUMNS",
    "EMIT_SCHEMA",
    "FIGURES_ENTRY",
    "GCHECK_ORDER",
    "GROUP_COLUMN",
    "INIT_SCHEMA",
    "PARTITION_STATE_SCHEMA",
    "QS_COLUMN",
    "STATE_SCHEMA",
    "AggregateSpec",
    "CecAggregateProcessor",
    "GCheckSpec",
    "output_partition",
    "partition_groups",
    "spark_hash_long",
]

STATE_NAME = "cec_partition"
# CEC_SPARK_PROFILE=DIR: every handleInputRows call dumps a cProfile of its work to DIR (benchmarks).
PROFILE_ENV = "CEC_SPARK_PROFILE"
# What the processor keeps per state partition: `_PartitionState`, pickled (see the module doc).
PARTITION_STATE_SCHEMA = StructType([StructField("blob", BinaryType(), False)])

# What the initial state gives per key (one open window at most: tumbling windows).
STATE_SCHEMA = StructType(
    [
        StructField("seq", LongType(), False),  # the open window's seq, or the next seq when none is open
        StructField("open", BooleanType(), False),
        StructField("state", BinaryType(), True),  # KeyedAggregate.encode_state of the open window
        StructField("fp_gen", LongType(), False),  # generation whose log holds its latest footprint; -1: none
        StructField("pos_w", ArrayType(LongType(), False), True),  # EC-loaded window: input below is in it
        # G-checks (GCheckSpec): may the window be G-checked (its last tuple was processed past the key's
        # crash point), the input position when its latest footprint was made, the key's last applied
        # tuple (j, o), its output partition, and the processing-time timer registered (-1: none).
        StructField("live", BooleanType(), False),
        StructField("fp_clock", ArrayType(LongType(), False), True),
        StructField("last_j", LongType(), False),
        StructField("last_o", LongType(), False),
        StructField("q", LongType(), False),
        StructField("timer", LongType(), False),
    ]
)
INIT_SCHEMA = StructType([StructField("cec_key", StringType(), True), *STATE_SCHEMA.fields])
# One row per record the operator produces; the sink turns them into OutputRecords.
EMIT_SCHEMA = StructType(
    [
        StructField("cec_q", LongType(), False),  # output partition in the current generation
        StructField("cec_j", LongType(), False),  # input partition of the tuple that produced it
        StructField("cec_o", LongType(), False),  # its offset
        StructField("cec_i", LongType(), False),  # emission order among that tuple's records
        StructField("cec_kind", StringType(), False),
        StructField("cec_key", StringType(), True),
        StructField("cec_seq", LongType(), False),
        StructField("cec_state", BinaryType(), True),
        StructField("cec_payload", BinaryType(), True),
        StructField("cec_t", LongType(), False),  # the tuple's event time, -1 if none
        StructField("cec_dn", LongType(), False),  # change of N
    ]
)
EMIT_COLUMNS = [f.name for f in EMIT_SCHEMA.fields]
# The emission index of a G-check row (the sink writes G-checks after a partition's other records).
GCHECK_ORDER = 1 << 30
# The kind of a row that is not a record: a state partition's checkpoint controls (what it planned and
# said), JSON in cec_payload, for the query's progress. The sinks take it out before writing.
CONTROL_KIND = "CTRL"
# The `entry` of a control row that carries a partition's extent figures (`_PartitionState.figures`) rather
# than its checkpoint controls.
FIGURES_ENTRY = "figures"


@dataclass(frozen=True)
class AggregateSpec:
    """The aggregate's configuration; picklable (shipped to the Python workers inside the processor).
    `json_values`: the value and time columns hold JSON text (the cec-topic source), decoded here."""

    key: str
    value: str
    agg: str
    window_count: int | None
    window_ms: int | None
    time: str | None
    json_values: bool = False

    def build(self) -> KeyedAggregate:
        return KeyedAggregate(
            key_field=self.key,
            value_field=self.value,
            agg=self.agg,
            window_count=self.window_count,
            window_ms=self.window_ms,
            time_field=self.time,
        )


_Emission = tuple[str, str | None, int, bytes | None, bytes | None, int]  # kind, key, seq, state, payload, dN


class _Key:
    """One key's facts in a state partition: its open window (if any) and the recovery and G-check facts.

    `fp_gen`: generation whose log holds the open window's latest footprint (-1: none); `pos_w`: for a
    window loaded from the EC, the input below which it holds every tuple; `live`: its last tuple was
    processed past the key's crash point (G-checks allowed); `fp_clock`: the task's input position when
    its latest footprint was made; (`last_j`, `last_o`): the key's last applied tuple."""

    __slots__ = ("fp_clock", "fp_gen", "fp_out", "last_j", "last_o", "live", "next_seq", "pos_w", "window")

    def __init__(self) -> None:
        self.next_seq = 0
        self.window: OpenWindow | None = None
        self.fp_gen = -1
        self.pos_w: tuple[int, ...] | None = None
        self.live = False
        self.fp_clock: tuple[int, ...] | None = None
        self.fp_out = 0  # the partition's records emitted in this run when its latest footprint was made
        self.last_j = self.last_o = -1


# A key as saved in the partition's state: (next_seq, open seq or -1, AggState fields or None, fp_gen,
# pos_w, live, fp_clock, last_j, last_o, fp_out). Plain tuples: the pickle of a partition stays one C-level
# pass.
_Saved = tuple[int, int, tuple[Any, ...] | None, int, Any, bool, Any, int, int, int]


def _save(k: _Key) -> _Saved:
    w = k.window
    if w is None:
        return (k.next_seq, -1, None, -1, None, False, None, k.last_j, k.last_o, 0)
    s = w.state
    return (
        k.next_seq,
        w.seq,
        (s.count, s.total, s.lo, s.hi, s.start, s.last),
        k.fp_gen,
        k.pos_w,
        k.live,
        k.fp_clock,
        k.last_j,
        k.last_o,
        k.fp_out,
    )


def _load(key: str, saved: _Saved) -> _Key:
    from operators.aggregate import AggState

    k = _Key()
    next_seq, seq, state, fp_gen, pos_w, live, fp_clock, last_j, last_o, fp_out = saved
    k.next_seq, k.last_j, k.last_o = next_seq, last_j, last_o
    if seq >= 0 and state is not None:
        k.window = OpenWindow(key, seq, AggState(*state), 0, 0, 0, 0)
        k.fp_gen, k.pos_w, k.live, k.fp_clock, k.fp_out = fp_gen, pos_w, live, fp_clock, fp_out
    return k


class _PartitionState:
    """A state partition's keys (as `_Saved` tuples), its output partition q, its timer (-1: none), its
    checkpointing measurements (`PartitionControl`) and `stamp`: the pos of the last record its rows have
    made so far (`operators.spark.stamping`; the log's crash point before any), from which the exact
    position of every footprint it makes follows."""

    __slots__ = ("control", "keys", "q", "stamp", "timer")

    def __init__(
        self,
        q: int,
        stamp: tuple[int, ...],
        keys: dict[str | None, _Saved] | None = None,
        timer: int = -1,
        control: PartitionControl | None = None,
    ) -> None:
        self.q = q
        self.stamp = stamp
        self.keys: dict[str | None, _Saved] = keys if keys is not None else {}
        self.timer = timer
        self.control = control if control is not None else PartitionControl()

    def dump(self) -> tuple[bytes]:
        state = (self.q, self.timer, self.keys, self.control, self.stamp)
        return (pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL),)

    @classmethod
    def load(cls, row: Any) -> _PartitionState:
        q, timer, keys, control, stamp = pickle.loads(bytes(row[0]))
        return cls(q, stamp, keys, timer, control)

    def figures(self, phase: int, tuples: int = 0) -> tuple[Any, ...]:
        """The partition's extent figures as a control row (`FIGURES_ENTRY`): its open windows and, per
        input partition, the lowest pos among their latest footprints; `tuples`: the input tuples it was
        handed in this call (packed rows hide them from Spark's own counts). `phase` orders the rows of
        one micro-batch (0: after its input, 1: after its G-checks)."""
        clocks = [saved[6] for saved in self.keys.values() if saved[1] >= 0 and saved[6] is not None]
        lowest = [min(column) for column in zip(*clocks, strict=True)] if clocks else None
        report = {"partition": self.q, "entry": FIGURES_ENTRY, "phase": phase, "open_windows": len(clocks),
                  "footprint_min": lowest, "tuples": tuples}  # fmt: skip
        return (self.q, -1, -1, 0, CONTROL_KIND, None, -1, None, json.dumps(report).encode(), -1, 0)


class _PartitionContext:
    """`OperatorContext` of one state partition for one call: KeyedAggregate drives it exactly as it
    drives `OperatorRuntime`; this class records what the runtime would emit (R on close, G-open once the
    tuple is done if its window is still open) and the per-key recovery facts (`_Key`). Keys are loaded
    from the partition's saved state when their first row of the call comes (`touch`)."""

    def __init__(self, operator: KeyedAggregate, saved: _PartitionState, generation: int) -> None:
        self.operator = operator
        self.saved = saved
        self.generation = generation
        self.keys: dict[str | None, _Key] = {}  # touched in this call
        self._registry = WindowRegistry()
        self._result_codec = AvroCodec(RESULT_SCHEMA)
        self._dead_codec = AvroCodec(DEAD_LETTER_SCHEMA)
        self._time = 0
        self.event_time = -1  # of the tuple last applied; -1 when it has none
        self._key: _Key = _Key()
        self._opened: OpenWindow | None = None
        self._silent = False
        self._out: list[_Emission] = []

    def touch(self, key: str | None) -> _Key:
        k = self.keys.get(key)
        if k is None:
            stored = self.saved.keys.get(key)
            k = _load(key, stored) if stored is not None and key is not None else _Key()
            if stored is not None and key is None:
                k.next_seq = stored[0]
            self.keys[key] = k
            if k.window is not None:
                self._registry.open(k.window)
        return k

    def store(self) -> None:
        """Write the touched keys back into the partition's saved state."""
        keys = self.saved.keys
        for key, k in self.keys.items():
            keys[key] = _save(k)

    # OperatorContext
    @property
    def registry(self) -> WindowRegistry:
        return self._registry

    @property
    def time(self) -> int:
        return self._time

    def open_window(self, key: str, state: Any) -> OpenWindow:
        k = self._key
        window = OpenWindow(key, k.next_seq, state, self._time, self._time, 0, 0)
        k.next_seq += 1
        self._registry.open(window)
        k.window = window
        self._opened = window
        k.fp_gen = -1
        k.pos_w = None
        return window

    def close_window(self, key: str, result: Mapping[str, Any]) -> None:
        window = self._registry.close(key)
        k = self._key
        if self._silent:
            raise RuntimeError(
                f"replay below the crash point closed window {window.seq} of {key!r}: the log and the "
                "replay disagree"
            )
        # N counts the windows whose latest footprint is in this generation's log (operators.spark.generations).
        dn = -1 if k.fp_gen == self.generation else 0
        self._out.append((_R, key, window.seq, None, self._result_codec.encode(result), dn))
        k.window = None
        k.fp_gen = -1
        k.pos_w = None
        k.live = False
        k.fp_clock = None

    def emit(self, result: Mapping[str, Any]) -> None:
        raise RuntimeError("a keyed aggregate emits results only by closing windows")

    # driving
    def apply(self, k: _Key, tup: InputTuple, silent: bool) -> list[_Emission]:
        """Apply one tuple of key `k`; the records it produces (none when `silent`: rebuilding below the
        crash point)."""
        out: list[_Emission] = []
        self._out = out
        self._key = k
        self._opened = None
        self._silent = silent
        self.event_time = -1
        k.last_j, k.last_o = tup.partition, tup.offset
        if tup.value is None:  # the source could not decode it (or a field is missing): a dead letter
            if not silent:
                self._dead(tup, tup.error or "undecodable input", "")
            return out
        try:
            event_time = self.operator.event_time(tup.value)
            if event_time is not None:
                self.event_time = event_time
                if event_time > self._time:
                    self._time = event_time
            self.operator.process(tup, self)
        except BadTupleError as exc:  # state unchanged (the operator's contract)
            if not silent:
                self._dead(tup, exc.reason, json.dumps(dict(tup.value), default=str, sort_keys=True))
            return out
        opened = self._opened
        if opened is not None and k.window is opened:  # not opened-and-closed
            if silent:
                raise RuntimeError(
                    f"replay below the crash point opened window {opened.seq} of {opened.key!r}: the log "
                    "and the replay disagree"
                )
            k.fp_gen = self.generation
            out.append((_GOPEN, opened.key, opened.seq, self.operator.encode_state(opened.state), None, 1))
        return out

    def _dead(self, tup: InputTuple, reason: str, raw: str) -> None:
        payload = self._dead_codec.encode(
            {"partition": tup.partition, "offset": tup.offset, "reason": reason, "raw": raw}
        )
        self._out.append((_DEAD, None, -1, None, payload, 0))

    def gcheck(self, k: _Key) -> _Emission:
        """A G-check of `k`'s open window: its state as of the key's last applied tuple."""
        window = k.window
        assert window is not None
        dn = 0 if k.fp_gen == self.generation else 1  # its latest footprint moves into this log
        k.fp_gen = self.generation
        return (_GCHECK, window.key, window.seq, self.operator.encode_state(window.state), None, dn)


_R, _GOPEN, _GCHECK, _DEAD = Kind.R.value, Kind.GOPEN.value, Kind.GCHECK.value, Kind.DEAD.value


def _plain(value: Any) -> Any:
    """pandas hands nullable integer columns over as float64 with NaN; the operator expects None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if hasattr(value, "item"):  # numpy scalar -> Python scalar
        return value.item()
    return value


def _from_json(text: Any) -> Any:
    return None if text is None else json.loads(text)


class CecAggregateProcessor(StatefulProcessor):
    """The CEC operator of one state partition at a time under transformWithStateInPandas (module doc)."""

    def __init__(
        self,
        spec: AggregateSpec,
        crash_points: list[list[tuple[int, ...]]],
        generation: int,
        gcheck: GCheckSpec | None = None,
        groups: Sequence[int] | None = None,
    ) -> None:
        self.spec = spec
        self.crash_points = crash_points
        self.generation = generation
        self.gcheck = gcheck
        # Grouping value -> output partition q of the current generation.
        partitions = len(crash_points[generation]) if crash_points else 1
        self.group_q = {g: q for q, g in enumerate(groups or partition_groups(partitions))}
        self.partitions = partitions
        # Durations within a task (G-check cost, task time) and wall time between micro-batches (which may
        # run in other Python workers); attributes so that tests can drive them.
        self.clock = time.perf_counter
        self.wall = time.time

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.operator = self.spec.build()
        self.handle = handle
        self.state = handle.getValueState(STATE_NAME, PARTITION_STATE_SCHEMA)
        # One processor per task: the input positions its rows reached in this micro-batch (next offsets),
        # the clock that G-check decisions measure replay with; and the task's G-check budget.
        self.seen = [0] * len(self.crash_points[0][0])
        self.task_started = self.clock()
        self.schedule = self.gcheck.schedule(self.clock) if self.gcheck is not None else None
        if self.schedule is not None:
            self.schedule.start()

    def _partition(self, group: Any) -> _PartitionState:
        row = self.state.get()  # None when the partition has no state yet (one round trip, no exists())
        if row is not None:
            part = _PartitionState.load(row)
        else:
            q = self.group_q[int(group)]
            part = _PartitionState(q, tuple(self.crash_points[self.generation][q]))
        if self.gcheck is not None:
            part.control.take_planned(self.gcheck.planned, self.partitions, self.wall())
        return part

    def handleInitialState(self, key: Any, initialState: Any, timerValues: TimerValues) -> None:
        """The keys the recovery plan loads into this partition (may come in several chunks)."""
        started = self.clock()
        part = self._partition(key[0])
        keys = part.keys
        columns = [initialState[c].tolist() for c in ("cec_key", "seq", "open", "state", "fp_gen", "pos_w")]
        decode = self.operator.decode_state
        for k, seq, is_open, state, fp_gen, pos_w in zip(*columns, strict=True):
            seq = int(seq)
            if is_open and k is not None:
                s = decode(bytes(state))
                window_pos = tuple(int(p) for p in pos_w)
                # Loaded windows are not live (G-checked only after a tuple past the key's crash point);
                # their footprint clock is pos_w.
                fields = (s.count, s.total, s.lo, s.hi, s.start, s.last)
                keys[k] = (seq + 1, seq, fields, int(fp_gen), window_pos, False, window_pos, -1, -1, 0)
            else:
                keys[k] = (seq, -1, None, -1, None, False, None, -1, -1, 0)
        windows = sum(1 for is_open in columns[2] if is_open)
        part.control.observe_load(windows, self.clock() - started)  # the EC load, measured where it runs
        self.state.update(part.dump())

    def _crash_point(self, qs: Sequence[int]) -> list[int]:
        """C_k: component-wise max over generations of the crash point of the key's partition there."""
        vectors = [self.crash_points[g][int(q)] for g, q in enumerate(qs)]
        return [max(v[j] for v in vectors) for j in range(len(vectors[0]))]

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Iterator[Any]:
        profile_dir = os.environ.get(PROFILE_ENV)
        if not profile_dir:
            yield from self._input_rows(key, rows, timerValues)
            return
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
        try:
            out = list(self._input_rows(key, rows, timerValues))
        finally:
            profile.disable()
            profile.dump_stats(str(Path(profile_dir) / f"processor-{os.getpid()}-{time.time_ns()}.prof"))
        yield from out

    def _input_rows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Iterator[Any]:
        import pandas as pd

        frames = list(rows)
        if not frames:
            return
        spec = self.spec
        names = ["cec_key", "cec_v", *(["cec_time"] if spec.time else [])]
        if spec.json_values:
            names.append("cec_error")
        if QS_COLUMN in frames[0].columns:
            names.append(QS_COLUMN)
        # In input order (packing.unpack): the operator's per-key order is the input order.
        columns = unpack(frames, names)
        part = self._partition(key[0])
        ctx = _PartitionContext(self.operator, part, self.generation)
        n = len(columns["cec_j"])
        if spec.json_values:
            values = [_from_json(v) for v in columns["cec_v"]]
            times = [_from_json(t) for t in columns["cec_time"]] if spec.time else [None] * n
            errors = columns["cec_error"]
        else:
            values = [_plain(v) for v in columns["cec_v"]]
            times = [_plain(t) for t in columns["cec_time"]] if spec.time else [None] * n
            errors = [None] * n
        seen = self.seen
        q = part.q
        # With one generation a key's crash point is its partition's (C_k = t_c[q]): the query sends no
        # per-row output partitions then (`QS_COLUMN`), only across generations.
        qs_column = columns.get(QS_COLUMN)
        own_crash = list(self.crash_points[self.generation][q])
        out_base = part.control.out
        crash_of: dict[str | None, list[int]] = {}  # C_k of the keys met in this call
        key_field, value_field, time_field = spec.key, spec.value, spec.time
        out: list[tuple[Any, ...]] = []
        for idx, (j, o, k, v, t, err) in enumerate(
            zip(
                columns["cec_j"],
                columns["cec_o"],
                columns["cec_key"],
                values,
                times,
                errors,
                strict=True,
            )
        ):
            if o >= seen[j]:
                seen[j] = o + 1
            crash = crash_of.get(k)
            if crash is None:  # k is canonical: the source packed it through `canonical_key`
                crash = crash_of[k] = own_crash if qs_column is None else self._crash_point(qs_column[idx])
            state = ctx.touch(k)
            # The replay contract (recovery.contract), per key: C_k is the key's crash point.
            fate = tuple_fate(o, crash[j], None if state.pos_w is None else state.pos_w[j])
            if fate is TupleFate.SKIP:
                continue
            silent = fate is TupleFate.REBUILD
            if err is not None:
                tup = InputTuple(j, o, None, err)
            else:
                value: dict[str, Any] = {key_field: k, value_field: v}
                if time_field:
                    value[time_field] = t
                tup = InputTuple(j, o, value)
            emitted = ctx.apply(state, tup, silent)
            if not silent and state.window is not None:
                state.live = True  # its state now holds every tuple of the key below this one
            if not emitted:
                continue
            event_time = ctx.event_time
            for i, (kind, rkey, seq, wstate, payload, dn) in enumerate(emitted):
                if kind == _GOPEN:
                    state.fp_out = out_base + len(out) + 1
                out.append((q, j, o, i, kind, rkey, seq, wstate, payload, event_time, dn))
        # Each new footprint's pos, exactly as the sink stamps it (`out` is in log order: the rows were
        # applied by (j, o) and emitted in order): the window's footprint clock.
        stamper = PositionStamper(part.stamp)
        touched = ctx.keys
        for row, pos in zip(out, positions(out, stamper), strict=True):
            if row[4] == _GOPEN:
                touched[row[5]].fp_clock = pos
        part.stamp = stamper.last
        ctx.store()
        part.control.observe_batch(
            now=self.wall(), task_seconds=self.clock() - self.task_started, seen=seen, emitted=len(out)
        )
        if (
            self.gcheck is not None
            and part.timer < 0
            and any(s.window is not None and s.live for s in ctx.keys.values())
        ):
            self._arm_timer(part, timerValues)
        self.state.update(part.dump())
        out.append(part.figures(0, n))
        yield pd.DataFrame(out, columns=EMIT_COLUMNS)

    def _arm_timer(self, part: _PartitionState, timerValues: TimerValues) -> None:
        assert self.gcheck is not None
        part.timer = timerValues.getCurrentProcessingTimeInMs() + self.gcheck.interval_ms
        self.handle.registerTimer(part.timer)

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues, expiredTimerInfo: Any) -> Iterator[Any]:
        """G-check the partition's live windows, oldest footprint first, while the policy wants the front
        one and the task's budget allows (`operators.spark.checkpointing.choose_gchecks`); re-arm while a
        live window is open (Spark deletes the expired timer after this returns)."""
        import pandas as pd

        if self.gcheck is None:
            return
        part = self._partition(key[0])
        part.timer = -1
        saved_keys = part.keys
        live = [k for k, saved in saved_keys.items() if saved[1] >= 0 and saved[5]]
        rows: list[tuple[Any, ...]] = []
        if live:
            schedule = self.schedule
            assert schedule is not None
            control = part.control
            ctx = _PartitionContext(self.operator, part, self.generation)
            # The partition's input position (this micro-batch's merged with the earlier ones': a no-data
            # micro-batch's timer measures u from where the input stands, not from zero).
            seen = control.seen or (0,) * len(self.seen)
            width = len(seen)
            marks = []
            for k in live:
                clock = saved_keys[k][6] or (0,) * width
                u = sum(s - c for s, c in zip(seen, clock, strict=True) if s > c)
                marks.append(WindowMark(k, u, max(control.out - saved_keys[k][9], 0)))
            open_windows = sum(1 for saved in saved_keys.values() if saved[1] >= 0)
            out_base = control.out

            def gcheck(k: Any) -> None:
                state = ctx.touch(k)
                kind, rkey, seq, wstate, payload, dn = ctx.gcheck(state)
                row = (
                    part.q,
                    state.last_j,
                    state.last_o,
                    GCHECK_ORDER,
                    kind,
                    rkey,
                    seq,
                    wstate,
                    payload,
                    -1,
                    dn,
                )
                rows.append(row)
                state.fp_out = out_base + len(rows)

            policy = self.gcheck.policy(control.rates)
            read_input = any(self.seen)
            now = self.wall()
            # The first timer's allowance covers the run since the partition's first task of this start:
            # the windows it must reach were opened during all of it, not only during this task.
            since = control.last_timer_wall if control.last_timer_wall is not None else control.first_wall
            elapsed = now - since if since is not None else 0.0  # first_wall is set by `_partition`
            control.last_timer_wall = now
            choose_gchecks(
                control,
                policy,
                schedule,
                marks,
                open_windows,
                gcheck,
                self.clock,
                part.q,
                read_input,
                elapsed,
            )
            # The G-checks' pos, as the sink stamps them after the micro-batch's other records.
            stamper = PositionStamper(part.stamp)
            for row, pos in zip(rows, positions(rows, stamper), strict=True):
                ctx.keys[row[5]].fp_clock = pos
            part.stamp = stamper.last
            ctx.store()
            self._arm_timer(part, timerValues)
            if rows:  # G-checks moved footprints: the partition's figures after them
                rows.append(part.figures(1))
            report = part.control.report(part.q)
            if report is not None:
                rows.append((part.q, -1, -1, 0, CONTROL_KIND, None, -1, None, report, -1, 0))
        self.state.update(part.dump())
        if rows:
            yield pd.DataFrame(rows, columns=EMIT_COLUMNS)

    def close(self) -> None:
        pass
