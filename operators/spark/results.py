"""Reading an attached query's output back: `read_results` (every generation's R records as one DataFrame),
`read_dead_letters` (every generation's dead letters: partition, offset, reason, raw), and the data
sources those reads use (`register_all`).

`read_results(consumer=NAME)` reads as a registered consumer of the output logs (`QueueStore.acknowledge`,
as `cec run`'s results writer is one): trimming (`trim_every`) never drops a record it has not
acknowledged. Each call returns what was written since the previous call's read (from the consumer's
acknowledged offsets to the logs' ends at the call; a first call registers at the logs' starts) and, first,
acknowledges what the previous call in this process returned: calling again says the caller is done with
it. A process that restarts reads again from the last acknowledgement (what its last call returned comes
again, never a record less)."""

from __future__ import annotations

import json
import re
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cec.exceptions import ConfigError
from operators.aggregate import RESULT_SCHEMA
from operators.base import DEAD_LETTER_SCHEMA
from operators.spark.datasource import FORMAT, register
from operators.spark.generations import Generation, list_generations
from operators.spark.keywords import NONE, READ_KEYWORDS, TEXT, checked_keywords
from operators.spark.topic_reader import register_topic_source

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from queuestore.kafka import KafkaQueueStore

__all__ = [
    "DEAD_LETTER_COLUMNS",
    "RESULTS_ATTACHMENT",
    "RESULT_COLUMNS",
    "RESULT_TYPES_ATTACHMENT",
    "bind_result_schema",
    "bind_result_types",
    "read_dead_letters",
    "read_results",
    "register_all",
]

RESULT_COLUMNS = [f["name"] for f in RESULT_SCHEMA["fields"]]
DEAD_LETTER_COLUMNS = [f["name"] for f in DEAD_LETTER_SCHEMA["fields"]]
# The attachment of an output topic (partition 0) that holds its results' Avro schema when they are not
# KeyedAggregate's (several aggregates, a composite key): `read_results` decodes them by it.
RESULTS_ATTACHMENT = "results"
# The attachment (partition 0) that says how `read_results` types an output topic's columns: whether its
# windows are time windows (`start`/`end` as TimestampType; count windows keep input positions, integers),
# and the key columns' input types where the query knew them (a transform's result, `bind_result_types`).
# A topic without it (written before typed results) reads as before: epoch-ms longs, text keys.
RESULT_TYPES_ATTACHMENT = "result-types"


def _recorded_schema(store: KafkaQueueStore, topic: str) -> dict[str, Any] | None:
    found = store.read_attachment(topic, 0, RESULTS_ATTACHMENT)
    return json.loads(found) if found else None


def bind_result_schema(
    store: KafkaQueueStore,
    generations: Sequence[Generation],
    schema: Mapping[str, Any] | None,
    *,
    resumed: bool,
) -> None:
    """Record the results' schema with the current generation (None: KeyedAggregate's, recorded as
    nothing, as every log written before several aggregates existed). A log that holds records written
    with other result columns is refused with one ConfigError: its results could not be read as one."""
    wanted = None if schema is None else dict(schema)
    for gen in generations:
        found = _recorded_schema(store, gen.topic)
        if found == wanted:
            continue
        if resumed:

            def columns(s: Mapping[str, Any] | None) -> str:
                return ", ".join(f["name"] for f in (s or RESULT_SCHEMA)["fields"])

            raise ConfigError(
                f"output topic {gen.topic!r} holds results with the columns ({columns(found)}), this "
                f"query's have ({columns(wanted)}): keep key= and agg= as they were, or use a new output_topic"
            )
    current = generations[-1].topic
    if _recorded_schema(store, current) != wanted:
        store.write_attachment(
            current, 0, RESULTS_ATTACHMENT, b"" if wanted is None else json.dumps(wanted).encode()
        )


