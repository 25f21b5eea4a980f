"""The attached query's input read by Spark's own Kafka source (`spark-sql-kafka-0-10`), when it is there.

`cec_aggregate(input_reader=...)` reads an ordinary topic (json, avro, registry, csv) one of two ways:
- `"python"`: the cec-topic Python Data Source (`operators.spark.topic_reader`, confluent-kafka in Spark's
  Python workers);
- `"spark-kafka"`: `readStream.format("kafka")`, the JVM's Kafka consumer, then one `mapInArrow` step in
  the same stage that turns each Arrow batch of Kafka rows (partition, offset, value, and the timestamp and
  key where the operator reads `@timestamp` or `@key`) into the packed rows the processor takes
  (`operators.spark.packing`). Records become tuples by the one rule of ordinary topics
  (`operators.topic_tuples.RecordTuples`: the same decoders, the same dead-letter reasons) and tuples become
  rows by the cec-topic source's own code (`topic_reader.TupleBatches`), so both readers hand the
  processor the same tuples at the same positions (j = the Kafka partition, o = the Kafka offset);
- `"auto"` (default): `DEFAULT_READER` when the session has the connector (`operators.spark.connector`),
  else `"python"`. Also `"python"` when `kafka_config` is given: its settings are librdkafka's, and Spark's
  source takes the Java client's, whose names differ for several of them.

Replay and recovery are the same as with the Python source: a fresh start reads from each partition's log
start (`startingOffsets` "earliest"); a resumed one from the recovery plan's replay start T
(`{"<topic>": {"<j>": T_j}}`), refused on the driver with `RetentionError` if T_j is below partition j's
log start now (the Python source refuses its seek the same way); while the query runs, records deleted
under it fail the query (`failOnDataLoss`, Spark's default), never a silent gap. Reads are
`read_committed` (`kafka.isolation.level`), as the Python source's are: aborted records are never input,
and offsets are not assumed dense (transaction markers). `max_records_per_trigger` is the source's
`maxOffsetsPerTrigger`.
"""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cec.exceptions import ConfigError
from operators.spark.connector import has_kafka_connector
from operators.spark.topic_reader import TopicOptions, TupleBatches

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from operators.base import InputTuple
    from operators.topic_tuples import RecordTuples

__all__ = [
    "AUTO",
    "DEFAULT_READER",
    "INPUT_READERS",
    "PYTHON",
    "SPARK_KAFKA",
    "KafkaRowPacker",
    "check_retention",
    "choose_input_reader",
    "kafka_rows",
    "spark_kafka_input",
]

SPARK_KAFKA = "spark-kafka"
PYTHON = "python"
AUTO = "auto"
INPUT_READERS = (AUTO, SPARK_KAFKA, PYTHON)
# What "auto" picks when the connector is on the classpath: measured in benchmarks/RESULTS.md ("Spark's
# Kafka connector").
DEFAULT_READER = SPARK_KAFKA


def choose_input_reader(
    spark: SparkSession, requested: str, input_format: str, kafka_config: Mapping[str, str] | None
) -> str:
    """The reader this query uses (module doc), or one `ConfigError` for a choice that cannot work."""
    if requested not in INPUT_READERS:
        raise ConfigError(f"input_reader must be one of {', '.join(INPUT_READERS)}, got {requested!r}")
    if requested == PYTHON:
        return PYTHON
    if input_format == "cec":
        if requested == SPARK_KAFKA:
            raise ConfigError(
                "input_reader='spark-kafka' reads ordinary topics (input_format json, avro, registry or "
                "csv); a cec queue carries cec's records and is read by the cec-kafka source"
            )
        return PYTHON
    connector = has_kafka_connector(spark)
    if requested == SPARK_KAFKA:
        if not connector:
            raise ConfigError(
                "input_reader='spark-kafka' needs Spark's Kafka connector on the session's classpath "
                "(org.apache.spark:spark-sql-kafka-0-10_2.13 at Spark's version: `make spark-kafka-jars` "
                "for local sessions, or --jars/--packages when the application starts)"
            )
        return SPARK_KAFKA
    if not connector or kafka_config:
        return PYTHON
    return DEFAULT_READER


def check_retention(opts: TopicOptions, start: Sequence[int]) -> None:
    """Refuse a replay that starts below a partition's log start, as the Python source's seek does."""
    from operators.exceptions import RetentionError

    starts, _ = opts.bounds()
    for j, (want, low) in enumerate(zip(start, starts, strict=True)):
        if want < low:
            raise RetentionError(
                f"input retention shorter than the replay needs: topic {opts.topic!r} partition {j} needs "
                f"offset {want}, but its log starts at {low}"
            )


def spark_kafka_input(
    spark: SparkSession,
    opts: TopicOptions,
    *,
    start: Sequence[int] | None,
    max_records_per_trigger: int | None,
) -> DataFrame:
    """The packed input rows of `opts` (which carries the `PackSpec`) through Spark's Kafka source, from
    `start` (per partition; None: every log start)."""
    if opts.pack is None:
        raise ValueError("spark_kafka_input builds the attached query's packed rows: opts.pack is needed")
    packer = KafkaRowPacker(opts)
    rows = kafka_rows(spark, opts, start=start, max_records_per_trigger=max_records_per_trigger)
    return rows.select(*packer.columns).mapInArrow(packer, opts.read_schema())


