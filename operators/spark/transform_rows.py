"""The Arrow steps around `transform=`: the input's records decoded into the typed fields of its schema
(`FieldDecoder`, a record that does not fit is a dead letter with its reason and raw value) and the
transformed rows packed for the processor (`TransformedPacker`, as an untransformed input is packed)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from cec.exceptions import ConfigError
from operators.spark.topic_reader import TopicOptions, TupleBatches

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import DataType, StructType

__all__ = ["ERROR_COLUMN", "POSITION_COLUMNS", "RAW_COLUMN", "FieldDecoder", "TransformedPacker"]

# The columns every input row carries beside its fields (Spark's Kafka source's names and types).
POSITION_COLUMNS = ("partition", "offset", "timestamp")
ERROR_COLUMN = "cec_error"
RAW_COLUMN = "cec_raw"


def record_decoder(opts: TopicOptions) -> Any:
    from operators.formats import make_decoder

    return make_decoder(
        opts.fmt, schema=opts.schema, registry_url=opts.registry_url, columns=list(opts.columns) or None
    )


def field_converter(name: str, data_type: DataType) -> Callable[[Any], Any]:
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
        decoder = record_decoder(self.opts)
        names = [f.name for f in self.struct.fields]
        convert = [field_converter(f.name, f.dataType) for f in self.struct.fields]
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
