"""The CEC operator of an attached aggregation, on the executors (`operators.spark.attach`): an adapter
around the engine (`operators.engine`), one instance per state partition and call.

`CecAggregateProcessor` runs under `groupBy(cec_group).transformWithStateInPandas`, where the grouping
value stands for one output partition q of the current generation (`partition_groups`: a value that Spark's
shuffle hash sends to state partition q). So each task calls the processor once per micro-batch with all
the rows of its partition, and the partition's whole state is one ValueState
(`operators.spark.state_partition.PartitionState`, pickled): one state get and one update per partition
and micro-batch, instead of exists/get/update per key (each a round trip to the JVM's state server) and a
pandas frame per key. Spark still versions that state per micro-batch, so task retries and the
exactly-once of the sink are as before. Within a call the engine's `OperatorInstance` drives
`operators.aggregate.KeyedAggregate` over the partition (`PartitionCall`), exactly as it does under the
local runtime: the replay contract, G-open, dead letters, watermarks and the phase are the engine's. Its
records come out as rows (j, o, emission index, kind, key, seq, state/payload bytes, event time, N delta,
marks); the sink (`operators.spark.sink`) stamps them into records.

Per-key order: Spark does not order a group's rows, so the processor orders the partition's tuples by
(j, o) as it unpacks them (`operators.spark.packing.unpack`), which orders every key's tuples. As in
DESIGN-NOTES section 2, exactness needs each key to live in one input partition.

Replay: the instance is RESTORING until its tuples reach the partition's crash point (`recovery.contract`;
with one generation, its own log's crash point; across generations each key's own C_k,
`recovery.contract.key_crash_point`, below the bound of all of them). With watermarks, tuples past the
crash point wait in the partition's state until every input partition reached its own, as locally.

Input: packed rows (`operators.spark.packing`) of the cec-kafka source (typed value and time) or of the
cec-topic source (`AggregateSpec.json_values`: value and time as JSON text, and `cec_error`, the reason a
record could not be read; the value column then holds the record as read, the dead letter's `raw`).

G-checks (`operators.spark.checkpointing`: the engine's controller fed with the partition's own rates;
timeMode "ProcessingTime", except for the default checkpointing, `GCheckSpec.in_batch`: there the controller
looks right after a micro-batch's input rows, in the same call, and no timer is armed):
- each task measures the input with `seen`: per input partition, the next offset after the rows it got
  in this micro-batch (timers fire after a micro-batch's input rows, in the same task and processor);
- a window records `fp_clock`, the pos its latest footprint carries in the log (`pos_w` for a window
  loaded from the EC; computed with the sink's own stamping rule, `operators.spark.stamping`, from the
  partition's `stamp`), and `fp_out`, the partition's records emitted in this run then; its partition has
  one processing-time timer while it holds a live open window, firing every CP ms at most;
- when it fires, and the partition is RUNNING, its live windows are taken oldest footprint first and
  G-checked while the policy wants the front one and the task's budget allows (`choose_gchecks`);
- only a *live* window is G-checked: one whose key had a tuple past its crash point, whose last applied
  tuple (j, o) the G-check row carries: its state holds that tuple and all before.

Figures: after its input rows, and again after its G-checks, a state partition reports its open windows
and the lowest footprint pos among them (`PartitionState` figures, a control row): the extent figures of
the query's progress come from one small row per partition and micro-batch, never from per-key rows.
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Iterator, Sequence
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

from cec.records import AvroCodec
from operators.base import Operator
from operators.collector import collector_paused
from operators.engine.instance import loaded_window_ends
from operators.engine.phase import Phase
from operators.spark.aggregate_spec import AggregateSpec
from operators.spark.checkpointing import GCheckSpec, WindowMark, choose_gchecks
from operators.spark.input_tuples import input_tuples, part_ids, plain_value

# The grouping column (one value per output partition of the current generation: `partition_groups`) and
# per tuple its output partition in every generation (for C_k; only across generations): see packing.
from operators.spark.packing import GROUP_COLUMN, QS_COLUMN, unpack
from operators.spark.partitioning import output_partition, partition_groups, spark_hash_long
from operators.spark.stamping import positions_and_times
from operators.spark.state_partition import (
    GCHECK_ORDER,
    KeyFacts,
    PartitionCall,
    PartitionState,
    flat_state,
    fresh_engine,
)
from recovery.contract import PositionStamper, TupleFate, key_crash_point

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
    "PartitionState",
    "output_partition",
    "partition_groups",
    "spark_hash_long",
]

STATE_NAME = "cec_partition"
# What the processor keeps per state partition: `PartitionState`, pickled (see the module doc).
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
        # The logical time of its latest footprint in its log (trimming finds the footprint's offset by it).
        StructField("fp_time", LongType(), True),
    ]
)
INIT_SCHEMA = StructType([StructField("cec_key", StringType(), True), *STATE_SCHEMA.fields])
# One row per record the operator produces; the sink turns them into OutputRecords.
EMIT_SCHEMA = StructType(
    [
        StructField("cec_q", LongType(), False),  # output partition in the current generation
        StructField("cec_j", LongType(), False),  # input partition of the tuple that produced it
        StructField("cec_o", LongType(), False),  # its offset
        StructField("cec_i", LongType(), False),  # emission order among the partition's records of the call
        StructField("cec_kind", StringType(), False),
        StructField("cec_key", StringType(), True),
        StructField("cec_seq", LongType(), False),
        StructField("cec_state", BinaryType(), True),
        StructField("cec_payload", BinaryType(), True),
        StructField("cec_t", LongType(), False),  # the tuple's event time, -1 if none
        StructField("cec_dn", LongType(), False),  # change of N
        StructField("cec_marks", ArrayType(LongType(), False), True),  # event-time marks (watermarks only)
        # The instance's live input position when it made the record (`operators.spark.stamping`).
        StructField("cec_live", ArrayType(LongType(), False), True),
    ]
)
EMIT_COLUMNS = [f.name for f in EMIT_SCHEMA.fields]
# The kind of a row that is not a record: a state partition's checkpoint controls (what it planned and
# said), JSON in cec_payload, for the query's progress. The sinks take it out before writing.
CONTROL_KIND = "CTRL"
_FOOTPRINT_KINDS = ("GOPEN", "GCHECK")
PROCESS, SKIP = TupleFate.PROCESS, TupleFate.SKIP
# The `entry` of a control row that carries a partition's extent figures (`_figures`) rather than its
# checkpoint controls.
FIGURES_ENTRY = "figures"


def _figures(part: PartitionState, generation: int, phase: int, tuples: int = 0) -> tuple[Any, ...]:
    """The partition's extent figures as a control row (`FIGURES_ENTRY`): its open windows and, per input
    partition, the lowest pos among their latest footprints; `tuples`: the input tuples it was handed in
    this call (packed rows hide them from Spark's own counts). `phase` orders the rows of one micro-batch
    (0: after its input, 1: after its G-checks). For trimming (`operators.spark.trim`): the lowest time of
    the footprints in this generation's log and whether the partition is still restoring."""
    clocks = [saved[6] for saved in part.keys.values() if saved[1] >= 0 and saved[6] is not None]
    lowest = [min(column) for column in zip(*clocks, strict=True)] if clocks else None
    report = {"partition": part.q, "entry": FIGURES_ENTRY, "phase": phase, "open_windows": len(clocks),
              "footprint_min": lowest, "tuples": tuples,
              "footprint_time": part.oldest_footprint_time(generation),
              "restoring": bool(part.engine[5])}  # fmt: skip
    return (part.q, -1, -1, 0, CONTROL_KIND, None, -1, None, json.dumps(report).encode(), -1, 0, None, None)


class CecAggregateProcessor(StatefulProcessor):
    """The CEC operator of one state partition at a time under transformWithStateInPandas (module doc).
    `marks`: per output partition of the current generation, the event-time marks of its log's crash
    record (watermarks; None: none kept, or nothing logged yet); `cut_results`: the result payloads of
    the records at its log's end that carry the crash point's pos (`recovery.cut_tuple`)."""

    def __init__(
        self,
        spec: AggregateSpec,
        crash_points: list[list[tuple[int, ...]]],
        generation: int,
        gcheck: GCheckSpec | None = None,
        groups: Sequence[int] | None = None,
        marks: Sequence[Sequence[int] | None] | None = None,
        times: Sequence[int] | None = None,
        cut_results: Sequence[Sequence[bytes]] | None = None,
    ) -> None:
        self.spec = spec
        self.crash_points = crash_points
        self.generation = generation
        self.gcheck = gcheck
        # Grouping value -> output partition q of the current generation.
        partitions = len(crash_points[generation]) if crash_points else 1
        self.group_q = {g: q for q, g in enumerate(groups or partition_groups(partitions))}
        self.partitions = partitions
        self.marks = list(marks) if marks is not None else [None] * partitions
        # Per output partition of the current generation, its crash record's logical time (0: empty log).
        self.times = list(times) if times is not None else [0] * partitions
        # Per output partition of the current generation, the result payloads at its log's end
        # (`recovery.cut_tuple`, `operators.spark.planning.LogEnd.results`), decoded in `init`.
        self.cut_results = [list(r) for r in cut_results] if cut_results is not None else [[]] * partitions
        # Durations within a task (G-check cost, task time) and wall time between micro-batches (which may
        # run in other Python workers); attributes so that tests can drive them.
        self.clock = time.perf_counter
        self.wall = time.time

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.operator: Operator = self.spec.build()
        # Parts that never reopen once closed are not kept after (PartitionCall, AggregateSpec.forget_closed).
        self.forget_closed = self.spec.forget_closed
        self.logged: list[list[dict[str, Any]]] = [[] for _ in self.cut_results]
        if self.operator.unique_results:
            codec = AvroCodec(self.operator.result_schema)
            self.logged = [[codec.decode(p) for p in payloads] for payloads in self.cut_results]
        self.handle = handle
        self.state = handle.getValueState(STATE_NAME, PARTITION_STATE_SCHEMA)
        # One processor per task: the input positions its rows reached in this micro-batch (next offsets),
        # the clock that G-check decisions measure replay with; and the task's G-check budget.
        self.seen = [0] * len(self.crash_points[0][0])
        self.task_started = self.clock()
        self.schedule = self.gcheck.schedule(self.clock) if self.gcheck is not None else None
        if self.schedule is not None:
            self.schedule.start()

    def _crash_pos(self, q: int) -> tuple[int, ...]:
        """The partition's crash point for the phase rule: its own log's with one generation; across
        generations the bound of every key's own (`recovery.contract`, "per-key crash points")."""
        if len(self.crash_points) == 1:
            return tuple(self.crash_points[0][q])
        width = len(self.crash_points[0][0])
        return tuple(max(c[j] for gen in self.crash_points for c in gen) for j in range(width))

    def _partition(self, group: Any) -> PartitionState:
        row = self.state.get()  # None when the partition has no state yet (one round trip, no exists())
        if row is not None:
            part = PartitionState.load(row)
        else:
            q = self.group_q[int(group)]
            own = tuple(self.crash_points[self.generation][q])
            # The crash record's marks (none for an empty log, or a query without watermarks).
            marks = (self.marks[q] or None) if self.spec.allowed_lateness is not None else None
            part = PartitionState(q, own, fresh_engine(len(own), marks), stamp_time=self.times[q])
        if self.gcheck is not None:
            part.control.take_planned(self.gcheck.planned, self.partitions, self.wall())
        return part

    def _call(self, part: PartitionState) -> PartitionCall:
        return PartitionCall(
            self.operator,
            part,
            self.generation,
            self._crash_pos(part.q),
            per_key_crash=len(self.crash_points) > 1,
            forget_closed=self.forget_closed,
            logged_results=self.logged[part.q],
        )

    def handleInitialState(self, key: Any, initialState: Any, timerValues: TimerValues) -> None:
        """The keys the recovery plan loads into this partition (may come in several chunks)."""
        with collector_paused():
            self._load_initial_state(key, initialState)

    def _load_initial_state(self, key: Any, initialState: Any) -> None:
        started = self.clock()
        part = self._partition(key[0])
        keys = part.keys
        names = ("cec_key", "seq", "open", "state", "fp_gen", "pos_w", "fp_time")
        columns = [initialState[c].tolist() for c in names]
        keys_, _seqs, opens, raw_states = columns[:4]
        # The open windows' states decoded at once, as the local host's EC-load does (Operator.decode_states).
        states = iter(
            self.operator.decode_states(
                [
                    bytes(st)
                    for k, is_open, st in zip(keys_, opens, raw_states, strict=True)
                    if is_open and k is not None
                ]
            )
        )
        watermarks = self.spec.allowed_lateness is not None
        loaded: list[tuple[str, int, Any]] = []
        for k, seq, is_open, _state, fp_gen, pos_w, fp_time in zip(*columns, strict=True):
            seq = int(seq)
            if is_open and k is not None:
                s = next(states)
                window_pos = tuple(int(p) for p in pos_w)
                # Loaded windows are not live (G-checked only after a tuple past the key's crash point);
                # their footprint clock is pos_w.
                fields = flat_state(s)
                t = plain_value(fp_time)
                keys[k] = (seq + 1, seq, fields, int(fp_gen), window_pos, False, window_pos, -1, -1, 0,
                           None if t is None else int(t))  # fmt: skip
                if watermarks:
                    loaded.append((k, seq, s))
            elif not self.forget_closed:
                keys[k] = (seq, -1, None, -1, None, False, None, -1, -1, 0, None)
        if loaded:
            # The engine's open windows by the end where the watermark acts on them (one heap; the
            # partition's marks are the crash record's until its first call).
            ends = part.engine[3]
            ends.extend(loaded_window_ends(self.operator, loaded, part.engine[2]))
            heapq.heapify(ends)
        windows = sum(1 for is_open in columns[2] if is_open)
        part.control.observe_load(windows, self.clock() - started)  # the EC load, measured where it runs
        self.state.update(part.dump())

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Iterator[Any]:
        with collector_paused():  # why: operators.collector
            frames = list(self._input_rows(key, rows, timerValues))
        yield from frames

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
        call = self._call(part)
        js, os_ = columns["cec_j"], columns["cec_o"]
        n = len(js)
        errors: Sequence[str | None] = columns["cec_error"] if spec.json_values else [None] * n
        tuples = input_tuples(spec, columns, errors)
        # The engine's part ids: the packed key for one aggregate; for several, the operator's own
        # `key_of` (a composite key, and with watermarks a part per (key, window start)).
        ks = part_ids(self.operator, tuples) if spec.several else columns["cec_key"]
        seen = self.seen
        for j, o in zip(js, os_, strict=True):
            if o >= seen[j]:
                seen[j] = o + 1
        # C_k of each key met, across generations (the contract's per-key crash points).
        qs_column = columns.get(QS_COLUMN)
        if call.key_crash is not None and qs_column is not None:
            key_crash = call.key_crash
            for k, qs in zip(ks, qs_column, strict=True):
                if k not in key_crash:
                    key_crash[k] = key_crash_point(self.crash_points, qs)
        # Per key: its last applied tuple (a G-check claims it) and whether a tuple past its crash point
        # was processed (its window becomes live): the fates are the contract's, fixed for the call.
        contract = call.instance.contract
        processed: dict[str | None, KeyFacts] = {}  # a call's facts of a key stay the same object
        touch, touched = call.touch, call.keys.get
        for j, o, k in zip(js, os_, ks, strict=True):
            fate = PROCESS if contract is None else contract.fate(j, o, k)
            if fate is SKIP:
                continue
            facts = touched(k) or touch(k)
            facts.last_j, facts.last_o = j, o
            if fate is PROCESS:
                processed[k] = facts
        call.instance.apply_run(tuples)
        open_now = call.windows.open_windows  # every processed key was touched: no saved window to install
        for k, facts in processed.items():
            if k is not None and k in open_now:
                facts.live = True  # its state now holds every tuple of the key so far
        out = call.rows.rows
        # Each new footprint's pos and time, exactly as the sink stamps them (`out` is in log order: the
        # order the instance made them): the window's footprint clock and time.
        self._footprints_stamped(part, call, out)
        call.store()
        call.release()
        part.control.observe_batch(
            now=self.wall(), task_seconds=self.clock() - self.task_started, seen=seen, emitted=len(out)
        )
        out.append(_figures(part, self.generation, 0, n))
        if self.gcheck is not None:
            live = part.live_windows() if self.gcheck.in_batch or part.timer < 0 else []
            if self.gcheck.in_batch:  # due through this input: made now, no timer (GCheckSpec.in_batch)
                out.extend(self._look(part, live))
            elif live:
                self._arm_timer(part, timerValues)
        self.state.update(part.dump())
        yield pd.DataFrame(out, columns=EMIT_COLUMNS)

    def _footprints_stamped(
        self, part: PartitionState, call: PartitionCall, rows: list[tuple[Any, ...]]
    ) -> None:
        """Each footprint row's pos and time, as the sink stamps `rows` (in log order, after the partition's
        earlier records): its key's footprint clock and time; the partition's stamp moved past them."""
        stamper = PositionStamper(part.stamp)
        stamps = positions_and_times(rows, stamper, part.stamp_time, self.spec.time is not None)
        facts_of = call.keys
        for row, (pos, t_log) in zip(rows, stamps, strict=True):
            if (
                row[4] in _FOOTPRINT_KINDS
            ):  # a G-check among a tuple's: a session's fold footprints its receiver
                facts = facts_of[row[5]]
                facts.fp_clock, facts.fp_time = pos, t_log
        part.stamp = stamper.last
        if stamps:
            part.stamp_time = stamps[-1][1]

    def _arm_timer(self, part: PartitionState, timerValues: TimerValues) -> None:
        assert self.gcheck is not None
        part.timer = timerValues.getCurrentProcessingTimeInMs() + self.gcheck.interval_ms
        self.handle.registerTimer(part.timer)

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues, expiredTimerInfo: Any) -> Iterator[Any]:
        """G-check the partition's live windows, oldest footprint first, while the policy wants the front
        one and the task's budget allows (`operators.spark.checkpointing.choose_gchecks`), once it is
        RUNNING (`operators.engine.phase`); re-arm while a live window is open (Spark deletes the expired
        timer after this returns)."""
        with collector_paused():
            frames = list(self._expired_timer(key, timerValues))
        yield from frames

    def _expired_timer(self, key: Any, timerValues: TimerValues) -> Iterator[Any]:
        import pandas as pd

        if self.gcheck is None:
            return
        part = self._partition(key[0])
        part.timer = -1
        live = part.live_windows()
        rows = self._look(part, live)
        if live:
            self._arm_timer(part, timerValues)
        self.state.update(part.dump())
        if rows:
            yield pd.DataFrame(rows, columns=EMIT_COLUMNS)

    def _look(self, part: PartitionState, live: list[str | None]) -> list[tuple[Any, ...]]:
        """One look of the checkpoint controller at the partition's `live` windows, from its timer or
        right after a micro-batch's input (`GCheckSpec.in_batch`): the G-checks it makes once the partition
        is RUNNING (`operators.engine.phase`), the partition's figures after them, and its controls when
        they changed."""
        rows: list[tuple[Any, ...]] = []
        if not live:
            return rows
        call = self._call(part)
        if call.instance.phase is Phase.RUNNING:
            rows = self._gcheck(part, call, live)
        if rows:  # G-checks moved footprints: the partition's figures after them
            rows.append(_figures(part, self.generation, 1))
        report = part.control.report(part.q)
        if report is not None:
            rows.append((part.q, -1, -1, 0, CONTROL_KIND, None, -1, None, report, -1, 0, None, None))
        return rows

    def _gcheck(
        self, part: PartitionState, call: PartitionCall, live: list[str | None]
    ) -> list[tuple[Any, ...]]:
        """One timer's G-checks (module doc); the rows they make, their footprint clocks kept."""
        assert self.gcheck is not None and self.schedule is not None
        control = part.control
        saved_keys = part.keys
        # The partition's input position (this micro-batch's merged with the earlier ones': a no-data
        # micro-batch's timer measures u from where the input stands, not from zero).
        seen = control.seen or (0,) * len(self.seen)
        width = len(seen)
        marks = []
        for k in live:
            clock = saved_keys[k][6] or (0,) * width
            u = sum(s - c for s, c in zip(seen, clock, strict=True) if s > c)
            marks.append(WindowMark(k, u, max(control.out - saved_keys[k][9], 0)))
        instance, windows = call.instance, call.windows

        def gcheck(k: Any) -> None:
            window = windows.get(k)
            assert window is not None
            instance.gcheck_run([window])

        now = self.wall()
        # The first timer's allowance covers the run since the partition's first task of this start:
        # the windows it must reach were opened during all of it, not only during this task.
        since = control.last_timer_wall if control.last_timer_wall is not None else control.first_wall
        elapsed = now - since if since is not None else 0.0  # first_wall is set by `_partition`
        control.last_timer_wall = now
        choose_gchecks(
            control,
            self.gcheck.policy(control.rates),
            self.schedule,
            marks,
            part.open_count(),
            gcheck,
            self.clock,
            part.q,
            any(self.seen),
            elapsed,
        )
        rows = call.rows.rows
        # The G-checks' pos and time, as the sink stamps them after the micro-batch's other records.
        self._footprints_stamped(part, call, rows)
        call.store()
        call.release()
        return rows

    def close(self) -> None:
        pass
