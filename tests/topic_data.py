"""Ordinary Kafka topics for the topic-source tests and benchmark, written by plain confluent-kafka
producers (no cec code on the writing side), plus the same records as a CSV for reference runs."""

from __future__ import annotations

import csv
import io
import json
import random
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import fastavro
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

__all__ = [
    "PURCHASE_AVSC",
    "as_json",
    "avro_body",
    "create_topic",
    "encoded",
    "make_purchases",
    "produce",
    "write_csv",
]

PURCHASE_AVSC: dict[str, Any] = {
    "type": "record",
    "name": "Purchase",
    "namespace": "shop",
    "fields": [
        {"name": "item", "type": ["null", "string"], "default": None},
        {"name": "price", "type": ["null", "double"], "default": None},
        {"name": "ts", "type": "long"},
    ],
}
_PARSED = fastavro.parse_schema(PURCHASE_AVSC)


def avro_body(record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, _PARSED, record)
    return buf.getvalue()


def create_topic(bootstrap: str, topic: str, partitions: int, config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})]).values():
        future.result(30)


def end_aware_consumer(bootstrap: str, isolation: str) -> Consumer:
    """A consumer that reports each partition's end (PARTITION_EOF) and commits nothing: the tests' reader
    of a whole topic with `isolation` ("read_committed" or "read_uncommitted")."""
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )


def make_purchases(count: int, keys: int, partitions: int, seed: int = 7) -> list[tuple[int, dict[str, Any]]]:
    """(partition, record): key k always lives in partition k % partitions; prices are exact in binary
    (quarters) so sums do not depend on the grouping."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        k = rng.randrange(keys)
        out.append((k % partitions, {"item": f"item{k}", "price": rng.randrange(1, 4000) / 4, "ts": i}))
    return out


def produce(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[int, bytes | None, bytes | None]],
) -> None:
    """(partition, key, value) in order, by a plain producer; waits until all are acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    failures: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    for partition, key, value in records:
        while True:
            try:
                producer.produce(topic, value, key, partition=partition, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0 and not failures, failures


def encoded(
    purchases: Sequence[tuple[int, dict[str, Any]]], encode: Callable[[dict[str, Any]], bytes]
) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(p, str(rec["item"]).encode(), encode(rec)) for p, rec in purchases]


def as_json(record: dict[str, Any]) -> bytes:
    return json.dumps(record).encode()


def write_csv(path: Path, purchases: Sequence[tuple[int, dict[str, Any]]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["item", "price", "ts"])
        for _p, rec in purchases:
            writer.writerow([rec["item"], repr(rec["price"]), rec["ts"]])
    return path
