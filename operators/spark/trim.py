"""Trimming of an attached query's output logs (`cec_aggregate(..., trim_every=N)`, DESIGN-NOTES section 3):
the I/O around the engine's rule (`operators.engine.trimming`), as `cec run --trim-every` has it
(`operators.local_trim`), per output partition of the current generation.

The bound is computed **on the driver**, after each micro-batch, by the sink (`operators.spark.sink`):
- the closed-window directory (key -> last closed window seq, which a restart needs for keys without an
  open window) lives in the driver's stream index under `state_dir`, where recovery planning reads it. A
  record may only be trimmed once that index has learnt it, or a key whose last R was trimmed would open
  its next window with the wrong seq. The executors have no index (on another host, not even a file), so
  only the driver can make sure of it: before it takes a bound it reconciles the partition's index from
  the log (what the driver does at every start anyway, now spread over the run);
- the rule needs the offset of the oldest open window's latest footprint. The state partitions report the
  logical time of that footprint in one control row per micro-batch (`FIGURES_ENTRY`: they follow the
  writers' stamping rule, `operators.spark.stamping`, for times as for positions), and the reconciled
  index maps that time to an offset, as the local host does (`LogTrimmer`);
- a micro-batch's records are all durable (committed) when the sink returns, so a bound taken after a
  batch is safe at once (`TrimSchedule.ready` with everything appended durable);
- `DeleteRecords` is an admin request: the driver's `OutputQueue` (which holds the partition's writer
  lock and never appends here) sends it.

The rule: a partition may drop the records below min(the oldest open footprint in its log, its last record
(the crash point), every registered consumer's acknowledged offset (`QueueStore.acknowledge`: a
downstream `cec run` over this topic registers itself)). Never while the partition is restoring (its
windows are not consistent yet). Only the current generation's logs are trimmed: an older generation's
log is read at every start for its crash points and for windows whose latest footprint it still holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cec.exceptions import ConfigError
from operators.engine.trimming import TrimSchedule, bound, capped
from queuestore.base import QueueStore
from queuestore.output import OutputQueue

if TYPE_CHECKING:
    from operators.spark.generations import Generation

__all__ = ["FootprintReport", "OutputTrimmer", "check_trim_every", "check_trimmed_indexes"]


def check_trim_every(trim_every: int | None) -> None:
    """`trim_every` as `cec run --trim-every` takes it: None (never trim) or at least 1."""
    if trim_every is not None and (isinstance(trim_every, bool) or not isinstance(trim_every, int)):
        raise ConfigError(f"trim_every must be a whole number of records, got {trim_every!r}")
    if trim_every is not None and trim_every < 1:
        raise ConfigError(f"trim_every must be >= 1, got {trim_every}")


def check_trimmed_indexes(store: QueueStore, generation: Generation) -> None:
    """Refuse a start whose trimmed log lost its stream index (module doc: the closed-window directory of
    keys whose last R was trimmed is in that index only; a rebuilt one would reopen them at seq 0)."""
    for q in range(generation.partitions):
        if store.index_path(generation.topic, q).exists():
            continue
        with store.reader(generation.topic, q) as reader:
            start = reader.start_offset()
        if start > 0:
            raise ConfigError(
                f"{generation.topic}[{q}] was trimmed (it starts at offset {start}) and its stream index is "
                f"not in the state_dir {store.state_dir}: the windows closed in the trimmed part cannot be "
                "known again; start with the state_dir of the run that trimmed it"
            )


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
