"""Reading an attached query's results back (`read_results`: every generation's R records as one
DataFrame), and the data sources its reads use (`register_all`)."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from cec.exceptions import ConfigError
from operators.aggregate import RESULT_SCHEMA
from operators.spark.datasource import FORMAT, register
from operators.spark.generations import list_generations
from operators.spark.topic_reader import register_topic_source

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["RESULT_COLUMNS", "read_results", "register_all"]

RESULT_COLUMNS = [f["name"] for f in RESULT_SCHEMA["fields"]]


def register_all(spark: SparkSession) -> None:
    """Make `format("cec-kafka")` and `format("cec-topic")` available in `spark` (done for the active
    session when this module is imported, and by `cec_aggregate` and `read_results`)."""
    register(spark)
    register_topic_source(spark)


def read_results(
    spark: SparkSession,
    output_topic: str,
    bootstrap_servers: str,
    *,
    kafka_config: Mapping[str, str] | None = None,
    with_meta: bool = False,
) -> DataFrame:
    """The results (R records) of every generation of `output_topic` as one DataFrame with KeyedAggregate's
    columns (plus the cec_ metadata columns and `cec_generation` when `with_meta`)."""
    from functools import reduce

    from pyspark.sql import functions as F

    from queuestore.kafka import KafkaQueueStore

    # Only reads metadata: the state directory is never written.
    state_dir = Path(tempfile.gettempdir()) / "cec-spark"
    store = KafkaQueueStore(bootstrap_servers, state_dir, config=dict(kafka_config or {}))
    try:
        generations = list_generations(store, output_topic)
    finally:
        store.close()
    if not generations:
        raise ConfigError(f"output topic {output_topic!r} does not exist")
    register_all(spark)
    frames = []
    for gen in generations:
        reader = (
            spark.read.format(FORMAT)
            .option("topic", gen.topic)
            .option("bootstrap.servers", bootstrap_servers)
            .option("schema", "aggregate")
        )
        for name, setting in (kafka_config or {}).items():
            reader = reader.option(f"kafka.{name}", setting)
        df = reader.load().withColumn("cec_generation", F.lit(gen.index))
        frames.append(df if with_meta else df.select(*RESULT_COLUMNS))
    return reduce(lambda a, b: a.unionByName(b), frames)
