"""CEC for a PySpark windowed aggregation, in one call (DESIGN-NOTES section 5, second design).

A user who would write

    events.groupBy("item_id").agg(F.avg("item_price"))      # over count or time windows

writes instead

    query = cec_aggregate(spark, input_topic="purchases", bootstrap_servers=bs, output_topic="avg",
                          key="item_id", value="item_price", agg="avg", window_count=10,
                          state_dir="/var/lib/cec", checkpoint_location="/tmp/ckpt", partitions=2)
    query.awaitTermination()
    read_results(spark, "avg", bs).show()     # key, window, value, count, start, end (R rows only)

Pipeline: the "cec-kafka" Python Data Source (one Spark input partition per Kafka partition j; rows carry
j and offset o) -> `groupBy(key).transformWithStateInPandas(CEC processor)` -> a CEC sink (foreachBatch).

The processor runs `operators.aggregate.KeyedAggregate` itself, one key at a time, through a one-window
`OperatorContext`, so the aggregation math and the state codec are the operator's. Window state lives in a
ValueState per key. It emits rows for R, G-open and DEAD (G-open only: no G-check policy in this design
yet), each with (j, o, emission index, kind, key, seq, state/payload bytes, event time, N delta).

Per-key order: Spark does not order a group's rows, so the processor sorts each key's rows by (j, o). As in
DESIGN-NOTES section 2, exactness needs each key to live in one input partition.

The sink runs on the driver, which owns the single writer (`OutputQueue` on a `KafkaQueueStore`, so the
stream index is maintained) of every output partition q, held across micro-batches: one writer per log,
no zombie writer from a retried task, and the indexes sit where recovery reads them. A row goes to q = pmod(hash(key), P), Spark's own
shuffle hash, so q is also the state partition when spark.sql.shuffle.partitions = P (set for the query).
For each q it sorts the batch's rows by (j, o, emission index) and computes per record, continuing from the
partition's log end:
- pos: a running vector (`recovery.contract.PositionStamper`, the rule every host uses); a record produced
  by input tuple (j, o) sets pos[j] = o + 1 if it is the tuple's last record, else o, never decreasing. Then "every input tuple below pos that maps to q has been applied, and every output
  it produced is in the log before this record", and "no tuple at or above pos has an output in the log".
  Sorting by (j, o) is what makes both hold for every prefix of the log: a tuple of partition j' < j in the
  batch comes before, and one of j' > j after, this record. A tuple that produces R then G-open (a time
  window rolling over) claims itself only on its last record: if the log ends between the two, recovery
  re-processes the tuple, finds the closed window gone, and opens the next window again (exactly once);
- N: +1 on a G-open, -1 on the R of a window whose footprint is in this log (see generations below);
- time: the largest event time so far (the input's logical time, non-decreasing along the log), or
  sum(pos) when the aggregate has no time field (as `OperatorRuntime` does).
A batch's records are durable (flushed) before the batch completes.

Recovery (on every start; the Spark checkpoint is never reused: each start is a fresh query):
- per output partition of every generation (below): `EventualCheckpointBuilder` over its log -> EC windows
  and crash point t_c (the zero vector for an empty log); per key, the last closed window sequence from
  the partition's stream index;
- per key, its crash point C_k = max over generations g of t_c[g][q_g(k)] (component-wise): every tuple of
  k below C_k has its outputs in some log, none at or above has. The open window of k is the EC window with
  the highest seq, unless a closed seq >= it exists (it closed in a later generation);
- initialState of the fresh query: open windows (seq, state, pos_w, generation of the footprint) and, for
  keys without one, the next window seq (last closed seq + 1): every key that ever closed a window, which
  costs one row per such key at each recovery but keeps the seq directory exact without per-key lookups
  from executors;
- the input restarts at T[j] = min(min over EC windows of pos_w[j], max_g min_q t_c[g][q][j]), a lower
  bound of every C_k[j] (the plain rule "t_c[j] if the EC is empty" for one generation and one partition);
- the processor applies the replay contract (`recovery.contract.tuple_fate`) per key: with an EC window,
  apply a tuple only if o >= pos_w[j]; otherwise skip it if o < C_k[j]; a tuple applied below C_k[j] only
  rebuilds state and emits nothing (not even DEAD; an R or G-open there means log and replay disagree, and fails the query).

Generations (restart with another partition count P'): Kafka topics cannot lose partitions and keys must
move, so P' writes a new generation: topic `<output>.g<g>` with P' partitions (generation 0 is `<output>`).
Old logs stay the record of what was output; `read_results` unions all generations. Windows are not
copied: a window carried over keeps its footprint in the old log, which recovery still reads, and N of a
log counts only windows whose latest footprint is in that log, so each log's EC scan stays self-contained.
(Copying the EC into the new logs was rejected: a copied footprint must keep its pos_w, and as the last
record of a new log that pos would be read as the crash point of keys that came from other old partitions.)
Restarting with the latest P continues the latest generation. A generation whose topic exists but is
empty (crash right after creating it) is harmless: its crash points are zero vectors.

Not done here: G-check policy (the extent of a long-open window reaches back to its G-open); a sink on
executors (all output records pass through the driver, which is fine for aggregates whose output is a
small fraction of their input); upstream DEAD letters are skipped by the source.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from cec.exceptions import BadTupleError, ConfigError
from cec.records import AvroCodec, Kind, OutputRecord, RecordCodec
from cec.registry import OpenWindow, WindowRegistry
from operators.aggregate import RESULT_SCHEMA, KeyedAggregate, parse_duration_ms
from operators.base import InputTuple
from operators.runtime import DEAD_LETTER_SCHEMA
from operators.spark.datasource import FORMAT, PAYLOAD_SCHEMAS, register
from queuestore import faults
from queuestore.index import StreamIndex
from queuestore.output import OutputQueue
from recovery.contract import PositionStamper, TupleFate, tuple_fate
from recovery.eventual import EventualCheckpointBuilder

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from queuestore.kafka import KafkaQueueStore

__all__ = [
    "RESULT_COLUMNS",
    "SINK_FAULT_SITE",
    "AttachRecovery",
    "CecAggregateProcessor",
    "CecAggregateQuery",
    "Generation",
    "cec_aggregate",
    "generation_topic",
    "list_generations",
    "read_results",
]

log = logging.getLogger(__name__)

RESULT_COLUMNS = [f["name"] for f in RESULT_SCHEMA["fields"]]
# Hit after the first half of a partition's batch is durable, before the second half is appended: a crash
# injected here (CEC_FAULTS) leaves that log cut in the middle of a micro-batch.
SINK_FAULT_SITE = "attach.sink.mid_batch"
_ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_STATE_NAME = "cec_window"
_STRIP_PATTERN = r"(?U)^[\s\x1c-\x1f]+|[\s\x1c-\x1f]+$"

# What the processor keeps per key (one open window at most: tumbling windows).
_STATE_SCHEMA = StructType(
    [
        StructField("seq", LongType(), False),  # the open window's seq, or the next seq when none is open
        StructField("open", BooleanType(), False),
        StructField("state", BinaryType(), True),  # KeyedAggregate.encode_state of the open window
        StructField("fp_gen", LongType(), False),  # generation whose log holds its latest footprint; -1: none
        StructField("pos_w", ArrayType(LongType(), False), True),  # EC-loaded window: input below is in it
    ]
)
_INIT_SCHEMA = StructType([StructField("cec_key", StringType(), True), *_STATE_SCHEMA.fields])
# One row per record the operator produces; the sink turns them into OutputRecords.
_EMIT_SCHEMA = StructType(
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
_EMIT_COLUMNS = [f.name for f in _EMIT_SCHEMA.fields]


# -- generations ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Generation:
    """One output topic generation: all output partitions written with one partition count."""

    index: int
    topic: str
    partitions: int


def generation_topic(output_topic: str, index: int) -> str:
    """Generation 0 is the output topic itself, so a query that never changes P has exactly one topic."""
    return output_topic if index == 0 else f"{output_topic}.g{index}"


def list_generations(store: KafkaQueueStore, output_topic: str) -> list[Generation]:
    """The existing generations, oldest first (numbered without gaps from 0)."""
    out: list[Generation] = []
    while store.topic_exists(topic := generation_topic(output_topic, len(out))):
        out.append(Generation(len(out), topic, store.partitions(topic)))
    return out


# -- recovery planning (driver) -------------------------------------------------------------------------


@dataclass(frozen=True)
class _LogEnd:
    """Where one output log of the current generation stands: the sink continues from here."""

    pos: tuple[int, ...]
    n: int
    time: int


@dataclass(frozen=True)
class _Loaded:
    seq: int
    state: bytes
    pos_w: tuple[int, ...]
    generation: int


@dataclass
class AttachRecovery:
    """What a start found in the output logs and how it resumes (all zero on a fresh start)."""

    generations: list[Generation]
    current: Generation
    resumed: bool = False
    crash_points: list[list[tuple[int, ...]]] = field(default_factory=list)  # per generation, per partition
    start: tuple[int, ...] = ()  # replay start T per input partition
    ec_windows: int = 0  # open windows loaded from the logs
    closed_keys: int = 0  # keys whose next window seq was loaded
    records_read: int = 0  # records the EC scans read
    seconds: float = 0.0
    ends: list[_LogEnd] = field(default_factory=list, repr=False)
    windows: dict[str | None, _Loaded] = field(default_factory=dict, repr=False)
    next_seq: dict[str | None, int] = field(default_factory=dict, repr=False)


def _plan(
    store: KafkaQueueStore,
    generations: list[Generation],
    outputs: Sequence[OutputQueue],
    input_partitions: int,
) -> AttachRecovery:
    """Read every generation's logs back: EC windows, crash points, closed-window directory, replay start."""
    started = time.perf_counter()
    current = generations[-1]
    zeros = (0,) * input_partitions
    plan = AttachRecovery(generations, current)
    open_found: dict[str | None, _Loaded] = {}
    closed: dict[str | None, int] = {}
    for gen in generations:
        crash: list[tuple[int, ...]] = []
        for q in range(gen.partitions):
            with store.reader(gen.topic, q) as reader:
                ec = EventualCheckpointBuilder(reader).build()
            plan.records_read += ec.records_read
            if ec.crash_pos is not None:
                plan.resumed = True
                if len(ec.crash_pos) != input_partitions:
                    raise ConfigError(
                        f"{gen.topic}[{q}] was written reading {len(ec.crash_pos)} input partitions; the "
                        f"input now has {input_partitions}"
                    )
            crash.append(ec.crash_pos or zeros)
            if gen is current:
                plan.ends.append(_LogEnd(ec.crash_pos or zeros, ec.n, ec.time))
            for key, fp in ec.windows.items():
                record = fp.record
                have = open_found.get(key)
                # The highest seq is the key's latest window; on a tie the later generation's footprint is
                # the newer one.
                if have is None or record.seq >= have.seq:
                    open_found[key] = _Loaded(record.seq, record.state or b"", record.pos, gen.index)
            if gen is current:
                for key, seq in outputs[q].index.closed_windows():
                    closed[key] = max(seq, closed.get(key, -1))
            else:
                with StreamIndex(store.index_path(gen.topic, q), identity=f"{gen.topic}/{q}") as index:
                    with store.reader(gen.topic, q) as reader:
                        index.reconcile(reader)
                    for key, seq in index.closed_windows():
                        closed[key] = max(seq, closed.get(key, -1))
        plan.crash_points.append(crash)
    for wkey, loaded in open_found.items():
        if closed.get(wkey, -1) < loaded.seq:
            plan.windows[wkey] = loaded
    plan.next_seq = {k: s + 1 for k, s in closed.items() if k not in plan.windows}
    # T[j]: C_k[j] = max_g t_c[g][q_g(k)][j] >= max_g min_q t_c[g][q][j] for every key k.
    start = [max(min(c[j] for c in crash) for crash in plan.crash_points) for j in range(input_partitions)]
    for loaded in plan.windows.values():
        start = [min(s, p) for s, p in zip(start, loaded.pos_w, strict=True)]
    plan.start = tuple(start)
    plan.ec_windows = len(plan.windows)
    plan.closed_keys = len(plan.next_seq)
    plan.seconds = time.perf_counter() - started
    return plan


