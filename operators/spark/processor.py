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
"""

from __future__ import annotations

import json
import math
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

from cec.exceptions import BadTupleError
from cec.records import AvroCodec, Kind
from cec.registry import OpenWindow, WindowRegistry
from operators.aggregate import RESULT_SCHEMA, KeyedAggregate
from operators.base import InputTuple
from operators.runtime import DEAD_LETTER_SCHEMA
from recovery.contract import TupleFate, tuple_fate

__all__ = [
    "EMIT_COLUMNS",
    "EMIT_SCHEMA",
    "INIT_SCHEMA",
    "STATE_SCHEMA",
    "AggregateSpec",
    "CecAggregateProcessor",
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


@dataclass(frozen=True)
class AggregateSpec:
    """The aggregate's configuration; picklable (shipped to the Python workers inside the processor)."""

    key: str
    value: str
    agg: str
    window_count: int | None
    window_ms: int | None
    time: str | None

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


class _KeyContext:
    """`OperatorContext` of one key for one call of handleInputRows: the key's single window.

    KeyedAggregate drives it exactly as it drives `OperatorRuntime`; this class only records what the
    runtime would emit (R on close, G-open once the tuple is done if its window is still open) and the
    per-key recovery facts (footprint generation, pos_w).
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
        if saved is not None:
            seq, is_open, state, fp_gen, pos_w = saved
            if is_open and key is not None:
                self._registry.open(
                    OpenWindow(key, int(seq), operator.decode_state(bytes(state)), 0, 0, 0, 0)
                )
                self.next_seq = int(seq) + 1
                self.fp_gen = int(fp_gen)
                self.pos_w = tuple(int(p) for p in pos_w) if pos_w is not None and len(pos_w) else None
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
        # N counts the windows whose latest footprint is in this generation's log (see the module doc).
        dn = -1 if self.fp_gen == self.generation else 0
        self._out.append((Kind.R.value, key, window.seq, None, self._result_codec.encode(result), dn))
        self.fp_gen = -1
        self.pos_w = None

    def emit(self, result: Mapping[str, Any]) -> None:
        raise RuntimeError("a keyed aggregate emits results only by closing windows")

    # driving
    def apply(self, tup: InputTuple, silent: bool) -> list[_Emission]:
        """Apply one tuple; the records it produces (none when `silent`: rebuilding below the crash point)."""
        self._out = []
        self._opened = None
        self._silent = silent
        assert tup.value is not None
        self.event_time = -1
        try:
            event_time = self.operator.event_time(tup.value)
            if event_time is not None:
                self.event_time = event_time
                self._time = max(self._time, event_time)
            self.operator.process(tup, self)
        except BadTupleError as exc:  # state unchanged (the operator's contract)
            if not silent:
                raw = json.dumps(dict(tup.value), default=str, sort_keys=True)
                payload = self._dead_codec.encode(
                    {"partition": tup.partition, "offset": tup.offset, "reason": exc.reason, "raw": raw}
                )
                self._out.append((Kind.DEAD.value, None, -1, None, payload, 0))
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

    def saved(self) -> tuple[Any, ...]:
        window = self._registry.get(self.key) if self.key is not None else None
        if window is None:
            return (self.next_seq, False, None, -1, None)
        pos_w = list(self.pos_w) if self.pos_w is not None else None
        return (window.seq, True, self.operator.encode_state(window.state), self.fp_gen, pos_w)


def _plain(value: Any) -> Any:
    """pandas hands nullable integer columns over as float64 with NaN; the operator expects None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if hasattr(value, "item"):  # numpy scalar -> Python scalar
        return value.item()
    return value


class CecAggregateProcessor(StatefulProcessor):
    """The CEC operator of one key at a time under transformWithStateInPandas (see the module doc)."""

    def __init__(
        self,
        spec: AggregateSpec,
        crash_points: list[list[tuple[int, ...]]],
        generation: int,
    ) -> None:
        self.spec = spec
        self.crash_points = crash_points
        self.generation = generation

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.operator = self.spec.build()
        self.window = handle.getValueState(STATE_NAME, STATE_SCHEMA)

    def handleInitialState(self, key: Any, initialState: Any, timerValues: TimerValues) -> None:
        row = initialState.iloc[0]
        pos_w = row["pos_w"]
        self.window.update(
            (
                int(row["seq"]),
                bool(row["open"]),
                row["state"],
                int(row["fp_gen"]),
                None if pos_w is None else [int(p) for p in pos_w],
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
        crash = self._crash_point(qs)
        values = batch["cec_v"].tolist()
        times = batch["cec_time"].tolist() if spec.time else [None] * len(batch)
        out: dict[str, list[Any]] = {c: [] for c in EMIT_COLUMNS}
        for j, o, v, t in zip(batch["cec_j"].tolist(), batch["cec_o"].tolist(), values, times, strict=True):
            j, o = int(j), int(o)
            # The replay contract (recovery.contract), per key: C_k is the key's crash point.
            fate = tuple_fate(o, crash[j], None if ctx.pos_w is None else ctx.pos_w[j])
            if fate is TupleFate.SKIP:
                continue
            silent = fate is TupleFate.REBUILD
            value: dict[str, Any] = {spec.key: k, spec.value: _plain(v)}
            if spec.time:
                value[spec.time] = _plain(t)
            emitted = ctx.apply(InputTuple(j, o, value), silent)
            if not emitted:
                continue
            event_time = ctx.event_time
            for i, (kind, rkey, seq, state, payload, dn) in enumerate(emitted):
                for col, item in zip(
                    EMIT_COLUMNS,
                    (qs[-1], j, o, i, kind, rkey, seq, state, payload, event_time, dn),
                    strict=True,
                ):
                    out[col].append(item)
        self.window.update(ctx.saved())
        if out["cec_kind"]:
            yield pd.DataFrame(out, columns=EMIT_COLUMNS)

    def close(self) -> None:
        pass
