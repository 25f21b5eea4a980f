"""`cec_aggregate(transform=...)`: the user's own row-wise DataFrame step between the input and the aggregate.

The input topic's records come as Spark's Kafka source gives them (partition, offset, timestamp, value),
from that source or from the cec-topic Python source's raw read (`topic_reader.RAW_OPTION`, the
`input_reader="python"` way), and each record is decoded (`operators.formats`, the decoders every reader
uses) into a streaming DataFrame of the input's fields, typed by `input_schema` (a Spark DDL string or
StructType) or, without one, by a sample of the topic's first records (`sample_schema`), plus the record's
`partition`, `offset` and Kafka `timestamp`. `transform` maps that DataFrame to the one the
aggregate reads; its key, value and time fields are then packed for the processor exactly as an
untransformed input is (`topic_reader.TupleBatches`, `operators.spark.packing`).

Why the refusals: recovery replays the input from T through the same transform and keys every tuple by its
(partition, offset) (DESIGN-NOTES section 2), so the transform is applied at every start and must give the
same rows for the same records whenever it runs. `check_plan` walks the analyzed plan above the decoded
input and refuses, with one ConfigError line, anything but row-wise steps (projections, filters,
repartitioning): aggregations, joins, limits, deduplication, window functions, unions, rows that multiply
one record (explode), samples, Python map steps, and any non-deterministic expression (rand, uuid, the
current time, ...). `partition` and `offset` must come through unchanged (the same attributes as the
input's), so that a row still names its record.

Records that cannot be decoded, or whose fields do not fit the schema, never reach the transform: they are
dead letters with their reason and raw value, as without a transform (a second branch of the same source,
unioned after the transform: one source, read once per micro-batch per branch, same offsets). Rows the
transform filters out are not input (neither tuples nor dead letters), at every replay alike.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from cec.exceptions import ConfigError
from operators.spark.topic_reader import TopicOptions, TupleBatches

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

__all__ = [
    "POSITION_COLUMNS",
    "Transform",
    "check_plan",
    "check_transform",
    "fields_schema",
    "input_struct",
    "sample_schema",
    "transformed_input",
]

log = logging.getLogger(__name__)

Transform = Callable[["DataFrame"], "DataFrame"]
# The columns every input row carries beside its fields (Spark's Kafka source's names and types).
POSITION_COLUMNS = ("partition", "offset", "timestamp")
ERROR_COLUMN = "cec_error"
RAW_COLUMN = "cec_raw"
SAMPLE_RECORDS = 500  # per partition, from its log start: what an inferred input schema is read from

_WHY = "transform= must be row-wise and deterministic, because recovery re-reads the input through it"
# Plan nodes a row-wise transform is made of (everything else is refused, `check_plan`).
_ROW_WISE = {
    "Project",
    "Filter",
    "SubqueryAlias",
    "Repartition",
    "RepartitionByExpression",
    "RebalancePartitions",
    "ResolvedHint",
    "View",
}
_REFUSED = {
    "Aggregate": "it aggregates",
    "Join": "it joins",
    "LateralJoin": "it joins",
    "GlobalLimit": "it has a limit",
    "LocalLimit": "it has a limit",
    "Tail": "it has a limit",
    "Offset": "it has a limit",
    "Deduplicate": "it deduplicates (state across rows)",
    "DeduplicateWithinWatermark": "it deduplicates (state across rows)",
    "Distinct": "it deduplicates (state across rows)",
    "Window": "it has a window function (state across rows)",
    "WindowGroupLimit": "it has a window function (state across rows)",
    "Sort": "it sorts (state across rows)",
    "Generate": "one record becomes several rows (explode), so (partition, offset) no longer names one row",
    "Expand": "one record becomes several rows, so (partition, offset) no longer names one row",
    "Union": "it unions another input",
    "Intersect": "it intersects with another input",
    "Except": "it subtracts another input",
    "Sample": "it samples (non-deterministic)",
    "EventTimeWatermark": "it sets a watermark (cec_aggregate's allowed_lateness does that)",
}
# Expressions whose value depends on when or where they run, whatever their `deterministic` flag says.
_NOT_REPLAYABLE = {
    "CurrentTimestamp",
    "CurrentDate",
    "CurrentBatchTimestamp",
    "LocalTimestamp",
    "Now",
    "CurrentTime",
    "Uuid",
    "Rand",
    "Randn",
    "Shuffle",
    "MonotonicallyIncreasingID",
    "SparkPartitionID",
    "InputFileName",
    "InputFileBlockStart",
    "InputFileBlockLength",
}


def check_transform(transform: object, input_format: str) -> None:
    """One ConfigError for a `transform=` that cannot be applied (before anything starts)."""
    if not callable(transform):
        raise ConfigError(
            f"transform must be a function from a DataFrame to a DataFrame, got {type(transform).__name__}"
        )
    if input_format == "cec":
        raise ConfigError(
            "transform= reads an ordinary topic (input_format json, avro, registry or csv); a cec queue's "
            "records are an upstream stage's output"
        )


def fields_schema(given: object) -> StructType | None:
    """`cec_aggregate(input_schema=...)` as the input fields' schema of a transform (json, registry): Spark
    DDL text ("item STRING, price DOUBLE") or a StructType, parsed and checked on the driver before any
    work, or None (inferred at start, `sample_schema`). One ConfigError for anything else, a type the
    decoder cannot fill, or a field named like a column transform= adds."""
    from pyspark.sql.types import StructType

    if given is None:
        return None
    if isinstance(given, StructType):
        struct = given
    elif isinstance(given, str):
        try:
            parsed = StructType.fromDDL(given)
        except Exception as exc:  # pyspark's parse error: many lines; one is enough
            raise ConfigError(
                f"input_schema {given!r} is not a Spark DDL schema: {_first_line(exc)}"
            ) from None
        if not isinstance(parsed, StructType):
            raise ConfigError(f'input_schema {given!r} is not a list of fields ("item STRING, price DOUBLE")')
        struct = parsed
    else:
        raise ConfigError(
            'with transform=, input_schema is a Spark DDL schema ("item STRING, price DOUBLE") or a '
            f"StructType, got {type(given).__name__}"
        )
    _check_fields(struct)
    return struct


def _check_fields(struct: StructType) -> None:
    for f in struct.fields:
        if f.name in POSITION_COLUMNS or f.name in (ERROR_COLUMN, RAW_COLUMN):
            raise ConfigError(
                f"the input field {f.name!r} has the name of a column transform= adds ("
                f"{', '.join(POSITION_COLUMNS)}); rename it in the topic or drop it from input_schema"
            )
        _converter(f.name, f.dataType)  # refuses a type it cannot fill
    if not struct.fields:
        raise ConfigError("transform= needs the input's fields: input_schema has none")


def input_struct(opts: TopicOptions, given: StructType | None) -> StructType:
    """The input fields' types: `given` (`fields_schema`), else `sample_schema` of the topic."""
    if given is not None:
        return given
    struct = sample_schema(opts)
    _check_fields(struct)
    log.info("transform= input schema inferred from the topic's first records: %s", struct.simpleString())
    return struct


