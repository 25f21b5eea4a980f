"""The "cec-kafka" Python Data Source: CEC output queues (and other CEC-format topics) in Spark.

PySpark ships no Kafka connector here (DESIGN-NOTES section 4), so Kafka I/O goes through the Python Data
Source API and confluent-kafka, reusing the queue store's Kafka readers:

    register(spark)
    spark.read.format("cec-kafka").option("topic", "agg").option("bootstrap.servers", bs)
         .option("schema", "aggregate").load()
    spark.readStream.format("cec-kafka")...option("maxRecordsPerTrigger", 1000).load()
    df.writeStream.format("cec-kafka").option("topic", "out").option("schema", "purchase")...

Reading
- One Spark input partition per Kafka partition; streaming offsets are `{"<partition>": next offset}`.
- The end of a partition is where consuming reaches the EOF event, never a broker watermark (Tansu
  understates watermarks and answers 0 to time lookups). The driver keeps one reader per partition across
  micro-batches, so finding the end costs only the records that arrived since the last time.
- By default a row is a result (R) of the operator; control tuples (G-open, G-check, DEAD, EOS) are
  skipped by their `cec.kind` header, after their checksum vouches for the header, without decoding
  state. `includeControl=true` yields them too, with the raw state / payload bytes. Every record is
  checked before its kind is looked at (`cec.verified`): one that fails its checksum (a damaged kind
  header included) fails the read with `DamagedLogError`: results are never silently dropped or used.
- `schema` decodes R payloads into columns: a name from `PAYLOAD_SCHEMAS` or a JSON Avro record schema;
  without it the payload stays binary (`payload` column). CEC metadata columns are prefixed `cec_` so
  that they never collide with payload fields (an aggregate result has its own `key`).
- `cec.pack` (set by `cec_aggregate`, not meant for other readers): results packed for the attached
  query, per chunk one row of arrays per output partition (`operators.spark.packing`).
- Admission control: `maxRecordsPerTrigger` bounds each micro-batch (split over partitions in proportion
  to what each has pending); `Trigger.AvailableNow` is supported.

Writing (batch and streaming sink, `operators.spark.kafka_sink`)
- Each row becomes an R record in CEC format (checksummed envelope, Avro payload of the `schema`
  columns, `cec.*` headers), so a CEC operator can consume the topic with a queue source and this source
  can read it back. `keyField` picks the Kafka partition by a stable hash of that column (CRC32C), else a
  task writes to partition `task partition id % partitions`; `timeField` sets the record's logical time.
- Exactly once: each task writes its rows in one Kafka transaction whose transactional.id derives from
  (topic, streaming query id or batch write, task partition), so a new attempt of a task fences any
  older one still running; the transaction also commits the task's progress (the next micro-batch id,
  as the offset of a consumer group named like the transactional.id), and an attempt whose batch is
  already committed writes nothing. A micro-batch that Spark runs again (a retried task, a query
  restarted from its checkpoint after the driver died between the task commits and its commit log)
  therefore adds no duplicate. Readers of the topic must use `isolation.level=read_committed` (this
  source and the queue store do). `transactionalIdPrefix` namespaces the transactional ids. The producer is
  the queue store's transactional producer (`queuestore.kafka.producer`: fencing, and a commit whose
  outcome is unknown ends in a new epoch before the task fails).
- Batch reads start at each partition's log start (a trimmed log's records below it are gone) and end at
  `endingOffsets` (`latest`, or `{"<partition>": offset}`: `read_results(consumer=...)` reads a fixed range).
- Options common to both Kafka sources (`topic`, `bootstrap.servers`, `kafka.*`, `startingOffsets`,
  `maxRecordsPerTrigger`) and micro-batch planning are `operators.spark.slices`'.

One job, the source's read side (options, row schema, batch and stream readers; a third of the module is
this text); the write side is `operators.spark.kafka_sink`.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from cec.exceptions import ConfigError
from cec.records import AvroCodec, Kind, OutputRecord, RecordCodec
from cec.verified import LogVerifier
from operators.spark.packing import PACK_OPTION, Packer, PackSpec, kept_packer, packed_schema
from operators.spark.reader_pool import READERS
from operators.spark.slices import KafkaOptions, SliceStreamReader, starting_positions
from operators.specs import SCHEMAS
from queuestore.exceptions import QueueStoreError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from queuestore.kafka import KafkaPartitionReader, KafkaQueueStore

__all__ = [
    "FORMAT",
    "META_COLUMNS",
    "PAYLOAD_SCHEMAS",
    "CecKafkaDataSource",
    "KafkaSlice",
    "register",
    "spark_schema",
]

FORMAT = "cec-kafka"
# Payload schemas known by name: the job schemas (inputs and the operators' results).
PAYLOAD_SCHEMAS: dict[str, dict[str, Any]] = SCHEMAS
META_COLUMNS: list[StructField] = [
    StructField("cec_partition", IntegerType(), False),
    StructField("cec_offset", LongType(), False),
    StructField("cec_kind", StringType(), False),
    StructField("cec_time", LongType(), False),
    StructField("cec_key", StringType(), True),
    StructField("cec_seq", LongType(), False),
    StructField("cec_n", LongType(), False),
    StructField("cec_pos", ArrayType(LongType(), False), False),
]
_CONTROL_COLUMNS = [
    StructField("cec_state", BinaryType(), True),
    StructField("cec_payload", BinaryType(), True),
]
_RESULT_CODES = frozenset({Kind.R.value})
_KIND_VALUES = {k: k.value for k in Kind}  # Enum.value is a descriptor call: too slow per record
_ALL_CODES = frozenset(k.value for k in Kind)
_AVRO_TYPES: dict[str, DataType] = {
    "long": LongType(),
    "int": IntegerType(),
    "double": DoubleType(),
    "float": FloatType(),
    "string": StringType(),
    "boolean": BooleanType(),
    "bytes": BinaryType(),
}
_READ_CHUNK = 10_000
_TRUE = {"true", "1", "yes"}


# -- options --------------------------------------------------------------------------------------------


def _payload_schema(text: str | None) -> dict[str, Any] | None:
    if text is None or not text.strip():
        return None
    if text in PAYLOAD_SCHEMAS:
        return PAYLOAD_SCHEMAS[text]
    try:
        schema = json.loads(text)
    except json.JSONDecodeError:
        raise ConfigError(
            f"schema {text[:60]!r} is neither a known name ({', '.join(PAYLOAD_SCHEMAS)}) nor JSON"
        ) from None
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ConfigError("a JSON payload schema must be an Avro record schema")
    return schema


def _avro_field_type(avro: Any) -> tuple[DataType, bool]:
    if isinstance(avro, list):  # a union: only ["null", T] (either order) maps to a nullable column
        others = [t for t in avro if t != "null"]
        if len(others) == 1 and len(avro) == 2:
            return _avro_field_type(others[0])[0], True
    elif isinstance(avro, str) and avro in _AVRO_TYPES:
        return _AVRO_TYPES[avro], False
    elif isinstance(avro, dict) and avro.get("type") in _AVRO_TYPES and "logicalType" not in avro:
        return _AVRO_TYPES[avro["type"]], False
    raise ConfigError(f"Avro type {avro!r} has no column mapping here (primitives and [null, T] only)")


def read_schema(opts: _Options) -> StructType:
    """The schema of what the source reads: packed rows for the attached query, else `spark_schema`."""
    if opts.pack is None:
        return spark_schema(opts.payload, include_control=opts.include_control)
    spec = opts.pack
    if opts.payload is None or opts.include_control:
        raise ConfigError(f"option {PACK_OPTION} needs a payload schema and no control rows")
    types = {f["name"]: _avro_field_type(f["type"])[0] for f in opts.payload["fields"]}
    wanted = {"key": spec.key, "value": spec.value, **({"time": spec.time} if spec.time else {})}
    for role, name in wanted.items():
        if name not in types:
            raise ConfigError(f"the {role} field {name!r} is not in the payload schema ({', '.join(types)})")
    time_type = types[spec.time] if spec.time else None
    return packed_schema(types[str(spec.value)], time_type, errors=False, generations=len(spec.partitions))


def spark_schema(payload: dict[str, Any] | None, *, include_control: bool) -> StructType:
    """The rows' schema: `cec_` metadata, then the payload fields (nullable: control rows have none)."""
    fields = list(META_COLUMNS)
    if payload is None:
        fields.append(StructField("payload", BinaryType(), True))
    else:
        taken = {f.name for f in META_COLUMNS} | {f.name for f in _CONTROL_COLUMNS}
        for f in payload["fields"]:
            if f["name"] in taken:
                raise ConfigError(f"payload field {f['name']!r} collides with a cec metadata column")
            data_type, _ = _avro_field_type(f["type"])
            fields.append(StructField(f["name"], data_type, True))
    if include_control:
        fields.extend(_CONTROL_COLUMNS)
    return StructType(fields)