# -- the processor (executors) --------------------------------------------------------------------------


@dataclass(frozen=True)
class _AggregateSpec:
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
        spec: _AggregateSpec,
        crash_points: list[list[tuple[int, ...]]],
        generation: int,
    ) -> None:
        self.spec = spec
        self.crash_points = crash_points
        self.generation = generation

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.operator = self.spec.build()
        self.window = handle.getValueState(_STATE_NAME, _STATE_SCHEMA)

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
        out: dict[str, list[Any]] = {c: [] for c in _EMIT_COLUMNS}
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
                    _EMIT_COLUMNS,
                    (qs[-1], j, o, i, kind, rkey, seq, state, payload, event_time, dn),
                    strict=True,
                ):
                    out[col].append(item)
        self.window.update(ctx.saved())
        if out["cec_kind"]:
            yield pd.DataFrame(out, columns=_EMIT_COLUMNS)

    def close(self) -> None:
        pass


# -- the sink (driver) ----------------------------------------------------------------------------------


@dataclass
class _Cursor:
    stamper: PositionStamper  # pos, continuing from the log's crash point (recovery.contract)
    n: int
    time: int


class _CecSink:
    """foreachBatch function: orders each output partition's rows, assigns pos/N/time, appends durably."""

    def __init__(self, outputs: Sequence[OutputQueue], ends: Sequence[_LogEnd], has_time: bool) -> None:
        self.outputs = list(outputs)
        self.cursors = [_Cursor(PositionStamper(e.pos), e.n, e.time) for e in ends]
        self.has_time = has_time
        self.codec = RecordCodec()
        self.lock = threading.Lock()
        self.batches = 0
        self.records = 0
        self.closed = False

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        table = batch_df.toArrow()
        columns = [table.column(c).to_pylist() for c in _EMIT_COLUMNS]
        by_q: dict[int, list[tuple[Any, ...]]] = {}
        for row in zip(*columns, strict=True):
            by_q.setdefault(int(row[0]), []).append(row)
        with self.lock:
            if self.closed:
                raise RuntimeError("the CEC sink is closed")
            for q in sorted(by_q):
                self._write(q, sorted(by_q[q], key=lambda r: (r[1], r[2], r[3])))
            for q in by_q:
                out = self.outputs[q]
                out.flush()
                if out.failures:
                    raise RuntimeError(
                        f"{len(out.failures)} appends to {out.topic}[{q}] failed: {out.failures[0]!r}"
                    )
            self.batches += 1

    def _write(self, q: int, rows: list[tuple[Any, ...]]) -> None:
        cursor, out = self.cursors[q], self.outputs[q]
        half = len(rows) // 2
        for idx, (_, j, o, _i, kind, key, seq, state, payload, t, dn) in enumerate(rows):
            last_of_tuple = idx + 1 == len(rows) or rows[idx + 1][1:3] != (j, o)
            pos = cursor.stamper.stamp(None, j, o, claims=last_of_tuple)
            cursor.n += dn
            if self.has_time:
                if t >= 0:
                    cursor.time = max(cursor.time, t)
            else:
                cursor.time = max(cursor.time, sum(pos))
            record = OutputRecord(Kind(kind), cursor.time, pos, cursor.n, key, seq, state, payload)
            if idx == half and half:
                # Durable first half, then the fault site: a crash injected here cuts the log mid-batch.
                out.flush()
                faults.hit(SINK_FAULT_SITE)
            out.append(self.codec.encode(record), record.meta())
            self.records += 1

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            errors: list[BaseException] = []
            for out in self.outputs:
                try:
                    out.close()
                except Exception as exc:  # close the others; report the first
                    errors.append(exc)
            if errors:
                raise errors[0]


