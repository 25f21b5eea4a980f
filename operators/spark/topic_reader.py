"""The "cec-topic" Python Data Source: a user's own Kafka topic (json, avro, registry, csv) in Spark.

Reading is `operators.topic_source.KafkaTopicSource`, the one reader of ordinary topics that the local
engine and `cec run --input-topic` use (values decoded by `operators.formats`): each Spark input partition
is one slice [start, end) of one Kafka partition, read by a KafkaTopicSource pinned to exactly that slice.
Ends and log starts come from `operators.topic_bounds.resolve_bounds` (the listed offsets, each end
confirmed where a read_committed consumer reaches the end of the partition).

Rows carry the record's position and either the three fields the operator needs or why it could not:
`cec_partition`, `cec_offset`, `cec_error` (None, or the dead-letter reason: undecodable, or the key,
value or time field missing or null), `cec_key` (the key field as text, str() of the decoded value),
`cec_v` and `cec_time` (the value and time fields as JSON text, so that the operator sees the decoded
types, ints stay ints, and does its own validation; for a record that could not be read, `cec_v` is the
record as read, its dead letter's `raw`).

    spark.readStream.format("cec-topic").option("topic", "purchases").option("bootstrap.servers", bs)
         .option("format", "json").option("key", "item_id").option("value", "item_price").load()

With the `cec.pack` option (set by `cec_aggregate`) the same tuples come packed for the attached query:
per chunk one row of arrays per output partition, keys in canonical form (`operators.spark.packing`).
With the `cec.raw` option (`true`, set by `cec_aggregate(transform=...)` on the Python reader) each record
comes as it is, in the columns Spark's Kafka source gives it (`RAW_ROW_SCHEMA`: partition, offset,
timestamp, value): the transform's decoding (`operators.spark.transform`) is then the same whichever
reader read the record.

Options: `topic`, `bootstrap.servers`, `format` (json | avro | registry | csv), `key`, `value`, `time`
(optional; `@timestamp` is the Kafka record timestamp), `schema` (avro: JSON text or an .avsc path),
`schema.registry.url` (registry), `columns` (csv: comma-separated names), `startingOffsets`
(`{"<partition>": offset}`, default the log start), `maxRecordsPerTrigger`, `kafka.*` client settings.
For several aggregates (`cec_aggregate(agg=[...])`, packed rows only): `keys` and `values` (JSON lists of
the key fields and value columns; `value` is then optional and no record needs one: SQL's null rule) and
`keyArray` (`true`: the packed key is the JSON array of the key fields' keys); each packed value is then the
JSON object of those fields (`TupleBatches`).
A seek below a partition's log start is `RetentionError` ("input retention shorter than
the replay needs"), never a silent gap.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from cec.exceptions import ConfigError
from operators.engine.records import raw_text
from operators.formats import FORMATS
from operators.spark.packing import PACK_OPTION, PackSpec, kept_packer, packed_schema
from operators.spark.partitioning import partition_key
from operators.spark.reader_pool import READERS
from operators.spark.slices import KafkaOptions, SliceStreamReader, starting_positions

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from operators.base import InputTuple
    from operators.topic_source import KafkaTopicSource

__all__ = [
    "RAW_OPTION",
    "RAW_ROW_SCHEMA",
    "TOPIC_FORMAT",
    "TOPIC_ROW_SCHEMA",
    "CecTopicDataSource",
    "TopicOptions",
    "TupleBatches",
    "register_topic_source",
]

TOPIC_FORMAT = "cec-topic"
TOPIC_ROW_SCHEMA = StructType(
    [
        StructField("cec_partition", IntegerType(), False),
        StructField("cec_offset", LongType(), False),
        StructField("cec_error", StringType(), True),
        StructField("cec_key", StringType(), True),
        StructField("cec_v", StringType(), True),
        StructField("cec_time", StringType(), True),
    ]
)
# The raw records' rows (option `cec.raw`): the columns of Spark's Kafka source that a transform reads.
RAW_OPTION = "cec.raw"
RAW_ROW_SCHEMA = StructType(
    [
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("timestamp", TimestampType(), True),
        StructField("value", BinaryType(), True),
    ]
)
_RAW_FIELD = "cec_raw_value"  # the one field of a raw record (`_RawValue`)
_POLL_BATCH = 2000


@dataclass(frozen=True)
class TopicOptions:
    """Parsed options; picklable (shipped to the executors)."""

    topic: str
    bootstrap: str
    fmt: str
    key: str
    value: str | None  # None: several aggregates that name their columns (`value_fields`)
    time: str | None
    schema: Any = None
    registry_url: str | None = None
    columns: tuple[str, ...] = ()
    starting_offsets: str = "earliest"
    max_records_per_trigger: int | None = None
    client_config: dict[str, str] = field(default_factory=dict)
    pack: PackSpec | None = None  # the attached query's packed rows (`operators.spark.packing`)
    # Several aggregates (options `keys`, `values`: JSON lists; `keyArray`): the key fields, the value
    # columns, and whether the packed key is the JSON array of the key fields' keys (module doc).
    key_fields: tuple[str, ...] = ()
    value_fields: tuple[str, ...] = ()
    key_array: bool = False
    raw: bool = False  # option `cec.raw`: the records as read (`RAW_ROW_SCHEMA`), for a transform

    @property
    def several(self) -> bool:
        """The several-aggregate form: rows carry the JSON object of every field the operator reads."""
        return bool(self.key_fields)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> TopicOptions:
        common = KafkaOptions.parse(options, TOPIC_FORMAT)
        opts = common.lowered
        fmt = opts.get("format", "json")
        if fmt not in FORMATS or fmt == "cec":
            raise ConfigError(f"{TOPIC_FORMAT} reads json, avro, registry or csv values, not {fmt!r}")
        key_fields = _names(opts.get("keys"), "keys")
        value_fields = _names(opts.get("values"), "values")
        if key_fields:
            opts.setdefault("key", key_fields[0])
        if not opts.get("key") or not (opts.get("value") or key_fields):
            raise ConfigError(f"{TOPIC_FORMAT} needs the options 'key' and 'value' (field names)")
        schema: Any = opts.get("schema")
        if schema is not None and schema.lstrip().startswith("{"):
            schema = json.loads(schema)
        return cls(
            topic=common.topic,
            bootstrap=common.bootstrap,
            fmt=fmt,
            key=opts["key"],
            value=opts.get("value") or None,
            time=opts.get("time") or None,
            schema=schema,
            registry_url=opts.get("schema.registry.url"),
            columns=tuple(c.strip() for c in opts.get("columns", "").split(",") if c.strip()),
            starting_offsets=common.starting_offsets,
            max_records_per_trigger=common.max_records_per_trigger,
            client_config=common.client_config,
            pack=PackSpec.from_option(opts[PACK_OPTION]) if opts.get(PACK_OPTION) else None,
            key_fields=key_fields,
            value_fields=value_fields,
            key_array=opts.get("keyarray", "false").lower() == "true",
            raw=opts.get(RAW_OPTION, "false").lower() == "true",
        )

    def read_schema(self) -> StructType:
        """`TOPIC_ROW_SCHEMA`, the packed rows' schema when the attached query asks for them, or
        `RAW_ROW_SCHEMA` for a transform's raw records."""
        if self.raw:
            return RAW_ROW_SCHEMA
        if self.pack is None:
            return TOPIC_ROW_SCHEMA
        time_type = StringType() if self.time else None
        return packed_schema(StringType(), time_type, errors=True, generations=len(self.pack.partitions))

    def reader_key(self, partition: int, total: int) -> tuple[Any, ...]:
        """What a kept reader of `partition` must share with a new read to serve it (`READERS`)."""
        schema = json.dumps(self.schema, sort_keys=True, default=str)
        config = tuple(sorted(self.client_config.items()))
        return (self.bootstrap, self.topic, self.fmt, self.key, self.value, self.time, schema,
                self.registry_url, self.columns, config, partition, total, self.key_fields,
                self.value_fields, self.raw)  # fmt: skip

    @property
    def required_value(self) -> str | None:
        """The value field a record must have to be a tuple: none for several aggregates (SQL's null rule:
        each aggregate skips a record without its column), as `cec run` reads them."""
        return None if self.several else self.value

    def bounds(self) -> tuple[list[int], list[int]]:
        """(log starts, ends) of every partition now."""
        from operators.topic_bounds import resolve_bounds

        found = resolve_bounds(self.bootstrap, self.topic, config=self.client_config)
        return list(found.starts), list(found.ends)