def bind_result_types(
    store: KafkaQueueStore, topic: str, *, time_windows: bool, key_types: Mapping[str, str]
) -> None:
    """Record how `read_results` types `topic`'s columns (`RESULT_TYPES_ATTACHMENT`; `key_types`: result
    column -> Spark type name)."""
    wanted = {"time_windows": time_windows, "keys": dict(key_types)}
    found = store.read_attachment(topic, 0, RESULT_TYPES_ATTACHMENT)
    if found is None or json.loads(found) != wanted:
        store.write_attachment(topic, 0, RESULT_TYPES_ATTACHMENT, json.dumps(wanted).encode())


def _recorded_types(store: KafkaQueueStore, topic: str) -> dict[str, Any] | None:
    found = store.read_attachment(topic, 0, RESULT_TYPES_ATTACHMENT)
    return json.loads(found) if found else None


def _typed(df: DataFrame, types: Mapping[str, Any] | None) -> DataFrame:
    """The result columns as `types` (`bind_result_types`) says: time windows' bounds as timestamps, keys
    cast from their canonical text back to their input types."""
    from pyspark.sql import functions as F

    if not types:
        return df
    if types.get("time_windows"):
        df = df.withColumn("start", F.timestamp_millis("start")).withColumn("end", F.timestamp_millis("end"))
    for column, type_name in types.get("keys", {}).items():
        df = df.withColumn(column, F.col(f"`{column}`").cast(type_name))
    return df


def register_all(spark: SparkSession) -> None:
    """Make `format("cec-kafka")` and `format("cec-topic")` available in `spark` (done for the active
    session when this module is imported, and by `cec_aggregate` and `read_results`), after pointing the
    session's Python processes at the launcher (`python_exec.use_launcher`: a data source's Python is the
    one it was registered with)."""
    from operators.spark.python_exec import use_launcher

    use_launcher(spark)
    register(spark)
    register_topic_source(spark)


# Per (bootstrap servers, output topic, consumer): the (generation topic, partition) -> end offset that the
# last `read_results(consumer=...)` of this process returned, acknowledged at its next call (module doc).
_RETURNED: dict[tuple[str, str, str], dict[tuple[str, int], int]] = {}
_RETURNED_LOCK = threading.Lock()

# Registers as `ack-<consumer>` (`queuestore.base.ATTACHMENT_NAME`).
_CONSUMER = re.compile(r"^[a-z0-9][a-z0-9-]{0,59}$")


@checked_keywords("read_results", {**READ_KEYWORDS, "consumer": TEXT | NONE})
def read_results(
    spark: SparkSession,
    output_topic: str,
    bootstrap_servers: str,
    *,
    kafka_config: Mapping[str, str] | None = None,
    with_meta: bool = False,
    consumer: str | None = None,
) -> DataFrame:
    """The results (R records) of every generation of `output_topic` as one DataFrame with KeyedAggregate's
    columns, or for several aggregates or a composite key `cec run`'s (`MultiAggregate.result_schema`,
    recorded with the topic: one column per key field, `value` or one `FUNC_COLUMN` per aggregate), plus
    the cec_ metadata columns and `cec_generation` when `with_meta`. Typed: a time window's `start` and
    `end` are TimestampType (a count window's stay the input positions, integers), and the key columns
    have their input types where the query knew them (`transform=`: its result's types), else text.
    `consumer`: read as that registered consumer (module doc): what was written since the previous call."""
    if consumer is not None and not _CONSUMER.match(consumer):
        raise ConfigError(
            f"consumer must be 1-60 lower-case letters, digits and '-' (not first), got {consumer!r}"
        )
    frames = [
        df if with_meta else df.select(*columns)
        for df, columns in _generation_frames(
            spark, output_topic, bootstrap_servers, kafka_config, control=False, consumer=consumer
        )
    ]
    return _union(frames)