# -- the query handle -----------------------------------------------------------------------------------


class CecAggregateQuery:
    """A running CEC aggregation: a StreamingQuery plus the driver-side writers of its output logs."""

    def __init__(
        self, query: StreamingQuery, sink: _CecSink, store: KafkaQueueStore, recovery: AttachRecovery
    ):
        self.query = query
        self.recovery = recovery
        self.checkpointing = Checkpointing()  # as given to cec_aggregate (not acted on yet: G-open only)
        self._sink = sink
        self._store = store
        self._closed = False

    @property
    def generation(self) -> Generation:
        return self.recovery.current

    @property
    def isActive(self) -> bool:
        return bool(self.query.isActive)

    @property
    def batches(self) -> int:
        """Micro-batches the sink completed."""
        return self._sink.batches

    def processAllAvailable(self) -> None:
        self.query.processAllAvailable()

    def awaitTermination(self, timeout: int | None = None) -> bool | None:
        """As StreamingQuery.awaitTermination; the output logs are closed once the query has ended."""
        try:
            return (
                self.query.awaitTermination(timeout) if timeout is not None else self.query.awaitTermination()
            )
        finally:
            if not self.query.isActive:
                self.close()

    def stop(self) -> None:
        try:
            self.query.stop()
        finally:
            self.close()

    def exception(self) -> Any:
        return self.query.exception()

    def close(self) -> None:
        """Release the output partitions (flushes what was appended). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._sink.close()
        finally:
            self._store.close()

    def __enter__(self) -> CecAggregateQuery:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.query.isActive:
            self.stop()
        else:
            self.close()


# -- entry points ---------------------------------------------------------------------------------------


def _schema_option(schema: str | Mapping[str, Any]) -> str:
    if isinstance(schema, str):
        if schema not in PAYLOAD_SCHEMAS:
            json.loads(schema)  # a JSON schema text: let the data source validate it
        return schema
    return json.dumps(dict(schema))


def _open_outputs(store: KafkaQueueStore, gen: Generation) -> list[OutputQueue]:
    outputs: list[OutputQueue] = []
    try:
        for q in range(gen.partitions):
            outputs.append(OutputQueue(store, gen.topic, q))
    except BaseException:
        for out in outputs:
            out.close()
        raise
    return outputs


def cec_aggregate(
    spark: SparkSession,
    *,
    input_topic: str,
    bootstrap_servers: str,
    output_topic: str,
    key: str,
    value: str,
    state_dir: str | Path,
    checkpoint_location: str | Path,
    agg: str = "avg",
    window_count: int | None = None,
    window_time: str | int | None = None,
    time: str | None = None,
    input_schema: str | Mapping[str, Any] = "purchase",
    partitions: int | None = None,
    available_now: bool = False,
    processing_time: str | None = None,
    max_records_per_trigger: int | None = None,
    kafka_config: Mapping[str, str] | None = None,
    query_name: str | None = None,
    checkpointing: Checkpointing | Mapping[str, Any] | None = None,
) -> CecAggregateQuery:
    """Start (or resume) `agg(value)` per `key` over tumbling windows with CEC, reading the cec-kafka topic
    `input_topic` and writing results plus footprints to `output_topic`.

    - `window_count=N` or `window_time="10s"` (with `time`, the event-time column in ms); `agg` is one of
      avg, sum, count, min, max; results have KeyedAggregate's columns (key, window, value, count, start,
      end) and are read with `read_results`;
    - `input_schema`: the input payload's Avro schema (a name known to cec-kafka, a JSON text or a dict);
    - `partitions`: output partitions P (default: the latest generation's, else the input's). A P other
      than the latest generation's starts a new generation (module doc);
    - `state_dir`: local state (stream indexes, writer locks); `checkpoint_location`: a fresh Spark
      checkpoint is made under it at every start, because recovery comes from the output logs;
    - trigger: `available_now=True` (run to the current end of the input, then stop), else
      `processing_time` (e.g. "1 second"), else Spark's default (as fast as possible).

    - `checkpointing`: a `cec.Checkpointing` (or its dict), validated here and kept as
      `query.checkpointing`. This design does not produce G-checks yet (G-open only, see the module doc):
      Q, U, CI/CP, a recovery target and the cost-benefit policy are not acted on by the attached
      operator, which logs a warning when given a configuration that asks for G-checks.

    The session's shuffle partitions (= P) and state store provider (RocksDB, which transformWithState
    needs) are set for this query only.
    """
    from pyspark.sql import functions as F

    from queuestore.kafka import KafkaQueueStore

    if checkpointing is None:
        checkpointing = Checkpointing()
    elif isinstance(checkpointing, Mapping):
        checkpointing = Checkpointing.from_dict(dict(checkpointing))
    elif not isinstance(checkpointing, Checkpointing):
        raise ConfigError(f"checkpointing must be a cec.Checkpointing, got {checkpointing!r}")
    if checkpointing.checkpoints:
        log.warning(
            "cec_aggregate writes G-open footprints only: the G-checks that %s asks for are not produced "
            "by the attached operator yet",
            checkpointing.describe(),
        )
    if key in (value, time) or (time is not None and time == value):
        raise ConfigError("key, value and time must be different columns")
    window_ms = None
    if window_time is not None:
        window_ms = int(window_time) if isinstance(window_time, int) else parse_duration_ms(window_time)
    spec = _AggregateSpec(key, value, agg, window_count, window_ms, time)
    spec.build()  # validates the aggregate configuration here, not on an executor
    if partitions is not None and partitions < 1:
        raise ConfigError(f"partitions must be >= 1, got {partitions}")
    if max_records_per_trigger is not None and max_records_per_trigger < 1:
        raise ConfigError("max_records_per_trigger must be >= 1")

    client = dict(kafka_config or {})
    store = KafkaQueueStore(bootstrap_servers, Path(state_dir), config=client)
    try:
        if not store.topic_exists(input_topic):
            raise ConfigError(f"input topic {input_topic!r} does not exist")
        input_partitions = store.partitions(input_topic)
        generations = list_generations(store, output_topic)
        wanted = partitions or (generations[-1].partitions if generations else input_partitions)
        if not generations or generations[-1].partitions != wanted:
            topic = generation_topic(output_topic, len(generations))
            store.create_topic(topic, wanted)
            generations.append(Generation(len(generations), topic, wanted))
        current = generations[-1]
        outputs = _open_outputs(store, current)  # takes the partitions' writer locks before reading the logs
        try:
            recovery = _plan(store, generations, outputs, input_partitions)
        except BaseException:
            for out in outputs:
                out.close()
            raise
    except BaseException:
        store.close()
        raise
    sink = _CecSink(outputs, recovery.ends, has_time=time is not None)
    try:
        query = _start_query(
            spark,
            spec=spec,
            recovery=recovery,
            sink=sink,
            input_topic=input_topic,
            bootstrap_servers=bootstrap_servers,
            input_schema=_schema_option(input_schema),
            state_dir=Path(state_dir),
            checkpoint=Path(checkpoint_location) / f"run-{_run_id()}",
            client=client,
            available_now=available_now,
            processing_time=processing_time,
            max_records_per_trigger=max_records_per_trigger,
            query_name=query_name,
            functions=F,
        )
    except BaseException:
        try:
            sink.close()
        finally:
            store.close()
        raise
    attached = CecAggregateQuery(query, sink, store, recovery)
    attached.checkpointing = checkpointing
    return attached


def _run_id() -> str:
    """A sortable unique name for a run's Spark checkpoint directory."""
    return f"{time.time_ns()}-{uuid.uuid4().hex[:8]}"


