"""The executors' side of an attached query's recovery planning (`operators.spark.planning`): the planning
job's task (`PartitionPlanTask`, one per output partition of every generation) and what it reads from one
log (`plan_partition`: the EC, checked by the replay contract, and the closed-window directory), as Arrow
rows in the processor's INIT_SCHEMA plus a summary row per log."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

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
    from pyspark.sql.types import StructType

    from queuestore.kafka import KafkaQueueStore

__all__ = ["PLAN_EXTRA", "PartitionPlan", "PartitionPlanTask", "plan_partition", "plan_schema"]

log = logging.getLogger(__name__)

_R = Kind.R.value
# Columns of the planning job's rows besides the processor's INIT_SCHEMA ones. entry: "end" (one per
# partition: its summary), "win" (an open window loaded from the EC) or "next" (a key's next window seq).
PLAN_EXTRA = ("entry", "plan_g", "plan_q", "crash_pos", "n", "time", "end_offset", "records_read",
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


def plan_schema() -> StructType:
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

        schema = _arrow_schema(plan_schema())
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
        cols: dict[str, list[Any]] = {name: [summary.get(name)] for name in PLAN_EXTRA}
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
        for name in PLAN_EXTRA[3:]:
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
