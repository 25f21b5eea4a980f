"""Writers on the executors: each output partition's task writes its own log (`operators.spark.attach`,
`writers="executors"`, the default).

Per micro-batch the driver's `ExecutorSink` (the foreachBatch function) runs one Spark job,
`batch_df.mapInArrow(BatchWriter)`: the processor's rows stay where the state partition's task made them
(the query's shuffle partitions equal the output partitions and a row's output partition q is Spark's own
shuffle hash of its key, so task q holds exactly the rows of output partition q). Task q:
1. orders and stamps its rows as the driver sink does (`operators.spark.sink.stamped`: pos, N, time
   continuing from the partition's cursor, which the driver hands to the task);
2. opens the partition's transactional writer (or reuses the one kept in this worker: Reuse, below;
   `queuestore.kafka.KafkaPartitionWriter`: the `transactional.id` is derived from the generation's topic
   and q, so `init_transactions()` aborts the open transaction of any earlier attempt of this task and
   fences it if it is still alive: a killed, retried or speculative attempt, a zombie executor, or the
   previous run's writer);
3. reads the log from the cursor's offset to its end (normally nothing) and compares what it finds with
   the messages it would write: an earlier attempt of this same task wrote a prefix of them (committed,
   or, on a broker that shows aborted records such as Tansu, left visible when it was killed), so the
   task appends only the rest. A duplicate attempt therefore adds nothing: exactly one copy in the log.
   Anything that is not a prefix (another writer's records, or a retried batch whose processing-time
   G-checks came out differently) fails the task with `OutputConflictError`: the query stops and a
   restart recovers from the log, which is always a valid prefix;
4. appends, commits (one transaction, or several when the writer's outstanding bound is reached: any
   committed prefix is a valid log), and returns one summary row: the new cursor (pos, N, time, next
   offset) and counts per kind, besides the state partition's control rows (its checkpoint controls and
   extent figures: open windows, lowest footprint pos; `operators.spark.write_summary`). No record, state,
   payload or per-key row reaches the driver.

Reuse (`session`, `operators.spark.live_writers`): PySpark reuses its Python workers across tasks
(`spark.python.worker.reuse`, on by default), so a task keeps its partition's writer open in the worker after
committing, with the offset the log ends at after that commit. The next micro-batch's task for q, if it lands
in that worker, is attempt 0 and is handed exactly that offset as its cursor in the same run, skips steps 2
and 3: no `init_transactions()`, no read of the log. That is safe because nothing can have been added to the
log since that commit without this writer being fenced: every other writer of the partition (another worker's
task, a retried or speculative attempt, which are never attempt 0 anyway, the driver of a new run) first calls
`init_transactions()` with the same transactional.id. A fenced kept writer learns it when it appends (the
broker rejects its records) and the task then falls back to steps 2 and 3 with a new writer, which compare
with whatever the log holds; a kept writer whose offset differs from the cursor (another worker wrote in
between, or a stage is re-run) is closed and replaced the same way. A new run (`ExecutorSink`) has a new
session id: writers kept for an older run are never used.

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

import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from cec.records import Kind, RecordCodec
from operators.exceptions import OutputConflictError
from operators.results_topic import ResultJson
from operators.spark.dead_letters import first_dead_reason
from operators.spark.live_writers import LiveWriter, discard, keep_live, take_live
from operators.spark.planning import AttachRecovery
from operators.spark.processor import EMIT_COLUMNS
from operators.spark.sink import CecSink, _Cursor, split_controls, stamped
from operators.spark.stamping import log_order
from operators.spark.trim import PartitionTrim, TaskTrim, directory_starts, footprint_report
from operators.spark.write_summary import (
    SUMMARY_KINDS,
    PartitionCursor,
    PartitionWrite,
    arrow_summary_schema,
    control_rows,
    read_summary,
    summary_rows,
    summary_schema,
)
from queuestore.base import RecordMeta, StoredRecord
from queuestore.chunks import split
from queuestore.exceptions import QueueStoreError, StoreClosedError
from queuestore.output import OutputQueue
from recovery.contract import PositionStamper

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from cec.metrics import OperatorMetrics
    from queuestore.kafka import KafkaPartitionWriter, KafkaQueueStore

__all__ = [
    "BatchWriter",
    "ExecutorSink",
    "PartitionCursor",
    "PartitionWrite",
    "PublishedResults",
    "write_partition",
]

log = logging.getLogger(__name__)


def _append_all(
    writer: KafkaPartitionWriter,
    messages: Sequence[tuple[bytes, RecordMeta]],
    first: int,
    last_offset: int,
    where: str,
    published: PublishedResults | None = None,
    before_commit: Callable[[KafkaPartitionWriter], None] | None = None,
) -> int:
    """Append messages[first:] and commit; the offset of the last message in the log. With `published`,
    each result also goes to the results topic in the same transaction, after its R record's last message
    (messages[:first] were committed by a killed attempt with theirs). `before_commit(writer)`: adds the
    last transaction's side records (the trimmed part's closed-window directory, `operators.spark.trim`)."""
    offsets: list[int] = []
    errors: list[Exception] = []

    def durable(offset: int | None, error: Exception | None) -> None:
        if error is not None or offset is None:
            errors.append(error or RuntimeError("no offset"))
        else:
            offsets.append(offset)

    for i in range(first, len(messages)):
        value, meta = messages[i]
        # Only the last message's offset matters (offsets grow along a partition): one callback per batch.
        writer.append(value, meta, durable if i == len(messages) - 1 else None)
        side = None if published is None else published.sides.get(i)
        if side is not None and published is not None:
            writer.append_side(published.topic, published.partition, *side)
    if before_commit is not None:
        before_commit(writer)
    writer.flush()
    if errors:
        raise QueueStoreError(f"{len(errors)} appends to {where} failed: {errors[0]!r}")
    if offsets:
        last_offset = max(last_offset, *offsets)
    return last_offset


@dataclass
class PublishedResults:
    """A partition's results for `cec_aggregate(results_topic=...)`: the results topic, its partition (the
    output partition's number) and, by message index, the (key, JSON) record of the R record that message
    ends (`operators.results_topic.ResultJson`, the record `cec run --results-topic` writes)."""

    topic: str
    partition: int
    sides: dict[int, tuple[bytes | None, bytes]]


def write_partition(
    bootstrap_servers: str,
    client: Mapping[str, str],
    topic: str,
    q: int,
    cursor: PartitionCursor,
    rows: list[tuple[Any, ...]],
    has_time: bool,
    *,
    session: str | None = None,
    attempt: int = 0,
    results: tuple[str, dict[str, Any]] | None = None,
    trim: TaskTrim | None = None,
) -> PartitionWrite:
    """Write one partition's batch (module doc, steps 1-4); `rows` in EMIT_COLUMNS order, any order.
    `session` (one per run of the query) keeps the partition's writer alive in this process for the next
    micro-batch, and `attempt` is the task's attempt number (module doc, "Reuse"); without a session the
    writer is opened and closed here. `trim`: the partition's trimming (`operators.spark.trim.TaskTrim`):
    a bound taken before the batch is appended, its directory carried in the batch's last transaction,
    the trim after the commit."""
    state = _Cursor(PositionStamper(cursor.pos), cursor.n, cursor.time)
    records = list(stamped(log_order(rows), state, has_time))
    codec = RecordCodec()
    kinds = Counter(record.kind.value for record in records)
    where = f"{topic}[{q}]"
    key = (bootstrap_servers, topic, q)
    live = take_live(key, session, attempt, cursor.next_offset)
    reused = live is not None
    if live is None:
        live = LiveWriter(session, bootstrap_servers, client, topic, q)
    try:
        messages: list[tuple[bytes, RecordMeta]] = []
        value_limit = live.store.value_limit
        published = None if results is None else PublishedResults(results[0], q, {})
        as_json = None if results is None else ResultJson(results[1]).record
        for record in records:
            value, meta = codec.encode(record), record.meta()
            limit = value_limit(meta)
            messages.extend([(value, meta)] if len(value) <= limit else split(value, meta, limit))
            if published is not None and as_json is not None and record.kind is Kind.R and record.payload:
                published.sides[len(messages) - 1] = as_json(meta.key, record.payload)
        found: list[StoredRecord] = []
        last_offset = -1
        before_commit = None
        if trim is not None:
            with live.store.reader(topic, q) as reader:
                trim.plan(
                    reader, lambda: live.store.acknowledged(topic, q), cursor.next_offset, len(messages)
                )
            before_commit = partial(trim.carry, topic=topic, q=q)
        if reused:
            assert live.writer is not None
            try:
                last_offset = _append_all(
                    live.writer, messages, 0, cursor.next_offset - 1, where, published, before_commit
                )
            except QueueStoreError as exc:
                # Fenced (a writer elsewhere took the partition over since this one's last commit) or
                # failed: decide from the log, as a first attempt would, with a new writer.
                log.info("the kept writer of %s cannot append (%s): taking the partition over", where, exc)
                reused = False
        if not reused:
            writer = live.open()  # init_transactions(): every earlier attempt is fenced from here on
            with live.store.reader(topic, q) as reader:
                reader.hint_end(cursor.next_offset)
                found = list(reader.scan_forward(cursor.next_offset))
            for i, stored in enumerate(found):
                if i >= len(messages) or (stored.value, tuple(stored.meta)) != (
                    messages[i][0],
                    tuple(messages[i][1]),
                ):
                    raise OutputConflictError(
                        f"{where} holds records from offset {cursor.next_offset} that this micro-batch "
                        f"did not produce (at offset {stored.offset}): another writer wrote to it, or a "
                        "retried batch made other G-checks than its killed attempt; stop the query and "
                        "start it again, which recovers from the log"
                    )
            last_offset = found[-1].offset if found else cursor.next_offset - 1
            last_offset = _append_all(
                writer, messages, len(found), last_offset, where, published, before_commit
            )
        trimmed = 0
        if trim is not None:
            assert live.writer is not None
            with live.store.reader(topic, q) as reader:
                trimmed = trim.apply(live.writer, reader)
    except BaseException:
        discard(live)
        raise
    end = PartitionCursor(state.stamper.last, state.n, state.time, last_offset + 1)
    if session is None:
        live.close()
    else:
        live.next_offset = end.next_offset
        keep_live(key, live)
    return PartitionWrite(
        q,
        end,
        len(found),
        len(messages) - len(found),
        kinds,
        reused,
        first_dead_reason(records),
        None if trim is None else trim.state,
        trimmed,
    )


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
        session: str | None = None,
        results: tuple[str, dict[str, Any]] | None = None,
        trim: tuple[int, Sequence[PartitionTrim]] | None = None,
    ) -> None:
        self.results = results  # (results topic, result schema): cec_aggregate(results_topic=...)
        self.trim = None if trim is None else (trim[0], list(trim[1]))  # (every, each partition's state)
        self.bootstrap_servers = bootstrap_servers
        self.client = dict(client)
        self.topic = topic
        self.cursors = list(cursors)
        self.has_time = has_time
        self.batch_number = batch_number  # 1-based
        self.session = session  # the run's id: a write task may reuse this worker's writer of its run

    @staticmethod
    def _attempt() -> int:
        """This task's attempt number (a retried or speculative attempt never appends through a kept
        writer unchecked; a re-run stage's attempt 0 is covered by the cursor and fencing, module doc)."""
        from pyspark import TaskContext

        ctx = TaskContext.get()
        return 0 if ctx is None else ctx.attemptNumber()

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from self._write(batches)

    def _write(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
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
        rows, reports = split_controls(rows)
        controls = control_rows(q, reports)
        if not rows:  # a timer that made no G-check reported its controls: nothing to write
            yield pa.RecordBatch.from_pylist(controls, schema=arrow_summary_schema())
            return
        attempt = self._attempt()
        trim = None
        if self.trim is not None:
            trim = TaskTrim(self.trim[0], self.trim[1][q], footprint_report(reports))
        done = write_partition(
            self.bootstrap_servers,
            self.client,
            self.topic,
            q,
            self.cursors[q],
            rows,
            self.has_time,
            session=self.session,
            attempt=attempt,
            results=self.results,
            trim=trim,
        )
        yield pa.RecordBatch.from_pylist(summary_rows(done, controls), schema=arrow_summary_schema())


class ExecutorSink(CecSink):
    """foreachBatch function of `writers="executors"`: runs the batch's write tasks (`BatchWriter`) and
    learns only their summaries (cursors, counts) and the state partitions' control rows, from which it
    keeps the same figures as the driver sink (`CecSink`)."""

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
        trim_every: int | None = None,
        results: tuple[str, dict[str, Any]] | None = None,
    ) -> None:
        # Trimming runs in the write tasks (`operators.spark.trim.TaskTrim`), not in the driver's sink. Set
        # before the base class starts: its metrics read the trimmed count (`_trimmed_offsets`) from then on.
        self.trimmed_total = 0
        super().__init__(outputs, recovery, has_time, keep_batches=keep_batches, metrics=metrics)
        self.trim_every = trim_every
        self.trim_states: list[PartitionTrim] = []
        if trim_every is not None:
            store = cast("KafkaQueueStore", self.outputs[0].store) if self.outputs else None
            covered = [] if store is None else directory_starts(store, self.outputs)
            self.trim_states = [PartitionTrim(0, c) for c in covered]
        self.results = results  # (results topic, result schema): cec_aggregate(results_topic=...)
        self.bootstrap_servers = bootstrap_servers
        self.client = dict(client)
        self.topic = recovery.current.topic
        self.next_offsets = [e.offset for e in recovery.ends]
        self.found = 0  # messages a retried task found already written by its killed attempt
        self.write_tasks = 0  # tasks that wrote a partition's batch (a partition without rows has none)
        self.reused = 0  # of them, those that appended through their worker's kept writer
        # One id per run: a kept writer serves only the run that opened it (a new run's driver fenced it).
        self.session = uuid.uuid4().hex
        self.summary_rows = 0  # rows the driver collected from the write tasks (the only data it gets)

    def _durable_end(self, q: int) -> int:
        return int(self.next_offsets[q])

    def _trimmed_offsets(self) -> int:
        return self.trimmed_total

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        with self.lock:
            if self.closed:
                raise StoreClosedError("the CEC sink is closed")
            cursors = [
                PartitionCursor(c.stamper.last, c.n, c.time, nxt)
                for c, nxt in zip(self.cursors, self.next_offsets, strict=True)
            ]
            batches = self.batches
        writer = BatchWriter(
            self.bootstrap_servers,
            self.client,
            self.topic,
            cursors,
            self.has_time,
            batches + 1,
            session=self.session,
            results=self.results,
            trim=None if self.trim_every is None else (self.trim_every, self.trim_states),
        )
        table = batch_df.mapInArrow(writer, summary_schema()).toArrow()
        rows = table.to_pylist()
        with self.lock:
            before = Counter(self.kinds)
            for row in rows:
                if row["entry"] != "end":
                    continue
                done = read_summary(row)
                q, cursor = done.q, done.cursor
                self.cursors[q] = _Cursor(PositionStamper(cursor.pos), cursor.n, cursor.time)
                self.next_offsets[q] = cursor.next_offset
                self.found += done.found
                self.reused += int(done.reused)
                self.write_tasks += 1
                if self._batch_reason is None:
                    self._batch_reason = done.dead_reason
                for kind in SUMMARY_KINDS:
                    self.kinds[kind] += done.kinds[kind]
                    self.records += done.kinds[kind]
                if done.trim is not None:
                    self.trim_states[q] = done.trim
                if done.trimmed:
                    self.trimmed_total += done.trimmed
                    if self.metrics is not None:
                        self.metrics.trimmed(done.trimmed)
            self._take_reports([row["key"] for row in rows if row["entry"] == "ctrl"])
            self.summary_rows += len(rows)
            self._batch_done(batch_id, before)
