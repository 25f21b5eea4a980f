"""What "as of" a past point of a log means, and the log cut at that point (`cec state --as-of AT`; the
state of the windows open there is rebuilt by `cec.state_as_of`).

What "as of" means. AT is either
- `pos:o0,o1,...`: an input position vector, as records carry it: for every input partition j, the
  offset of the next tuple (everything below o_j applied, nothing at or above). With one input partition
  `pos:K` is "after the first K tuples";
- a logical time T (integer milliseconds, or ISO-8601 such as `2026-01-01T10:00:00Z`, read as UTC): the
  operator's clock (its largest event time seen) has not passed T, i.e. on each input partition every
  tuple before the first one whose event time is past T. An operator without event time keeps the sum
  of its positions as logical time; then T is that sum.

The cut: for `pos:P`, the records whose `pos` is at most P, less those whose `pos` equals P (a record
stamped P can be the first, unclaimed record of tuple P itself, e.g. the R of the window that tuple
closes, which at P is still open); for a time T, the records whose logical time is at most T, found with
the stream index (`StreamIndex.offset_for_time`) when it is there. `copy_prefix` copies that prefix into
a scratch store, where a recovery can run as if the operator had crashed right there. Nothing of the
original log is changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from cec.exceptions import ConfigError
from cec.records import Kind, RecordCodec
from cec.verified import verified_records
from queuestore.base import QueueStore
from queuestore.exceptions import QueueStoreError
from queuestore.index import StreamIndex
from queuestore.output import OutputQueue
from queuestore.sqlite import SqliteQueueStore

__all__ = ["AsOf", "copy_prefix", "time_cut_start"]


@dataclass(frozen=True)
class AsOf:
    positions: tuple[int, ...] | None = None
    time: int | None = None

    @classmethod
    def parse(cls, text: str) -> AsOf:
        raw = text.strip()
        if raw.lower().startswith("pos:"):
            try:
                positions = tuple(int(part) for part in raw[4:].split(","))
            except ValueError:
                raise ConfigError(
                    f"--as-of {text!r}: pos: takes offsets, e.g. pos:1000 or pos:500,480"
                ) from None
            if any(p < 0 for p in positions):
                raise ConfigError(f"--as-of {text!r}: offsets cannot be negative")
            return cls(positions=positions)
        try:
            return cls(time=int(raw))
        except ValueError:
            pass
        try:
            moment = datetime.fromisoformat(raw.replace("Z", "+00:00") if raw.endswith("Z") else raw)
        except ValueError:
            raise ConfigError(
                f"--as-of {text!r}: give a logical time (milliseconds or ISO-8601) or pos:OFFSETS"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return cls(time=int(moment.timestamp() * 1000))

    def describe(self) -> str:
        return (
            f"pos:{','.join(map(str, self.positions))}" if self.positions is not None else f"time {self.time}"
        )


def time_cut_start(store: QueueStore, topic: str, partition: int, time: int) -> int:
    """Where to look for the first record past `time`: from the stream index when this host has it."""
    path = store.index_path(topic, partition)
    if not path.exists():
        return 0
    try:
        with StreamIndex(path, identity=f"{topic}/{partition}", read_only=True) as index:
            return index.offset_for_time(time + 1)
    except (QueueStoreError, OSError, RuntimeError):  # unreadable or foreign: derived data, scan instead
        return 0


def copy_prefix(store: QueueStore, topic: str, partition: int, at: AsOf, scratch: SqliteQueueStore) -> int:
    """Copy the records of the log before the as-of point (EOS excluded) into `scratch`; returns how many."""
    codec = RecordCodec()
    kinds = tuple(k.value for k in Kind)
    stop_offset: int | None = None
    if at.time is not None:
        with store.reader(topic, partition) as reader:
            start = time_cut_start(store, topic, partition, at.time)
            for record in verified_records(reader, start, codec=codec):
                if record.meta.time > at.time:
                    stop_offset = record.offset
                    break
    scratch.create_topic(topic, 1)
    out = OutputQueue(scratch, topic, 0)
    copied = 0
    try:
        with store.reader(topic, partition) as reader:
            first = reader.read_forward(reader.start_offset(), 1)  # a trimmed log: from its log start
            for verified in verified_records(
                reader, first[0].offset if first else 0, codec=codec, decode=kinds if at.positions else ()
            ):
                if stop_offset is not None and verified.offset >= stop_offset:
                    break
                if at.positions is not None:
                    decoded = verified.record
                    assert decoded is not None
                    if decoded.pos == at.positions or any(
                        p > q for p, q in zip(decoded.pos, at.positions, strict=False)
                    ):
                        break
                if verified.meta.kind == Kind.EOS.value:
                    break
                out.append(verified.value, verified.meta)
                copied += 1
                if copied % 4096 == 0:
                    out.poll()
        out.flush()
    finally:
        out.close()
    return copied
