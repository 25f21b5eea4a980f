"""The sink of an attached aggregation (`operators.spark.attach`): the processor's rows -> CEC records.

The sink runs on the driver, which owns the single writer (`OutputQueue` on a `KafkaQueueStore`, so the
stream index is maintained) of every output partition q, held across micro-batches: one writer per log,
no zombie writer from a retried task, and the indexes sit where recovery reads them. A row goes to
q = pmod(hash(key), P), Spark's own shuffle hash, so q is also the state partition when
spark.sql.shuffle.partitions = P (set for the query). For each q it sorts the batch's rows by
(j, o, emission index) and computes per record, continuing from the partition's log end:
- pos: `recovery.contract.PositionStamper` (the rule every host uses; this host only knows the records it
  writes, so the previous record's pos stands for the live vector). A record produced by input tuple
  (j, o) sets pos[j] = o + 1 if it is the tuple's last record, else o, never decreasing. Sorting by (j, o)
  is what makes "every input tuple below pos that maps to q has been applied, and every output it produced
  is in the log before this record" hold for every prefix of the log;
- N: +1 on a G-open, -1 on the R of a window whose footprint is in this log (`operators.spark.generations`);
- time: the largest event time so far (the input's logical time, non-decreasing along the log), or
  sum(pos) when the aggregate has no time field (as `OperatorRuntime` does).
A batch's records are durable (flushed) before the batch completes.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cec.records import Kind, OutputRecord, RecordCodec
from operators.spark.planning import LogEnd
from operators.spark.processor import EMIT_COLUMNS
from queuestore import faults
from queuestore.output import OutputQueue
from recovery.contract import PositionStamper

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["SINK_FAULT_SITE", "CecSink"]

# Hit after the first half of a partition's batch is durable, before the second half is appended: a crash
# injected here (CEC_FAULTS) leaves that log cut in the middle of a micro-batch.
SINK_FAULT_SITE = "attach.sink.mid_batch"


@dataclass
class _Cursor:
    stamper: PositionStamper  # pos, continuing from the log's crash point (recovery.contract)
    n: int
    time: int


class CecSink:
    """foreachBatch function: orders each output partition's rows, assigns pos/N/time, appends durably."""

    def __init__(self, outputs: Sequence[OutputQueue], ends: Sequence[LogEnd], has_time: bool) -> None:
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
        columns = [table.column(c).to_pylist() for c in EMIT_COLUMNS]
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