def kafka_rows(
    spark: SparkSession,
    opts: TopicOptions,
    *,
    start: Sequence[int] | None,
    max_records_per_trigger: int | None,
) -> DataFrame:
    """Spark's Kafka source over `opts.topic` (its own rows: key, value, topic, partition, offset,
    timestamp...), read_committed, from `start` (per partition; None: every log start)."""
    client = dict(opts.client_config)
    client.setdefault("isolation.level", "read_committed")
    starting = (
        "earliest"
        if start is None
        else json.dumps({opts.topic: {str(j): int(o) for j, o in enumerate(start)}})
    )
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", opts.bootstrap)
        .option("subscribe", opts.topic)
        .option("startingOffsets", starting)
        .option("failOnDataLoss", "true")
    )
    for name, setting in client.items():
        reader = reader.option(f"kafka.{name}", setting)
    if max_records_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_records_per_trigger))
    return reader.load()


class KafkaRowPacker:
    """`mapInArrow` function: Arrow batches of Kafka rows -> the packed rows of their tuples (module doc).
    Picklable (shipped to the executors); each Python worker keeps one decoder per options
    (`_kept_records`), as the Python source keeps its readers."""

    def __init__(self, opts: TopicOptions) -> None:
        from operators.topic_tuples import KEY_FIELD, TIMESTAMP_FIELD

        self.opts = opts
        named = {opts.key, opts.value, opts.time, *opts.key_fields, *opts.value_fields}
        self.columns = ["partition", "offset", "value"]
        if TIMESTAMP_FIELD in named:
            self.columns.append("timestamp")
        if KEY_FIELD in named:
            self.columns.append("key")

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        records = _kept_records(self.opts)
        rows = TupleBatches(self.opts)
        for batch in batches:
            if batch.num_rows:
                yield from self.pack(records, rows, batch)

    def pack(
        self, records: RecordTuples, rows: TupleBatches, batch: pa.RecordBatch
    ) -> Iterator[pa.RecordBatch]:
        """One batch of Kafka rows, per Kafka partition in it (a Spark task reads one partition, so one)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        partition = batch.column("partition")
        found = pc.unique(partition).to_pylist()
        for p in found:
            part = (
                batch if len(found) == 1 else batch.filter(pc.equal(partition, pa.scalar(p, partition.type)))
            )
            offsets = part.column("offset").to_pylist()
            raws = part.column("value").to_pylist()
            if records.needs_message:
                timestamps = _millis(part, "timestamp") if records.inject_ts else [0] * len(raws)
                keys = part.column("key").to_pylist() if records.inject_key else [None] * len(raws)
                tuples = records.tuples([p] * len(raws), offsets, raws, timestamps=timestamps, keys=keys)
            else:
                tuples = _value_tuples(records, p, offsets, raws)
            yield rows.of(p, tuples)


def _value_tuples(records: RecordTuples, p: int, offsets: list[int], raws: list[Any]) -> list[InputTuple]:
    """The tuples of records whose values are all the operator reads, as `records.tuples` makes them, in one
    C call where the decoder has one (`cec._native.topic_batch`, the Python source's own fast path: the
    records are read-only mappings holding the wanted fields, no dict per record); a record it declines
    (malformed, a field missing or null, a tombstone...) is made by `records.tuples` on its own, which gives
    its value or its reason exactly."""
    from cec.native import native
    from operators.base import InputTuple

    spec_of = getattr(records.decoder, "native_spec", None)
    spec = spec_of(records.required) if native is not None and spec_of is not None else None
    if spec is None:
        return records.tuples([p] * len(raws), offsets, raws)
    assert native is not None
    count = len(raws)
    # topic_batch reads confluent-kafka messages through accessors; here a message is its row's index.
    accessors = ([None] * count).__getitem__, ([p] * count).__getitem__, offsets.__getitem__, raws.__getitem__
    identity = list(range(p + 1))  # input partition j = the Kafka partition
    collecting = gc.isenabled()  # a batch makes no cyclic garbage: the collector's passes are pure cost
    if collecting:
        gc.disable()
    try:
        got = native.topic_batch(
            list(range(count)), accessors, InputTuple, identity, [math.inf] * (p + 1), [0] * (p + 1), spec
        )
    finally:
        if collecting:
            gc.enable()
    if got is None:
        return records.tuples([p] * count, offsets, raws)
    out, declined = got
    if declined:
        redo = [i for i, t in enumerate(out) if t is None]
        again = records.tuples([p] * len(redo), [offsets[i] for i in redo], [raws[i] for i in redo])
        for i, tup in zip(redo, again, strict=True):
            out[i] = tup
    return out


def _millis(batch: pa.RecordBatch, name: str) -> list[int]:
    """A timestamp column (Spark's, microseconds) as Kafka's milliseconds."""
    import pyarrow as pa

    return [micros // 1000 for micros in batch.column(name).cast(pa.int64()).to_pylist()]


_RECORDS: dict[tuple[Any, ...], RecordTuples] = {}


def _kept_records(opts: TopicOptions) -> RecordTuples:
    """This worker's record decoder for `opts` (a registry decoder caches its schemas)."""
    from operators.formats import make_decoder
    from operators.topic_tuples import RecordTuples

    key = opts.reader_key(-1, -1)
    records = _RECORDS.get(key)
    if records is None:
        if len(_RECORDS) >= 8:
            _RECORDS.clear()
        decoder = make_decoder(
            opts.fmt,
            schema=opts.schema,
            registry_url=opts.registry_url,
            columns=list(opts.columns) or None,
        )
        records = _RECORDS[key] = RecordTuples(decoder, opts.key, opts.required_value, opts.time)
    return records
