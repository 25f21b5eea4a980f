"""Trimming of an attached query's output logs (`cec_aggregate(..., trim_every=N)`, DESIGN-NOTES section 3):
the I/O around the engine's rule (`operators.engine.trimming`), as `cec run --trim-every` has it
(`operators.local_trim`), per output partition of the current generation.

The rule: a partition may drop the records below min(the oldest open footprint in its log, its last record
(the crash point), every registered consumer's acknowledged offset (`QueueStore.acknowledge`: a
downstream `cec run` over this topic, or `read_results(consumer=...)`, registers itself)), once the
closed-window directory (key -> last closed window seq, which a restart needs for keys without an open
window) of every record below that bound is durable. Never while the partition is restoring (its windows
are not consistent yet). Only the current generation's logs are trimmed: an older generation's log is read
at every start for its crash points and for windows whose latest footprint it still holds.

**On the executors** (`writers="executors"`, the default: `TaskTrim`, run by each write task of
`operators.spark.writer` for its own partition):
- the state partition reports, in a control row that reaches the same task as its rows (`FIGURES_ENTRY`),
  whether it is restoring and the logical time of its oldest open window's latest footprint (it follows
  the writers' stamping rule, `operators.spark.stamping`, for times as for positions);
- when a bound is due (`TrimSchedule`, whose state the driver hands from task to task), the task takes it
  before appending its batch, from the log as it stands (every record of it durable): it reads the log
  from its start to the first record at or after that time (times never decrease along the log), and the
  acknowledgements (`KafkaQueueStore.acknowledged`, read on incrementally by the worker's kept store);
- it appends, in the transaction of its batch's records, the (key, seq) of every R between where the
  carried directory stood and the bound (`operators.spark.closed_windows`): the directory is then durable
  with the batch, or aborted with it;
- after the commit (the batch's footprints are durable: the bound is safe, `TrimSchedule.ready`) it sends
  `DeleteRecords` through its writer. A task killed between the commit and the trim leaves the log longer,
  never shorter; its retry takes the bound again.
A start finds the directory of the trimmed part in Kafka (`check_trimmed_indexes`): the driver's stream
index, which never learnt what the executors trimmed, adopts it; no `state_dir` needs to survive.

**On the driver** (`writers="driver"`: `OutputTrimmer`, after each micro-batch, by the sink
`operators.spark.sink`): the closed-window directory lives in the driver's stream index, which reconciles
itself from the log before each bound (so the index has learnt every record below it); the oldest
footprint's time maps to an offset by that index; a batch's records are all durable when the sink
returns; the driver's `OutputQueue` sends `DeleteRecords`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from cec.exceptions import ConfigError
from cec.model import FOOTPRINT_KINDS
from operators.engine.trimming import TrimSchedule, bound, capped, carry_from
from operators.spark.closed_windows import carry, create_directory_topic, read_directory
from queuestore.base import PartitionReader, QueueStore
from queuestore.index import StreamIndex
from queuestore.kafka import KafkaQueueStore
from queuestore.output import OutputQueue

if TYPE_CHECKING:
    from operators.spark.generations import Generation
    from queuestore.kafka import KafkaPartitionWriter

__all__ = [
    "FootprintReport",
    "OutputTrimmer",
    "PartitionTrim",
    "TaskTrim",
    "check_trim_every",
    "check_trimmed_indexes",
    "directory_starts",
    "footprint_report",
    "trim_interval",
]


def check_trim_every(trim_every: int | None) -> None:
    """`trim_every` as `cec run --trim-every` takes it: a whole number of records, 0 (or None) never."""
    if trim_every is not None and (isinstance(trim_every, bool) or not isinstance(trim_every, int)):
        raise ConfigError(f"trim_every must be a whole number of records, got {trim_every!r}")
    if trim_every is not None and trim_every < 0:
        raise ConfigError(f"trim_every must be >= 0 (0: never trim), got {trim_every}")


def trim_interval(trim_every: int | None) -> int | None:
    """The interval the query trims at (None: never), from `cec_aggregate(trim_every=)`: its default
    (`DEFAULT_TRIM_EVERY`: the attached query's results are written as it runs, so it trims by default, as
    `cec run --follow` does), a number of records, or 0 / None for never."""
    check_trim_every(trim_every)
    return trim_every or None


def check_trimmed_indexes(store: QueueStore, generation: Generation) -> None:
    """Before the current generation's logs are opened: a partition whose stream index is behind its
    trimmed log's start (lost with the `state_dir`, or never told what the executors trimmed) adopts the
    closed-window directory carried in Kafka (module doc); a start that finds none covering the log start
    is refused (the windows closed in the trimmed part cannot be known again)."""
    for q in range(generation.partitions):
        with store.reader(generation.topic, q) as reader:
            start = reader.start_offset()
        if start == 0:
            continue
        index = StreamIndex(store.index_path(generation.topic, q), identity=f"{generation.topic}/{q}")
        try:
            if index.next_offset >= start:
                continue
            carried = (
                read_directory(store, generation.topic, q) if isinstance(store, KafkaQueueStore) else None
            )
            if carried is None or carried.covered < start:
                raise ConfigError(
                    f"{generation.topic}[{q}] was trimmed (it starts at offset {start}) and neither its "
                    f"stream index in the state_dir {store.state_dir} nor the closed-window directory "
                    "carried in Kafka covers the trimmed part: the windows closed there cannot be known "
                    "again; start with the state_dir of the run that trimmed it"
                )
            index.adopt_closed_windows(carried.seqs.items(), start)
        finally:
            index.close()


def directory_starts(store: KafkaQueueStore, outputs: Sequence[OutputQueue]) -> list[int]:
    """For trimming on the executors: the offset below which each partition's carried directory covers
    its log, carrying first, from the driver's reconciled index, the directory of a log that was trimmed
    without one (by the driver, `writers="driver"`)."""
    if not outputs:
        return []
    create_directory_topic(store, outputs[0].topic, len(outputs))
    covered = []
    for out in outputs:
        carried = read_directory(store, out.topic, out.partition)
        start = out.index.start_offset
        if carried is not None and carried.covered >= start:
            covered.append(carried.covered)
        elif carried is None and start == 0:
            covered.append(0)  # nothing trimmed: a directory of nothing below offset 0
        else:
            out.catch_up_index()  # the directory below: every record's (`open_outputs`, `defer_index`)
            end = out.index.next_offset
            carry(
                cast("KafkaPartitionWriter", out.writer),
                out.topic,
                out.partition,
                ((k, s, -1) for k, s in out.index.closed_windows()),
                end,
            )
            out.flush()
            covered.append(end)
    return covered


def footprint_report(reports: Sequence[bytes | str]) -> FootprintReport | None:
    """A state partition's latest extent figures (`FIGURES_ENTRY`, the highest phase) among a batch's
    control rows, as trimming reads them; None when it reported none."""
    from operators.spark.processor import FIGURES_ENTRY

    latest: tuple[int, FootprintReport] | None = None
    for report in reports:
        control = json.loads(report)
        if control.get("entry") != FIGURES_ENTRY:
            continue
        if latest is None or control["phase"] >= latest[0]:
            found = FootprintReport(bool(control.get("restoring", True)), control.get("footprint_time"))
            latest = (int(control["phase"]), found)
    return None if latest is None else latest[1]


@dataclass(frozen=True)
class PartitionTrim:
    """What a write task needs to trim its partition, handed from task to task by the driver: the durable
    end when a bound was last taken (`TrimSchedule`) and the offset below which the carried directory
    covers the log."""

    looked: int
    covered: int


class TaskTrim:
    """One write task's trim of its partition (module doc, "On the executors"): `plan` before the batch is
    appended, `apply` after its commit."""

    def __init__(self, every: int, state: PartitionTrim, report: FootprintReport | None) -> None:
        self.schedule = TrimSchedule(every, state.looked)
        self.covered = state.covered
        self.report = report
        self.carried: list[tuple[str, int, int]] = []  # (key, seq, offset) of the R records to carry
        self._appended_end = 0
        self._carried_by: tuple[KafkaPartitionWriter, int] | None = None  # the writer that carried, to where
        self.records_read = 0  # log records read to take the bound

    @property
    def state(self) -> PartitionTrim:
        """What the next task of the partition continues from."""
        return PartitionTrim(self.schedule.looked, self.covered)

    def plan(
        self,
        reader: PartitionReader,
        acknowledged: Callable[[], Mapping[str, int]],
        durable_end: int,
        appending: int,
    ) -> None:
        """Take the bound if one is due: `durable_end`, the log's end before this batch (all durable);
        `appending`, the messages this batch appends."""
        report = self.report
        if report is None or report.restoring:
            return
        self._appended_end = durable_end + appending
        self.schedule.take_if_due(
            durable_end=durable_end,
            appended=self._appended_end,
            take=lambda: self._bound(reader, report, durable_end, acknowledged),
        )

    def _bound(
        self,
        reader: PartitionReader,
        report: FootprintReport,
        durable_end: int,
        acknowledged: Callable[[], Mapping[str, int]],
    ) -> int:
        from cec.verified import LogVerifier

        start = reader.start_offset()
        last = reader.read_backward(durable_end, 1)
        if not last:
            return start
        end = last[0].offset + 1  # after the crash record (the cursor may end after a transaction marker)
        oldest = report.footprint_time
        footprint: int | None = None
        closed: dict[str, tuple[int, int]] = {}
        verifier = LogVerifier(reader, passable=FOOTPRINT_KINDS, passed_over=[])
        verifier.seek(start)
        for records in reader.scan_forward_chunks(start, stop_before=end):
            for record in verifier.check(records):
                self.records_read += 1
                meta = record.meta
                if oldest is not None and meta.time >= oldest:
                    footprint = record.offset
                    break
                if (
                    meta.kind == "R"
                    and meta.key is not None
                    and meta.seq >= 0
                    and record.offset >= self.covered
                ):
                    closed[meta.key] = (meta.seq, record.offset)
            if footprint is not None:
                break
        low = capped(bound(end, footprint), acknowledged().values())
        stretch = carry_from(self.covered, low)
        if stretch is not None:
            self.carried = [(k, seq, offset) for k, (seq, offset) in closed.items() if offset < stretch[1]]
        return low

    def carry(self, writer: KafkaPartitionWriter, topic: str, q: int) -> None:
        """Before the batch's commit: the directory of the records below a taken bound, in its transaction
        (a writer that fails before its commit and is replaced carries it again in the new one's)."""
        low = self.schedule.pending
        if low is None or low <= self.covered:
            return
        carry(writer, topic, q, self.carried, low)
        self._carried_by = (writer, low)

    def apply(self, writer: KafkaPartitionWriter, reader: PartitionReader) -> int:
        """After `writer` committed the batch: trim to the taken bound, once the directory below it is
        durable (carried in a transaction `writer` committed, or before); the offsets trimmed."""
        low = self.schedule.ready(self._appended_end)
        carried = self._carried_by
        if carried is not None and carried[0] is writer:
            self.covered = max(self.covered, carried[1])
        if low is None or low > self.covered:
            return 0
        start = reader.start_offset()
        if low <= start or not writer.trim(low):  # nothing to drop, or a broker that cannot
            return 0
        return low - start


@dataclass(frozen=True)
class FootprintReport:
    """What a state partition last reported for trimming: whether it is still restoring, and the logical
    time of the oldest latest-footprint in its log (None: no open window has its footprint there)."""

    restoring: bool
    footprint_time: int | None


class OutputTrimmer:
    """Trims the current generation's output logs every `every` durable records (module doc)."""

    def __init__(self, outputs: Sequence[OutputQueue], every: int) -> None:
        self.outputs = list(outputs)
        self.schedules = [TrimSchedule(every) for _ in self.outputs]
        self.trimmed = 0  # offsets trimmed from the heads of the logs in this run

    def after_batch(self, q: int, durable_end: int, report: FootprintReport | None) -> int:
        """After a micro-batch of partition q, whose log's records below `durable_end` are all durable (the
        offset after its last record): trim to the bound when one is due; returns the offsets trimmed.
        `report`: the partition's latest (None: it reported nothing yet, so nothing is known)."""
        if report is None or report.restoring:
            return 0
        schedule = self.schedules[q]
        schedule.take_if_due(
            durable_end=durable_end, appended=durable_end, take=lambda: self._bound(q, report)
        )
        low = schedule.ready(durable_end)  # everything appended is durable at the end of a batch
        return 0 if low is None else self._trim_to(q, low)

    def _bound(self, q: int, report: FootprintReport) -> int:
        out = self.outputs[q]
        with out.store.reader(out.topic, out.partition) as reader:
            out.index.reconcile(reader)  # the closed-window directory learns every record first
        oldest = report.footprint_time
        # The reconciled index ends right after the log's last record: the sink's cursor may end after a
        # transaction marker instead, and the crash record is the one to keep.
        return bound(out.index.next_offset, None if oldest is None else out.index.offset_for_time(oldest))

    def _trim_to(self, q: int, low: int) -> int:
        out = self.outputs[q]
        low = capped(low, out.store.acknowledged(out.topic, out.partition).values())
        start = out.index.start_offset
        if low <= start or not out.writer.trim(low):  # nothing to drop, or a broker that cannot
            return 0
        out.index.prune(low)
        self.trimmed += low - start
        return low - start
