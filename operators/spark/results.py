"""Reading an attached query's output back: `read_results` (every generation's R records as one DataFrame),
`read_dead_letters` (every generation's dead letters: partition, offset, reason, raw), and the data
sources those reads use (`register_all`)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from cec.exceptions import ConfigError
from operators.aggregate import RESULT_SCHEMA
from operators.base import DEAD_LETTER_SCHEMA
from operators.spark.datasource import FORMAT, register
from operators.spark.generations import list_generations
from operators.spark.topic_reader import register_topic_source

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["DEAD_LETTER_COLUMNS", "RESULT_COLUMNS", "read_dead_letters", "read_results", "register_all"]

RESULT_COLUMNS = [f["name"] for f in RESULT_SCHEMA["fields"]]
DEAD_LETTER_COLUMNS = [f["name"] for f in DEAD_LETTER_SCHEMA["fields"]]


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
    frames = [
        df if with_meta else df.select(*RESULT_COLUMNS)
        for df in _generation_frames(spark, output_topic, bootstrap_servers, kafka_config, control=False)
    ]
    return _union(frames)


def read_dead_letters(
    spark: SparkSession,
    output_topic: str,
    bootstrap_servers: str,
    *,
    kafka_config: Mapping[str, str] | None = None,
    with_meta: bool = False,
) -> DataFrame:
    """The dead letters (DEAD records) of every generation of `output_topic` as one DataFrame with the
    columns every host gives them (`operators.engine.records`): `partition` and `offset` of the input
    tuple, `reason`, and `raw` (the record as read, or the tuple's fields as JSON); plus `cec_partition`,
    `cec_offset` (where the dead letter is in the output log) and `cec_generation` when `with_meta`."""
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    types = {"long": LongType(), "string": StringType()}
    fields = [StructField(f["name"], types[f["type"]], False) for f in DEAD_LETTER_SCHEMA["fields"]]
    meta = [
        StructField("cec_partition", IntegerType(), False),
        StructField("cec_offset", LongType(), False),
        StructField("cec_generation", IntegerType(), False),
    ]
    schema = StructType([*fields, *meta])
    frames = []
    for df in _generation_frames(spark, output_topic, bootstrap_servers, kafka_config, control=True):
        dead = df.where(df.cec_kind == "DEAD").select(
            "cec_payload", "cec_partition", "cec_offset", "cec_generation"
        )
        decoded = dead.mapInArrow(_decode_dead_letters, schema)
        frames.append(decoded if with_meta else decoded.select(*DEAD_LETTER_COLUMNS))
    return _union(frames)


def _decode_dead_letters(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow: DEAD records' payloads -> the dead letter's columns (records whose checksum passed)."""
    import pyarrow as pa

    from cec.records import AvroCodec

    codec = AvroCodec(DEAD_LETTER_SCHEMA)
    for batch in batches:
        letters = [codec.decode(payload) for payload in batch.column("cec_payload").to_pylist()]
        columns = {name: [letter[name] for letter in letters] for name in DEAD_LETTER_COLUMNS}
        for name in ("cec_partition", "cec_offset", "cec_generation"):
            columns[name] = batch.column(name).to_pylist()
        yield pa.RecordBatch.from_pydict(
            columns,
            schema=pa.schema(
                [
                    pa.field("partition", pa.int64(), False),
                    pa.field("offset", pa.int64(), False),
                    pa.field("reason", pa.string(), False),
                    pa.field("raw", pa.string(), False),
                    pa.field("cec_partition", pa.int32(), False),
                    pa.field("cec_offset", pa.int64(), False),
                    pa.field("cec_generation", pa.int32(), False),
                ]
            ),
        )


def _generation_frames(
    spark: SparkSession,
    output_topic: str,
    bootstrap_servers: str,
    kafka_config: Mapping[str, str] | None,
    *,
    control: bool,
) -> list[DataFrame]:
    """One `cec-kafka` read per generation of `output_topic` (with `cec_generation`): results decoded as
    the aggregate's, or (`control`) every record with its raw payload."""
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
        )
        reader = reader.option("includeControl", "true") if control else reader.option("schema", "aggregate")
        for name, setting in (kafka_config or {}).items():
            reader = reader.option(f"kafka.{name}", setting)
        frames.append(reader.load().withColumn("cec_generation", F.lit(gen.index)))
    return frames


def _union(frames: list[DataFrame]) -> DataFrame:
    from functools import reduce

    return reduce(lambda a, b: a.unionByName(b), frames)
