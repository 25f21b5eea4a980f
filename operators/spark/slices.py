"""What the two Kafka data sources ("cec-kafka": cec queues, `operators.spark.datasource`; "cec-topic": a
user's own topic, `operators.spark.topic_reader`) share: the options every Kafka source takes (`topic`,
`bootstrap.servers`, `kafka.*` client settings, `startingOffsets`, `maxRecordsPerTrigger`), streaming
offsets as `{"<partition>": next offset}`, admission control, and the planning of a micro-batch into
slices [start, end) of one Kafka partition each (`SliceStreamReader`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from cec.exceptions import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["KafkaOptions", "SliceStreamReader", "admit", "as_offsets", "from_offsets", "starting_positions"]


@dataclass(frozen=True)
class KafkaOptions:
    """The options every Kafka data source takes, parsed (option names are case-insensitive)."""

    lowered: dict[str, str]  # every option, its name lower-cased
    topic: str
    bootstrap: str
    client_config: dict[str, str]  # `kafka.*` settings (security.protocol, sasl.*, ssl.*, ...), unprefixed
    starting_offsets: str
    max_records_per_trigger: int | None

    @classmethod
    def parse(cls, options: Mapping[str, str], source: str) -> KafkaOptions:
        opts = {k.lower(): v for k, v in options.items()}
        topic = opts.get("topic")
        bootstrap = opts.get("bootstrap.servers") or opts.get("kafka.bootstrap.servers")
        if not topic or not bootstrap:
            raise ConfigError(f"{source} needs the options 'topic' and 'bootstrap.servers'")
        limit = opts.get("maxrecordspertrigger")
        max_records = int(limit) if limit else None
        if max_records is not None and max_records < 1:
            raise ConfigError("maxRecordsPerTrigger must be >= 1")
        # Client settings (security.protocol, sasl.*, ssl.*, ...) pass through with a "kafka." prefix.
        client = {
            k[len("kafka.") :]: v
            for k, v in options.items()
            if k.lower().startswith("kafka.") and k.lower() != "kafka.bootstrap.servers"
        }
        return cls(
            lowered=opts,
            topic=topic,
            bootstrap=bootstrap,
            client_config=client,
            starting_offsets=opts.get("startingoffsets", "earliest").strip(),
            max_records_per_trigger=max_records,
        )


def starting_positions(spec: str, starts: Sequence[int], ends: Sequence[int]) -> list[int]:
    """Where a query starts on each partition: `earliest` (the partitions' starts), `latest` (their ends),
    or `{"<partition>": offset}` (a partition not named starts at its start; no start beyond the end). An
    offset below a start stays below it: a read there meets the source's own rule (retention error)."""
    if spec.lower() == "earliest":
        return list(starts)
    if spec.lower() == "latest":
        return list(ends)
    try:
        given = {int(k): int(v) for k, v in json.loads(spec).items()}
    except (ValueError, AttributeError, TypeError):
        raise ConfigError(
            f'startingOffsets must be earliest, latest or {{"<partition>": offset}}: {spec!r}'
        ) from None
    return [min(given.get(p, s), e) for p, (s, e) in enumerate(zip(starts, ends, strict=True))]


def as_offsets(positions: Sequence[int]) -> dict[str, int]:
    return {str(p): int(o) for p, o in enumerate(positions)}


def from_offsets(offsets: Mapping[str, Any]) -> list[int]:
    return [int(offsets[str(p)]) for p in range(len(offsets))]


def admit(start: Sequence[int], ends: Sequence[int], max_rows: int | None) -> list[int]:
    """End offsets of the next micro-batch: everything pending, or at most `max_rows` offsets split over
    partitions in proportion to what each has pending (every partition with data advances)."""
    pending = [max(0, e - s) for s, e in zip(start, ends, strict=True)]
    total = sum(pending)
    if max_rows is None or total <= max_rows:
        return [max(s, e) for s, e in zip(start, ends, strict=True)]
    take = [n * max_rows // total for n in pending]
    spare = max_rows - sum(take)
    for p in sorted(range(len(pending)), key=lambda i: pending[i] - take[i], reverse=True):
        if spare == 0:
            break
        if take[p] < pending[p]:
            take[p] += 1
            spare -= 1
    return [s + t for s, t in zip(start, take, strict=True)]


class SliceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A streaming reader of a Kafka topic by slices: offsets per partition, admission control by
    `maxRecordsPerTrigger`, `Trigger.AvailableNow` (the ends when the query started). A source gives its
    partitions' `_bounds()` (starts, ends), its `_slice` and its `read`; nothing is committed to Kafka
    (Spark's checkpoint holds the offsets; recovery uses the positions in the output log)."""

    def __init__(self, starting_offsets: str, max_records_per_trigger: int | None) -> None:
        self._starting_offsets = starting_offsets
        self._max_records = max_records_per_trigger
        self._target: list[int] | None = None  # Trigger.AvailableNow: the ends when the query started

    def _bounds(self) -> tuple[list[int], list[int]]:
        """(starts, ends) of every partition now."""
        raise NotImplementedError

    def _slice(self, partition: int, start: int, end: int, total: int) -> InputPartition:
        raise NotImplementedError

    def _ends(self) -> list[int]:
        if self._target is not None:
            return list(self._target)
        return self._bounds()[1]

    def initialOffset(self) -> dict[str, int]:
        starts, ends = self._bounds()
        if self._target is not None:
            ends = list(self._target)
        return as_offsets(starting_positions(self._starting_offsets, starts, ends))

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self._max_records
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        ends = self._ends()
        begin = from_offsets(start)
        begin += [0] * (len(ends) - len(begin))  # partitions added to the topic since: read from 0
        return as_offsets(admit(begin, ends, max_rows))

    def reportLatestOffset(self) -> dict[str, int] | None:
        return None  # finding the end costs a consume; Spark would call this every trigger

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = None
        self._target = self._ends()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        stop = from_offsets(end)
        begin = from_offsets(start)
        begin += [0] * (len(stop) - len(begin))
        total = len(stop)
        return [
            self._slice(p, s, e, total) for p, (s, e) in enumerate(zip(begin, stop, strict=True)) if e > s
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        raise NotImplementedError

    def commit(self, end: dict[str, Any]) -> None:
        pass
