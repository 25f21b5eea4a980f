"""Recovery planning of an attached aggregation (`operators.spark.attach`), on the executors.

On a start that does not resume Spark's own checkpoint (`operators.spark.resume`: none, or one the logs
do not agree with, or `resume_checkpoint=False`; such a start is a fresh query) one small Spark job runs
one task per output partition of every generation (`operators.spark.generations`), `PartitionPlanTask`
under `mapInArrow` (`operators.spark.plan_task`). Task (g, q):
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from cec.exceptions import ConfigError
from cec.records import RecordCodec
from operators.spark.generations import Generation
from operators.spark.plan_task import (
    PLAN_EXTRA,
    PartitionPlan,
    PartitionPlanTask,
    plan_partition,
    plan_schema,
)
from recovery.cut_tuple import results_at_end

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

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


@dataclass(frozen=True)
class LogEnd:
    """Where one output log of the current generation stands: the sink continues from here."""

    pos: tuple[int, ...]
    n: int
    time: int
    offset: int = 0  # the log's end offset (where the next record goes; transaction markers included)
    marks: tuple[int, ...] = ()  # the crash record's event-time marks (watermarks; () without, or empty)
    # The result payloads of the records that carry the crash point's pos (`recovery.cut_tuple`): those of
    # the tuple the crash cut, which an operator with `unique_results` does not make again.
    results: tuple[bytes, ...] = ()


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
    # Which way this start went (`operators.spark.resume`): "from-logs" (this plan) or "resumed-checkpoint"
    # (Spark's checkpoint of an earlier run, checked against the logs), and why.
    path: str = "from-logs"
    reason: str = ""
    # A resumed checkpoint: the input position the logs reached (caught up once the query reads past it)
    # and the last micro-batch Spark had committed; None on the log path.
    caught_up_at: tuple[int, ...] | None = None
    checkpoint_batch: int | None = None
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


def _current_ends(store: KafkaQueueStore, gen: Generation, outputs: Sequence[OutputQueue]) -> list[int]:
    """Each current log's end offset (transaction markers included), found from its index's end: the
    reconciled index ends at the last record, so only what follows it is read."""
    ends = []
    for q in range(gen.partitions):
        with store.reader(gen.topic, q) as reader:
            reader.hint_end(outputs[q].index.next_offset)
            ends.append(reader.end_offset())
    return ends


def _with_cut_results(store: KafkaQueueStore, gen: Generation, ends: list[LogEnd]) -> list[LogEnd]:
    """`ends` with the results at each non-empty log's end that carry its crash point (`LogEnd.results`):
    a few records read back on the driver per partition."""
    codec = RecordCodec()
    out = []
    for q, end in enumerate(ends):
        if end.offset:
            with store.reader(gen.topic, q) as reader:
                end = replace(end, results=tuple(results_at_end(reader, codec, end.pos)))
        out.append(end)
    return out


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
    rows = spark.range(0, count, 1, count).mapInArrow(task, plan_schema())
    rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
    plan._cached.append(rows)
    try:
        # One job: the summaries (a row per log; no window, key or footprint reaches the driver).
        pulled = rows.filter(F.col("entry") == "end").select(*PLAN_EXTRA).toArrow()
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
        plan.ends = _with_cut_results(store, current, plan.ends)
        plan.initial = initial if plan.ec_windows or plan.closed_keys else None
        if plan.initial is None:
            plan.release()
    except BaseException:
        plan.release()
        raise
    plan.seconds = time.perf_counter() - started
    return plan
