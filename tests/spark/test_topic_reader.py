"""The "cec-topic" source's slice reader (`operators.spark.topic_reader.read_slice`) against a real broker:
Arrow batches of the row schema, dead letters as rows with their reason, and a Python worker that reads
its next slice of a partition through the reader it kept (`operators.spark.reader_pool`)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from operators.spark.reader_pool import ReaderPool
from operators.spark.topic_reader import TOPIC_ROW_SCHEMA, TopicOptions, TopicSlice, read_slice
from tests.brokers import Broker
from tests.topic_data import as_json, create_topic, make_purchases, produce


def _rows(opts: TopicOptions, piece: TopicSlice) -> list[dict[str, Any]]:
    out = []
    for batch in read_slice(opts, piece):
        assert batch.schema.names == TOPIC_ROW_SCHEMA.fieldNames()
        out.extend(batch.to_pylist())
    return out


def test_slices_read_through_a_kept_reader_are_the_partitions_records(
    spark_kafka_broker: Broker, reader_pool: ReaderPool
) -> None:
    bootstrap = spark_kafka_broker.bootstrap
    topic = f"slices-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 2)
    purchases = make_purchases(300, keys=20, partitions=2)
    records = [(p, None, as_json(rec)) for p, rec in purchases]
    records.insert(10, (0, None, b"not json"))
    produce(bootstrap, topic, records)
    expected = [rec for p, rec in purchases if p == 0]
    opts = TopicOptions.parse(
        {"topic": topic, "bootstrap.servers": bootstrap, "format": "json", "key": "item", "value": "price"}
    )
    end = len(expected) + 1  # the undecodable record has an offset too; no transactions: offsets are dense
    opened, reused = reader_pool.opened, reader_pool.reused
    rows = _rows(opts, TopicSlice(0, 0, end // 2, 2)) + _rows(opts, TopicSlice(0, end // 2, end, 2))
    assert (reader_pool.opened - opened, reader_pool.reused - reused) == (1, 1)
    assert [r["cec_offset"] for r in rows] == list(range(end))
    assert {r["cec_partition"] for r in rows} == {0}
    (dead,) = [r for r in rows if r["cec_error"] is not None]
    assert (
        dead["cec_key"] is None and dead["cec_v"] == "not json"
    )  # the record as read: its dead letter's raw
    good = [r for r in rows if r["cec_error"] is None]
    assert [(r["cec_key"], json.loads(r["cec_v"])) for r in good] == [
        (str(rec["item"]), rec["price"]) for rec in expected
    ]

    # Spark abandons a read (a limit, a cancelled task): its reader is closed, not kept.
    abandoned = read_slice(opts, TopicSlice(0, 0, end, 2))
    next(abandoned)
    abandoned.close()
    assert _rows(opts, TopicSlice(0, 5, 8, 2)) == rows[5:8]
    assert (reader_pool.opened - opened, reader_pool.reused - reused) == (2, 2)