@dataclass(frozen=True)
class _Options:
    """Parsed options; picklable, because Spark ships readers and writers to executors."""

    topic: str
    bootstrap: str
    client_config: dict[str, str]
    include_control: bool
    payload: dict[str, Any] | None
    max_records_per_trigger: int | None
    starting_offsets: str
    state_dir: str
    key_field: str | None
    time_field: str | None
    partitions: int | None  # sink: create the topic with this many partitions if it is missing
    extra: dict[str, str] = field(default_factory=dict)
    transactional_id_prefix: str = ""  # sink: prefix of its tasks' transactional.ids
    pack: PackSpec | None = None  # the attached query's packed rows (`operators.spark.packing`)
    ending_offsets: str = "latest"  # batch reads: where each partition's read ends (as startingOffsets)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> _Options:
        common = KafkaOptions.parse(options, FORMAT)
        opts = common.lowered
        partitions = opts.get("partitions")
        return cls(
            topic=common.topic,
            bootstrap=common.bootstrap,
            client_config=common.client_config,
            include_control=opts.get("includecontrol", "false").strip().lower() in _TRUE,
            payload=_payload_schema(opts.get("schema")),
            max_records_per_trigger=common.max_records_per_trigger,
            starting_offsets=common.starting_offsets,
            state_dir=opts.get("statedir") or str(Path(tempfile.gettempdir()) / "cec-spark"),
            key_field=opts.get("keyfield"),
            time_field=opts.get("timefield"),
            partitions=int(partitions) if partitions else None,
            transactional_id_prefix=opts.get("transactionalidprefix", ""),
            pack=PackSpec.from_option(opts[PACK_OPTION]) if opts.get(PACK_OPTION) else None,
            ending_offsets=opts.get("endingoffsets", "latest").strip(),
        )

    def store(self) -> KafkaQueueStore:
        from queuestore.kafka import KafkaQueueStore

        return KafkaQueueStore(self.bootstrap, Path(self.state_dir), config=dict(self.client_config))

    def reader_key(self, partition: int) -> tuple[Any, ...]:
        """What a kept reader of `partition` must share with a new read to serve it (`READERS`)."""
        return (
            self.bootstrap,
            tuple(sorted(self.client_config.items())),
            self.state_dir,
            self.topic,
            partition,
        )


