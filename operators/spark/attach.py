"""CEC for a PySpark windowed aggregation, in one call (DESIGN-NOTES section 5, second design).

A user who would write

    events.groupBy("item_id").agg(F.avg("item_price"))      # over count or time windows

writes instead

    from operators.spark.attach import cec_aggregate, read_results   # also registers the data sources
    query = cec_aggregate(spark, input_topic="purchases", input_format="json", bootstrap_servers=bs,
                          output_topic="avg", key="item_id", value="item_price", agg="avg", window_count=10,
                          state_dir="/var/lib/cec", checkpoint_location="/tmp/ckpt", partitions=2,
                          checkpointing=Checkpointing(u_target=100_000))
    query.lastProgress["cec"]        # extent, open windows, G-opens/G-checks, recovery phases
    query.awaitTermination()
    read_results(spark, "avg", bs).show()     # key, window, value, count, start, end (R rows only)

Pipeline: the input, one Spark input partition per Kafka partition j, packed as it is read
(`operators.spark.packing`: per chunk one row per output partition, whose columns are arrays of the
tuples' j, offset o, canonical key, value and time): an ordinary json/avro/registry/csv topic through
Spark's own Kafka source plus a packing step (`operators.spark.kafka_input`, when the connector is on the
classpath) or through the "cec-topic" Python Data Source (`operators.topic_source.KafkaTopicSource`), a
cec queue through the "cec-kafka" Python Data Source ->
`groupBy(output partition).transformWithStateInPandas(CEC processor)` (one group and one state value per
output partition) -> a
CEC sink (foreachBatch) whose write tasks run on the executors, one per output partition, each through its
own fenced transactional writer (`operators.spark.writer`; `writers="driver"` collects the records to the
driver and writes them there instead, `operators.spark.sink`).

cec must be importable on every executor (an installed package, or `--py-files`/`--archives` of a venv):
the processor and the data sources run there. The Kafka store is the only store here (an embedded
SQLite log would live on one executor's disk); `spark.speculation=true` is refused.

Responsibilities, one module each:
- `operators.spark.packing` and `operators.spark.partitioning`: the packed input, and which partition a
  key belongs to (Spark's own hash, also computed in Python by the sources);
- `operators.spark.kafka_input`: which reader reads an ordinary topic, and Spark's Kafka source as one;
- `operators.spark.generations`: output topic generations (restart with another partition count);
- `operators.spark.planning`: recovery planning on the executors (EC, crash points, replay start, the
  initial state as a DataFrame that never passes through the driver);
- `operators.spark.processor`: the StatefulProcessor that runs the aggregate per output partition
  (executors), all of a partition's keys in one state value;
- `operators.spark.sink`: ordering, pos/N/time stamping and durable appends of the output records;
- `operators.spark.writer`: the same, in each output partition's task on the executors;
- `operators.spark.query`: the handle `cec_aggregate` returns;
- this module: the entry points `cec_aggregate` and `read_results`, and the query's wiring.
The replay and stamping rules come from `recovery.contract` (tuple_fate, ReplayContract, PositionStamper).
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from time import time as wall_time  # `time` is also a parameter of cec_aggregate
from typing import TYPE_CHECKING, Any

from cec.config import Checkpointing
from cec.exceptions import ConfigError
from cec.metrics import OperatorMetrics, serve
from operators.aggregate import RESULT_SCHEMA, parse_duration_ms, parse_lateness_ms
from operators.formats import FORMATS, load_avro_schema
from operators.spark.checkpointing import GCheckSpec, PlannedRecovery
from operators.spark.datasource import FORMAT, PAYLOAD_SCHEMAS, register
from operators.spark.generations import Generation, generation_topic, list_generations
from operators.spark.kafka_input import (
    AUTO,
    SPARK_KAFKA,
    check_retention,
    choose_input_reader,
    spark_kafka_input,
)
from operators.spark.packing import PACK_OPTION, PackSpec
from operators.spark.planning import AttachRecovery, plan_recovery
from operators.spark.processor import (
    EMIT_SCHEMA,
    GROUP_COLUMN,
    AggregateSpec,
    CecAggregateProcessor,
    output_partition,
    partition_groups,
)
from operators.spark.query import CecAggregateQuery
from operators.spark.session import check_session
from operators.spark.sink import CecSink
from operators.spark.topic_reader import TOPIC_FORMAT, TopicOptions, register_topic_source
from operators.spark.trim import check_trim_every, check_trimmed_indexes
from operators.spark.writer import ExecutorSink
from queuestore.output import OutputQueue

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from queuestore.kafka import KafkaQueueStore

__all__ = [
    "RESULT_COLUMNS",
    "WRITERS",
    "AttachRecovery",
    "CecAggregateProcessor",
    "CecAggregateQuery",
    "Generation",
    "cec_aggregate",
    "generation_topic",
    "list_generations",
    "read_results",
    "register_all",
]

log = logging.getLogger(__name__)

RESULT_COLUMNS = [f["name"] for f in RESULT_SCHEMA["fields"]]
WRITERS = ("executors", "driver")  # cec_aggregate(writers=...): who writes the output logs
_ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def _schema_option(schema: str | Mapping[str, Any]) -> str:
    if isinstance(schema, str):
        if schema not in PAYLOAD_SCHEMAS:
            json.loads(schema)  # a JSON schema text: let the data source validate it
        return schema
    return json.dumps(dict(schema))


def _open_outputs(store: KafkaQueueStore, gen: Generation) -> list[OutputQueue]:
    outputs: list[OutputQueue] = []
    try:
        for q in range(gen.partitions):
            outputs.append(OutputQueue(store, gen.topic, q))
    except BaseException:
        for out in outputs:
            out.close()
        raise
    return outputs


def cec_aggregate(
    spark: SparkSession,
    *,
    input_topic: str,
    bootstrap_servers: str,
    output_topic: str,
    key: str,
    value: str,
    state_dir: str | Path,
    checkpoint_location: str | Path,
    agg: str = "avg",
    window_count: int | None = None,
    window_time: str | int | None = None,
    time: str | None = None,
    input_schema: str | Mapping[str, Any] | Sequence[str] | None = None,
    input_format: str = "cec",
    schema_registry_url: str | None = None,
    partitions: int | None = None,
    available_now: bool = False,
    processing_time: str | None = None,
    max_records_per_trigger: int | None = None,
    kafka_config: Mapping[str, str] | None = None,
    query_name: str | None = None,
    checkpointing: Checkpointing | Mapping[str, Any] | None = None,
    metrics_port: int | None = None,
    writers: str = "executors",
    allowed_lateness: str | int | None = None,
    input_reader: str = AUTO,
    trim_every: int | None = None,
) -> CecAggregateQuery:
    """Start (or resume) `agg(value)` per `key` over tumbling windows with CEC, reading `input_topic` and
    writing results plus footprints to `output_topic`; returns a `CecAggregateQuery` (a StreamingQuery
    handle with CEC's figures in its progress, see `operators.spark.query`).

    - `input_format`: `"json"`, `"avro"`, `"registry"` or `"csv"` for an ordinary topic written by any
      producer (read by `operators.topic_source.KafkaTopicSource` through the cec-topic data source:
      `key`, `value` and `time` are value fields, `time="@timestamp"` the Kafka record timestamp; a record
      that cannot be decoded or lacks a field is a dead letter with its partition, offset and reason), or
      `"cec"` (the default) for a cec queue (an upstream CEC stage's output or the cec-kafka sink);
    - `input_reader`: how an ordinary topic is read: `"spark-kafka"` (Spark's own Kafka source, which needs
      the connector `spark-sql-kafka-0-10` on the classpath), `"python"` (the cec-topic Python data
      source), or `"auto"` (the default: spark-kafka when the session has the connector and no
      `kafka_config` is given, else python). Both give the same tuples, dead letters and recovery
      (`operators.spark.kafka_input`); a cec queue is always read by the cec-kafka source;
    - `input_schema`: avro: the schema (dict, JSON text or `.avsc` path); csv: the column names (list or
      comma-separated text); cec: the payload's Avro schema (a name known to cec-kafka, JSON text or a
      dict; default "purchase"); `schema_registry_url`: registry;
    - `window_count=N` or `window_time="10s"` (with `time`, the event-time field in ms); `agg` is one of
      avg, sum, count, min, max; results have KeyedAggregate's columns (key, window, value, count, start,
      end) and are read with `read_results`;
    - `allowed_lateness="10s"` (a time window): event-time watermarks, as `cec run --allowed-lateness`: a
      window also closes when the watermark (per input partition the largest event time a state partition
      applied, less the lateness, min over input partitions) passes its end, whether or not its key comes
      back; a tuple behind it is a dead letter "late". Not across a change of `partitions`;
    - `partitions`: output partitions P (default: the latest generation's, else the input's). A P other
      than the latest generation's starts a new generation (`operators.spark.generations`);
    - `state_dir`: local state (stream indexes, writer locks); `checkpoint_location`: a fresh Spark
      checkpoint is made under it at every start, because recovery comes from the output logs;
    - trigger: `available_now=True` (run to the current end of the input, then stop), else
      `processing_time` (e.g. "1 second"), else Spark's default (as fast as possible);
    - `checkpointing`: a `cec.Checkpointing` (or its dict), as for the local runtime: Q/U targets, a
      recovery target, the cost-benefit policy, CI/CP. Each state partition with a live open window has a
      processing-time timer (every CP ms at most) that G-checks its oldest windows while the policy
      wants them, within the task's budget, planning with the partition's own measured rates and the EC
      build rate of this start's recovery planning (`operators.spark.checkpointing`). What a policy
      cannot meet is logged once per state partition, and `CecAggregateQuery.checkpoint_controls()`
      reads back what each partition planned, measured and said;
    - `metrics_port`: serve `cec.metrics` over HTTP from the driver on this port (0: any free port, see
      `CecAggregateQuery.metrics_port`), labelled with `output_topic` and partition `all`, updated after
      each micro-batch from the sink's figures: `cec_open_windows`, `cec_replay_tuples` (the extent in
      input tuples), `cec_gopens_total`, `cec_gchecks_total`, `cec_appended_records_total`,
      `cec_append_rate` and, with `trim_every`, `cec_trimmed_offsets_total`. The driver does not see the input tuples, the extent in output records or the
      processor's checkpoint duty: `cec_input_tuples_total`, `cec_input_rate`, `cec_extent_records` and
      `cec_checkpoint_duty_ratio` are not exported; `cec_recovery_phase` stays `idle` (recovery is planned
      before the query starts; its figures are in the progress, `cec.recovery`).

    - `trim_every`: trim the output logs, as `cec run --trim-every`: each time this many more records of an
      output partition are durable, the driver drops the records below min(its oldest open window's latest
      footprint, its last record, every registered consumer's acknowledged offset), never while the
      partition restores (`operators.spark.trim`). None (the default): never. A trimmed log's closed-window
      directory lives only in `state_dir`'s stream index: keep `state_dir` (a start that finds a trimmed
      log without its index is refused);
    - `writers`: where the output records are written. `"executors"` (default): each state partition's
      task writes its own output partition through a transactional writer fenced by its
      `transactional.id`, and the driver only learns cursors and counts (`operators.spark.writer`);
      `"driver"`: every record is collected to the driver, which writes all partitions
      (`operators.spark.sink.CecSink`; the earlier path, kept as a fallback).

    Refused (one clear `ConfigError`): `spark.speculation=true`. The session's shuffle partitions (= P) and
    state store provider (RocksDB, which transformWithState needs) are set for this query only.
    """
    from pyspark.sql import functions as F

    from queuestore.kafka import KafkaQueueStore

    started_wall = wall_time()  # a restart's fixed cost is measured from here (PlannedRecovery)
    if checkpointing is None:
        checkpointing = Checkpointing()
    elif isinstance(checkpointing, Mapping):
        checkpointing = Checkpointing.from_dict(dict(checkpointing))
    elif not isinstance(checkpointing, Checkpointing):
        raise ConfigError(f"checkpointing must be a cec.Checkpointing, got {checkpointing!r}")
    if writers not in WRITERS:
        raise ConfigError(f"writers must be one of {', '.join(WRITERS)}, got {writers!r}")
    if input_format not in FORMATS:
        raise ConfigError(f"input_format must be one of {', '.join(FORMATS)}, got {input_format!r}")
    if key in (value, time) or (time is not None and time == value):
        raise ConfigError("key, value and time must be different columns")
    window_ms = None
    if window_time is not None:
        window_ms = int(window_time) if isinstance(window_time, int) else parse_duration_ms(window_time)
    lateness = None if allowed_lateness is None else parse_lateness_ms(allowed_lateness)
    spec = AggregateSpec(
        key,
        value,
        agg,
        window_count,
        window_ms,
        time,
        json_values=input_format != "cec",
        allowed_lateness=lateness,
    )
    spec.build()  # validates the aggregate configuration here, not on an executor
    if partitions is not None and partitions < 1:
        raise ConfigError(f"partitions must be >= 1, got {partitions}")
    if max_records_per_trigger is not None and max_records_per_trigger < 1:
        raise ConfigError("max_records_per_trigger must be >= 1")
    check_trim_every(trim_every)
    source_options = _source_options(input_format, input_schema, schema_registry_url, key, value, time)
    check_session(spark, embedded_store=False, what="cec_aggregate")
    reader_kind = choose_input_reader(spark, input_reader, input_format, kafka_config)
    metrics, served_port = None, None
    if metrics_port is not None:  # before any work: a port in use is one ConfigError
        served_port = serve(metrics_port)
        metrics = OperatorMetrics(output_topic, "all")

    client = dict(kafka_config or {})
    store = KafkaQueueStore(bootstrap_servers, Path(state_dir), config=client)
    try:
        if not store.topic_exists(input_topic):
            raise ConfigError(f"input topic {input_topic!r} does not exist")
        input_partitions = store.partitions(input_topic)
        generations = list_generations(store, output_topic)
        wanted = partitions or (generations[-1].partitions if generations else input_partitions)
        if lateness is not None and (
            len(generations) > 1 or (generations and generations[-1].partitions != wanted)
        ):
            raise ConfigError(
                "allowed_lateness cannot resume after a change of partitions (each state partition's "
                "watermark is its own); restart with the latest partition count, or without allowed_lateness"
            )
        if not generations or generations[-1].partitions != wanted:
            topic = generation_topic(output_topic, len(generations))
            store.create_topic(topic, wanted)
            generations.append(Generation(len(generations), topic, wanted))
        current = generations[-1]
        check_trimmed_indexes(store, current)
        outputs = _open_outputs(store, current)  # takes the partitions' writer locks before reading the logs
        try:
            recovery = plan_recovery(spark, store, generations, outputs, input_partitions, client=client)
            if lateness is not None:
                try:
                    _check_watermarks(recovery, input_partitions)
                except ConfigError:
                    recovery.release()
                    raise
        except BaseException:
            for out in outputs:
                out.close()
            raise
    except BaseException:
        store.close()
        raise
    sink: CecSink
    if writers == "executors":
        sink = ExecutorSink(
            outputs,
            recovery,
            has_time=time is not None,
            bootstrap_servers=bootstrap_servers,
            client=client,
            metrics=metrics,
            trim_every=trim_every,
        )
    else:
        sink = CecSink(outputs, recovery, has_time=time is not None, metrics=metrics, trim_every=trim_every)
    planned = PlannedRecovery(
        records_read=recovery.records_read,
        ec_windows=recovery.ec_windows,
        ec_build_seconds=recovery.seconds,
        started_wall=started_wall,
    )
    gcheck = GCheckSpec.from_checkpointing(checkpointing, planned)
    checkpoint = Path(checkpoint_location) / f"run-{_run_id()}"
    try:
        query = _start_query(
            spark,
            spec=spec,
            recovery=recovery,
            sink=sink,
            input_topic=input_topic,
            bootstrap_servers=bootstrap_servers,
            source_options=source_options,
            gcheck=gcheck,
            state_dir=Path(state_dir),
            checkpoint=checkpoint,
            client=client,
            available_now=available_now,
            processing_time=processing_time,
            max_records_per_trigger=max_records_per_trigger,
            query_name=query_name,
            functions=F,
            input_reader=reader_kind,
        )
    except BaseException:
        try:
            sink.close()
        finally:
            store.close()
        raise
    return CecAggregateQuery(
        query,
        sink,
        store,
        recovery,
        checkpointing,
        stop_when_drained=available_now and gcheck is not None,
        metrics_port=served_port,
        checkpoint=checkpoint,
        input_reader=reader_kind,
    )


def _check_watermarks(recovery: AttachRecovery, input_partitions: int) -> None:
    """Watermarks resume from each log's crash record (`recovery.contract`, "watermarks"): a log written
    without event-time marks over this input is refused, with one ConfigError."""
    for q, end in enumerate(recovery.ends):
        if not any(end.pos) or len(end.marks) == input_partitions:
            continue  # an empty log, or one written with watermarks over this input
        raise ConfigError(
            f"{recovery.current.topic}[{q}]: the log's crash record carries event-time marks for "
            f"{len(end.marks)} input partitions, the input has {input_partitions} (was it written with "
            "another allowed_lateness setting?)"
        )


def _run_id() -> str:
    """A sortable unique name for a run's Spark checkpoint directory."""
    return f"{time.time_ns()}-{uuid.uuid4().hex[:8]}"


