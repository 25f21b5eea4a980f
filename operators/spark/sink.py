"""The sink of an attached aggregation (`operators.spark.attach`): the processor's rows -> CEC records.

Two sinks share the ordering and stamping rules (`operators.spark.stamping`, applied by `stamped`): `CecSink`, the driver-side
one described here (`cec_aggregate(writers="driver")`), and `operators.spark.writer.ExecutorSink` (the
default), whose tasks apply the same rules to their own partition on the executors.

`CecSink` runs on the driver, which owns the single writer (`OutputQueue` on a `KafkaQueueStore`, so the
stream index is maintained) of every output partition q, held across micro-batches: one writer per log,
no zombie writer from a retried task, and the indexes sit where recovery reads them. A row goes to
q = pmod(hash(key), P), Spark's own shuffle hash, so q is also the state partition when
spark.sql.shuffle.partitions = P (set for the query). For each q it puts the batch's rows in the order the
partition's instance made them (`operators.spark.stamping.log_order`: the order it applied its tuples, by
(j, o)) and computes per record, continuing from the partition's log end:
- pos: `recovery.contract.PositionStamper` (the rule every host uses; this host only knows the records it
  writes, so the previous record's pos stands for the live vector). A record produced by input tuple
  (j, o) sets pos[j] = o + 1 if it is the tuple's last record, else o, never decreasing. The application
  order is what makes "every input tuple below pos that maps to q has been applied, and every output it
  produced is in the log before this record" hold for every prefix of the log;
- marks: as the instance made them (event-time watermarks, `recovery.contract`);
- N: +1 on a G-open, -1 on the R of a window whose footprint is in this log (`operators.spark.generations`);
- time: the largest event time so far (the input's logical time, non-decreasing along the log), or
  sum(pos) when the aggregate has no time field (as `OperatorRuntime` does).
G-check rows (made by the processor's timers after a micro-batch's input) go after the other records of
their partition's batch (`operators.spark.stamping.log_order`). A batch's records are durable (flushed) before the batch completes.
"""

from __future__ import annotations

import json
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cec.records import Kind, OutputRecord, RecordCodec
from operators.spark.dead_letters import DeadLetterWatch, dead_reason
from operators.spark.planning import AttachRecovery
from operators.spark.processor import CONTROL_KIND, EMIT_COLUMNS, FIGURES_ENTRY
from operators.spark.stamping import log_order, log_time, positions
from operators.spark.trim import FootprintReport, OutputTrimmer
from queuestore.exceptions import QueueStoreError, StoreClosedError
from queuestore.output import OutputQueue
from recovery.contract import PositionStamper

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from cec.metrics import OperatorMetrics

__all__ = ["CecSink"]

_R, _GOPEN, _GCHECK, _DEAD = Kind.R.value, Kind.GOPEN.value, Kind.GCHECK.value, Kind.DEAD.value
_KINDS = (_R, _GOPEN, _GCHECK, _DEAD)
_KIND_OF = {kind.value: kind for kind in Kind}  # Kind(name) is an enum lookup of several calls per record


@dataclass
class _Cursor:
    stamper: PositionStamper  # pos, continuing from the log's crash point (recovery.contract)
    n: int
    time: int


def split_controls(rows: list[tuple[Any, ...]]) -> tuple[list[tuple[Any, ...]], list[bytes]]:
    """A batch's rows as (records to write, control reports): a state partition's checkpoint controls
    (`operators.spark.checkpointing.PartitionControl.report`) and its extent figures (`FIGURES_ENTRY`)
    travel with its rows but are figures for the query's progress, never log records."""
    if not any(r[4] == CONTROL_KIND for r in rows):
        return rows, []
    return [r for r in rows if r[4] != CONTROL_KIND], [bytes(r[8]) for r in rows if r[4] == CONTROL_KIND]


