"""Writers on the executors: each output partition's task writes its own log (`operators.spark.attach`,
`writers="executors"`, the default).

Per micro-batch the driver's `ExecutorSink` (the foreachBatch function) runs one Spark job,
`batch_df.mapInArrow(BatchWriter)`: the processor's rows stay where the state partition's task made them
(the query's shuffle partitions equal the output partitions and a row's output partition q is Spark's own
shuffle hash of its key, so task q holds exactly the rows of output partition q). Task q:
1. orders and stamps its rows as the driver sink does (`operators.spark.sink.stamped`: pos, N, time
   continuing from the partition's cursor, which the driver hands to the task);
2. opens the partition's transactional writer (`queuestore.kafka.KafkaPartitionWriter`: the
   `transactional.id` is derived from the generation's topic and q, so `init_transactions()` aborts the
   open transaction of any earlier attempt of this task and fences it if it is still alive: a killed,
   retried or speculative attempt, a zombie executor, or the previous run's writer);
3. reads the log from the cursor's offset to its end (normally nothing) and compares what it finds with
   the messages it would write: an earlier attempt of this same task wrote a prefix of them (committed,
   or, on a broker that shows aborted records such as Tansu, left visible when it was killed), so the
   task appends only the rest. A duplicate attempt therefore adds nothing: exactly one copy in the log.
   Anything that is not a prefix (another writer's records, or a retried batch whose processing-time
   G-checks came out differently) fails the task with `OutputConflictError`: the query stops and a
   restart recovers from the log, which is always a valid prefix;
4. appends, commits (one transaction, or several when the writer's outstanding bound is reached: any
   committed prefix is a valid log), and returns one summary row: the new cursor (pos, N, time, next
   offset), counts per kind, and per key of the batch its latest footprint position (or that its window
   closed) for CEC's figures (the extent). No record, state or payload reaches the driver.

Correctness does not depend on the processor's output being identical across attempts except for the
records an earlier attempt managed to write: those are produced rows (ordered by (j, o, emission index),
a deterministic function of the partition's input and state) and, only when an attempt died inside the
G-check tail, G-checks (made by processing-time timers; a mismatch there is the conflict above).

The stream index is not written here: it is derived from the log, and the driver reconciles it from the
log at every start (`queuestore.output.OutputQueue` reads from its last indexed offset to the end), which
is also where recovery planning reads it. The driver keeps the partitions' `OutputQueue`s open for the
run without writing through them: they hold the same-host writer locks and were the first to fence the
previous run's writers.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cec.records import Kind, RecordCodec
from operators.exceptions import OutputConflictError
from operators.spark.planning import AttachRecovery
from operators.spark.processor import EMIT_COLUMNS
from operators.spark.sink import SINK_FAULT_SITE, CecSink, _Cursor, _ordered, stamped
from queuestore import faults
from queuestore.base import RecordMeta
from queuestore.chunks import split
from queuestore.output import OutputQueue
from recovery.contract import PositionStamper

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from cec.metrics import OperatorMetrics

__all__ = [
    "WRITER_KILL_SITE",
    "BatchWriter",
    "ExecutorSink",
    "PartitionCursor",
    "PartitionWrite",
    "write_partition",
]

# CEC_FAULTS="attach.writer.kill_task:n": the first attempt of every write task of the n-th micro-batch
# (1-based) SIGKILLs its own Python worker once the first half of its records is committed; Spark retries
# the task, and the retry must add only the other half.
WRITER_KILL_SITE = "attach.writer.kill_task"
# CEC_FAULTS="attach.sink.mid_batch:n" under writers="executors": the first write task of the n-th
# micro-batch to reach the middle of its records (first half committed) SIGKILLs the driver's process
# group (`_kill_driver`): in local mode the driver and its JVM, i.e. the driver dies mid-write. (A pass
# counter as in the driver sink would restart in every forked Python worker.)

_R, _GCHECK, _DEAD = Kind.R.value, Kind.GCHECK.value, Kind.DEAD.value
_KINDS = (Kind.R.value, Kind.GOPEN.value, _GCHECK, _DEAD)


@dataclass(frozen=True)
class PartitionCursor:
    """Where one output log stands after the last completed micro-batch: the stamping state the next
    batch continues from, and the offset its records start at (the log end, transaction markers included)."""

    pos: tuple[int, ...]
    n: int
    time: int
    next_offset: int


@dataclass
class PartitionWrite:
    """What one task did to its partition (the driver's whole view of the batch)."""

    q: int
    cursor: PartitionCursor
    found: int  # messages of this batch already in the log (an earlier attempt's)
    written: int  # messages this attempt appended
    kinds: Counter[str]
    footprints: dict[str | None, tuple[int, ...] | None]  # per key: latest footprint pos, None: closed


def _result_schema() -> StructType:
    from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

    longs = ArrayType(LongType(), False)
    return StructType(
        [
            StructField("q", LongType(), False),
            StructField("entry", StringType(), False),  # "end": the partition's summary; "fp": one key
            StructField("pos", longs, True),  # end: the cursor's pos; fp: the footprint's (null: closed)
            StructField("n", LongType(), True),
            StructField("time", LongType(), True),
            StructField("next_offset", LongType(), True),
            StructField("found", LongType(), True),
            StructField("written", LongType(), True),
            StructField("kinds", ArrayType(LongType(), False), True),  # counts in _KINDS order
            StructField("key", StringType(), True),
        ]
    )


def write_partition(
    bootstrap_servers: str,
    client: Mapping[str, str],
    topic: str,
    q: int,
    cursor: PartitionCursor,
    rows: list[tuple[Any, ...]],
    has_time: bool,
    *,
    kill_mid_batch: Any = None,
) -> PartitionWrite:
    """Write one partition's batch (module doc, steps 1-4); `rows` in EMIT_COLUMNS order, any order.
    `kill_mid_batch(first_half_committed)` is the fault hook of the tests (None in production)."""
    from queuestore.kafka import KafkaQueueStore

    state = _Cursor(PositionStamper(cursor.pos), cursor.n, cursor.time)
    records = list(stamped(_ordered(rows), state, has_time))
    codec = RecordCodec()
    kinds: Counter[str] = Counter()
    footprints: dict[str | None, tuple[int, ...] | None] = {}
    for record in records:
        kind = record.kind.value
        kinds[kind] += 1
        if kind == _R:
            footprints[record.key] = None
        elif kind != _DEAD:
            footprints[record.key] = record.pos
    # The writer's locks go to a directory of this task: on another host the driver's state_dir does not
    # exist, and on the driver's host its OutputQueue holds the partition's lock (module doc).
    scratch = Path(tempfile.mkdtemp(prefix="cec-writer-"))
    store = KafkaQueueStore(bootstrap_servers, scratch, config=dict(client))
    try:
        messages: list[tuple[bytes, RecordMeta]] = []
        for record in records:
            value, meta = codec.encode(record), record.meta()
            limit = store.value_limit(meta)
            messages.extend([(value, meta)] if len(value) <= limit else split(value, meta, limit))
        writer = store.writer(topic, q)  # init_transactions(): every earlier attempt is fenced from here on
        try:
            with store.reader(topic, q) as reader:
                reader.hint_end(cursor.next_offset)
                found = list(reader.scan_forward(cursor.next_offset))
            for i, stored in enumerate(found):
                if i >= len(messages) or (stored.value, tuple(stored.meta)) != (
                    messages[i][0],
                    tuple(messages[i][1]),
                ):
                    raise OutputConflictError(
                        f"{topic}[{q}] holds records from offset {cursor.next_offset} that this micro-batch "
                        f"did not produce (at offset {stored.offset}): another writer wrote to it, or a "
                        "retried batch made other G-checks than its killed attempt; stop the query and "
                        "start it again, which recovers from the log"
                    )
            last_offset = found[-1].offset if found else cursor.next_offset - 1
            offsets: list[int] = []
            errors: list[Exception] = []

            def durable(offset: int | None, error: Exception | None) -> None:
                if error is not None or offset is None:
                    errors.append(error or RuntimeError("no offset"))
                else:
                    offsets.append(offset)

            half = len(messages) // 2
            for i in range(len(found), len(messages)):
                if kill_mid_batch is not None and i == half and half:
                    writer.flush()
                    kill_mid_batch()
                value, meta = messages[i]
                writer.append(value, meta, durable)
            writer.flush()
            if errors:
                raise RuntimeError(f"{len(errors)} appends to {topic}[{q}] failed: {errors[0]!r}")
            if offsets:
                last_offset = max(last_offset, *offsets)
        finally:
            writer.close()
    finally:
        store.close()
        shutil.rmtree(scratch, ignore_errors=True)
    end = PartitionCursor(state.stamper.last, state.n, state.time, last_offset + 1)
    return PartitionWrite(q, end, len(found), len(messages) - len(found), kinds, footprints)


def _kill_driver() -> None:
    """SIGKILL the driver from a local-mode Python worker: PySpark's daemon puts its workers in process
    groups of their own, but not in a session of their own, so the session's leader is the driver (the
    tests start it with a session of its own); its group holds the driver and its JVM."""
    os.killpg(os.getsid(0), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


class BatchWriter:
    """The `mapInArrow` function of one micro-batch (picklable: shipped to the executors)."""

    def __init__(
        self,
        bootstrap_servers: str,
        client: Mapping[str, str],
        topic: str,
        cursors: Sequence[PartitionCursor],
        has_time: bool,
        batch_number: int,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.client = dict(client)
        self.topic = topic
        self.cursors = list(cursors)
        self.has_time = has_time
        self.batch_number = batch_number  # 1-based, for the fault sites

    def _fault_hook(self) -> Any:
        from pyspark import TaskContext

        if faults.planned(SINK_FAULT_SITE) == self.batch_number:
            return _kill_driver
        ctx = TaskContext.get()
        if (
            faults.planned(WRITER_KILL_SITE) == self.batch_number
            and ctx is not None
            and ctx.attemptNumber() == 0
        ):
            return lambda: os.kill(os.getpid(), signal.SIGKILL)
        return None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        rows: list[tuple[Any, ...]] = []
        for batch in batches:
            columns = [batch.column(c).to_pylist() for c in EMIT_COLUMNS]
            rows.extend(zip(*columns, strict=True))
        if not rows:
            return
        qs = {int(r[0]) for r in rows}
        if len(qs) != 1:
            # Two tasks writing one partition would fence each other; never expected (module doc).
            raise RuntimeError(f"a write task got rows of output partitions {sorted(qs)}, expected one")
        q = qs.pop()
        done = write_partition(
            self.bootstrap_servers,
            self.client,
            self.topic,
            q,
            self.cursors[q],
            rows,
            self.has_time,
            kill_mid_batch=self._fault_hook(),
        )
        c = done.cursor
        out: list[dict[str, Any]] = [
            {
                "q": q,
                "entry": "end",
                "pos": list(c.pos),
                "n": c.n,
                "time": c.time,
                "next_offset": c.next_offset,
                "found": done.found,
                "written": done.written,
                "kinds": [done.kinds[k] for k in _KINDS],
                "key": None,
            }
        ]
        out.extend(
            {"q": q, "entry": "fp", "pos": None if p is None else list(p), "key": k}
            for k, p in done.footprints.items()
        )
        yield pa.RecordBatch.from_pylist(out, schema=_arrow_schema())


def _arrow_schema() -> pa.Schema:
    import pyarrow as pa

    longs = pa.list_(pa.field("element", pa.int64(), nullable=False))
    return pa.schema(
        [
            pa.field("q", pa.int64(), nullable=False),
            pa.field("entry", pa.string(), nullable=False),
            pa.field("pos", longs),
            pa.field("n", pa.int64()),
            pa.field("time", pa.int64()),
            pa.field("next_offset", pa.int64()),
            pa.field("found", pa.int64()),
            pa.field("written", pa.int64()),
            pa.field("kinds", longs),
            pa.field("key", pa.string()),
        ]
    )


class ExecutorSink(CecSink):
    """foreachBatch function of `writers="executors"`: runs the batch's write tasks (`BatchWriter`) and
    learns only their summaries (cursors, counts, footprint positions per key), from which it keeps the
    same figures as the driver sink (`CecSink`)."""

    def __init__(
        self,
        outputs: Sequence[OutputQueue],
        recovery: AttachRecovery,
        has_time: bool,
        *,
        bootstrap_servers: str,
        client: Mapping[str, str],
        keep_batches: int = 200,
        metrics: OperatorMetrics | None = None,
    ) -> None:
        super().__init__(outputs, recovery, has_time, keep_batches=keep_batches, metrics=metrics)
        self.bootstrap_servers = bootstrap_servers
        self.client = dict(client)
        self.topic = recovery.current.topic
        self.next_offsets = [e.offset for e in recovery.ends]
        self.found = 0  # messages a retried task found already written by its killed attempt
        self.summary_rows = 0  # rows the driver collected from the write tasks (the only data it gets)

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        with self.lock:
            if self.closed:
                raise RuntimeError("the CEC sink is closed")
            cursors = [
                PartitionCursor(c.stamper.last, c.n, c.time, nxt)
                for c, nxt in zip(self.cursors, self.next_offsets, strict=True)
            ]
            batches = self.batches
        writer = BatchWriter(
            self.bootstrap_servers, self.client, self.topic, cursors, self.has_time, batches + 1
        )
        table = batch_df.mapInArrow(writer, _result_schema()).toArrow()
        rows = table.to_pylist()
        with self.lock:
            before = Counter(self.kinds)
            for row in rows:
                if row["entry"] != "end":
                    continue
                q = row["q"]
                self.cursors[q] = _Cursor(PositionStamper(row["pos"]), row["n"], row["time"])
                self.next_offsets[q] = row["next_offset"]
                self.found += row["found"]
                for kind, count in zip(_KINDS, row["kinds"], strict=True):
                    self.kinds[kind] += count
                    self.records += count
            for row in rows:
                if row["entry"] == "fp":
                    if row["pos"] is None:
                        self.footprints.pop(row["key"], None)
                    else:
                        self.footprints[row["key"]] = tuple(row["pos"])
            self.summary_rows += len(rows)
            self._batch_done(batch_id, before)
