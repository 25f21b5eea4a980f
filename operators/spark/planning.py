"""Recovery planning of an attached aggregation (`operators.spark.attach`), on the executors.

On every start (the Spark checkpoint is never reused: each start is a fresh query) one small Spark job runs
one task per output partition of every generation (`operators.spark.generations`), `PartitionPlanTask`
under `mapInArrow`. Task (g, q):
- reads its log back: `EventualCheckpointBuilder` -> EC windows and crash point t_c (the zero vector for
  an empty log), checked by `recovery.contract.ReplayContract.build` (one input width, no footprint
  beyond its crash point). The current generation's logs are read up to the end offsets the driver found
  when it fenced their writers, so a recomputed task (a lost executor) reads exactly the same log;
- reads the partition's closed-window directory (key -> last closed window seq) from its stream index
  (`queuestore.index.StreamIndex`), plus the records past the index's end: the current generation's index
  was reconciled by the driver's `OutputQueue` and is only read here; an older generation's is reconciled
  here (built from the log where this executor has none);
- returns the partition's summary (crash point, N, time, end offset, records read, counts, the smallest
  footprint pos of its windows) and, as Arrow rows in the processor's `INIT_SCHEMA`, its open windows
  (seq, state, pos_w, generation of the footprint) and, for keys without one, the next window seq (last
  closed seq + 1).
The rows stay on the executors: the plan is cached there and the fresh query's `initialState` is that
cached DataFrame. The driver collects only a summary per log (and, across generations, one row per output
partition: its loaded windows and their lowest footprint pos, the sink's extent figures), so what it holds
is bounded by the partition count: no window, key or state passes through it.

Across generations (a restart with another partition count), per key: its crash point C_k = max over
generations g of t_c[g][q_g(k)] (component-wise): every tuple of k below C_k has its outputs in some log,
none at or above has. The open window of k is the EC window with the highest seq (on a tie, the later
generation's footprint), unless a closed seq >= it exists (it closed in a later generation); that merge
is a Spark aggregation by key (one generation needs none: a key's windows are all in one partition).

The input restarts at T[j] = min(min over loaded windows of pos_w[j], max_g min_q t_c[g][q][j]), a lower
bound of every C_k[j]. With one generation and one output partition this is exactly the contract's
replay start (`ReplayContract.start`); with several, each log's contract start is combined so that T is
below every key's own C_k. The per-tuple rule itself (`tuple_fate` with C_k) is applied by the processor.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from cec.exceptions import ConfigError
from cec.records import Kind
from cec.verified import LogVerifier
from operators.spark.generations import Generation
from queuestore.base import PartitionReader
from queuestore.exceptions import IndexError_
from queuestore.index import StreamIndex
from recovery.contract import ReplayContract
from recovery.eventual import EventualCheckpointBuilder
from recovery.exceptions import RecoveryError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from queuestore.kafka import KafkaQueueStore
    from queuestore.output import OutputQueue

__all__ = [
    "AttachRecovery",
    "LogEnd",
    "PartitionPlan",
    "PartitionPlanTask",
    "plan_partition",
    "plan_recovery",
]

log = logging.getLogger(__name__)

_R = Kind.R.value
# Columns of the planning job's rows besides the processor's INIT_SCHEMA ones. entry: "end" (one per
# partition: its summary), "win" (an open window loaded from the EC) or "next" (a key's next window seq).
_PLAN_EXTRA = ("entry", "plan_g", "plan_q", "crash_pos", "n", "time", "end_offset", "records_read",
               "windows", "nexts", "min_pos", "marks", "error")  # fmt: skip
_INIT_COLUMNS = (
    "cec_key",
    "seq",
    "open",
    "state",
    "fp_gen",
    "pos_w",
    "live",
    "fp_clock",
    "last_j",
    "last_o",
    "q",
    "timer",
    "fp_time",
)  # fmt: skip (the processor's INIT_SCHEMA, which imports pyspark)


@dataclass(frozen=True)
class LogEnd:
    """Where one output log of the current generation stands: the sink continues from here."""

    pos: tuple[int, ...]
    n: int
    time: int
    offset: int = 0  # the log's end offset (where the next record goes; transaction markers included)
    marks: tuple[int, ...] = ()  # the crash record's event-time marks (watermarks; () without, or empty)


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
    driver_rows: int = 0  # rows the driver collected while planning (a summary per log or per partition)
    ends: list[LogEnd] = field(default_factory=list, repr=False)
    # Per output partition of the current generation: the windows loaded into it and the lowest pos of
    # their footprints (the sink's extent figures until the partition reports its own; empty: none).
    partition_windows: list[tuple[int, tuple[int, ...] | None]] = field(default_factory=list, repr=False)
    # The fresh query's initialState (processor INIT_SCHEMA rows, cached on the executors); None: nothing.
    initial: DataFrame | None = field(default=None, repr=False)
    _cached: list[DataFrame] = field(default_factory=list, repr=False)

    def release(self) -> None:
        """Drop the cached planning rows (once the query no longer needs its initial state). Never raises:
        it runs on the way out, also after the session has stopped (then there is nothing to drop)."""
        for df in self._cached:
            try:
                df.unpersist()
            except Exception as exc:  # a stopped session or context: its cache is gone with it
                log.debug("unpersist of the recovery plan failed: %s", exc)
        self._cached.clear()


@dataclass
class PartitionPlan:
    """What one output partition's log holds for recovery (`plan_partition`)."""

    crash_pos: tuple[int, ...] | None  # None: an empty log
    n: int
    time: int
    end_offset: int
    records_read: int
    # key -> (seq, state, pos_w, footprint time) of its open window
    windows: dict[str, tuple[int, bytes, tuple[int, ...], int]]
    next_seq: dict[str, int]  # keys with no open window here: last closed seq + 1
    marks: tuple[int, ...] = ()  # the crash record's event-time marks (watermarks)


