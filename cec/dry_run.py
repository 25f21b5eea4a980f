"""`cec recover --dry-run`: what a recovery of each partition of a log would do now, changing nothing.

For every output partition: the eventual checkpoint (its windows, N, the extent), the crash point, and the
replay start on each input partition, all by the same code a recovery runs (`EventualCheckpointBuilder`,
`ReplayContract.build`), on a reader only: no writer, no lock, no index update, nothing appended.

The time estimate is the EC build just measured (the dry run does that part of a recovery for real) plus
EC load and replay at the rates the operator last measured (`cec.rates.MeasuredRates`, from the stats a run
leaves beside its store, `.<topic>[.<p>].stats.json`); without them, the conservative default rates, and
the report says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from cec.rates import MeasuredRates
from cec.records import RecordCodec
from queuestore.base import QueueStore
from recovery.contract import ReplayContract
from recovery.eventual import EventualCheckpoint, EventualCheckpointBuilder, footprint_records

__all__ = ["PartitionPlan", "load_rates", "plan_partition", "plan_recovery"]


@dataclass(frozen=True)
class PartitionPlan:
    partition: int
    log_end: int
    ec_windows: int
    n: int
    extent: int  # records read back to rebuild the EC
    extent_start: int
    crash_pos: tuple[int, ...] | None  # None: an empty log, nothing to recover
    replay_start: tuple[int, ...]
    replay_tuples: int  # input tuples (by offset) from the replay start to the crash point
    finished: bool  # the log ends with EOS: a restart only confirms it is done
    damaged_footprints: int
    ec_build_seconds: float  # measured by this dry run
    estimated_seconds: float
    rates_measured: bool  # False: the default rates, nothing measured yet

    def as_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "log_end": self.log_end,
            "ec_windows": self.ec_windows,
            "n": self.n,
            "extent": self.extent,
            "extent_start": self.extent_start,
            "crash_pos": None if self.crash_pos is None else list(self.crash_pos),
            "replay_start": list(self.replay_start),
            "replay_tuples": self.replay_tuples,
            "finished": self.finished,
            "damaged_footprints": self.damaged_footprints,
            "ec_build_seconds": self.ec_build_seconds,
            "estimated_seconds": self.estimated_seconds,
            "rates_measured": self.rates_measured,
        }

    def lines(self, topic: str) -> list[str]:
        head = f"{topic}[{self.partition}]:"
        if self.crash_pos is None:
            return [f"{head} empty log: a start would begin from the input's beginning, nothing to recover"]
        lines = [
            f"{head} crash point {list(self.crash_pos)}, N={self.n}"
            + (
                " (finished: the log ends with EOS; a restart rebuilds the EC and stops)"
                if self.finished
                else ""
            ),
            f"  eventual checkpoint: {self.ec_windows:,} windows; extent {self.extent:,} records "
            f"(offsets {self.extent_start:,}..{self.log_end:,})"
            + (
                f"; {self.damaged_footprints} damaged footprint(s) passed over"
                if self.damaged_footprints
                else ""
            ),
            f"  replay: from {list(self.replay_start)} to {list(self.crash_pos)} "
            f"({self.replay_tuples:,} input tuples{', not replayed: finished' if self.finished else ''})",
            f"  estimated recovery: {self.estimated_seconds * 1000:,.0f} ms (EC build measured now "
            f"{self.ec_build_seconds * 1000:,.1f} ms; load and replay at "
            f"{'the last measured' if self.rates_measured else 'default (unmeasured)'} rates)",
        ]
        return lines


def load_rates(store_dir: Path | None, topic: str, partition: int) -> MeasuredRates | None:
    """The rates the operator of `topic[partition]` last measured, from its run's stats file, if any."""
    if store_dir is None:
        return None
    for name in (f".{topic}.{partition}.stats.json", f".{topic}.stats.json"):
        try:
            stats = json.loads((store_dir / name).read_text())
        except (OSError, ValueError):
            continue
        saved = stats.get("rates") if isinstance(stats, dict) else None
        if isinstance(saved, dict):
            known = {f.name for f in fields(MeasuredRates)}
            rates = MeasuredRates(**{k: v for k, v in saved.items() if k in known and k != "measured"})
            rates.measured = set(saved.get("measured") or ())
            return rates
    return None


def _window_positions(ec: EventualCheckpoint, codec: RecordCodec) -> dict[str, tuple[int, ...]]:
    footprints = list(ec.windows.values())
    return {
        fp.key: record.pos
        for fp, record in zip(footprints, footprint_records(footprints, codec), strict=True)
    }


def plan_partition(
    store: QueueStore, topic: str, partition: int, rates: MeasuredRates | None = None
) -> PartitionPlan:
    codec = RecordCodec()
    with store.reader(topic, partition) as reader:
        ec = EventualCheckpointBuilder(reader, codec).build()
    width = 0 if ec.crash_pos is None else len(ec.crash_pos)
    plan = ReplayContract.build(ec.crash_pos, _window_positions(ec, codec), width)
    measured = rates is not None and bool(rates.measured)
    rates = rates or MeasuredRates()
    # A finished log (EOS) is rebuilt and loaded on a restart, then the operator stops: no replay.
    replay = 0 if ec.complete else plan.replay_span
    estimate = ec.build_seconds + rates.recovery_seconds(extent=0, windows=len(ec.windows), replay=replay)
    return PartitionPlan(
        partition=partition,
        log_end=ec.end_offset,
        ec_windows=len(ec.windows),
        n=ec.n,
        extent=ec.extent_size,
        extent_start=ec.extent_start,
        crash_pos=ec.crash_pos,
        replay_start=plan.start,
        replay_tuples=plan.replay_span,
        finished=ec.complete,
        damaged_footprints=ec.corrupt_skipped,
        ec_build_seconds=ec.build_seconds,
        estimated_seconds=0.0 if ec.crash_pos is None else estimate,
        rates_measured=measured,
    )


def plan_recovery(store: QueueStore, topic: str, store_dir: Path | None = None) -> list[PartitionPlan]:
    """A plan per partition of `topic` (`UnknownTopicError` if there is no such topic)."""
    return [
        plan_partition(store, topic, p, load_rates(store_dir, topic, p))
        for p in range(store.partitions(topic))
    ]