def _source_options(
    input_format: str,
    input_schema: str | Mapping[str, Any] | Sequence[str] | None,
    registry_url: str | None,
    key: str,
    value: str,
    time: str | None,
) -> dict[str, str]:
    """The input's data source options (format name under "format_name"), validated on the driver."""
    if input_format == "cec":
        if input_schema is not None and not isinstance(input_schema, (str, Mapping)):
            raise ConfigError("input_schema of a cec topic is an Avro schema (a name, JSON text or a dict)")
        return {"format_name": FORMAT, "schema": _schema_option(input_schema or "purchase")}
    options = {"format_name": TOPIC_FORMAT, "format": input_format, "key": key, "value": value}
    if time is not None:
        options["time"] = time
    if input_format == "avro":
        if input_schema is None:
            raise ConfigError("input_format='avro' needs input_schema (a dict, JSON text or an .avsc path)")
        if isinstance(input_schema, Mapping):
            options["schema"] = json.dumps(dict(input_schema))
        elif isinstance(input_schema, str):
            options["schema"] = input_schema
            load_avro_schema(
                json.loads(input_schema) if input_schema.lstrip().startswith("{") else input_schema
            )
        else:
            raise ConfigError("input_schema of an avro topic is a dict, JSON text or an .avsc path")
    elif input_format == "csv":
        if input_schema is None or isinstance(input_schema, Mapping):
            raise ConfigError("input_format='csv' needs input_schema: the column names")
        columns = input_schema.split(",") if isinstance(input_schema, str) else list(input_schema)
        options["columns"] = ",".join(c.strip() for c in columns)
    elif input_format == "registry":
        if not registry_url:
            raise ConfigError("input_format='registry' needs schema_registry_url")
        options["schema.registry.url"] = registry_url
    return options