class _BoundedReader:
    """A partition reader whose log ends at `end`: what the driver saw when it fenced the writers."""

    def __init__(self, reader: PartitionReader, end: int) -> None:
        self._reader = reader
        self._end = end

    def end_offset(self) -> int:
        return self._end

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)


def _closed_windows(
    store: KafkaQueueStore, reader: PartitionReader, topic: str, q: int, end: int, *, current: bool
) -> dict[str, int]:
    """key -> last closed window seq in the log below `end` (index hints: the index, then the records past
    its end; see the module doc for who reconciles which index)."""
    path = store.index_path(topic, q)
    identity = f"{topic}/{q}"
    closed: dict[str, int] = {}
    tail = 0
    if current:
        if path.exists():
            try:
                with StreamIndex(path, identity=identity, read_only=True) as index:
                    closed.update(index.closed_windows())
                    tail = index.next_offset
            except IndexError_ as exc:  # the driver's index, damaged: only the driver may rebuild it
                log.warning("%s; reading the closed windows of %s[%d] from the log", exc, topic, q)
                closed.clear()
                tail = 0
        else:  # an executor on another host than the driver: no index here, the log is the index
            if reader.start_offset() > 0:
                # A trimmed log no longer holds every key's last R (`operators.spark.trim`).
                raise RecoveryError(
                    f"{topic}[{q}] was trimmed and its stream index is on the driver's host only: plan "
                    "the recovery of a trimmed log with executors on that host"
                )
            log.info(
                "%s[%d]: no stream index on this host; reading the closed windows from the log", topic, q
            )
    else:
        with StreamIndex(path, identity=identity) as index:  # rebuilt from the log if damaged
            index.reconcile(reader)
            closed.update(index.closed_windows())
            tail = index.next_offset
    if tail < end:
        # Checked records only, as the index itself takes them: a damaged footprint is passed over (as
        # recovery passes over it), any other damaged record is an error, never a window directory entry.
        verifier = LogVerifier(reader, passable=(Kind.GOPEN.value, Kind.GCHECK.value))
        verifier.seek(tail)
        for records in reader.scan_forward_chunks(tail):
            for record in verifier.check(records):
                meta = record.meta
                if record.offset < end and meta.kind == _R and meta.key is not None:
                    closed[meta.key] = max(meta.seq, closed.get(meta.key, -1))
            if records[-1].offset >= end:
                break
    return closed