@checked_keywords("read_dead_letters", READ_KEYWORDS)
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
    for df, _ in _generation_frames(spark, output_topic, bootstrap_servers, kafka_config, control=True):
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
    consumer: str | None = None,
) -> list[tuple[DataFrame, list[str]]]:
    """One `cec-kafka` read per generation of `output_topic` (with `cec_generation`), with the result
    columns of that generation: results decoded by the schema recorded with it (`bind_result_schema`), or
    (`control`) every record with its raw payload; with `consumer`, of the offsets it has not read yet."""
    from pyspark.sql import functions as F

    from queuestore.kafka import KafkaQueueStore

    # Only reads metadata: the state directory is never written.
    state_dir = Path(tempfile.gettempdir()) / "cec-spark"
    store = KafkaQueueStore(bootstrap_servers, state_dir, config=dict(kafka_config or {}))
    try:
        generations = list_generations(store, output_topic)
        schemas = [_recorded_schema(store, gen.topic) for gen in generations]
        typings = [None if control else _recorded_types(store, gen.topic) for gen in generations]
        ranges = (
            {}
            if consumer is None
            else _consumer_ranges(store, (bootstrap_servers, output_topic, consumer), generations)
        )
    finally:
        store.close()
    if not generations:
        raise ConfigError(f"output topic {output_topic!r} does not exist")
    register_all(spark)
    frames = []
    for gen, schema, typing in zip(generations, schemas, typings, strict=True):
        reader = (
            spark.read.format(FORMAT)
            .option("topic", gen.topic)
            .option("bootstrap.servers", bootstrap_servers)
        )
        if gen.topic in ranges:
            starts, ends = ranges[gen.topic]
            reader = reader.option("startingOffsets", json.dumps(starts)).option(
                "endingOffsets", json.dumps(ends)
            )
        if control:
            reader = reader.option("includeControl", "true")
        else:
            reader = reader.option("schema", "aggregate" if schema is None else json.dumps(schema))
        columns = RESULT_COLUMNS if schema is None else [f["name"] for f in schema["fields"]]
        for name, setting in (kafka_config or {}).items():
            reader = reader.option(f"kafka.{name}", setting)
        loaded = _typed(reader.load(), typing)
        frames.append((loaded.withColumn("cec_generation", F.lit(gen.index)), columns))
    return frames


def _consumer_ranges(
    store: KafkaQueueStore, key: tuple[str, str, str], generations: Sequence[Generation]
) -> dict[str, tuple[dict[str, int], dict[str, int]]]:
    """Per generation topic, the (starts, ends) a consumer's read takes (module doc): what the previous
    call returned acknowledged first, a partition it never read registered at its start."""
    consumer = key[2]
    with _RETURNED_LOCK:
        for (topic, q), end in _RETURNED.pop(key, {}).items():
            store.acknowledge(topic, q, consumer, end)
        returned: dict[tuple[str, int], int] = {}
        ranges: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
        for gen in generations:
            starts: dict[str, int] = {}
            ends: dict[str, int] = {}
            for q in range(gen.partitions):
                with store.reader(gen.topic, q) as reader:
                    log_start, end = reader.start_offset(), reader.end_offset()
                acked = store.acknowledged(gen.topic, q).get(consumer)
                if acked is None:
                    store.acknowledge(gen.topic, q, consumer, log_start)  # registered: kept from here on
                    acked = log_start
                if acked < log_start:
                    raise ConfigError(
                        f"{gen.topic}[{q}] was trimmed to offset {log_start} past what consumer "
                        f"{consumer!r} acknowledged ({acked}): it was not registered when those were trimmed"
                    )
                starts[str(q)], ends[str(q)] = acked, max(acked, end)
                returned[(gen.topic, q)] = max(acked, end)
            ranges[gen.topic] = (starts, ends)
        _RETURNED[key] = returned
    return ranges


def _union(frames: list[DataFrame]) -> DataFrame:
    from functools import reduce

    return reduce(lambda a, b: a.unionByName(b), frames)