class TopicSlice(InputPartition):
    """Offsets [start, end) of Kafka partition `partition` of a topic with `total` partitions."""

    def __init__(self, partition: int, start: int, end: int, total: int) -> None:
        super().__init__((partition, start, end, total))
        self.partition = partition
        self.start = start
        self.end = end
        self.total = total


def read_slice(opts: TopicOptions, piece: TopicSlice) -> Iterator[pa.RecordBatch]:
    """One slice, read by a KafkaTopicSource pinned to it (runs on an executor), as Arrow record batches
    of `TOPIC_ROW_SCHEMA` (or packed), one per poll: Spark takes the columns as they are, with no
    conversion per row and field in its worker."""
    batches = RawBatches() if opts.raw else TupleBatches(opts)
    p = piece.partition
    starts, ends = [0] * piece.total, [0] * piece.total
    starts[p], ends[p] = piece.start, piece.end
    with READERS.lease(
        opts.reader_key(p, piece.total), lambda: _open_source(opts, p, starts, ends)
    ) as source:
        source.pin({"start_offsets": starts, "end_offsets": ends})
        source.seek([piece.start])  # below the log start: RetentionError, never a silent gap
        while (batch := source.poll(_POLL_BATCH)) is not None:
            if batch:
                yield batches.of(p, batch)