def sample_schema(opts: TopicOptions, limit: int = SAMPLE_RECORDS) -> StructType:
    """The types of the fields of up to `limit` records from each partition's log start, decoded as the
    query decodes them: bool -> boolean, int -> bigint, float (or int and float) -> double, anything else
    (text, nested values, mixed types) -> string, in first-seen order. One ConfigError for a topic with no
    decodable record."""
    from confluent_kafka import Consumer, TopicPartition
    from pyspark.sql.types import StructField, StructType

    from operators.topic_tuples import decode_values

    starts, ends = opts.bounds()
    consumer = Consumer(
        {
            **opts.client_config,
            "bootstrap.servers": opts.bootstrap,
            "group.id": "cec-transform-schema",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    raws: list[bytes | None] = []
    try:
        for p, (start, end) in enumerate(zip(starts, ends, strict=True)):
            want = min(limit, end - start)
            if want <= 0:
                continue
            consumer.assign([TopicPartition(opts.topic, p, start)])
            got = 0
            while got < want:
                messages = consumer.consume(want - got, 10.0)
                if not messages:
                    break
                for msg in messages:
                    if msg.error() is None and msg.partition() == p:
                        raws.append(msg.value())
                        got += 1
    finally:
        consumer.close()
    kinds: dict[str, str | None] = {}
    for value in decode_values(_decoder(opts), raws):
        if isinstance(value, str):
            continue  # a dead letter: says nothing about the fields
        for name, item in value.items():
            kinds[name] = _merge(kinds.get(name), _kind(item))
    if not kinds:
        raise ConfigError(
            f"topic {opts.topic!r} has no decodable {opts.fmt} record to infer the input's fields from: "
            'give input_schema (Spark DDL, e.g. "item STRING, price DOUBLE")'
        )
    return StructType([StructField(name, _TYPE_OF[kind](), True) for name, kind in kinds.items()])


def _kind(item: Any) -> str | None:
    if item is None:
        return None
    if isinstance(item, bool):
        return "boolean"
    if isinstance(item, int):
        return "bigint"
    if isinstance(item, float):
        return "double"
    return "string"


def _merge(seen: str | None, kind: str | None) -> str | None:
    if seen is None or seen == kind:
        return kind or seen
    if kind is None:
        return seen
    if {seen, kind} == {"bigint", "double"}:
        return "double"
    return "string"


def _long_type() -> DataType:
    from pyspark.sql.types import LongType

    return LongType()


def _double_type() -> DataType:
    from pyspark.sql.types import DoubleType

    return DoubleType()


def _string_type() -> DataType:
    from pyspark.sql.types import StringType

    return StringType()


def _boolean_type() -> DataType:
    from pyspark.sql.types import BooleanType

    return BooleanType()


_TYPE_OF: dict[str | None, Callable[[], DataType]] = {
    "bigint": _long_type,
    "double": _double_type,
    "string": _string_type,
    "boolean": _boolean_type,
    None: _string_type,  # only nulls seen
}


def _decoder(opts: TopicOptions) -> Any:
    from operators.formats import make_decoder

    return make_decoder(
        opts.fmt, schema=opts.schema, registry_url=opts.registry_url, columns=list(opts.columns) or None
    )


def _converter(name: str, data_type: DataType) -> Callable[[Any], Any]:
    """A decoded field's value -> the column's (a ValueError for one that does not fit: the record's dead
    letter). One ConfigError for a column type the decoder cannot fill."""
    from pyspark.sql.types import (
        BooleanType,
        DoubleType,
        FloatType,
        IntegerType,
        LongType,
        ShortType,
        StringType,
    )

    if isinstance(data_type, (LongType, IntegerType, ShortType)):
        bits = 64 if isinstance(data_type, LongType) else 32 if isinstance(data_type, IntegerType) else 16
        return partial(_to_int, bound=1 << (bits - 1))
    if isinstance(data_type, DoubleType):
        return _to_float
    if isinstance(data_type, FloatType):
        return _to_float32
    if isinstance(data_type, StringType):
        return _to_text
    if isinstance(data_type, BooleanType):
        return _to_bool
    raise ConfigError(
        f"input_schema field {name!r} is {data_type.simpleString()}: with transform=, input fields are "
        "string, bigint, int, smallint, double, float or boolean (cast in the transform)"
    )


def _to_int(item: Any, *, bound: int) -> int:
    if isinstance(item, bool) or not isinstance(item, (int, float)) or item != int(item):
        raise ValueError(f"not an integer: {item!r:.60}")
    if not -bound <= int(item) < bound:
        raise ValueError(f"out of the column's range: {item!r:.60}")
    return int(item)


def _to_float(item: Any) -> float:
    if isinstance(item, bool) or not isinstance(item, (int, float)):
        raise ValueError(f"not a number: {item!r:.60}")
    return float(item)


_FLOAT32_MAX = 3.4028234663852886e38


def _to_float32(item: Any) -> float:
    value = _to_float(item)
    if abs(value) > _FLOAT32_MAX and value not in (math.inf, -math.inf):
        raise ValueError(f"out of the column's range: {item!r:.60}")
    return value


def _to_text(item: Any) -> str:
    if not isinstance(item, str):
        return json.dumps(item, default=str)
    item.encode("utf-8")  # a lone surrogate (an escaped one in JSON) cannot be a Spark string: ValueError
    return item


def _to_bool(item: Any) -> bool:
    if not isinstance(item, bool):
        raise ValueError(f"not a boolean: {item!r:.60}")
    return item


class FieldDecoder:
    """`mapInArrow`: Spark's Kafka rows (partition, offset, timestamp, value) -> the input's typed fields,
    the positions, and (dead letters) the reason and raw value. Picklable."""

    def __init__(self, opts: TopicOptions, struct: StructType) -> None:
        self.opts = opts
        self.struct = struct

    def output_schema(self) -> StructType:
        from pyspark.sql.types import (
            BinaryType,
            IntegerType,
            LongType,
            StringType,
            StructField,
            StructType,
            TimestampType,
        )

        return StructType(
            [
                *self.struct.fields,
                StructField("partition", IntegerType(), True),
                StructField("offset", LongType(), True),
                StructField("timestamp", TimestampType(), True),
                StructField(ERROR_COLUMN, StringType(), True),
                StructField(RAW_COLUMN, BinaryType(), True),
            ]
        )

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        from operators.topic_tuples import decode_values

        schema = to_arrow_schema(self.output_schema(), timezone="UTC")  # Spark's Arrow timestamps are UTC
        decoder = _decoder(self.opts)
        names = [f.name for f in self.struct.fields]
        convert = [_converter(f.name, f.dataType) for f in self.struct.fields]
        for batch in batches:
            if not batch.num_rows:
                continue
            raws = batch.column("value").to_pylist()
            columns: list[list[Any]] = [[] for _ in names]
            errors: list[str | None] = []
            kept_raw: list[bytes | None] = []
            for value, raw in zip(decode_values(decoder, raws), raws, strict=True):
                row, why = _typed_row(value, names, convert)
                for column, item in zip(columns, row, strict=True):
                    column.append(item)
                errors.append(why)
                kept_raw.append(None if why is None else raw)
            arrays = [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=False)]
            arrays += [
                batch.column("partition").cast(pa.int32()),
                batch.column("offset").cast(pa.int64()),
                batch.column("timestamp").cast(schema.field("timestamp").type),
                pa.array(errors, type=pa.string()),
                pa.array(kept_raw, type=pa.binary()),
            ]
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)


