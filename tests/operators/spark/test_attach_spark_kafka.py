"""`cec_aggregate(input_reader="spark-kafka")`: an ordinary topic read through Spark's own Kafka source
(`operators.spark.kafka_input`), on a real broker and local Spark with the connector on the classpath:

1. the 3-partition JSON topic of test_attach_topic.py (bad and hostile records among the good ones): the
   results equal a plain-Python aggregation, and the dead letters are the ones the Python data source
   writes, at the same positions, with the same reasons;
2. records of an aborted transaction are never input (read_committed), and the offsets its markers take
   leave gaps that neither reader mistakes for lost data;
3. the driver SIGKILLed in the middle of a sink write, then restarted: the replay starts inside the input,
   from the recovery plan's T, and the output is exact (no window twice, every dead letter once);
4. a replay that would start below a partition's log start is refused with the retention error;
5. choosing the reader: `spark-kafka` for a cec queue is one clear ConfigError; `auto` picks the Kafka
   source when the connector is there and no librdkafka settings are given.

The connector comes from `make spark-kafka-jars` (`operators.spark.connector`). Without its jars these tests
are skipped with that reason, except under CI (`CI` set, or `CEC_TEST_SPARK_KAFKA=required`, which .ci/run
sets), where they fail: CI must not go green without them.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from cec.exceptions import ConfigError
from operators.exceptions import RetentionError
from operators.spark.connector import has_kafka_connector
from operators.spark.kafka_input import PYTHON, SPARK_KAFKA, check_retention, choose_input_reader
from operators.spark.topic_reader import TopicOptions
from tests.brokers import Broker
from tests.helpers.attached import run_to_end
from tests.operators.spark.test_attach import _killed_driver
from tests.operators.spark.test_attach_topic import (
    JsonTopic,
    _args,
    _assert_equal,
    _dead_letters,
    _kinds,
    _reference,
    _results,
    json_topic,
)
from tests.topic_data import create_topic

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REQUIRE_ENV = "CEC_TEST_SPARK_KAFKA"  # "required": fail instead of skipping without the connector

__all__ = ["json_topic"]  # the module-scoped fixture, shared with test_attach_topic.py


@pytest.fixture(scope="module", autouse=True)
def _connector(spark: SparkSession) -> None:
    if has_kafka_connector(spark):
        return
    why = "Spark's Kafka connector is not on the classpath: run `make spark-kafka-jars`"
    if os.environ.get("CI") or os.environ.get(REQUIRE_ENV) == "required":
        pytest.fail(why, pytrace=False)
    pytest.skip(why)


def test_json_topic_through_sparks_kafka_source_equals_the_python_source(
    spark: SparkSession, json_topic: JsonTopic, tmp_path: Path
) -> None:
    outputs = {}
    for reader in (SPARK_KAFKA, PYTHON):
        output = f"avg-{reader}-{uuid.uuid4().hex[:8]}"
        query = run_to_end(spark, _args(json_topic, tmp_path / reader, output, input_reader=reader))
        assert query.input_reader == reader
        # Spark's progress counts Kafka rows on that path; the handle reports input tuples either way.
        assert sum(p["numInputRows"] for p in query.recentProgress) == json_topic.count
        outputs[reader] = output
    kafka, python = outputs[SPARK_KAFKA], outputs[PYTHON]
    _assert_equal(_results(spark, json_topic, kafka), _reference(json_topic))
    letters = _dead_letters(json_topic, tmp_path / SPARK_KAFKA, kafka)
    assert letters.keys() == json_topic.bad.keys() and len(letters) >= 30
    assert letters == _dead_letters(json_topic, tmp_path / PYTHON, python)  # same reasons, word for word
    assert _kinds(json_topic, tmp_path / SPARK_KAFKA, kafka) == _kinds(json_topic, tmp_path / PYTHON, python)


@pytest.mark.kafka_transactions
def test_aborted_transactions_are_never_input(
    spark: SparkSession, spark_kafka_broker: Broker, tmp_path: Path
) -> None:
    """Two partitions written in transactions, every third one aborted: the results hold the committed
    records only, on both readers (the commit and abort markers take offsets: positions have gaps)."""
    bootstrap = spark_kafka_broker.bootstrap
    topic = f"json-txn-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 2)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"txn-{uuid.uuid4().hex}"})
    producer.init_transactions(30)
    committed: dict[str, list[float]] = {}
    for t in range(12):
        producer.begin_transaction()
        for i in range(20):
            key = f"k{(t * 20 + i) % 6}"
            price = float(t * 100 + i)
            producer.produce(
                topic, json.dumps({"item": key, "price": price}).encode(), partition=int(key[1:]) % 2
            )
            if t % 3 != 2:
                committed.setdefault(key, []).append(price)
        if t % 3 == 2:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
    want = {
        (key, w): sum(prices[w * 5 : w * 5 + 5]) / 5
        for key, prices in committed.items()
        for w in range(len(prices) // 5)
    }
    for reader in (SPARK_KAFKA, PYTHON):
        output = f"avg-txn-{reader}-{uuid.uuid4().hex[:8]}"
        run_to_end(
            spark,
            {
                "input_topic": topic,
                "input_format": "json",
                "bootstrap_servers": bootstrap,
                "output_topic": output,
                "key": "item",
                "value": "price",
                "window_count": 5,
                "state_dir": str(tmp_path / reader / "state"),
                "checkpoint_location": str(tmp_path / reader / "checkpoints"),
                "max_records_per_trigger": 50,
                "input_reader": reader,
            },
        )
        data = JsonTopic(bootstrap, output, [], {})
        got = {(key, row[1]): row[2] for key, rows in _results(spark, data, output).items() for row in rows}
        assert got == pytest.approx(want), reader
        assert _kinds(data, tmp_path / reader, output)["DEAD"] == 0


def test_exact_after_driver_sigkill_through_sparks_kafka_source(
    spark: SparkSession, json_topic: JsonTopic, tmp_path: Path
) -> None:
    output = f"avg-kill-sk-{uuid.uuid4().hex[:8]}"
    # From the logs: the replay from T (a resumed checkpoint is test_attach_resume.py's).
    args = _args(json_topic, tmp_path, output, input_reader=SPARK_KAFKA, resume_checkpoint=False)
    # The 3rd of 6 micro-batches: its first write task kills the driver's process group half way through.
    _killed_driver(args, tmp_path / "driver", hit=3)
    partial = _kinds(json_topic, tmp_path, output)
    total = sum(len(v) for v in _reference(json_topic).values())
    assert 0 < partial["R"] < total, (partial, total)

    query = run_to_end(spark, args)
    assert query.input_reader == SPARK_KAFKA
    rec = query.recovery
    assert rec.resumed and rec.ec_windows > 0
    assert 0 < sum(rec.start) < json_topic.count  # the replay starts inside the input, from T
    _assert_equal(_results(spark, json_topic, output), _reference(json_topic))
    assert _dead_letters(json_topic, tmp_path, output).keys() == json_topic.bad.keys()  # each once


@pytest.mark.kafka_transactions
def test_a_replay_below_the_log_start_is_the_retention_error(spark_kafka_broker: Broker) -> None:
    bootstrap = spark_kafka_broker.bootstrap
    topic = f"json-trimmed-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 2)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(40):
        producer.produce(topic, json.dumps({"item": "a", "price": 1.0}).encode(), partition=i % 2)
    assert producer.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 1, 10)]).values():
        future.result(30)
    opts = TopicOptions.parse(
        {"topic": topic, "bootstrap.servers": bootstrap, "format": "json", "key": "item", "value": "price"}
    )
    check_retention(opts, [0, 10])  # at the log start: fine
    with pytest.raises(RetentionError, match=r"partition 1 needs offset 9, but its log starts at 10"):
        check_retention(opts, [0, 9])


def test_choosing_the_reader(spark: SparkSession) -> None:
    assert choose_input_reader(spark, "auto", "json", None) == SPARK_KAFKA
    assert choose_input_reader(spark, "auto", "json", {"security.protocol": "plaintext"}) == PYTHON
    assert choose_input_reader(spark, "auto", "cec", None) == PYTHON
    assert choose_input_reader(spark, "python", "json", None) == PYTHON
    with pytest.raises(ConfigError, match="reads ordinary topics"):
        choose_input_reader(spark, "spark-kafka", "cec", None)
    with pytest.raises(ConfigError, match="input_reader must be one of auto, spark-kafka, python"):
        choose_input_reader(spark, "jvm", "json", None)