def _start_query(
    spark: SparkSession,
    *,
    spec: _AggregateSpec,
    recovery: AttachRecovery,
    sink: _CecSink,
    input_topic: str,
    bootstrap_servers: str,
    input_schema: str,
    state_dir: Path,
    checkpoint: Path,
    client: Mapping[str, str],
    available_now: bool,
    processing_time: str | None,
    max_records_per_trigger: int | None,
    query_name: str | None,
    functions: Any,
) -> StreamingQuery:
    F = functions
    register(spark)
    reader = (
        spark.readStream.format(FORMAT)
        .option("topic", input_topic)
        .option("bootstrap.servers", bootstrap_servers)
        .option("schema", input_schema)
        .option("stateDir", str(state_dir / "source"))
        .option("startingOffsets", json.dumps({str(j): o for j, o in enumerate(recovery.start)}))
    )
    if max_records_per_trigger is not None:
        reader = reader.option("maxRecordsPerTrigger", str(max_records_per_trigger))
    for name, setting in client.items():
        reader = reader.option(f"kafka.{name}", setting)
    source = reader.load()
    # The key as KeyedAggregate.key_of makes it (str(value).strip()), so that the group key, the window id
    # in the log and the initial state's key are one string: Java's Unicode \s plus the separators
    # \x1c-\x1f is the set of characters Python's strip() removes.
    key_col = F.regexp_replace(F.col(spec.key).cast("string"), _STRIP_PATTERN, "")
    # q_g(k) for every generation g: Spark's shuffle hash, so q is also the state partition when the shuffle
    # partitions equal P. The processor needs all of them for C_k; the last one routes the output.
    qs = F.array(*[F.pmod(F.hash(F.col("cec_key")), F.lit(g.partitions)) for g in recovery.generations])
    columns = [
        F.col("cec_partition").cast("long").alias("cec_j"),
        F.col("cec_offset").alias("cec_o"),
        key_col.alias("cec_key"),
        F.col(spec.value).alias("cec_v"),
    ]
    if spec.time:
        columns.append(F.col(spec.time).alias("cec_time"))
    rows = source.select(*columns).withColumn("cec_qs", qs)
    processor = CecAggregateProcessor(spec, recovery.crash_points, recovery.current.index)
    initial = _initial_state(spark, recovery)
    transformed = rows.groupBy("cec_key").transformWithStateInPandas(
        statefulProcessor=processor,
        outputStructType=_EMIT_SCHEMA,
        outputMode="Append",
        timeMode="None",
        initialState=initial.groupBy("cec_key") if initial is not None else None,
    )
    writer = transformed.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    if query_name:
        writer = writer.queryName(query_name)
    if available_now:
        writer = writer.trigger(availableNow=True)
    elif processing_time:
        writer = writer.trigger(processingTime=processing_time)
    # Both settings are captured by the query when it starts (its session is cloned then).
    saved: dict[str, str | None] = {
        conf: spark.conf.get(conf, None)
        for conf in ("spark.sql.shuffle.partitions", "spark.sql.streaming.stateStore.providerClass")
    }
    spark.conf.set("spark.sql.shuffle.partitions", str(recovery.current.partitions))
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", _ROCKSDB_PROVIDER)
    try:
        return writer.start()
    finally:
        for conf, previous in saved.items():
            if previous is None:
                spark.conf.unset(conf)
            else:
                spark.conf.set(conf, previous)