def plan_partition(
    store: KafkaQueueStore,
    gen: Generation,
    q: int,
    input_partitions: int,
    *,
    current: bool,
    end: int | None = None,
) -> PartitionPlan:
    """One output partition's part of the plan: its EC (checked by the replay contract) and closed-window
    directory. `end`: read the log as if it ended there (None: its real end). Raises RecoveryError."""
    with store.reader(gen.topic, q) as reader:
        if end is None:
            end = reader.end_offset()
        else:
            reader.hint_end(end)
        bounded = cast(PartitionReader, _BoundedReader(reader, end))
        ec = EventualCheckpointBuilder(bounded).build()
        # The contract checks the log against the input (width, footprints below the crash point).
        ReplayContract.build(
            ec.crash_pos, {k: fp.record.pos for k, fp in ec.windows.items()}, input_partitions
        )
        closed = _closed_windows(store, reader, gen.topic, q, end, current=current)
    windows = {
        k: (fp.record.seq, fp.record.state or b"", tuple(fp.record.pos), fp.record.time)
        for k, fp in ec.windows.items()
    }
    # An EC window's R is not in its log (module doc of recovery.eventual), so no closed seq here reaches it.
    next_seq = {k: s + 1 for k, s in closed.items() if k not in windows}
    return PartitionPlan(
        ec.crash_pos, ec.n, ec.time, end, ec.records_read, windows, next_seq, tuple(ec.marks)
    )


def _plan_schema() -> StructType:
    from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

    from operators.spark.processor import INIT_SCHEMA

    longs = ArrayType(LongType(), False)
    return StructType(
        [
            StructField("entry", StringType(), False),
            StructField("plan_g", LongType(), False),
            StructField("plan_q", LongType(), False),
            StructField("crash_pos", longs, True),
            StructField("n", LongType(), True),
            StructField("time", LongType(), True),
            StructField("end_offset", LongType(), True),
            StructField("records_read", LongType(), True),
            StructField("windows", LongType(), True),
            StructField("nexts", LongType(), True),
            StructField("min_pos", longs, True),
            StructField("marks", longs, True),
            StructField("error", StringType(), True),
            *[StructField(f.name, f.dataType, True) for f in INIT_SCHEMA.fields],
        ]
    )


class PartitionPlanTask:
    """The `mapInArrow` function of the planning job (picklable: shipped to the executors). Its input rows
    are `id`s of `spark.range`: task i plans `targets[i]` = (generation, partition)."""

    def __init__(
        self,
        bootstrap_servers: str,
        client: Mapping[str, str],
        state_dir: str,
        generations: Sequence[Generation],
        current_ends: Sequence[int],
        input_partitions: int,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.client = dict(client)
        self.state_dir = state_dir
        self.generations = list(generations)
        self.current_ends = list(current_ends)
        self.input_partitions = input_partitions
        self.targets = [(g.index, q) for g in self.generations for q in range(g.partitions)]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        from queuestore.kafka import KafkaQueueStore

        schema = _arrow_schema(_plan_schema())
        ids = [i for batch in batches for i in batch.column("id").to_pylist()]
        if not ids:
            return
        store = KafkaQueueStore(self.bootstrap_servers, Path(self.state_dir), config=self.client)
        try:
            for i in ids:
                g, q = self.targets[i]
                yield pa.RecordBatch.from_pydict(self._columns(store, g, q), schema=schema)
        finally:
            store.close()

    def _columns(self, store: KafkaQueueStore, g: int, q: int) -> dict[str, list[Any]]:
        """Partition (g, q)'s rows as columns: its summary ("end"), its windows ("win"), its next seqs."""
        gen = self.generations[g]
        current = g == self.generations[-1].index
        summary: dict[str, Any] = {}
        try:
            plan = plan_partition(
                store, gen, q, self.input_partitions, current=current,
                end=self.current_ends[q] if current else None,
            )  # fmt: skip
        except RecoveryError as exc:
            summary["error"] = str(exc)
            plan = None
        cols: dict[str, list[Any]] = {name: [summary.get(name)] for name in _PLAN_EXTRA}
        cols.update({name: [None] for name in _INIT_COLUMNS})
        cols["entry"], cols["plan_g"], cols["plan_q"] = ["end"], [g], [q]
        if plan is None:
            return cols
        pos_ws = [w[2] for w in plan.windows.values()]
        for name, value in (
            ("crash_pos", None if plan.crash_pos is None else list(plan.crash_pos)),
            ("n", plan.n),
            ("time", plan.time),
            ("end_offset", plan.end_offset),
            ("records_read", plan.records_read),
            ("windows", len(plan.windows)),
            ("nexts", len(plan.next_seq)),
            ("min_pos", [min(p[j] for p in pos_ws) for j in range(len(pos_ws[0]))] if pos_ws else None),
            ("marks", list(plan.marks)),
        ):
            cols[name] = [value]
        wins, nexts = len(plan.windows), len(plan.next_seq)
        rest = wins + nexts
        for name in _PLAN_EXTRA[3:]:
            cols[name].extend([None] * rest)
        cols["entry"] += ["win"] * wins + ["next"] * nexts
        cols["plan_g"] += [g] * rest
        cols["plan_q"] += [q] * rest
        cols["cec_key"] += [*plan.windows, *plan.next_seq]
        cols["seq"] += [w[0] for w in plan.windows.values()] + list(plan.next_seq.values())
        cols["open"] += [True] * wins + [False] * nexts
        cols["state"] += [w[1] for w in plan.windows.values()] + [None] * nexts
        cols["fp_gen"] += [g] * wins + [-1] * nexts
        # Loaded windows are not live: they are G-checked only after a tuple of their key past its crash
        # point. fp_clock starts at pos_w (the input read when the footprint was made).
        pos_lists = [list(p) for p in pos_ws]
        cols["pos_w"] += pos_lists + [None] * nexts
        cols["fp_clock"] += pos_lists + [None] * nexts
        cols["live"] += [False] * rest
        for name in ("last_j", "last_o", "q", "timer"):
            cols[name] += [-1] * rest
        cols["fp_time"] += [w[3] for w in plan.windows.values()] + [None] * nexts
        return cols


def _arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema)


