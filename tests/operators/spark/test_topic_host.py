"""A user's Kafka topic as the input of long-running CEC tasks on Spark: the same topic source as the
local engine (operators.topic_source), bounds pinned once on the driver."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from operators.job import JobSpec, instance_spec, run_job
from operators.spark.host import SparkOperatorHost
from queuestore.sqlite import SqliteQueueStore
from tests.brokers import Broker
from tests.helpers import per_key, results
from tests.topic_data import as_json, create_topic, encoded, make_purchases, produce

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_spark_host_reads_a_json_topic_like_the_local_engine(
    spark: SparkSession, kafka_broker: Broker, tmp_path: Path
) -> None:
    topic = f"purchases-spark-{uuid.uuid4().hex[:10]}"
    create_topic(kafka_broker.bootstrap, topic, 2)
    purchases = make_purchases(4000, keys=40, partitions=2)
    produce(kafka_broker.bootstrap, topic, encoded(purchases, as_json))

    def spec(root: Path) -> JobSpec:
        return JobSpec(
            operator={"type": "aggregate", "key_field": "item", "value_field": "price", "window_count": 5},
            source={
                "type": "topic",
                "bootstrap_servers": kafka_broker.bootstrap,
                "topic": topic,
                "format": "json",
                "key_field": "item",
                "value_field": "price",
            },
            store={"type": "sqlite", "root": str(root)},
            output_topic="avg",
            output_partitions=2,
        )

    host = SparkOperatorHost(spark, [spec(tmp_path / "spark")])
    result = host.run()
    assert all(i.completed for i in result.instances)
    assert host.pipeline[0].source["end_offsets"] == [sum(1 for p, _ in purchases if p == q) for q in (0, 1)]
    for p in (0, 1):  # the local engine, instance by instance
        run_job(instance_spec(spec(tmp_path / "local"), p))
    got, want = SqliteQueueStore(tmp_path / "spark"), SqliteQueueStore(tmp_path / "local")
    try:
        spark_results = results(got, "avg")
        assert per_key(spark_results) == per_key(results(want, "avg")) and len(spark_results) > 500
    finally:
        got.close()
        want.close()