def _start_query(
    spark: SparkSession,
    *,
    spec: AggregateSpec,
    gcheck: GCheckSpec | None,
    recovery: AttachRecovery,
    sink: CecSink,
    input_topic: str,
    bootstrap_servers: str,
    source_options: Mapping[str, str],
    state_dir: Path,
    checkpoint: Path,
    client: Mapping[str, str],
    available_now: bool,
    processing_time: str | None,
    max_records_per_trigger: int | None,
    query_name: str | None,
    functions: Any,
    input_reader: str,
) -> StreamingQuery:
    F = functions
    register_all(spark)
    # The source packs the tuples: per chunk it reads, one row of arrays per state partition, each tuple
    # with its key as the aggregate makes it (canonical_key), so that the group key, the window id in the
    # log and the initial state's key are one string (operators.spark.packing). Across generations each
    # tuple also carries q_g(k) in every generation g (for C_k); with one, C_k is its partition's.
    # The fields name the key in dead letters on every format; a CEC-format source also reads them.
    pack = PackSpec(tuple(g.partitions for g in recovery.generations), spec.key, spec.value, spec.time)
    options = dict(source_options)
    fmt = options.pop("format_name")
    rows: DataFrame
    if input_reader == SPARK_KAFKA:
        opts = TopicOptions.parse(
            {
                "topic": input_topic,
                "bootstrap.servers": bootstrap_servers,
                PACK_OPTION: pack.to_option(),
                **options,
                **{f"kafka.{name}": setting for name, setting in client.items()},
            }
        )
        if recovery.resumed:  # a replay from T: below a log start now is the retention error, here
            check_retention(opts, recovery.start)
        rows = spark_kafka_input(
            spark,
            opts,
            start=list(recovery.start) if recovery.resumed else None,
            max_records_per_trigger=max_records_per_trigger,
        )
    else:
        rows = _python_input(
            spark, fmt, options, input_topic, bootstrap_servers, state_dir, recovery, client,
            max_records_per_trigger, pack,
        )  # fmt: skip
    # One group per output partition q of the current generation (the processor keeps a partition's keys
    # in one state value): a grouping value that Spark's shuffle hash sends to state partition q.
    groups = partition_groups(recovery.current.partitions)
    group_of = F.array(*[F.lit(g).cast("long") for g in groups])[
        output_partition(F.col("cec_key"), recovery.current.partitions)
    ]
    marks = [end.marks for end in recovery.ends]
    times = [end.time for end in recovery.ends]
    processor = CecAggregateProcessor(
        spec, recovery.crash_points, recovery.current.index, gcheck, groups, marks, times
    )
    initial = _initial_state(spark, recovery)
    if initial is not None:
        initial = initial.withColumn(GROUP_COLUMN, group_of)
    transformed = rows.groupBy(GROUP_COLUMN).transformWithStateInPandas(
        statefulProcessor=processor,
        outputStructType=EMIT_SCHEMA,
        outputMode="Append",
        timeMode="None" if gcheck is None else "ProcessingTime",
        initialState=initial.groupBy(GROUP_COLUMN) if initial is not None else None,
    )
    writer = transformed.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    if query_name:
        writer = writer.queryName(query_name)
    if available_now:
        writer = writer.trigger(availableNow=True)
    elif processing_time:
        writer = writer.trigger(processingTime=processing_time)
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
    input_topic: str,
    bootstrap_servers: str,
    state_dir: Path,
    recovery: AttachRecovery,
    client: Mapping[str, str],
    max_records_per_trigger: int | None,
    pack: PackSpec,
) -> DataFrame:
    """The packed input rows through the project's Python data sources (cec-kafka, cec-topic)."""
    reader = (
        spark.readStream.format(fmt)
        .option("topic", input_topic)
        .option("bootstrap.servers", bootstrap_servers)
        .options(**options)
    )
    if fmt == FORMAT:
        reader = reader.option("stateDir", str(state_dir / "source"))
    if recovery.resumed or fmt == FORMAT:
        # A resumed run replays from T; below an ordinary topic's log start that is the retention error.
        reader = reader.option(
            "startingOffsets", json.dumps({str(j): o for j, o in enumerate(recovery.start)})
        )
    if max_records_per_trigger is not None:
        reader = reader.option("maxRecordsPerTrigger", str(max_records_per_trigger))
    for name, setting in client.items():
        reader = reader.option(f"kafka.{name}", setting)
    return reader.option(PACK_OPTION, pack.to_option()).load()


def _initial_state(spark: SparkSession, recovery: AttachRecovery) -> DataFrame | None:
    """The fresh query's initialState: the planning job's rows, cached on the executors
    (`operators.spark.planning`); no window state is built on the driver."""
    return recovery.initial


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


def _register_active_session() -> None:
    """`spark.read.format("cec-kafka")` / `"cec-topic"` work in the session that is active when this module
    is imported, without a separate call (a session created later needs `register_all(spark)`, which
    `cec_aggregate` and `read_results` make themselves)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        register_all(active)


_register_active_session()