# -- reading --------------------------------------------------------------------------------------------


class _StoreReader:
    """A store and its reader of one partition, closed together (what `READERS` keeps)."""

    def __init__(self, opts: _Options, partition: int) -> None:
        self.store = opts.store()
        try:
            self.reader = self.store.reader(opts.topic, partition)
        except BaseException:
            self.store.close()
            raise

    def close(self) -> None:
        self.store.close()  # closes its readers


class KafkaSlice(InputPartition):
    """Offsets [start, end) of one Kafka partition: one Spark input partition."""

    def __init__(self, partition: int, start: int, end: int) -> None:
        super().__init__((partition, start, end))
        self.partition = partition
        self.start = start
        self.end = end


def _batches(opts: _Options, piece: KafkaSlice) -> Iterator[pa.RecordBatch]:
    """Decode one slice into Arrow record batches of the source's schema (runs on an executor): flat rows
    from one bulk read per chunk, checked in a batch (`cec.verified`: every record's checksum before its
    kind is looked at; a damaged one fails the read with `DamagedLogError`), results' payloads decoded in
    one call, columns handed to Spark as they are (no per-row conversion in Spark's worker)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = read_schema(opts)
    packer = kept_packer(opts.pack, schema) if opts.pack is not None else None
    arrow_schema = to_arrow_schema(schema) if packer is None else packer.arrow_schema
    codec = RecordCodec()
    payload_codec = AvroCodec(opts.payload) if opts.payload is not None else None
    decode = _ALL_CODES if opts.include_control else _RESULT_CODES
    with READERS.lease(opts.reader_key(piece.partition), lambda: _StoreReader(opts, piece.partition)) as kept:
        reader = kept.reader
        verifier = LogVerifier(reader, codec, decode=decode)
        verifier.seek(piece.start)
        offset = piece.start
        while offset < piece.end:
            stop = min(piece.end, offset + _READ_CHUNK)
            rows = reader.read_range_rows(offset, stop)
            if not rows:
                if reader.end_offset() >= stop:
                    offset = stop  # only transaction markers there: offsets are not dense
                    continue
                raise QueueStoreError(
                    f"{opts.topic}[{piece.partition}] ends before offset {piece.end} that was planned"
                )
            offset = rows[-1][0] + 1
            # A control tuple is skipped by its kind once its checksum passed (no record decoded); so is an
            # R without a result (a session's slice folded into a later one: `OperatorContext.close_window`)
            # unless control tuples are asked for.
            checked = [
                (o, r)
                for o, _kind, r in verifier.check_rows(rows)
                if r is not None and (r.payload is not None or r.kind is not Kind.R or opts.include_control)
            ]
            if checked and packer is not None:
                assert payload_codec is not None  # read_schema: packing needs a payload schema
                yield _packed_batch(piece.partition, checked, payload_codec, packer)
            elif checked:
                yield _arrow_batch(piece.partition, checked, payload_codec, opts, arrow_schema)


def _packed_batch(
    partition: int, checked: list[tuple[int, OutputRecord]], payload_codec: AvroCodec, packer: Packer
) -> pa.RecordBatch:
    """The results among one chunk's checked records, packed (`operators.spark.packing`)."""
    spec = packer.spec
    names = payload_codec.names
    results = [(o, r) for o, r in checked if r.kind is Kind.R and r.payload is not None]
    decoded = payload_codec.decode_tuples([r.payload or b"" for _, r in results])
    ki, vi = names.index(str(spec.key)), names.index(str(spec.value))
    ti = names.index(spec.time) if spec.time else None
    return packer.pack(
        partition,
        [o for o, _ in results],
        [d[ki] for d in decoded],
        [d[vi] for d in decoded],
        [d[ti] for d in decoded] if ti is not None else None,
    )


