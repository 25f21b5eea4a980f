"""Flights on a Kafka topic, for the attached query (`cec_aggregate`) and `cec run --input-topic` alike:
the records, the far-future tuples that close every window under watermarks, the topic, the same records
as one CSV file, the dead letters an output topic holds, and the reader a test needs."""

from __future__ import annotations

import csv
import json
import os
import uuid
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cec.records import AvroCodec, Kind
from operators.base import DEAD_LETTER_SCHEMA
from operators.spark.partitioning import KeyGrouper, partition_key
from queuestore.kafka import KafkaQueueStore
from tests.brokers import Broker
from tests.helpers import log_records
from tests.topic_data import create_topic, produce

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "FLUSH_TS",
    "Record",
    "flight_records",
    "flights_csv",
    "flights_topic",
    "flush_records",
    "key_and_value_dead_letters",
    "logged_dead_letters",
    "need_reader",
]

FLUSH_TS = 10**9  # far past every real tuple: closes every real window on every state partition
Record = tuple[int, dict[str, Any]]  # (input partition, the record's JSON object)


def flight_records(partitions: int, count: int, *, spread: bool, step: int = 3) -> list[Record]:
    """(input partition, record). `spread`: a key's tuples go to every partition (round robin), else each
    key lives in one. Event times (`ts`, `step` ms apart along the input) increase within a partition, so
    no tuple is ever behind a watermark. Averages of sevenths are not exact in binary (the sum's order
    would show); some values are null or absent (SQL's rule), every 151st arr_delay is not a number and
    every 173rd record lacks its origin (dead letters)."""
    out = []
    for i in range(count):
        h = (i * 2654435761) % 2**32
        record: dict[str, Any] = {
            "carrier": ["AA", "UA", "DL"][h % 3],
            "origin": ["JFK", "SFO", "ORD"][(h >> 5) % 3],
        }
        partition = i % partitions if spread else zlib.crc32(json.dumps(record).encode()) % partitions
        record["ts"] = i * step + partition
        if h % 11:
            record["arr_delay"] = (h % 100_000) / 7 - 40
        if h % 13:
            record["dep_delay"] = (h >> 8) % 90 - 10
        elif h % 2:
            record["dep_delay"] = None
        if i % 151 == 150:
            record["arr_delay"] = "late"
        if i % 173 == 172:
            del record["origin"]
        out.append((partition, record))
    return out


def flush_records(
    partitions: int, state_partitions: int, key: Sequence[str], *, as_array: bool = True, ts: int = FLUSH_TS
) -> list[Record]:
    """Per input partition, one far-future tuple (carrier "ZZ") for every state partition (a key that goes
    there, packed as the query packs it: `as_array`, `AggregateSpec.key_array`): the watermark of every
    state partition then passes every real window's end. `ts`: their time, for a watermark of every state
    partition at `ts` less the lateness (at the input's last time: the last windows stay open)."""
    grouper = KeyGrouper([state_partitions])
    origins: dict[int, str] = {}
    i = 0
    while len(origins) < state_partitions:
        origin = f"flush{i}"
        packed = partition_key({"carrier": "ZZ", "origin": origin}, key, as_array=as_array)
        origins.setdefault(grouper(packed)[1][-1], origin)
        i += 1
    return [
        (j, {"carrier": "ZZ", "origin": origin, "ts": ts, "arr_delay": 1.0, "dep_delay": 1})
        for j in range(partitions)
        for origin in origins.values()
    ]


def flights_topic(broker: Broker, records: list[Record], partitions: int) -> str:
    """A new topic of `partitions` partitions holding `records` as JSON, each on its partition."""
    topic = f"flights-{uuid.uuid4().hex[:10]}"
    create_topic(broker.bootstrap, topic, partitions)
    produce(broker.bootstrap, topic, [(p, None, json.dumps(r).encode()) for p, r in records])
    return topic


def flights_csv(path: Path, records: list[Record]) -> Path:
    """The records in their order as one CSV file (a null or absent field is an empty one)."""
    columns = ("carrier", "origin", "ts", "arr_delay", "dep_delay")
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for _, r in records:
            writer.writerow(["" if r.get(c) is None else repr(r[c]) if isinstance(r[c], float) else r[c]
                             for c in columns])  # fmt: skip
    return path


def key_and_value_dead_letters(records: list[Record]) -> list[tuple[int, int, str]]:
    """(partition, offset, reason), sorted: the dead letters of an aggregate keyed by (carrier, origin) over
    arr_delay (and other fields) on `flights_topic(records)`, in plain Python: every record without its
    origin and every arr_delay that is not a number (`flight_records` makes none with both). Offsets
    count each partition's records in their order, as the topic's one producer wrote them."""
    offsets = [0] * (max(p for p, _ in records) + 1)
    out = []
    for p, r in records:
        missing, late = "origin" not in r, r.get("arr_delay") == "late"
        assert not (missing and late), r
        if missing:
            out.append((p, offsets[p], "missing key 'origin'"))
        elif late:
            out.append((p, offsets[p], "value 'arr_delay' is not a number: 'late'"))
        offsets[p] += 1
    return sorted(out)


def logged_dead_letters(broker: Broker, root: Path, output: str) -> list[tuple[Any, ...]]:
    """(partition, offset, reason) of every dead letter in the output topic, sorted."""
    codec = AvroCodec(DEAD_LETTER_SCHEMA)
    store = KafkaQueueStore(broker.bootstrap, root / "probe")
    try:
        out = []
        for q in range(store.partitions(output)):
            for record in log_records(store, output, q):
                if record.kind is Kind.DEAD and record.payload is not None:
                    d = codec.decode(record.payload)
                    out.append((d["partition"], d["offset"], d["reason"]))
        return sorted(out)
    finally:
        store.close()


def need_reader(spark: SparkSession, reader: str) -> None:
    """Skip (fail under CI or CEC_TEST_SPARK_KAFKA=required) a test of Spark's Kafka reader without its
    connector on the classpath."""
    from operators.spark.connector import has_kafka_connector
    from operators.spark.kafka_input import SPARK_KAFKA

    if reader != SPARK_KAFKA or has_kafka_connector(spark):
        return
    why = "Spark's Kafka connector is not on the classpath: run `make spark-kafka-jars`"
    if os.environ.get("CI") or os.environ.get("CEC_TEST_SPARK_KAFKA") == "required":
        pytest.fail(why, pytrace=False)
    pytest.skip(why)