def _initial_state(spark: SparkSession, recovery: AttachRecovery) -> DataFrame | None:
    rows: list[tuple[Any, ...]] = [
        (k, w.seq, True, w.state, w.generation, list(w.pos_w)) for k, w in recovery.windows.items()
    ]
    rows.extend((k, s, False, None, -1, None) for k, s in recovery.next_seq.items())
    if not rows:
        return None
    return spark.createDataFrame(rows, _INIT_SCHEMA)


def read_results(
    spark: SparkSession,
    output_topic: str,
    bootstrap_servers: str,
    *,
    kafka_config: Mapping[str, str] | None = None,
    with_meta: bool = False,
) -> DataFrame:
    """The results (R records) of every generation of `output_topic` as one DataFrame with KeyedAggregate's
    columns (plus the cec_ metadata columns and `cec_generation` when `with_meta`)."""
    from functools import reduce

    from pyspark.sql import functions as F

    from queuestore.kafka import KafkaQueueStore

    # Only reads metadata: the state directory is never written.
    state_dir = Path(tempfile.gettempdir()) / "cec-spark"
    store = KafkaQueueStore(bootstrap_servers, state_dir, config=dict(kafka_config or {}))
    try:
        generations = list_generations(store, output_topic)
    finally:
        store.close()
    if not generations:
        raise ConfigError(f"output topic {output_topic!r} does not exist")
    register(spark)
    frames = []
    for gen in generations:
        reader = (
            spark.read.format(FORMAT)
            .option("topic", gen.topic)
            .option("bootstrap.servers", bootstrap_servers)
            .option("schema", "aggregate")
        )
        for name, setting in (kafka_config or {}).items():
            reader = reader.option(f"kafka.{name}", setting)
        df = reader.load().withColumn("cec_generation", F.lit(gen.index))
        frames.append(df if with_meta else df.select(*RESULT_COLUMNS))
    return reduce(lambda a, b: a.unionByName(b), frames)