def _typed_row(
    value: Mapping[str, Any] | str, names: Sequence[str], convert: Sequence[Callable[[Any], Any]]
) -> tuple[list[Any], str | None]:
    """A decoded record's typed fields, or (nulls, the reason it is a dead letter)."""
    if isinstance(value, str):
        return [None] * len(names), value
    row: list[Any] = []
    for name, to_column in zip(names, convert, strict=True):
        item = value.get(name)
        if item is None:
            row.append(None)
            continue
        try:
            row.append(to_column(item))
        except (ValueError, OverflowError) as exc:
            return [None] * len(names), f"field {name!r} does not fit input_schema: {exc}"
    return row, None


class TransformedPacker:
    """`mapInArrow`: the transformed rows (positions, the operator's fields) and the dead letters' rows ->
    the packed rows of their tuples (`topic_reader.TupleBatches`, as an untransformed input is packed).
    Picklable."""

    def __init__(self, opts: TopicOptions, fields: Sequence[str]) -> None:
        self.opts = opts
        self.fields = list(fields)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from operators.base import InputTuple
        from operators.topic_tuples import RecordTuples

        rows = TupleBatches(self.opts)
        checks = RecordTuples(None, self.opts.key, self.opts.required_value, self.opts.time)  # type: ignore[arg-type]
        # Rows carry every field the aggregate reads, @timestamp included (`transformed_input`): the checks
        # need nothing of the Kafka record.
        checks.inject_ts = checks.inject_key = False
        for batch in batches:
            if not batch.num_rows:
                continue
            js = batch.column("partition").to_pylist()
            offsets = batch.column("offset").to_pylist()
            errors = batch.column(ERROR_COLUMN).to_pylist()
            raws = batch.column(RAW_COLUMN).to_pylist()
            values = [batch.column(name).to_pylist() for name in self.fields]
            per_partition: dict[int, list[InputTuple]] = {}
            decoded: list[Mapping[str, Any] | str] = []
            kept: list[bytes | None] = []
            for i, error in enumerate(errors):
                if error is not None:
                    decoded.append(error)
                    kept.append(raws[i])
                    continue
                record = {name: column[i] for name, column in zip(self.fields, values, strict=True)}
                decoded.append(record)
                kept.append(None)
            for i, tup in enumerate(checks.tuples(js, offsets, kept, decoded=decoded)):
                if tup.value is None and tup.raw is None:  # a row lacking a field: its fields are its raw
                    tup = tup._replace(raw=json.dumps(decoded[i], default=str))
                per_partition.setdefault(tup.partition, []).append(tup)
            for p, tuples in sorted(per_partition.items()):
                yield rows.of(p, tuples)