def stamped(rows: list[tuple[Any, ...]], cursor: _Cursor, has_time: bool) -> Iterator[OutputRecord]:
    """The records of one partition's batch (rows in `log_order`), with pos/N/time continuing from
    `cursor` (advanced as they are made): the one stamping rule of both sinks (driver and executors)."""
    for (_, _j, _o, _i, kind, key, seq, state, payload, t, dn, marks, *_live), pos in zip(
        rows, positions(rows, cursor.stamper), strict=True
    ):
        cursor.n += dn
        cursor.time = log_time(cursor.time, t, pos, has_time)
        yield OutputRecord(
            _KIND_OF.get(kind) or Kind(kind),
            cursor.time,
            pos,
            cursor.n,
            key,
            seq,
            state,
            payload,
            () if marks is None else tuple(marks),
        )


class CecSink:
    """foreachBatch function: orders each output partition's rows, assigns pos/N/time, appends durably,
    and keeps CEC's figures (`figures`, per batch in `batch_figures`) for the query's progress."""

    def __init__(
        self,
        outputs: Sequence[OutputQueue],
        recovery: AttachRecovery,
        has_time: bool,
        keep_batches: int = 200,
        metrics: OperatorMetrics | None = None,
        trim_every: int | None = None,
    ) -> None:
        self.outputs = list(outputs)
        self.cursors = [_Cursor(PositionStamper(e.pos), e.n, e.time) for e in recovery.ends]
        self.has_time = has_time
        self.codec = RecordCodec()
        self.lock = threading.Lock()
        self.batches = 0
        self.records = 0
        self.closed = False
        # Figures: record kinds written since the start; per output partition, its open windows and the
        # lowest pos of their latest footprints (as the recovery plan found them, then as the partition's
        # processor reports them), which give the extent; the crash points of older generations, fixed.
        self.kinds: Counter[str] = Counter()
        self.partitions: dict[int, tuple[int, tuple[int, ...] | None]] = dict(
            enumerate(recovery.partition_windows)
        )
        self._older = [
            c
            for g, c in zip(recovery.generations, recovery.crash_points, strict=True)
            if g != recovery.current
        ]
        self._width = len(recovery.start)
        self.batch_figures: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self._batch_tuples = 0  # input tuples of the micro-batch being written (its partitions' reports)
        self._keep = keep_batches
        # Each state partition's checkpoint controls as last reported (its targets, budget, G-checks and
        # what it said): the controller's messages reach the driver with the rows, not by a Spark job.
        self.controls: dict[int, dict[str, Any]] = {}
        self.metrics = metrics
        # Dead letters per micro-batch and run: a batch or a bounded run that dead-lettered every tuple is
        # said (`operators.spark.dead_letters`); `_batch_reason` is the first reason of the batch being written.
        self.dead_letters = DeadLetterWatch(recovery.current.topic)
        self._batch_reason: str | None = None
        # Trimming (`operators.spark.trim`): each state partition's latest footprint report.
        self.trimmer = None if trim_every is None else OutputTrimmer(self.outputs, trim_every)
        self.trim_reports: dict[int, FootprintReport] = {}
        if metrics is not None:  # the windows carried over by recovery are open before the first batch
            self._publish(self._figures())

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        table = batch_df.toArrow()
        columns = [table.column(c).to_pylist() for c in EMIT_COLUMNS]
        rows, reports = split_controls(list(zip(*columns, strict=True)))
        by_q: dict[int, list[tuple[Any, ...]]] = {}
        for row in rows:
            by_q.setdefault(int(row[0]), []).append(row)
        with self.lock:
            if self.closed:
                raise StoreClosedError("the CEC sink is closed")
            self._take_reports(reports)
            before = Counter(self.kinds)
            for q in sorted(by_q):
                self._write(q, log_order(by_q[q]))
            for q in by_q:
                out = self.outputs[q]
                out.flush()
                if out.failures:
                    raise QueueStoreError(
                        f"{len(out.failures)} appends to {out.topic}[{q}] failed: {out.failures[0]!r}"
                    )
            self._batch_done(batch_id, before)

    def _take_reports(self, reports: Sequence[bytes | str]) -> None:
        """Keep each state partition's latest checkpoint controls and extent figures from one micro-batch's
        control rows (under the sink's lock)."""
        phases: dict[int, int] = {}
        for report in reports:
            control = json.loads(report)
            q = int(control["partition"])
            if control.get("entry") != FIGURES_ENTRY:
                self.controls[q] = control
                continue
            self._batch_tuples += int(control.get("tuples", 0))
            if control["phase"] >= phases.get(q, -1):  # after its G-checks, if it made any
                phases[q] = control["phase"]
                low = control["footprint_min"]
                self.partitions[q] = (int(control["open_windows"]), None if low is None else tuple(low))
                self.trim_reports[q] = FootprintReport(
                    bool(control.get("restoring", True)), control.get("footprint_time")
                )

    def _batch_done(self, batch_id: int, before: Counter[str]) -> None:
        """Count a written micro-batch, trim the logs when due, and keep (and publish) its figures; under
        the sink's lock."""
        self.batches += 1
        if self.trimmer is not None:
            for q, report in sorted(self.trim_reports.items()):
                trimmed = self.trimmer.after_batch(q, self._durable_end(q), report)
                if trimmed and self.metrics is not None:
                    self.metrics.trimmed(trimmed)
        figures = self._figures()
        figures["batch"] = batch_id
        figures["batch_records"] = {k: self.kinds[k] - before[k] for k in _KINDS}
        figures["input_tuples"], self._batch_tuples = self._batch_tuples, 0
        reason, self._batch_reason = self._batch_reason, None
        self.dead_letters.batch(batch_id, figures["input_tuples"], figures["batch_records"][_DEAD], reason)
        figures["dead_letters"] = self.dead_letters.figures()
        self.batch_figures[batch_id] = figures
        while len(self.batch_figures) > self._keep:
            self.batch_figures.popitem(last=False)
        if self.metrics is not None:
            self._publish(figures)

    def _publish(self, figures: Mapping[str, Any]) -> None:
        """The figures the driver knows, as cec.metrics: u is the extent in input tuples; the extent in
        output records, the input read and the checkpoint duty are not known here and left unset."""
        assert self.metrics is not None
        self.metrics.update(
            open_windows=figures["open_windows"],
            replay=figures["extent_tuples"],
            outputs=self.records,
            gopens=figures["gopens"],
            gchecks=figures["gchecks"],
            dead_letters=figures["records"][_DEAD],
        )

    def _trimmed_offsets(self) -> int:
        """Offsets trimmed from the heads of the logs in this run."""
        return 0 if self.trimmer is None else self.trimmer.trimmed

    def _durable_end(self, q: int) -> int:
        """The offset after partition q's last durable record (the batch was flushed)."""
        return self.outputs[q].index.next_offset

    def _write(self, q: int, rows: list[tuple[Any, ...]]) -> None:
        out = self.outputs[q]
        kinds = self.kinds
        for record in stamped(rows, self.cursors[q], self.has_time):
            out.append(self.codec.encode(record), record.meta())
            self.records += 1
            kinds[record.kind.value] += 1
            if record.kind is Kind.DEAD and self._batch_reason is None:
                self._batch_reason = dead_reason(record.payload)

    def extent(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(replay start T, newest crash point) a recovery would use if the driver died now: the planning
        rule (`operators.spark.planning`) applied to the logs as written so far."""
        logs = [*self._older, [c.stamper.last for c in self.cursors]]
        width = self._width
        start = [max(min(c[j] for c in crash) for crash in logs) for j in range(width)]
        lows = [low for n, low in self.partitions.values() if n and low is not None]
        for j in range(width):
            start[j] = min([start[j], *(low[j] for low in lows)])
        newest = [max(c[j] for crash in logs for c in crash) for j in range(width)]
        return tuple(start), tuple(newest)

    def _figures(self) -> dict[str, Any]:
        start, newest = self.extent()
        return {
            "open_windows": sum(n for n, _ in self.partitions.values()),
            "extent_tuples": sum(n - s for s, n in zip(start, newest, strict=True)),
            "extent_start": list(start),
            "position": list(newest),
            "records": {k: self.kinds[k] for k in _KINDS},
            "gopens": self.kinds[_GOPEN],
            "gchecks": self.kinds[_GCHECK],
            "trimmed_offsets": self._trimmed_offsets(),
            "checkpointing": [self.controls[q] for q in sorted(self.controls)],
            "dead_letters": self.dead_letters.figures(),
        }

    def figures(self) -> dict[str, Any]:
        """CEC's figures now (see `operators.spark.query.CecAggregateQuery.cec_progress`)."""
        with self.lock:
            return self._figures()

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
