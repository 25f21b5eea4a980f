"""An attached query's wiring (`operators.spark.attach.cec_aggregate`): its packed input (Spark's Kafka source or
the project's Python data sources), `groupBy(output partition).transformWithStateInPandas(CEC processor)`
with the recovery plan as `initialState`, and the CEC sink as `foreachBatch`; started with the session
settings the query needs (shuffle partitions = output partitions, the RocksDB state store)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cec.exceptions import ConfigError
from operators.spark.checkpointing import GCheckSpec
from operators.spark.datasource import FORMAT
from operators.spark.kafka_input import SPARK_KAFKA, check_retention, kafka_rows, spark_kafka_input
from operators.spark.packing import PACK_OPTION, PackSpec
from operators.spark.partitioning import part_partition_key
from operators.spark.planning import AttachRecovery
from operators.spark.processor import (
    EMIT_SCHEMA,
    GROUP_COLUMN,
    AggregateSpec,
    CecAggregateProcessor,
    output_partition,
    partition_groups,
)
from operators.spark.results import register_all
from operators.spark.resume import BatchMarker
from operators.spark.sink import CecSink
from operators.spark.topic_reader import RAW_OPTION, TopicOptions
from operators.spark.transform import Transform, input_struct, transformed_input

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery
    from pyspark.sql.types import StructType

__all__ = ["QueryInput", "QueryTrigger", "check_input", "start_query"]

_ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


@dataclass(frozen=True)
class QueryInput:
    """What the query reads, as `cec_aggregate` validated it: the topic, its data source's options
    (`operators.spark.input_options`, the format under "format_name"), which reader reads it, the Kafka
    client settings, where the cec-kafka source keeps its state, the micro-batch bound, and the user's
    `transform` (`operators.spark.transform`) with the input fields' schema (`input_schema`) it reads."""

    topic: str
    bootstrap_servers: str
    options: Mapping[str, str]
    reader: str
    client: Mapping[str, str]
    state_dir: Path
    max_records_per_trigger: int | None
    transform: Transform | None = None
    input_schema: StructType | None = None


@dataclass(frozen=True)
class QueryTrigger:
    """When micro-batches run (`available_now`, else `processing_time`, else as fast as possible), and the
    query's name."""

    available_now: bool
    processing_time: str | None
    query_name: str | None


def check_input(source: QueryInput, key: str, value: str | None, time: str | None) -> None:
    """The input data source's own checks (its options, the fields it reads), run here on the driver before
    anything starts: the same ConfigError, one line, not a Python worker's traceback through Py4J. A cec
    queue that lacks the fields also says how to read a topic of one's own."""
    from pyspark.sql.datasource import CaseInsensitiveDict

    from operators.spark.datasource import CecKafkaDataSource
    from operators.spark.topic_reader import CecTopicDataSource

    options = dict(source.options)
    fmt = options.pop("format_name")
    pack = PackSpec((1,), key, value, time)
    given = CaseInsensitiveDict(
        {**options, "topic": source.topic, "bootstrap.servers": source.bootstrap_servers,
         PACK_OPTION: pack.to_option()}
    )  # fmt: skip
    try:
        (CecKafkaDataSource if fmt == FORMAT else CecTopicDataSource)(given).schema()
    except ConfigError as exc:
        if fmt != FORMAT or "not in the payload schema" not in str(exc):
            raise
        raise ConfigError(
            f"{exc} (input_format='cec', the default, reads a cec queue: for a topic of your own give "
            "input_format='json', 'avro', 'registry' or 'csv')"
        ) from None


