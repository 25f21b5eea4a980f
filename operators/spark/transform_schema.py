"""The input fields' schema of `transform=`: the one given (`input_schema`, Spark DDL or a StructType,
`fields_schema`) or one inferred from a sample of the topic's first records (`sample_schema`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cec.exceptions import ConfigError
from operators.spark.topic_reader import TopicOptions
from operators.spark.transform_plan import first_line
from operators.spark.transform_rows import (
    ERROR_COLUMN,
    POSITION_COLUMNS,
    RAW_COLUMN,
    field_converter,
    record_decoder,
)

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

__all__ = ["SAMPLE_RECORDS", "fields_schema", "input_struct", "sample_schema"]

log = logging.getLogger("operators.spark.transform")  # the name its log lines had before the split
SAMPLE_RECORDS = 500  # per partition, from its log start: what an inferred input schema is read from


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
                f"input_schema {given!r} is not a Spark DDL schema: {first_line(exc)}"
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
        field_converter(f.name, f.dataType)  # refuses a type it cannot fill
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
    from confluent_kafka import TopicPartition
    from pyspark.sql.types import StructField, StructType

    from operators.topic_tuples import decode_values
    from queuestore.kafka.admin import consumer_knowing

    starts, ends = opts.bounds()
    consumer = consumer_knowing(
        {
            **opts.client_config,
            "bootstrap.servers": opts.bootstrap,
            "group.id": "cec-transform-schema",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        },
        opts.topic,
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
    for value in decode_values(record_decoder(opts), raws):
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