class _RawValue:
    """The decoder of a raw read (`cec.raw`): every value is a record of one field, its bytes, so that
    the source's own reading (pinned slice, read_committed, retention check on the seek, ends past
    transaction markers) hands them over undecoded; a null value (tombstone) stays a dead letter."""

    def decode(self, raw: bytes) -> Mapping[str, Any]:
        return {_RAW_FIELD: raw}


class RawBatches:
    """The rows of a raw read (`RAW_ROW_SCHEMA`): each record's partition, offset, Kafka timestamp and
    value bytes, as Spark's Kafka source gives them (a tombstone's value is null, its timestamp too)."""

    def __init__(self) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.schema = to_arrow_schema(RAW_ROW_SCHEMA, timezone="UTC")

    def of(self, p: int, batch: Sequence[InputTuple]) -> pa.RecordBatch:
        import pyarrow as pa

        from operators.topic_tuples import TIMESTAMP_FIELD

        offsets = [tup.offset for tup in batch]
        stamps = [None if tup.value is None else tup.value[TIMESTAMP_FIELD] * 1000 for tup in batch]
        values = [tup.raw if tup.value is None else tup.value[_RAW_FIELD] for tup in batch]
        columns = [[p] * len(offsets), offsets, stamps, values]
        return pa.RecordBatch.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(columns, self.schema, strict=True)], schema=self.schema
        )


class TupleBatches:
    """The rows a topic source hands Spark for a batch of one input partition's tuples: `TOPIC_ROW_SCHEMA`
    (position, dead-letter reason, key as text, value and time as JSON text), or with `opts.pack` the
    attached query's packed rows (keys in canonical form, `operators.spark.packing`). Both readers of an
    ordinary topic build them here: the cec-topic source and Spark's Kafka source
    (`operators.spark.kafka_input`)."""

    def __init__(self, opts: TopicOptions) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.opts = opts
        read_schema = opts.read_schema()
        self.schema = to_arrow_schema(read_schema)
        self.packer = kept_packer(opts.pack, read_schema) if opts.pack is not None else None

    def of(self, p: int, batch: Sequence[InputTuple]) -> pa.RecordBatch:
        import pyarrow as pa

        if self.opts.several:
            return self._several(p, batch)
        key, value = self.opts.key, str(self.opts.value)
        packer, dumps = self.packer, json.dumps
        offsets, errors, keys, values, times = _columns(
            batch,
            (lambda v: v[key]) if packer is not None else (lambda v: str(v[key])),  # packing: canonical_key
            lambda v: dumps(v[value], default=str),
            self.opts.time,
        )
        if packer is not None:
            return packer.pack(p, offsets, keys, values, times, errors)
        columns = [[p] * len(offsets), offsets, errors, keys, values, times]
        return pa.RecordBatch.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(columns, self.schema, strict=True)], schema=self.schema
        )

    def _several(self, p: int, batch: Sequence[InputTuple]) -> pa.RecordBatch:
        """`of` for several aggregates: the packed key is `partition_key` of the record (None when a key
        field is missing or not a key: the operator dead-letters it with its own reason) and the value the
        JSON object of the key fields and value columns, which the processor hands the operator."""
        opts = self.opts
        assert self.packer is not None, "several aggregates are read packed only"
        fields = list(dict.fromkeys((*opts.key_fields, *opts.value_fields)))
        dumps = json.dumps
        offsets, errors, keys, values, times = _columns(
            batch,
            lambda v: partition_key(v, opts.key_fields, as_array=opts.key_array),
            lambda v: dumps({name: v.get(name) for name in fields}, default=str),
            opts.time,
        )
        return self.packer.pack(p, offsets, keys, values, times, errors)