def _current_ends(store: KafkaQueueStore, gen: Generation, outputs: Sequence[OutputQueue]) -> list[int]:
    """Each current log's end offset (transaction markers included), found from its index's end: the
    reconciled index ends at the last record, so only what follows it is read."""
    ends = []
    for q in range(gen.partitions):
        with store.reader(gen.topic, q) as reader:
            reader.hint_end(outputs[q].index.next_offset)
            ends.append(reader.end_offset())
    return ends


def _merged(windows: DataFrame) -> DataFrame:
    """Several generations: per key, its open window with the highest seq (a later generation's on a tie)
    unless a closed seq >= it exists, else its next seq (module doc). On the executors (one aggregation)."""
    from pyspark.sql import functions as F

    from operators.spark.processor import INIT_SCHEMA

    best = F.max(F.when(F.col("open"), F.struct("seq", "fp_gen", "state", "pos_w", "fp_time"))).alias("best")
    nxt = F.max(F.when(~F.col("open"), F.col("seq"))).alias("next")
    grouped = windows.groupBy("cec_key").agg(best, nxt)
    kept = F.col("best").isNotNull() & (F.col("next").isNull() | (F.col("next") <= F.col("best.seq")))
    none = F.lit(None)
    columns = {
        "cec_key": F.col("cec_key"),
        "seq": F.when(kept, F.col("best.seq")).otherwise(F.col("next")),
        "open": kept,
        "state": F.when(kept, F.col("best.state")).otherwise(none),
        "fp_gen": F.when(kept, F.col("best.fp_gen")).otherwise(F.lit(-1).cast("long")),
        "pos_w": F.when(kept, F.col("best.pos_w")).otherwise(none),
        "live": F.lit(False),
        "fp_clock": F.when(kept, F.col("best.pos_w")).otherwise(none),
        "last_j": F.lit(-1).cast("long"),
        "last_o": F.lit(-1).cast("long"),
        "q": F.lit(-1).cast("long"),
        "timer": F.lit(-1).cast("long"),
        "fp_time": F.when(kept, F.col("best.fp_time")).otherwise(none),
    }
    return grouped.select(*[columns[f.name].cast(f.dataType).alias(f.name) for f in INIT_SCHEMA.fields])


