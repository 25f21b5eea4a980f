"""`cec inspect`: what an output log holds and the eventual checkpoint recovery would build from it.

Read-only: the store is opened only if its directory exists (a typo in `--store-dir` must not leave an
empty store behind), nothing is written, no writer lock is taken.

`--json` prints one object whose names are a contract (scripts and the README rely on them):

    {"topic": T, "partitions": [{"partition": p, "start_offset": s, "end_offset": e,
      "counts": {"R": .., "GOPEN": .., "GCHECK": .., "DEAD": .., "EOS": ..},
      "n": N, "extent": q, "crash_pos": [..] | null}, ...]}

- `start_offset`/`end_offset`: the first offset the partition still holds (above 0 once trimmed) and one
  past the last; `counts`: this partition's records of each kind, every one checked first;
- `n`: the open windows at the newest record, `extent`: records from the oldest footprint of the eventual
  checkpoint to the end (what a recovery reads back), `crash_pos`: the newest record's `pos` (null for
  an empty log);
- `standby` (only where a standby of the partition wrote its status, `cec run --standby`): `state`
  ("following" or "took over"), `applied` (every record below it applied), `log_end` (the log's end then),
  `lag_records`, `pid`, `updated_unix` (when it measured them); the text report's `standby:` line.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cec.exceptions import ConfigError
from cec.records import Kind, RecordCodec
from cec.verified import verified_records
from cec.wire import MAGIC
from operators.standby import StandbyStatus, read_status
from queuestore.base import PartitionReader, QueueStore
from queuestore.exceptions import DamagedLogError
from queuestore.factory import open_store, store_spec
from recovery.eventual import EventualCheckpoint, EventualCheckpointBuilder

# Where `cec run` remembers the output topic of each (operator, input file) in its store dir.
RUN_TOPICS = "cec-run-topics.json"

__all__ = [
    "KIND_NAMES",
    "RUN_TOPICS",
    "PartitionSummary",
    "existing_store",
    "inspect_topic",
    "list_topics",
    "no_embedded_log",
    "start_offset",
]

KIND_NAMES = tuple(k.value for k in Kind)


@contextmanager
def existing_store(store_dir: str | None, bootstrap_servers: str | None) -> Iterator[QueueStore]:
    """The store at `store_dir` (or on Kafka), opened only if it is there: never created.

    On Kafka the directory only holds local, derived state (stream indexes, writer locks) that a reader
    does not need, so it may be omitted (a temporary one is used and removed)."""
    temporary: Path | None = None
    if store_dir is None:
        if not bootstrap_servers:
            raise ConfigError("give --store-dir DIR (the embedded store), or --bootstrap-servers for Kafka")
        temporary = Path(tempfile.mkdtemp(prefix="cec-inspect-"))
        path = temporary
    else:
        path = Path(store_dir)
        if not path.exists():
            raise ConfigError(f"store dir {path} does not exist")
        if not path.is_dir():
            raise ConfigError(f"store dir {path} is not a directory")
    try:
        store = open_store(store_spec(path, bootstrap_servers))
        try:
            yield store
        finally:
            store.close()
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


def list_topics(store: QueueStore) -> list[tuple[str, int]]:
    """(topic, partitions) of every topic in the store, by name."""
    return [(topic, store.partitions(topic)) for topic in store.topics()]


def no_embedded_log(store_dir: str) -> str:
    """Why a store dir opened as the embedded store holds no topic: what is missing to read it (one line).
    A `cec run` on Kafka keeps only its stream indexes there, and names its topics in `cec-run-topics.json`."""
    try:
        named = sorted(set(json.loads((Path(store_dir) / RUN_TOPICS).read_text(encoding="utf-8")).values()))
    except (OSError, ValueError, AttributeError):
        named = []
    if named:
        return (
            f"store dir {store_dir} holds no embedded log: it kept the stream indexes of a run on Kafka "
            f"({', '.join(named)}); give --bootstrap-servers (or set CEC_BOOTSTRAP_SERVERS) to read it"
        )
    return (
        f"store dir {store_dir} holds no cec log: give the --store-dir of a run, or --bootstrap-servers (or "
        "CEC_BOOTSTRAP_SERVERS) for a store on Kafka"
    )


def start_offset(reader: PartitionReader) -> int:
    """The first offset the partition still holds (0 unless its head was trimmed); its end if empty."""
    # From the log start: a read below it is refused on a trimmed log.
    first = reader.read_forward(reader.start_offset(), 1)
    return first[0].offset if first else reader.end_offset()


@dataclass(frozen=True)
class PartitionSummary:
    partition: int
    start_offset: int
    end_offset: int
    counts: dict[str, int]
    checkpoint: EventualCheckpoint
    standby: StandbyStatus | None = None  # what a standby of the partition last said (`operators.standby`)

    def as_json(self) -> dict[str, Any]:
        ec = self.checkpoint
        out: dict[str, Any] = {
            "partition": self.partition,
            "start_offset": self.start_offset,
            "end_offset": self.end_offset,
            "counts": self.counts,
            "n": ec.n,
            "extent": ec.extent_size,
            "crash_pos": None if ec.crash_pos is None else list(ec.crash_pos),
        }
        if self.standby is not None:
            out["standby"] = {**asdict(self.standby), "lag_records": self.standby.lag_records}
        return out

    def standby_line(self, now_unix: float) -> str | None:
        """The standby's lag as it last measured it, `now_unix` - its measurement's age; None: no standby."""
        s = self.standby
        if s is None:
            return None
        age = max(0.0, now_unix - s.updated_unix)
        if s.state == "took over":
            return f"  standby: pid {s.pid} took over after following the log to offset {s.applied:,}"
        line = (
            f"  standby: pid {s.pid} following, applied up to offset {s.applied:,} of {s.log_end:,}: lag "
            f"{s.lag_records:,} records ({age:.1f} s ago)"
        )
        if s.replica == "applying" and s.replica_behind is not None:
            return f"{line}; replica {s.replica_behind:,} input tuples behind that log's crash point"
        if s.replica not in ("off", "applying"):
            return f"{line}; replica {s.replica}"
        return line

    def lines(self, topic: str) -> list[str]:
        ec = self.checkpoint
        kinds = ", ".join(f"{kind} {count:,}" for kind, count in self.counts.items())
        return [
            f"{topic}[{self.partition}]: offsets {self.start_offset:,}..{self.end_offset:,}: {kinds}",
            f"  crash point (newest record's pos): {list(ec.crash_pos) if ec.crash_pos else None}, "
            f"N={ec.n}, {'finished (EOS)' if ec.complete else 'not finished'}",
            f"  eventual checkpoint: {len(ec.windows):,} windows, extent {ec.extent_size:,} records "
            f"(from offset {ec.extent_start:,}), rebuilt in {ec.build_seconds * 1000:.1f} ms",
            *filter(None, [self.standby_line(time.time())]),
        ]


def summarize_partition(store: QueueStore, topic: str, partition: int) -> PartitionSummary:
    codec = RecordCodec()
    with store.reader(topic, partition) as reader:
        start = start_offset(reader)
        counts: Counter[str] = Counter()
        # Every record checked before its kind is counted: a damaged one is an error, never skipped.
        counts.update(v.meta.kind for v in verified_records(reader, start, codec=codec))
        ec = EventualCheckpointBuilder(reader, codec).build()
    return PartitionSummary(
        partition,
        start,
        ec.end_offset,
        {kind: counts.get(kind, 0) for kind in KIND_NAMES},
        ec,
        read_status(store, topic, partition),
    )


def inspect_topic(store: QueueStore, topic: str, *, shared: bool = False) -> list[PartitionSummary]:
    """One summary per partition of `topic` (`UnknownTopicError` if there is none). In a `shared` store
    (Kafka: it holds other programs' topics too), a topic none of whose partitions starts with a cec
    record (an input topic) is a `ConfigError` saying so, not damage; the embedded store holds only what
    cec wrote, so there it is damage."""
    try:
        return [summarize_partition(store, topic, p) for p in range(store.partitions(topic))]
    except DamagedLogError:
        if not shared or _written_by_cec(store, topic):
            raise
        raise ConfigError(
            f"{topic} is not a cec log: its records were not written by cec (an input topic?); cec inspect "
            "reads the output log of a run (cec inspect --list names them)"
        ) from None


def _written_by_cec(store: QueueStore, topic: str) -> bool:
    """Whether any of the first records of a partition of `topic` begins as every cec record does (its
    magic byte): a damaged cec log keeps that in its other records, a topic of someone else's in none."""
    magic = bytes([MAGIC])
    for p in range(store.partitions(topic)):
        with store.reader(topic, p) as reader:
            first = reader.read_forward(reader.start_offset(), _PROBE_RECORDS)
        if any(stored.value[:1] == magic for stored in first):
            return True
    return False


_PROBE_RECORDS = 16


def topic_json(topic: str, summaries: list[PartitionSummary]) -> dict[str, Any]:
    return {"topic": topic, "partitions": [s.as_json() for s in summaries]}
