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

from operators.spark.checkpointing import GCheckSpec
from operators.spark.datasource import FORMAT
from operators.spark.kafka_input import SPARK_KAFKA, check_retention, spark_kafka_input
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
from operators.spark.sink import CecSink
from operators.spark.topic_reader import TopicOptions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = ["QueryInput", "QueryTrigger", "start_query"]

_ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


@dataclass(frozen=True)
class QueryInput:
    """What the query reads, as `cec_aggregate` validated it: the topic, its data source's options
    (`operators.spark.input_options`, the format under "format_name"), which reader reads it, the Kafka
    client settings, where the cec-kafka source keeps its state, and the micro-batch bound."""

    topic: str
    bootstrap_servers: str
    options: Mapping[str, str]
    reader: str
    client: Mapping[str, str]
    state_dir: Path
    max_records_per_trigger: int | None


@dataclass(frozen=True)
class QueryTrigger:
    """When micro-batches run (`available_now`, else `processing_time`, else as fast as possible), and the
    query's name."""

    available_now: bool
    processing_time: str | None
    query_name: str | None


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
) -> StreamingQuery:
    """Wire the query (module doc) and start it."""
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
    if source.reader == SPARK_KAFKA:
        opts = TopicOptions.parse(
            {
                "topic": source.topic,
                "bootstrap.servers": source.bootstrap_servers,
                PACK_OPTION: pack.to_option(),
                **options,
                **{f"kafka.{name}": setting for name, setting in source.client.items()},
            }
        )
        if recovery.resumed:  # a replay from T: below a log start now is the retention error, here
            check_retention(opts, recovery.start)
        rows = spark_kafka_input(
            spark,
            opts,
            start=list(recovery.start) if recovery.resumed else None,
            max_records_per_trigger=source.max_records_per_trigger,
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
    writer = transformed.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
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
    pack: PackSpec,
) -> DataFrame:
    """The packed input rows through the project's Python data sources (cec-kafka, cec-topic)."""
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
    return reader.option(PACK_OPTION, pack.to_option()).load()