def _columns(
    batch: Sequence[InputTuple],
    key_of: Callable[[Mapping[str, Any]], Any],
    value_of: Callable[[Mapping[str, Any]], str],
    time_field: str | None,
) -> tuple[list[int], list[str | None], list[Any], list[str | None], list[str | None]]:
    """The columns (offsets, errors, keys, values, times) of `batch`: a decoded tuple's key and value as
    `key_of` and `value_of` give them and its time as JSON; an undecodable one's error and raw value."""
    dumps = json.dumps
    offsets: list[int] = []
    errors: list[str | None] = []
    keys: list[Any] = []
    values: list[str | None] = []
    times: list[str | None] = []
    for tup in batch:
        offsets.append(tup.offset)
        v = tup.value
        if v is None:
            errors.append(tup.error or "undecodable input")
            keys.append(None)
            values.append(raw_text(tup))  # the record as read: its dead letter's raw
            times.append(None)
            continue
        errors.append(None)
        keys.append(key_of(v))
        values.append(value_of(v))
        times.append(None if time_field is None else dumps(v[time_field], default=str))
    return offsets, errors, keys, values, times


def _names(text: str | None, option: str) -> tuple[str, ...]:
    """A JSON list of field names (options `keys`, `values`); () when not given."""
    if not text:
        return ()
    try:
        names = json.loads(text)
    except ValueError:
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(
            f"{TOPIC_FORMAT} option {option!r} must be a JSON list of field names, got {text!r}"
        )
    return tuple(names)


def _open_source(opts: TopicOptions, partition: int, starts: list[int], ends: list[int]) -> KafkaTopicSource:
    """A KafkaTopicSource of one partition, bounded by the slice it opens for (and later by each slice it
    reads, `KafkaTopicSource.pin`)."""
    from operators.topic_source import KafkaTopicSource
    from operators.topic_tuples import TIMESTAMP_FIELD

    if opts.raw:
        return KafkaTopicSource(
            opts.bootstrap,
            opts.topic,
            fmt="json",  # not used: the raw decoder reads every value
            key_field=_RAW_FIELD,
            value_field=None,
            time_field=TIMESTAMP_FIELD,
            decoder=_RawValue(),
            partitions=[partition],
            start_offsets=starts,
            end_offsets=ends,
            config=opts.client_config,
        )
    return KafkaTopicSource(
        opts.bootstrap,
        opts.topic,
        fmt=opts.fmt,
        key_field=opts.key,
        value_field=opts.required_value,
        time_field=opts.time,
        schema=opts.schema,
        registry_url=opts.registry_url,
        columns=list(opts.columns) or None,
        partitions=[partition],
        start_offsets=starts,
        end_offsets=ends,
        config=opts.client_config,
    )


class _TopicStreamReader(SliceStreamReader):
    def __init__(self, opts: TopicOptions) -> None:
        super().__init__(opts.starting_offsets, opts.max_records_per_trigger)
        self.opts = opts

    def _bounds(self) -> tuple[list[int], list[int]]:
        return self.opts.bounds()

    def _slice(self, partition: int, start: int, end: int, total: int) -> InputPartition:
        return TopicSlice(partition, start, end, total)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TopicSlice)
        return read_slice(self.opts, partition)


class _TopicBatchReader(DataSourceReader):
    def __init__(self, opts: TopicOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[InputPartition]:
        starts, ends = self.opts.bounds()
        begin = starting_positions(self.opts.starting_offsets, starts, ends)
        total = len(ends)
        return [TopicSlice(p, s, e, total) for p, (s, e) in enumerate(zip(begin, ends, strict=True)) if e > s]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, TopicSlice):  # an empty topic
            return iter(())
        return read_slice(self.opts, partition)


class CecTopicDataSource(DataSource):
    """`format("cec-topic")`: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return TOPIC_FORMAT

    def schema(self) -> StructType:
        return TopicOptions.parse(self.options).read_schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        return _TopicBatchReader(TopicOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _TopicStreamReader(TopicOptions.parse(self.options))


def register_topic_source(spark: SparkSession) -> None:
    """Make `format("cec-topic")` available in this session."""
    spark.dataSource.register(CecTopicDataSource)
