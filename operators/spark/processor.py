"""The CEC operator of an attached aggregation, on the executors (`operators.spark.attach`).

`CecAggregateProcessor` runs under `groupBy(key).transformWithStateInPandas`. It drives
`operators.aggregate.KeyedAggregate` itself, one key at a time, through a one-window `OperatorContext`
(`_KeyContext`), so the aggregation math and the state codec are the operator's. Window state lives in a
ValueState per key. It emits rows for R, G-open and DEAD, each with (j, o, emission index, kind, key, seq,
state/payload bytes, event time, N delta); the sink (`operators.spark.sink`) turns them into records.

Per-key order: Spark does not order a group's rows, so the processor sorts each key's rows by (j, o). As in
DESIGN-NOTES section 2, exactness needs each key to live in one input partition.

Replay: the processor applies the replay contract (`recovery.contract.tuple_fate`) per key, with the key's
own crash point C_k (`operators.spark.planning`): with an EC window, apply a tuple only if o >= pos_w[j];
otherwise skip it if o < C_k[j]; a tuple applied below C_k[j] only rebuilds state and emits nothing (not
even DEAD; an R or G-open there means log and replay disagree, and fails the query).

Input: rows of the cec-kafka source (typed value and time columns) or of the cec-topic source
(`AggregateSpec.json_values`: value and time as JSON text, and `cec_error`, the reason a record could not
be read, which becomes a DEAD record with its partition and offset).

G-checks (`GCheckSpec`, from `Checkpointing(u_target=U, ci_ms, cp_ms)`; timeMode "ProcessingTime"):
- each task measures the input with `seen`: per input partition, the next offset after the rows it got
  in this micro-batch (timers fire after a micro-batch's input rows, in the same task and processor);
- a window records `fp_clock`, that vector when its latest footprint was made (`pos_w` for a window
  loaded from the EC), and has one processing-time timer while open, firing every CP ms at most;
- when it fires, the window is G-checked if the input read since its footprint, sum(seen - fp_clock),
  reached U/2 and the task's budget (`cec.schedule.CheckpointSchedule`, CI of every CP) has credit;
- only a *live* window is G-checked: one whose key had a tuple past its crash point C_k. Before that a
  loaded window may still miss tuples of its key below C_k that later micro-batches replay, and a
  footprint written now would claim them.
The G-check row carries the key's last applied tuple (j, o); its state holds that tuple and all before.
Not done: the paper's oldest-first order across windows (each key's timer acts on its own window) and
Q, recovery targets and the cost-benefit policy (refused by `cec_aggregate`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
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

from cec.config import Checkpointing
from cec.exceptions import BadTupleError
from cec.records import AvroCodec, Kind
from cec.registry import OpenWindow, WindowRegistry
from cec.schedule import CheckpointSchedule
from operators.aggregate import RESULT_SCHEMA, KeyedAggregate
from operators.base import InputTuple
from operators.runtime import DEAD_LETTER_SCHEMA
from recovery.contract import TupleFate, tuple_fate

__all__ = [
    "EMIT_COLUMNS",
    "EMIT_SCHEMA",
    "GCHECK_ORDER",
    "INIT_SCHEMA",
    "STATE_SCHEMA",
    "AggregateSpec",
    "CecAggregateProcessor",
    "GCheckSpec",
]

STATE_NAME = "cec_window"

# What the processor keeps per key (one open window at most: tumbling windows).
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


@dataclass(frozen=True)
class GCheckSpec:
    """When the processor G-checks a window (from `cec.Checkpointing`; see the module doc).

    `threshold`: G-check an open window once the input read since its latest footprint reaches this many
    tuples (U/2: timers fire only between micro-batches, so half of U is left for the input one
    micro-batch adds); `interval_ms`: how often each open window's timer looks (CP); `ci_ms`/`cp_ms`: the
    budget of G-check work per task (`cec.schedule.CheckpointSchedule`)."""

    threshold: int
    interval_ms: int
    ci_ms: float
    cp_ms: float

    @classmethod
    def from_checkpointing(cls, checkpointing: Checkpointing) -> GCheckSpec | None:
        if checkpointing.u_target is None:
            return None
        return cls(
            threshold=max(1, checkpointing.u_target // 2),
            interval_ms=max(1, int(checkpointing.cp_ms)),
            ci_ms=checkpointing.ci_ms,
            cp_ms=checkpointing.cp_ms,
        )


_Emission = tuple[str, str | None, int, bytes | None, bytes | None, int]  # kind, key, seq, state, payload, dN


class _KeyContext:
    """`OperatorContext` of one key for one call of handleInputRows: the key's single window.

    KeyedAggregate drives it exactly as it drives `OperatorRuntime`; this class only records what the
    runtime would emit (R on close, G-open once the tuple is done if its window is still open) and the
    per-key recovery facts (footprint generation, pos_w, G-check bookkeeping).
    """

    def __init__(
        self,
        operator: KeyedAggregate,
        key: str | None,
        saved: tuple[Any, ...] | None,
        generation: int,
    ) -> None:
        self.operator = operator
        self.key = key
        self.generation = generation
        self._registry = WindowRegistry()
        self._result_codec = AvroCodec(RESULT_SCHEMA)
        self._dead_codec = AvroCodec(DEAD_LETTER_SCHEMA)
        self._time = 0
        self.event_time = -1  # of the tuple last applied; -1 when it has none
        self.fp_gen = -1
        self.pos_w: tuple[int, ...] | None = None
        self.next_seq = 0
        self.live = False
        self.fp_clock: list[int] | None = None
        self.last_j = self.last_o = self.q = self.timer = -1
        if saved is not None:
            seq, is_open, state, fp_gen, pos_w, live, fp_clock, last_j, last_o, q, timer = saved
            self.last_j, self.last_o, self.q, self.timer = int(last_j), int(last_o), int(q), int(timer)
            if is_open and key is not None:
                self._registry.open(
                    OpenWindow(key, int(seq), operator.decode_state(bytes(state)), 0, 0, 0, 0)
                )
                self.next_seq = int(seq) + 1
                self.fp_gen = int(fp_gen)
                self.pos_w = tuple(int(p) for p in pos_w) if pos_w is not None and len(pos_w) else None
                self.live = bool(live)
                self.fp_clock = None if fp_clock is None else [int(c) for c in fp_clock]
            else:
                self.next_seq = int(seq)
        self._opened: OpenWindow | None = None
        self._silent = False
        self._out: list[_Emission] = []

    # OperatorContext
    @property
    def registry(self) -> WindowRegistry:
        return self._registry

    @property
    def time(self) -> int:
        return self._time

    def open_window(self, key: str, state: Any) -> OpenWindow:
        window = OpenWindow(key, self.next_seq, state, self._time, self._time, 0, 0)
        self.next_seq += 1
        self._registry.open(window)
        self._opened = window
        self.fp_gen = -1
        self.pos_w = None
        return window

    def close_window(self, key: str, result: Mapping[str, Any]) -> None:
        window = self._registry.close(key)
        if self._silent:
            raise RuntimeError(
                f"replay below the crash point closed window {window.seq} of {key!r}: the log and the "
                "replay disagree"
            )
        # N counts the windows whose latest footprint is in this generation's log (operators.spark.generations).
        dn = -1 if self.fp_gen == self.generation else 0
        self._out.append((Kind.R.value, key, window.seq, None, self._result_codec.encode(result), dn))
        self.fp_gen = -1
        self.pos_w = None
        self.live = False
        self.fp_clock = None

    def emit(self, result: Mapping[str, Any]) -> None:
        raise RuntimeError("a keyed aggregate emits results only by closing windows")

    # driving
    @property
    def window(self) -> OpenWindow | None:
        return self._registry.get(self.key) if self.key is not None else None

    def apply(self, tup: InputTuple, silent: bool) -> list[_Emission]:
        """Apply one tuple; the records it produces (none when `silent`: rebuilding below the crash point)."""
        self._out = []
        self._opened = None
        self._silent = silent
        self.event_time = -1
        self.last_j, self.last_o = tup.partition, tup.offset
        if tup.value is None:  # the source could not decode it (or a field is missing): a dead letter
            if not silent:
                self._dead(tup, tup.error or "undecodable input", "")
            return self._out
        try:
            event_time = self.operator.event_time(tup.value)
            if event_time is not None:
                self.event_time = event_time
                self._time = max(self._time, event_time)
            self.operator.process(tup, self)
        except BadTupleError as exc:  # state unchanged (the operator's contract)
            if not silent:
                self._dead(tup, exc.reason, json.dumps(dict(tup.value), default=str, sort_keys=True))
            return self._out
        opened = self._opened
        if opened is not None and self._registry.get(opened.key) is opened:  # not opened-and-closed
            if silent:
                raise RuntimeError(
                    f"replay below the crash point opened window {opened.seq} of {opened.key!r}: the log "
                    "and the replay disagree"
                )
            self.fp_gen = self.generation
            self._out.append(
                (Kind.GOPEN.value, opened.key, opened.seq, self.operator.encode_state(opened.state), None, 1)
            )
        return self._out

    def _dead(self, tup: InputTuple, reason: str, raw: str) -> None:
        payload = self._dead_codec.encode(
            {"partition": tup.partition, "offset": tup.offset, "reason": reason, "raw": raw}
        )
        self._out.append((Kind.DEAD.value, None, -1, None, payload, 0))

    def gcheck(self) -> _Emission:
        """A G-check of the open window: its state as of the key's last applied tuple."""
        window = self.window
        assert window is not None
        dn = 0 if self.fp_gen == self.generation else 1  # its latest footprint moves into this log
        self.fp_gen = self.generation
        return (Kind.GCHECK.value, window.key, window.seq, self.operator.encode_state(window.state), None, dn)

    def saved(self) -> tuple[Any, ...]:
        window = self.window
        tail = (self.last_j, self.last_o, self.q, self.timer)
        if window is None:
            return (self.next_seq, False, None, -1, None, False, None, *tail)
        pos_w = list(self.pos_w) if self.pos_w is not None else None
        state = self.operator.encode_state(window.state)
        return (window.seq, True, state, self.fp_gen, pos_w, self.live, self.fp_clock, *tail)


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
    """The CEC operator of one key at a time under transformWithStateInPandas (see the module doc)."""

    def __init__(
        self,
        spec: AggregateSpec,
        crash_points: list[list[tuple[int, ...]]],
        generation: int,
        gcheck: GCheckSpec | None = None,
    ) -> None:
        self.spec = spec
        self.crash_points = crash_points
        self.generation = generation
        self.gcheck = gcheck

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.operator = self.spec.build()
        self.handle = handle
        self.window = handle.getValueState(STATE_NAME, STATE_SCHEMA)
        # One processor per task: the input positions its rows reached in this micro-batch (next offsets),
        # the clock that G-check decisions measure replay with; and the task's G-check budget.
        self.seen = [0] * len(self.crash_points[0][0])
        self.schedule = (
            CheckpointSchedule(self.gcheck.ci_ms, self.gcheck.cp_ms) if self.gcheck is not None else None
        )
        if self.schedule is not None:
            self.schedule.start()

    def handleInitialState(self, key: Any, initialState: Any, timerValues: TimerValues) -> None:
        row = initialState.iloc[0]
        pos_w = row["pos_w"]
        fp_clock = row["fp_clock"]
        self.window.update(
            (
                int(row["seq"]),
                bool(row["open"]),
                row["state"],
                int(row["fp_gen"]),
                None if pos_w is None else [int(p) for p in pos_w],
                bool(row["live"]),
                None if fp_clock is None else [int(p) for p in fp_clock],
                int(row["last_j"]),
                int(row["last_o"]),
                int(row["q"]),
                int(row["timer"]),
            )
        )

    def _crash_point(self, qs: Sequence[int]) -> list[int]:
        """C_k: component-wise max over generations of the crash point of the key's partition there."""
        vectors = [self.crash_points[g][int(q)] for g, q in enumerate(qs)]
        return [max(v[j] for v in vectors) for j in range(len(vectors[0]))]

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Iterator[Any]:
        import pandas as pd

        frames = list(rows)
        if not frames:
            return
        batch = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        # Spark does not order a group's rows; the operator's per-key order is the input order.
        batch = batch.sort_values(["cec_j", "cec_o"], kind="stable")
        k: str | None = key[0]
        spec = self.spec
        if k is not None and self.operator.key_of({spec.key: k}) not in (k, None):
            # Two group keys would share one window id in the log: never write that.
            raise RuntimeError(f"group key {k!r} is not in the aggregate's canonical (stripped) form")
        ctx = _KeyContext(
            self.operator, k, self.window.get() if self.window.exists() else None, self.generation
        )
        qs = [int(q) for q in batch["cec_qs"].iloc[0]]
        ctx.q = qs[-1]
        crash = self._crash_point(qs)
        n = len(batch)
        if spec.json_values:
            values = [_from_json(v) for v in batch["cec_v"].tolist()]
            times = [_from_json(t) for t in batch["cec_time"].tolist()] if spec.time else [None] * n
            errors = batch["cec_error"].tolist()
        else:
            values = [_plain(v) for v in batch["cec_v"].tolist()]
            times = [_plain(t) for t in batch["cec_time"].tolist()] if spec.time else [None] * n
            errors = [None] * n
        seen = self.seen
        out: dict[str, list[Any]] = {c: [] for c in EMIT_COLUMNS}
        for j, o, v, t, err in zip(
            batch["cec_j"].tolist(), batch["cec_o"].tolist(), values, times, errors, strict=True
        ):
            j, o = int(j), int(o)
            if o >= seen[j]:
                seen[j] = o + 1
            # The replay contract (recovery.contract), per key: C_k is the key's crash point.
            fate = tuple_fate(o, crash[j], None if ctx.pos_w is None else ctx.pos_w[j])
            if fate is TupleFate.SKIP:
                continue
            silent = fate is TupleFate.REBUILD
            if err is not None:
                tup = InputTuple(j, o, None, err)
            else:
                value: dict[str, Any] = {spec.key: k, spec.value: v}
                if spec.time:
                    value[spec.time] = t
                tup = InputTuple(j, o, value)
            emitted = ctx.apply(tup, silent)
            if not silent and ctx.window is not None:
                ctx.live = True  # its state now holds every tuple of the key below this one
            if not emitted:
                continue
            event_time = ctx.event_time
            for i, (kind, rkey, seq, state, payload, dn) in enumerate(emitted):
                if kind == Kind.GOPEN.value:
                    ctx.fp_clock = list(seen)
                for col, item in zip(
                    EMIT_COLUMNS,
                    (qs[-1], j, o, i, kind, rkey, seq, state, payload, event_time, dn),
                    strict=True,
                ):
                    out[col].append(item)
        if self.gcheck is not None:
            self._arm_timer(ctx, timerValues)
        self.window.update(ctx.saved())
        if out["cec_kind"]:
            yield pd.DataFrame(out, columns=EMIT_COLUMNS)

    def _arm_timer(self, ctx: _KeyContext, timerValues: TimerValues) -> None:
        """One processing-time timer per live open window; none otherwise."""
        assert self.gcheck is not None
        if ctx.window is not None and ctx.live:
            if ctx.timer < 0:
                ctx.timer = timerValues.getCurrentProcessingTimeInMs() + self.gcheck.interval_ms
                self.handle.registerTimer(ctx.timer)
        elif ctx.timer >= 0:
            self.handle.deleteTimer(ctx.timer)
            ctx.timer = -1

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues, expiredTimerInfo: Any) -> Iterator[Any]:
        """G-check the key's window if the input read since its latest footprint reached the threshold and
        the task's budget allows (Spark deletes the expired timer after this returns)."""
        import pandas as pd

        if self.gcheck is None or not self.window.exists():
            return
        ctx = _KeyContext(self.operator, key[0], self.window.get(), self.generation)
        ctx.timer = -1
        window = ctx.window
        if window is None or not ctx.live:
            self.window.update(ctx.saved())
            return
        clock = ctx.fp_clock or [0] * len(self.seen)
        # Partitions this task read nothing of in this micro-batch add nothing (their position is unknown).
        u = sum(s - c for s, c in zip(self.seen, clock, strict=True) if s > c)
        row: tuple[Any, ...] | None = None
        schedule = self.schedule
        assert schedule is not None
        if u >= self.gcheck.threshold and schedule.credit() > 0:
            started = time.perf_counter()
            kind, rkey, seq, state, payload, dn = ctx.gcheck()
            row = (ctx.q, ctx.last_j, ctx.last_o, GCHECK_ORDER, kind, rkey, seq, state, payload, -1, dn)
            ctx.fp_clock = [max(s, c) for s, c in zip(self.seen, clock, strict=True)]
            schedule.spend(time.perf_counter() - started, 1)
        self._arm_timer(ctx, timerValues)
        self.window.update(ctx.saved())
        if row is not None:
            yield pd.DataFrame([row], columns=EMIT_COLUMNS)

    def close(self) -> None:
        pass
