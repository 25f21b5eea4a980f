"""Read an operator's output queue as its consumers see it: results only, control tuples dropped by kind,
every record's checksum checked first (`cec.verified`)."""

from __future__ import annotations

import csv
import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from cec.exceptions import CodecError, ConfigError
from cec.records import AvroCodec, Kind, RecordCodec
from cec.timeparse import format_time_ms
from cec.verified import verified_records
from queuestore.base import QueueStore, RecordMeta
from queuestore.exceptions import QueueStoreError
from queuestore.output import OutputQueue

__all__ = [
    "RESULTS_TOPIC",
    "RESULT_COLUMNS",
    "ResultsTopicOutput",
    "count_kinds",
    "iter_payloads",
    "result_formats",
    "write_dead_letter_csv",
    "write_outputs",
    "write_results_csv",
]

# The results file's columns. The first four keep their order (readers outside the project rely on it).
RESULT_COLUMNS = ["key", "window", "value", "count", "start", "end"]

Formats = Mapping[str, Callable[[Any], str]]

# JobSpec.extra key: the topic that receives every result as a plain JSON record (`ResultsTopicOutput`).
RESULTS_TOPIC = "results_topic"


def iter_payloads(
    store: QueueStore, topic: str, schema: dict[str, Any], kind: Kind = Kind.R
) -> Iterator[dict[str, Any]]:
    """Decoded payloads of every `kind` record of every partition, partition by partition in log order.

    Every record is checked before it is filtered by kind: a damaged or missing record of any kind raises
    `DamagedLogError`, so results are never silently dropped or used.
    """
    codec, payloads = RecordCodec(), AvroCodec(schema)
    wanted = kind.value
    for p in range(store.partitions(topic)):
        with store.reader(topic, p) as reader:
            for verified in verified_records(reader, codec=codec, decode=(wanted,)):
                if verified.meta.kind != wanted:
                    continue
                record = verified.record
                assert record is not None
                if record.payload is None:
                    raise CodecError(f"{reader.where(verified.offset)}: a {wanted} record without payload")
                yield payloads.decode(record.payload)


def count_kinds(store: QueueStore, topic: str, partition: int | None = None) -> Counter[str]:
    """How many records of each kind a topic (or one of its partitions) holds, every one checked."""
    counts: Counter[str] = Counter()
    codec = RecordCodec()
    partitions = range(store.partitions(topic)) if partition is None else [partition]
    for p in partitions:
        with store.reader(topic, p) as reader:
            counts.update(v.meta.kind for v in verified_records(reader, codec=codec))
    return counts