def _arrow_batch(
    partition: int,
    checked: list[tuple[int, OutputRecord]],
    payload_codec: AvroCodec | None,
    opts: _Options,
    schema: pa.Schema,
) -> pa.RecordBatch:
    """The columns of `spark_schema` for the checked records of one chunk."""
    import pyarrow as pa

    records = [r for _, r in checked]
    count = len(records)
    columns: list[list[Any]] = [
        [partition] * count,
        [o for o, _ in checked],
        [_KIND_VALUES[r.kind] for r in records],
        [r.time for r in records],
        [r.key for r in records],
        [r.seq for r in records],
        [r.n for r in records],
        [r.pos for r in records],
    ]
    results = [i for i, r in enumerate(records) if r.kind is Kind.R and r.payload is not None]
    if payload_codec is None:
        columns.append([r.payload if r.kind is Kind.R else None for r in records])
    else:
        decoded = payload_codec.decode_tuples([records[i].payload or b"" for i in results])
        if len(results) == count:  # results only (`checked` is never empty)
            columns.extend(list(column) for column in zip(*decoded, strict=True))
        else:  # control tuples among them: no payload columns
            fields: list[list[Any]] = [[None] * count for _ in payload_codec.names]
            for i, values in zip(results, decoded, strict=True):
                for column, value in zip(fields, values, strict=True):
                    column[i] = value
            columns.extend(fields)
    if opts.include_control:
        columns.append([None if r.kind is Kind.R else r.state for r in records])
        columns.append([None if r.kind is Kind.R else r.payload for r in records])
    arrays = [pa.array(column, type=f.type) for column, f in zip(columns, schema, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class _Ends:
    """Finds partition ends on the driver by consuming to EOF, with one reader per partition kept open so
    that each call reads only what arrived since the previous one. Never pickled (holds Kafka clients)."""

    def __init__(self, opts: _Options) -> None:
        self.store = opts.store()
        self.topic = opts.topic
        self.readers: list[KafkaPartitionReader] = [
            self.store.reader(opts.topic, p) for p in range(self.store.partitions(opts.topic))
        ]

    def ends(self) -> list[int]:
        return [reader.end_offset() for reader in self.readers]

    def starts(self) -> list[int]:
        """Each partition's log start (above 0 once trimmed: the records below are gone)."""
        return [reader.start_offset() for reader in self.readers]

    def close(self) -> None:
        self.store.close()


class _BatchReader(DataSourceReader):
    def __init__(self, opts: _Options) -> None:
        self.opts = opts

    def partitions(self) -> list[InputPartition]:
        finder = _Ends(self.opts)
        try:
            ends = finder.ends()
            starts = finder.starts()
        finally:
            finder.close()
        ends = starting_positions(self.opts.ending_offsets, ends, ends)
        start = starting_positions(self.opts.starting_offsets, starts, ends)
        return [KafkaSlice(p, s, e) for p, (s, e) in enumerate(zip(start, ends, strict=True)) if e > s]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, KafkaSlice):  # Spark passes InputPartition(None) for an empty topic
            return iter(())
        return _batches(self.opts, partition)


class _StreamReader(SliceStreamReader):
    def __init__(self, opts: _Options) -> None:
        super().__init__(opts.starting_offsets, opts.max_records_per_trigger)
        self.opts = opts
        self._finder: _Ends | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader into the read function; Kafka clients stay behind.
        state = dict(self.__dict__)
        state["_finder"] = None
        return state

    def _bounds(self) -> tuple[list[int], list[int]]:
        # Retention is infinite on CEC topics (the log is the checkpoint): every partition starts at 0.
        if self._finder is None:
            self._finder = _Ends(self.opts)
        ends = self._finder.ends()
        return [0] * len(ends), ends

    def _slice(self, partition: int, start: int, end: int, total: int) -> InputPartition:
        return KafkaSlice(partition, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaSlice)
        return _batches(self.opts, partition)

    def stop(self) -> None:
        if self._finder is not None:
            self._finder.close()
            self._finder = None


# -- the data source ------------------------------------------------------------------------------------


class CecKafkaDataSource(DataSource):
    """`format("cec-kafka")`: see the module docstring for options and semantics."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _opts(self) -> _Options:
        return _Options.parse(self.options)

    def schema(self) -> StructType:
        return read_schema(self._opts())

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader(self._opts())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _StreamReader(self._opts())

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from operators.spark.kafka_sink import BatchSinkWriter  # the sink imports this module's options

        return BatchSinkWriter(self._opts())

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from operators.spark.kafka_sink import StreamSinkWriter

        return StreamSinkWriter(self._opts())


def register(spark: SparkSession) -> None:
    """Make `format("cec-kafka")` available in this session."""
    spark.dataSource.register(CecKafkaDataSource)