def start_query(
    spark: SparkSession,
    *,
    spec: AggregateSpec,
    gcheck: GCheckSpec | None,
    recovery: AttachRecovery,
    sink: CecSink,
    source: QueryInput,
    trigger: QueryTrigger,
    checkpoint: Path,
    input_types: dict[str, str] | None = None,
    batch_markers: bool = False,
) -> StreamingQuery:
    """Wire the query (module doc) and start it. `input_types`, if given, receives the types of the columns
    the aggregate reads where the input has them (a `transform`'s result), by name. `batch_markers`: the
    sink records each micro-batch's cursors in the checkpoint (`operators.spark.resume.BatchMarker`), so
    that a later start can resume it."""
    from pyspark.sql import functions as F

    register_all(spark)
    # The source packs the tuples: per chunk it reads, one row of arrays per state partition, each tuple
    # with its key as the aggregate makes it (canonical_key), so that the group key, the window id in the
    # log and the initial state's key are one string (operators.spark.packing). Across generations each
    # tuple also carries q_g(k) in every generation g (for C_k); with one, C_k is its partition's.
    # The fields name the key in dead letters on every format; a CEC-format source also reads them.
    pack = PackSpec(tuple(g.partitions for g in recovery.generations), spec.key, spec.value, spec.time)
    options = dict(source.options)
    fmt = options.pop("format_name")
    rows: DataFrame
    if source.reader == SPARK_KAFKA or source.transform is not None:  # an ordinary topic
        opts = TopicOptions.parse(
            {
                "topic": source.topic,
                "bootstrap.servers": source.bootstrap_servers,
                PACK_OPTION: pack.to_option(),
                **options,
                **{f"kafka.{name}": setting for name, setting in source.client.items()},
            }
        )
        if recovery.resumed and recovery.caught_up_at is None:  # a replay from T (not a resumed checkpoint):
            # below a log start now is the retention error, here
            check_retention(opts, recovery.start)
        start = list(recovery.start) if recovery.resumed else None
        if source.transform is None:
            rows = spark_kafka_input(
                spark, opts, start=start, max_records_per_trigger=source.max_records_per_trigger
            )
        else:  # applied at every start: a replay re-reads through it
            # The records as Spark's Kafka source gives them, from it or from the cec-topic source's raw
            # read: the transform's decoding and plan are then the same whichever reader read them.
            if source.reader == SPARK_KAFKA:
                records = kafka_rows(
                    spark, opts, start=start, max_records_per_trigger=source.max_records_per_trigger
                )
            else:
                records = _python_input(spark, fmt, {**options, RAW_OPTION: "true"}, source, recovery, None)
            rows = transformed_input(
                spark, opts, input_struct(opts, source.input_schema), source.transform, records, input_types
            )
    else:
        rows = _python_input(spark, fmt, options, source, recovery, pack)
    # One group per output partition q of the current generation (the processor keeps a partition's keys
    # in one state value): a grouping value that Spark's shuffle hash sends to state partition q.
    groups = partition_groups(recovery.current.partitions)
    # The initial state's windows are keyed by part id; their tuples by its partition key (with several
    # aggregates under watermarks, the part id less the window's start).
    by_window = spec.by_window
    group_of = F.array(*[F.lit(g).cast("long") for g in groups])[
        output_partition(
            part_partition_key(F.col("cec_key"), by_window=by_window), recovery.current.partitions
        )
    ]
    marks = [end.marks for end in recovery.ends]
    times = [end.time for end in recovery.ends]
    processor = CecAggregateProcessor(
        spec, recovery.crash_points, recovery.current.index, gcheck, groups, marks, times,
        [end.results for end in recovery.ends],
    )  # fmt: skip
    initial = recovery.initial  # the planning job's rows, cached on the executors (never on the driver)
    if initial is not None:
        initial = initial.withColumn(GROUP_COLUMN, group_of)
    transformed = rows.groupBy(GROUP_COLUMN).transformWithStateInPandas(
        statefulProcessor=processor,
        outputStructType=EMIT_SCHEMA,
        outputMode="Append",
        timeMode="ProcessingTime" if gcheck is not None and gcheck.timers else "None",
        initialState=initial.groupBy(GROUP_COLUMN) if initial is not None else None,
    )
    batch_function = BatchMarker(sink, checkpoint) if batch_markers else sink
    writer = transformed.writeStream.foreachBatch(batch_function).option(
        "checkpointLocation", str(checkpoint)
    )
    if trigger.query_name:
        writer = writer.queryName(trigger.query_name)
    if trigger.available_now:
        writer = writer.trigger(availableNow=True)
    elif trigger.processing_time:
        writer = writer.trigger(processingTime=trigger.processing_time)
    # Both settings are captured by the query when it starts (its session is cloned then).
    saved: dict[str, str | None] = {
        conf: spark.conf.get(conf, None)
        for conf in ("spark.sql.shuffle.partitions", "spark.sql.streaming.stateStore.providerClass")
    }
    spark.conf.set("spark.sql.shuffle.partitions", str(recovery.current.partitions))
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", _ROCKSDB_PROVIDER)
    try:
        return writer.start()
    finally:
        for conf, previous in saved.items():
            if previous is None:
                spark.conf.unset(conf)
            else:
                spark.conf.set(conf, previous)


def _python_input(
    spark: SparkSession,
    fmt: str,
    options: Mapping[str, str],
    source: QueryInput,
    recovery: AttachRecovery,
    pack: PackSpec | None,
) -> DataFrame:
    """The packed input rows through the project's Python data sources (cec-kafka, cec-topic); with no
    `pack`, the rows the options ask for (a transform's raw records)."""
    reader = (
        spark.readStream.format(fmt)
        .option("topic", source.topic)
        .option("bootstrap.servers", source.bootstrap_servers)
        .options(**options)
    )
    if fmt == FORMAT:
        reader = reader.option("stateDir", str(source.state_dir / "source"))
    if recovery.resumed or fmt == FORMAT:
        # A resumed run replays from T; below an ordinary topic's log start that is the retention error.
        reader = reader.option(
            "startingOffsets", json.dumps({str(j): o for j, o in enumerate(recovery.start)})
        )
    if source.max_records_per_trigger is not None:
        reader = reader.option("maxRecordsPerTrigger", str(source.max_records_per_trigger))
    for name, setting in source.client.items():
        reader = reader.option(f"kafka.{name}", setting)
    if pack is not None:
        reader = reader.option(PACK_OPTION, pack.to_option())
    return reader.load()