def plan_recovery(
    spark: SparkSession,
    store: KafkaQueueStore,
    generations: list[Generation],
    outputs: Sequence[OutputQueue],
    input_partitions: int,
    *,
    client: Mapping[str, str] | None = None,
) -> AttachRecovery:
    """Read every generation's logs back on the executors (module doc): crash points, replay start, the
    log ends the sink continues from, and the initial state as a DataFrame that stays on the executors."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from operators.spark.processor import INIT_SCHEMA, output_partition

    started = time.perf_counter()
    current = generations[-1]
    plan = AttachRecovery(generations, current)
    ends = _current_ends(store, current, outputs)
    zeros = (0,) * input_partitions
    if len(generations) == 1 and not any(ends):
        # A first start: every log is empty (its end offset is 0), so there is nothing to read back and
        # no Spark job to run for it.
        plan.crash_points = [[zeros] * current.partitions]
        plan.ends = [LogEnd(zeros, 0, 0, 0) for _ in range(current.partitions)]
        plan.start = zeros
        plan.seconds = time.perf_counter() - started
        return plan
    task = PartitionPlanTask(
        store.bootstrap_servers, dict(client or {}), str(store.state_dir), generations, ends, input_partitions
    )
    count = len(task.targets)
    rows = spark.range(0, count, 1, count).mapInArrow(task, _plan_schema())
    rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
    plan._cached.append(rows)
    try:
        # One job: the summaries (a row per log; no window, key or footprint reaches the driver).
        pulled = rows.filter(F.col("entry") == "end").select(*_PLAN_EXTRA).toArrow()
        plan.driver_rows += pulled.num_rows
        summaries = pulled.to_pylist()
        by_target = {(r["plan_g"], r["plan_q"]): r for r in summaries}
        for g, q in task.targets:
            r = by_target[(g, q)]
            if r["error"] is not None:
                raise ConfigError(f"{generations[g].topic}[{q}]: {r['error']}")
        windows = rows.filter(F.col("entry") != "end").select(*[f.name for f in INIT_SCHEMA.fields])
        for gen in generations:
            crash = []
            for q in range(gen.partitions):
                r = by_target[(gen.index, q)]
                pos = zeros if r["crash_pos"] is None else tuple(r["crash_pos"])
                plan.resumed = plan.resumed or r["crash_pos"] is not None
                plan.records_read += r["records_read"]
                crash.append(pos)
                if gen is current:
                    marks = tuple(r["marks"] or ())
                    plan.ends.append(LogEnd(pos, r["n"], r["time"], r["end_offset"], marks))
            plan.crash_points.append(crash)
        # T[j]: C_k[j] = max_g t_c[g][q_g(k)][j] >= max_g min_q t_c[g][q][j] for every key k.
        start = [
            max(min(c[j] for c in crash) for crash in plan.crash_points) for j in range(input_partitions)
        ]
        # Per output partition q of the current generation: the windows loaded into it and their lowest
        # footprint pos (the sink's extent figures; a row per partition, never one per window).
        per_q: dict[int, tuple[int, tuple[int, ...] | None]] = {}
        if len(generations) == 1:
            initial = windows
            plan.ec_windows = sum(r["windows"] for r in summaries)
            plan.closed_keys = sum(r["nexts"] for r in summaries)
            for r in summaries:
                low = r["min_pos"]
                per_q[r["plan_q"]] = (r["windows"], None if low is None else tuple(low))
        else:
            initial = _merged(windows).persist(StorageLevel.MEMORY_AND_DISK)
            plan._cached.append(initial)
            mins = [F.min(F.when(F.col("open"), F.col("pos_w")[j])) for j in range(input_partitions)]
            # The attached query's own partitioning of keys (its grouping value).
            target = output_partition(F.col("cec_key"), current.partitions).alias("q")
            for figures in (
                initial.groupBy(target)
                .agg(F.sum(F.col("open").cast("long")), F.sum((~F.col("open")).cast("long")), *mins)
                .collect()
            ):
                plan.driver_rows += 1
                opened, closed = int(figures[1] or 0), int(figures[2] or 0)
                plan.ec_windows += opened
                plan.closed_keys += closed
                per_q[int(figures[0])] = (opened, tuple(figures[3:]) if opened else None)
        plan.partition_windows = [per_q.get(q, (0, None)) for q in range(current.partitions)]
        for _, low in plan.partition_windows:
            if low is not None:
                start = [min(s, p) for s, p in zip(start, low, strict=True)]
        plan.start = tuple(start)
        plan.initial = initial if plan.ec_windows or plan.closed_keys else None
        if plan.initial is None:
            plan.release()
    except BaseException:
        plan.release()
        raise
    plan.seconds = time.perf_counter() - started
    return plan
