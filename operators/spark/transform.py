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

This module puts the query's input together; its parts are the input's schema (`transform_schema`), the
Arrow steps that decode and pack rows (`transform_rows`) and the plan check (`transform_plan`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cec.exceptions import ConfigError
from operators.spark.topic_reader import TopicOptions
from operators.spark.transform_plan import check_plan, first_line
from operators.spark.transform_rows import (
    ERROR_COLUMN,
    POSITION_COLUMNS,
    RAW_COLUMN,
    FieldDecoder,
    TransformedPacker,
)
from operators.spark.transform_schema import SAMPLE_RECORDS, fields_schema, input_struct, sample_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

__all__ = [
    "ERROR_COLUMN",
    "POSITION_COLUMNS",
    "RAW_COLUMN",
    "SAMPLE_RECORDS",
    "FieldDecoder",
    "Transform",
    "TransformedPacker",
    "check_plan",
    "check_transform",
    "fields_schema",
    "input_struct",
    "operator_fields",
    "sample_schema",
    "transformed_input",
]

Transform = Callable[["DataFrame"], "DataFrame"]


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
        raise ConfigError(f"transform failed: {first_line(exc)}") from None
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