def check_plan(base: DataFrame, transformed: DataFrame) -> None:
    """One ConfigError unless `transformed` is `base` through row-wise, deterministic steps with
    `partition` and `offset` passed through unchanged (module doc)."""
    from pyspark.sql import DataFrame

    if not isinstance(transformed, DataFrame):
        raise ConfigError(f"transform must return a DataFrame, got {type(transformed).__name__}")
    if not transformed.isStreaming:
        raise ConfigError("transform must return the streaming DataFrame it was given, transformed")
    try:
        analyzed = transformed._jdf.queryExecution().analyzed()
    except Exception as exc:  # an analysis error (a column that does not exist...): its first line
        raise ConfigError(f"transform: {_first_line(exc)}") from None
    below = base._jdf.queryExecution().analyzed()
    reached = False
    for node in _nodes(analyzed, below):
        if node is None:
            reached = True
            continue
        name = str(node.nodeName())
        if name not in _ROW_WISE:
            why = _REFUSED.get(name, f"its plan has a {name} step, which is not a row-wise one")
            raise ConfigError(f"{_WHY}: {why}")
        _check_expressions(node)
    if not reached:
        raise ConfigError("transform must build on the DataFrame it was given (not read another input)")
    given = {str(a.name()): int(a.exprId().id()) for a in _seq(below.output())}
    out = {str(a.name()): int(a.exprId().id()) for a in _seq(analyzed.output())}
    for column in ("partition", "offset"):
        if column not in out:
            raise ConfigError(
                f"transform dropped the column {column!r}: keep partition and offset (recovery keys every "
                "tuple by them)"
            )
        if out[column] != given[column]:
            raise ConfigError(
                f"transform changed the column {column!r}: pass partition and offset through unchanged "
                "(recovery keys every tuple by them)"
            )


