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
- `operators.spark.attach_config`: the keywords' values checked together, before any work;
- `operators.spark.output_logs`: the generation a start writes, its output partitions, the results topic;
- `operators.spark.resume`: whether a start resumes Spark's checkpoint or recovers from the logs, and why;
- `operators.spark.start_recovery`: the start's recovery (resumed or planned), checked against its settings;
- `operators.spark.planning`: recovery planning on the executors (EC, crash points, replay start, the
  initial state as a DataFrame that never passes through the driver);
- `operators.spark.processor`: the StatefulProcessor that runs the aggregate per output partition
  (executors), all of a partition's keys in one state value;
- `operators.spark.sink`: ordering, pos/N/time stamping and durable appends of the output records;
- `operators.spark.writer`: the same, in each output partition's task on the executors;
- `operators.spark.query`: the handle `cec_aggregate` returns;
- `operators.spark.input_options`: the input data source's options, validated on the driver;
- `operators.spark.wiring`: the query's wiring (input, processor, initial state, sink, trigger);
- `operators.spark.trim`: trimming the output logs (`trim_every`);
- `operators.spark.results`: `read_results` (typed columns), `read_dead_letters`;
- `operators.spark.transform`: the user's `transform=` (decoded input, plan check, packing after it);
- `operators.spark.config_errors`: a CecError raised across Py4J, back as its one line;
- this module: the entry point `cec_aggregate`, which runs these steps in order and owns what each opens
  (the store, the output partitions, the recovery, the sink) until the query handle takes them over.
The replay and stamping rules come from `recovery.contract` (tuple_fate, ReplayContract, PositionStamper).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from time import time as wall_time  # `time` is also a parameter of cec_aggregate
from typing import TYPE_CHECKING, Any

from cec.config import Checkpointing
from cec.exceptions import ConfigError
from cec.metrics import OperatorMetrics, serve
from operators.engine.trimming import DEFAULT_TRIM_EVERY
from operators.spark.attach_config import WRITERS, attach_config
from operators.spark.checkpointing import GCheckSpec, PlannedRecovery, uses_timers
from operators.spark.config_errors import cec_errors
from operators.spark.generations import Generation, generation_topic, list_generations
from operators.spark.kafka_input import AUTO
from operators.spark.keywords import CEC_AGGREGATE_KEYWORDS, checked_keywords
from operators.spark.output_logs import create_results_topic, open_outputs, written_generations
from operators.spark.planning import AttachRecovery
from operators.spark.processor import CecAggregateProcessor
from operators.spark.query import CecAggregateQuery
from operators.spark.results import RESULT_COLUMNS, bind_result_types, read_results, register_all
from operators.spark.resume import never_resumes, options_fingerprint, query_fingerprint, run_checkpoint
from operators.spark.sink import CecSink
from operators.spark.start_recovery import start_recovery
from operators.spark.transform import Transform
from operators.spark.trim import check_trimmed_indexes
from operators.spark.wiring import QueryTrigger, start_query
from operators.spark.writer import ExecutorSink

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

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