def _fmt(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _integer(value: Any) -> str:
    return str(int(value))


def result_formats(operator: Mapping[str, Any]) -> dict[str, Callable[[Any], str]]:
    """How the results of an aggregate operator spec print: counts as integers (`count`, and `value` of
    agg=count); with an event-time column, `start`/`end` as ISO-8601 UTC (a time window's [start, end),
    a count window's first and last tuple's time); without one (count windows only) they stay input
    positions: the offsets of the window's first and last tuple in their input partition (a CSV's data
    row number, 0 = the row after the header; a topic record's offset)."""
    formats: dict[str, Callable[[Any], str]] = {"count": _integer}
    if operator.get("agg") == "count":
        formats["value"] = _integer
    if operator.get("time_field"):
        formats["start"] = formats["end"] = format_time_ms
    return formats


def write_results_csv(
    rows: Iterator[dict[str, Any]], path: Path, columns: list[str], formats: Formats | None = None
) -> int:
    """Columns in `columns` order; a column is printed by `formats[column]` when given, else as is
    (floats by repr: exact)."""
    n = 0
    out = [(c, (formats or {}).get(c, _fmt)) for c in columns]
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(columns)
            for row in rows:
                writer.writerow([fmt(row[c]) for c, fmt in out])
                n += 1
    except BaseException:
        tmp.unlink(missing_ok=True)  # a damaged log publishes no partial results file
        raise
    tmp.replace(path)
    return n


def write_dead_letter_csv(rows: Iterator[dict[str, Any]], path: Path) -> int:
    return write_results_csv(rows, path, ["partition", "offset", "reason", "raw"])


def write_outputs(
    store: QueueStore,
    topic: str,
    result_schema: dict[str, Any],
    dead_letter_schema: dict[str, Any],
    results: tuple[Path, list[str]],
    dead_letters: Path,
    formats: Formats | None = None,
) -> tuple[int, int, Counter[str]]:
    """What a run hands its user, from ONE checked pass over the log (results and dead letters are few
        next to the footprints, so they are held until the pass is done): the results CSV (path, columns),
        the dead-letter CSV, and the count of every kind. A damaged log writes neither file. `formats`: how
    result columns print (`result_formats`)."""
    codec = RecordCodec()
    found: dict[str, list[dict[str, Any]]] = {Kind.R.value: [], Kind.DEAD.value: []}
    decoders = {Kind.R.value: AvroCodec(result_schema), Kind.DEAD.value: AvroCodec(dead_letter_schema)}
    counts: Counter[str] = Counter()
    for p in range(store.partitions(topic)):
        with store.reader(topic, p) as reader:
            for verified in verified_records(reader, codec=codec, decode=tuple(found)):
                kind = verified.meta.kind
                counts[kind] += 1
                rows = found.get(kind)
                if rows is None:
                    continue
                record = verified.record
                assert record is not None
                if record.payload is None:
                    raise CodecError(f"{reader.where(verified.offset)}: a {kind} record without payload")
                rows.append(decoders[kind].decode(record.payload))
    path, columns = results
    n_results = write_results_csv(iter(found[Kind.R.value]), path, columns, formats)
    n_dead = write_dead_letter_csv(iter(found[Kind.DEAD.value]), dead_letters)
    return n_results, n_dead, counts


class ResultsTopicOutput(OutputQueue):
    """An output queue that also publishes every result (R record) as a plain JSON record to
    `results_topic`: key = the window key, value = the result's fields (key, window, value, count, start,
    end for the aggregate). Each one is produced in the Kafka transaction of its R record, so a
    read_committed consumer that knows nothing of cec reads each result exactly once, crashes included:
    a result is in the results topic exactly when its R record is in the log, and recovery never emits an
    R that the log holds. Output partition p publishes to results partition p (the results topic has as
    many partitions as the output log), so per key the results topic is in log order."""

    def __init__(
        self,
        store: QueueStore,
        topic: str,
        partition: int,
        *,
        results_topic: str,
        result_schema: dict[str, Any],
    ) -> None:
        super().__init__(store, topic, partition)
        append_side = getattr(self.writer, "append_side", None)
        if append_side is None:
            self.close()
            raise ConfigError(
                "--results-topic needs the Kafka store (--bootstrap-servers): results are published in the "
                "transaction of the output log"
            )
        try:
            store.create_topic(results_topic, store.partitions(topic))
        except BaseException:
            self.close()
            raise
        self.results_topic = results_topic
        self._append_side = append_side
        self._records = RecordCodec()
        self._results = AvroCodec(result_schema)
        self.published = 0
        self.republished = 0
        try:
            from operators.topic_source import broker_compat

            if broker_compat() == "tansu":
                self._republish_missing()
        except BaseException:
            self.close()
            raise

    def _side_record(self, meta_key: str | None, payload: bytes) -> tuple[bytes | None, bytes]:
        row = self._results.decode(payload)
        body = json.dumps(row, separators=(",", ":")).encode()
        return (None if meta_key is None else meta_key.encode()), body

    def append(self, value: bytes, meta: RecordMeta) -> None:
        super().append(value, meta)
        if meta.kind != Kind.R.value:
            return
        record = self._records.decode(value, meta)
        if record.payload is None:
            return
        key, body = self._side_record(meta.key, record.payload)
        # After the last part of a chunked R: in the transaction that completes the result in the log.
        self._append_side(self.results_topic, self.partition, key, body)
        self.published += 1

    def _republish_missing(self) -> None:
        """Tansu only: it shows the records of aborted transactions to read_committed consumers, so after a
        crash the log can hold results (delivered, then aborted) whose side records were never produced
        (`append_side` produces them at commit time, after the log's records are delivered). The results
        partition is then the log's results minus a tail; publish that tail now, once this writer has
        taken the partition. On Apache Kafka aborted records stay hidden and nothing is ever missing."""
        published, last = self._published()
        logged: list[tuple[bytes | None, bytes]] = []
        with self.store.reader(self.topic, self.partition) as reader:
            for verified in verified_records(reader, codec=self._records, decode=(Kind.R.value,)):
                if verified.meta.kind == Kind.R.value and verified.record and verified.record.payload:
                    logged.append(self._side_record(verified.meta.key, verified.record.payload))
        if published > len(logged) or (published and logged[published - 1] != last):
            raise ConfigError(
                f"results topic {self.results_topic!r} partition {self.partition} holds records that are not "
                f"the results of {self.topic}[{self.partition}]: give each job a results topic of its own"
            )
        for key, body in logged[published:]:
            self._append_side(self.results_topic, self.partition, key, body)
            self.republished += 1
        if self.republished:
            self.writer.flush()

    def _published(self) -> tuple[int, tuple[bytes | None, bytes] | None]:
        """How many records results partition p shows a read_committed consumer, and the last one."""
        import time

        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

        # The store's own consumer settings (security, read_committed, partition EOF events).
        consumer = Consumer(self.store._consumer_config("results"))  # type: ignore[attr-defined]
        timeout = float(getattr(self.store, "request_timeout", 30.0))
        try:
            consumer.assign([TopicPartition(self.results_topic, self.partition, OFFSET_BEGINNING)])
            count: int = 0
            last: tuple[bytes | None, bytes] | None = None
            quiet_since = time.monotonic()
            while True:
                msg = consumer.poll(0.1)
                if msg is None:
                    if time.monotonic() - quiet_since > timeout:
                        raise QueueStoreError(
                            f"results topic {self.results_topic!r}: no end of partition {self.partition} "
                            f"within {timeout}s"
                        )
                    continue
                quiet_since = time.monotonic()
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return count, last
                    raise QueueStoreError(f"cannot read results topic {self.results_topic!r}: {error.str()}")
                count += 1
                last = (msg.key(), msg.value() or b"")
        finally:
            consumer.close()