def _nodes(plan: Any, stop: Any) -> Iterator[Any]:
    """The plan's nodes above `stop` (yielded as None where it is reached)."""
    stack = [plan]
    while stack:
        node = stack.pop()
        if node.equals(stop):
            yield None
            continue
        yield node
        stack.extend(_seq(node.children()))


def _check_expressions(node: Any) -> None:
    """One ConfigError naming the first non-deterministic expression of `node` (the innermost one whose
    inputs are deterministic), or one of `_NOT_REPLAYABLE`."""
    stack = list(_seq(node.expressions()))
    while stack:
        expr = stack.pop()
        children = _seq(expr.children())
        culprit = not bool(expr.deterministic()) and all(bool(c.deterministic()) for c in children)
        if culprit or str(expr.nodeName()) in _NOT_REPLAYABLE:
            raise ConfigError(f"{_WHY}: {_sql(expr)} is not deterministic (its value differs at a replay)")
        stack.extend(children)


def _sql(expr: Any) -> str:
    try:
        return str(expr.sql())
    except Exception:
        return str(expr.prettyName())


def _seq(seq: Any) -> list[Any]:
    """A Scala Seq over Py4J as a list."""
    return [seq.apply(i) for i in range(seq.size())]


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "desc", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def transformed_input(
    spark: SparkSession,
    opts: TopicOptions,
    struct: StructType,
    transform: Transform,
    kafka_rows: DataFrame,
    types: dict[str, str] | None = None,
) -> DataFrame:
    """The packed input rows: `kafka_rows` (Spark's Kafka source) decoded, transformed, checked
    (`check_plan`), the operator's fields taken, dead letters unioned back, packed (module doc). `types`,
    if given, receives the transform's result columns' Spark types (by name)."""
    from pyspark.sql import functions as F

    from operators.topic_tuples import TIMESTAMP_FIELD

    decoder = FieldDecoder(opts, struct)
    decoded = kafka_rows.select("partition", "offset", "timestamp", "value").mapInArrow(
        decoder, decoder.output_schema()
    )
    good = decoded.where(F.col(ERROR_COLUMN).isNull()).drop(ERROR_COLUMN, RAW_COLUMN)
    bad = decoded.where(F.col(ERROR_COLUMN).isNotNull())
    try:
        user = transform(good)
    except ConfigError:
        raise
    except Exception as exc:  # the user's function failed on the DataFrame (a missing column...)
        raise ConfigError(f"transform failed: {_first_line(exc)}") from None
    check_plan(good, user)
    fields = operator_fields(opts)
    have = set(user.columns)
    if TIMESTAMP_FIELD in fields and TIMESTAMP_FIELD not in have and "timestamp" in have:
        user = user.withColumn(TIMESTAMP_FIELD, F.col("timestamp"))  # the Kafka timestamp, as elsewhere
        have.add(TIMESTAMP_FIELD)
    for name in fields:
        if name not in have:
            raise ConfigError(
                f"field {name!r} is not a column of transform's result ({', '.join(user.columns)})"
            )
    types_of = {f.name: f.dataType for f in user.schema.fields}
    if types is not None:
        types.update({name: data_type.simpleString() for name, data_type in types_of.items()})
    taken = [_as_input(name, types_of[name], is_time=name == opts.time) for name in fields]
    # kept: the transformed rows, as the aggregate reads them; letters: the records that could not be
    # decoded, which bypass the transform (module doc)
    kept = user.select(
        "partition", "offset", *taken, F.lit(None).cast("string").alias(ERROR_COLUMN),
        F.lit(None).cast("binary").alias(RAW_COLUMN),
    )  # fmt: skip
    letters = bad.select(
        "partition", "offset", *[F.lit(None).cast(kept.schema[n].dataType).alias(n) for n in fields],
        ERROR_COLUMN, RAW_COLUMN,
    )  # fmt: skip
    packer = TransformedPacker(opts, fields)
    return kept.unionByName(letters).mapInArrow(packer, opts.read_schema())


def operator_fields(opts: TopicOptions) -> list[str]:
    """The columns of the transform's result the aggregate reads: its key field(s), value(s) and time."""
    names: list[str] = [*(opts.key_fields or (opts.key,)), *opts.value_fields]
    if opts.value:
        names.append(opts.value)
    if opts.time:
        names.append(opts.time)
    return list(dict.fromkeys(names))


def _as_input(name: str, data_type: DataType, *, is_time: bool) -> Any:
    """A result column as the aggregate reads it: a timestamp time field in epoch ms, decimals as double,
    nested values as JSON text."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import (
        ArrayType,
        DateType,
        DecimalType,
        MapType,
        StructType,
        TimestampNTZType,
        TimestampType,
    )

    column = F.col(f"`{name}`")
    if isinstance(data_type, (TimestampType, TimestampNTZType)):
        return (F.unix_millis(column) if is_time else column.cast("string")).alias(name)
    if isinstance(data_type, DateType):
        return (F.unix_millis(column.cast("timestamp")) if is_time else column.cast("string")).alias(name)
    if isinstance(data_type, DecimalType):
        return column.cast("double").alias(name)
    if isinstance(data_type, (ArrayType, MapType, StructType)):
        return F.to_json(column).alias(name)
    return column