@checked_keywords("cec_aggregate", CEC_AGGREGATE_KEYWORDS)  # a wrong type is one line, before any work
def cec_aggregate(
    spark: SparkSession,
    *,
    input_topic: str,
    bootstrap_servers: str,
    output_topic: str,
    key: str | Sequence[str],
    value: str | None = None,
    state_dir: str | Path,
    checkpoint_location: str | Path,
    agg: str | Sequence[tuple[str, str]] = "avg",
    window_count: int | None = None,
    window_time: str | int | None = None,
    time: str | None = None,
    input_schema: str | Mapping[str, Any] | Sequence[str] | StructType | None = None,
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
    trim_every: int | None = DEFAULT_TRIM_EVERY,
    slide: str | int | None = None,
    session_gap: str | int | None = None,
    transform: Transform | None = None,
    results_topic: str | None = None,
    resume_checkpoint: bool = True,
) -> CecAggregateQuery:
    """Start (or resume) `agg(value)` (or several aggregates) per `key` over tumbling windows with CEC, reading `input_topic` and
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
      avg, sum, count, min, max over `value`; results have KeyedAggregate's columns (key, window, value,
      count, start, end) and are read with `read_results`;
    - several aggregates and composite keys (`operators.spark.aggregate_form`): `key=["carrier",
      "origin"]`, `agg=[("avg", "arr_delay"), ("max", "dep_delay"), ("count", "*")]` (no `value`) run
      `operators.multi_aggregate.MultiAggregate`, as `cec run --key a,b --agg FUNC:COLUMN` does, with its
      result columns (one per key field, `value` or one `FUNC_COLUMN` per aggregate) and SQL's null rule;
      an ordinary topic input only;
    - hopping windows `window_time="1h", slide="15m"` (Spark's `window(ts, size, slide)`) and session
      windows `session_gap="30m"` (Spark's `session_window`; needs `time`) run `operators.hopping` and
      `operators.sessions`, as `cec run --slide` / `--session-gap` do, with the several-aggregate form's
      columns (also for one key and a plain string `agg`);
    - `allowed_lateness="10s"` (a time window): event-time watermarks, as `cec run --allowed-lateness`: a
      window also closes when the watermark (per input partition the largest event time a state partition
      applied, less the lateness, min over input partitions) passes its end, whether or not its key comes
      back; a tuple behind it is a dead letter "late". Not across a change of `partitions`;
    - `partitions`: output partitions P (default: the latest generation's, else the input's). A P other
      than the latest generation's starts a new generation (`operators.spark.generations`);
    - `state_dir`: local state (stream indexes, writer locks); `checkpoint_location`: a fresh Spark
      checkpoint is made under it at every start that recovers from the output logs, the latest one is
      resumed by a start that may (`resume_checkpoint`);
    - `resume_checkpoint` (True by default): a start first checks whether the latest Spark checkpoint
      under `checkpoint_location` agrees with the output logs (same query, same generation and partition
      count, its last committed micro-batch's cursor at each log's end, or only that batch's successor
      beyond it) and, if so, resumes it as Spark's own restart does (its last committed micro-batch, its
      state store); otherwise (missing, damaged, another query's, behind or ahead of the logs, another
      partition count) it recovers from the logs (`operators.spark.resume`). `writers="executors"` only.
      `lastProgress["cec"]["recovery"]["path"]` says which ("resumed-checkpoint" or "from-logs") and
      `["reason"]` why. False: every start recovers from the logs (and the run keeps no batch markers);
    - trigger: `available_now=True` (run to the current end of the input, then stop), else
      `processing_time` (e.g. "1 second"), else Spark's default (as fast as possible);
    - `checkpointing`: a `cec.Checkpointing` (or its dict), as for the local runtime: Q/U targets, a
      recovery target, the cost-benefit policy, CI/CP. Each state partition with a live open window has a
      processing-time timer (every CP ms at most) that G-checks its oldest windows while the policy
      wants them, within the task's budget, planning with the partition's own measured rates and the EC
      build rate of this start's recovery planning (`operators.spark.checkpointing`). What a policy
      cannot meet is logged once per state partition, and `CecAggregateQuery.checkpoint_controls()`
      reads back what each partition planned, measured and said. None (the default) is
      `Checkpointing.default()`, U = 100,000 (`cec.config`), looked at right after each micro-batch's input
      instead of by a timer (`GCheckSpec.in_batch`); `Checkpointing.gopen_only()` for none;
    - `metrics_port`: serve `cec.metrics` over HTTP from the driver on this port (0: any free port, see
      `CecAggregateQuery.metrics_port`), labelled with `output_topic` and partition `all`, updated after
      each micro-batch from the sink's figures: `cec_open_windows`, `cec_replay_tuples` (the extent in
      input tuples), `cec_gopens_total`, `cec_gchecks_total`, `cec_appended_records_total`,
      `cec_append_rate` and, with `trim_every`, `cec_trimmed_offsets_total`. The driver does not see the input tuples, the extent in output records or the
      processor's checkpoint duty: `cec_input_tuples_total`, `cec_input_rate`, `cec_extent_records` and
      `cec_checkpoint_duty_ratio` are not exported; `cec_recovery_phase` stays `idle` (recovery is planned
      before the query starts; its figures are in the progress, `cec.recovery`).

    - `trim_every`: trim the output logs, as `cec run --trim-every`: each time this many more records of an
      output partition are durable, the records below min(its oldest open window's latest footprint, its
      last record, every registered consumer's acknowledged offset) are dropped, by the partition's write
      task on its executor (the driver with `writers="driver"`), never while the partition restores
      (`operators.spark.trim`). On by default, every 10,000 records (`DEFAULT_TRIM_EVERY`, as `cec run
      --follow`): the results are written as the query runs, so read them as it runs with
      `read_results(..., consumer="name")` (never trimmed past) or give 0 (or None): never. A trimmed
      log's closed-window directory is carried in Kafka (a start without `state_dir` takes it from there);
    - `writers`: where the output records are written. `"executors"` (default): each state partition's
      task writes its own output partition through a transactional writer fenced by its
      `transactional.id`, and the driver only learns cursors and counts (`operators.spark.writer`);
      `"driver"`: every record is collected to the driver, which writes all partitions
      (`operators.spark.sink.CecSink`; the earlier path, kept as a fallback);
    - `results_topic`: also publish every result to this plain topic, as `cec run --results-topic` does
      (`operators.results_topic.ResultJson`: key = the window key, value = the result's columns as JSON),
      in the transaction that appends its R record to the output log, so a read_committed consumer that
      knows nothing of cec reads each result exactly once, across driver and task failures. Created with
      a partition per output partition (output partition q publishes to its partition q); an existing one
      with another partition count is one ConfigError;
    - `transform`: a function from the input's streaming DataFrame (its fields, plus `partition`, `offset`
      and the Kafka `timestamp`) to the DataFrame the aggregate reads (`key`, `value`, `time` name its
      columns), e.g. `lambda df: df.where("price > 0").withColumn("eur", F.col("price") * 0.9)`. Applied
      at every start, so a replay re-reads through it; only row-wise, deterministic steps (select,
      withColumn, where...) with `partition` and `offset` unchanged, anything else is one ConfigError
      (`operators.spark.transform`). An ordinary topic, read by either `input_reader` (the same records,
      the same decoding); for json and registry, `input_schema` may type the fields (Spark DDL, "item
      STRING, price DOUBLE"), else they are inferred from the topic's first records.

    Refused (one clear `ConfigError`): `spark.speculation=true`. The session's shuffle partitions (= P) and
    state store provider (RocksDB, which transformWithState needs) are set for this query only.
    """

    from queuestore.kafka import KafkaQueueStore

    started_wall = wall_time()  # a restart's fixed cost is measured from here (PlannedRecovery)
    config = attach_config(
        spark, input_topic=input_topic, bootstrap_servers=bootstrap_servers, output_topic=output_topic,
        key=key, value=value, state_dir=state_dir, agg=agg, window_count=window_count,
        window_time=window_time, time=time, input_schema=input_schema, input_format=input_format,
        schema_registry_url=schema_registry_url, partitions=partitions,
        max_records_per_trigger=max_records_per_trigger, kafka_config=kafka_config,
        checkpointing=checkpointing, writers=writers, allowed_lateness=allowed_lateness,
        input_reader=input_reader, trim_every=trim_every, slide=slide, session_gap=session_gap,
        transform=transform, results_topic=results_topic,
    )  # fmt: skip
    spec, windows = config.spec, config.windows
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
        generations = written_generations(
            store, output_topic, partitions, input_partitions, watermarks=config.lateness is not None
        )
        current = generations[-1]
        check_trimmed_indexes(store, current)
        results = None
        if results_topic is not None:
            results = (results_topic, spec.build().result_schema)
            create_results_topic(store, results_topic, current.partitions)
        # Takes the partitions' writer locks before reading the logs. A start that may resume the Spark
        # checkpoint indexes the logs only if it recovers from them instead (`start_recovery`).
        may_resume = never_resumes(resume_checkpoint=resume_checkpoint, writers=writers) is None
        outputs = open_outputs(store, current, results, defer_index=may_resume)
        try:
            timers = uses_timers(config.checkpointing)
            fingerprint = query_fingerprint(
                spec, input_format, options_fingerprint(config.source_options), config.reader_kind, time,
                results_topic, None if transform is None else getattr(transform, "__qualname__", "transform"),
            )  # fmt: skip
            decision, recovery = start_recovery(
                spark, store, generations, outputs, location=Path(checkpoint_location),
                resume_checkpoint=resume_checkpoint, writers=writers, input_topic=input_topic,
                input_partitions=input_partitions, fingerprint=fingerprint, timers=timers, client=client,
                watermarks=config.lateness is not None,
                result_schema=spec.build().result_schema if spec.several else None,
            )  # fmt: skip
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
            trim_every=config.trim_every,
            results=results,
        )
    else:
        sink = CecSink(
            outputs, recovery, has_time=time is not None, metrics=metrics, trim_every=config.trim_every
        )
    planned = PlannedRecovery(
        records_read=recovery.records_read,
        ec_windows=recovery.ec_windows,
        ec_build_seconds=recovery.seconds,
        started_wall=started_wall,
    )
    gcheck = GCheckSpec.from_checkpointing(config.checkpointing, planned)
    checkpoint = run_checkpoint(
        decision, recovery, Path(checkpoint_location), resumable=may_resume,
        input_topic=input_topic, input_partitions=input_partitions, fingerprint=fingerprint, timers=timers,
    )  # fmt: skip
    input_types: dict[str, str] = {}
    try:
        with cec_errors():  # a CecError raised in a Python worker through Py4J: its one line
            query = start_query(
                spark,
                spec=spec,
                gcheck=gcheck,
                recovery=recovery,
                sink=sink,
                source=config.source,
                trigger=QueryTrigger(available_now, processing_time, query_name),
                checkpoint=checkpoint,
                input_types=input_types,
                batch_markers=may_resume,
            )
        # How read_results types the columns: time windows' bounds as timestamps, keys as their input types.
        key_fields = (spec.key_fields or (spec.key,)) if spec.several else (spec.key,)
        key_columns = key_fields if spec.several else ("key",)
        try:
            bind_result_types(
                store,
                current.topic,
                time_windows=windows.window_ms is not None or windows.session_gap_ms is not None,
                key_types={
                    column: input_types[name]
                    for column, name in zip(key_columns, key_fields, strict=True)
                    if name in input_types
                },
            )
        except BaseException:
            query.stop()
            raise
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
        config.checkpointing,
        stop_when_drained=available_now and gcheck is not None,
        metrics_port=served_port,
        checkpoint=checkpoint,
        input_reader=config.reader_kind,
        bounded=available_now,
    )


def _register_active_session() -> None:
    """`spark.read.format("cec-kafka")` / `"cec-topic"` work in the session that is active when this module
    is imported, without a separate call (a session created later needs `register_all(spark)`, which
    `cec_aggregate` and `read_results` make themselves)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        register_all(active)


_register_active_session()
