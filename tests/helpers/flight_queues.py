"""Flights as an upstream cec queue (SQLite store) and the results a job wrote, compared bit for bit: the
input and output builders of the aggregate tests (tumbling, hopping, session windows)."""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cec.records import AvroCodec, Kind, OutputRecord, RecordCodec
from operators.sinks import iter_payloads
from queuestore.base import RecordMeta
from queuestore.sqlite import SqliteQueueStore
from tests.helpers import log_records

__all__ = [
    "bits",
    "flight_schema",
    "log_kinds",
    "logged",
    "logged_result_bits",
    "result_bits",
    "write_partitions",
]


def flight_schema(namespace: str, values: Sequence[str]) -> dict[str, Any]:
    """A flight's Avro schema: carrier, origin, the nullable double `values`, and `ts` (ms)."""
    return {
        "type": "record",
        "name": "Flight",
        "namespace": namespace,
        "fields": [
            {"name": "carrier", "type": "string"},
            {"name": "origin", "type": "string"},
            *({"name": v, "type": ["null", "double"]} for v in values),
            {"name": "ts", "type": "long"},
        ],
    }


def write_partitions(
    root: Path, parts: Sequence[Sequence[dict[str, Any]]], schema: dict[str, Any], topic: str = "flights"
) -> None:
    """An upstream cec queue with one partition per list of `parts`, its rows (the schema's fields of
    each) in that order as results, then EOS."""
    store = SqliteQueueStore(root)
    store.create_topic(topic, len(parts))
    codec, payload = RecordCodec(), AvroCodec(schema)
    names = [f["name"] for f in schema["fields"]]
    for p, rows in enumerate(parts):
        with store.writer(topic, p) as writer:
            for i, r in enumerate(rows):
                value = {n: r[n] for n in names}
                writer.append(
                    codec.encode(OutputRecord(Kind.R, i, (i,), 0, payload=payload.encode(value))),
                    RecordMeta(Kind.R.value, i, None, -1),
                )
            writer.append(
                codec.encode(OutputRecord(Kind.EOS, len(rows), (len(rows),), 0)),
                RecordMeta(Kind.EOS.value, len(rows), None, -1),
            )
            writer.flush()


def bits(x: Any) -> Any:
    """A double as the hex of its 8 bytes (two results are equal only bit for bit), anything else as is."""
    return struct.pack("<d", x).hex() if isinstance(x, float) else x


def result_bits(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Results as sorted JSON lines with their doubles as bits: equal lists are bit-for-bit equal results."""
    return sorted(json.dumps({k: bits(v) for k, v in r.items()}) for r in rows)


def logged_result_bits(root: Path, schema: dict[str, Any], topic: str = "agg") -> list[str]:
    """`result_bits` of the results in the job's output log (a store under `root`)."""
    return result_bits(list(iter_payloads(SqliteQueueStore(root), topic, schema)))


def log_kinds(root: Path, topic: str = "agg") -> list[Kind]:
    """The kind of every record in partition 0 of the job's output log."""
    return [r.kind for r in log_records(SqliteQueueStore(root), topic)]


def logged(root: Path, topic: str = "agg") -> int:
    """How many records partition 0 of the job's output log holds (0 before it exists)."""
    store = SqliteQueueStore(root)
    if not store.topic_exists(topic):
        return 0
    with store.reader(topic, 0) as reader:
        return reader.end_offset()
