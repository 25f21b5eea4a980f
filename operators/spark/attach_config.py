"""`cec_aggregate`'s keyword values checked against each other and turned into what a start is built from
(`AttachConfig`), before any store is opened: a value out of range or a combination that cannot work is
one `ConfigError` here (the types were checked before the call, `operators.spark.keywords`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cec.config import Checkpointing
from cec.exceptions import ConfigError
from operators.aggregate import parse_lateness_ms
from operators.formats import FORMATS
from operators.spark.aggregate_form import WindowForm, aggregate_form, window_form
from operators.spark.input_options import source_options as select_source_options
from operators.spark.kafka_input import choose_input_reader
from operators.spark.processor import AggregateSpec
from operators.spark.session import check_session
from operators.spark.transform import Transform, check_transform, fields_schema
from operators.spark.trim import trim_interval
from operators.spark.wiring import QueryInput, check_input

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

__all__ = ["WRITERS", "AttachConfig", "attach_config"]

WRITERS = ("executors", "driver")  # cec_aggregate(writers=...): who writes the output logs


@dataclass(frozen=True)
class AttachConfig:
    """What `cec_aggregate`'s checked keywords make: the checkpointing policy, the windows, the aggregate,
    the lateness (ms), the trimming interval and the query's input."""

    checkpointing: Checkpointing
    windows: WindowForm
    spec: AggregateSpec
    lateness: int | None
    trim_every: int | None
    source_options: dict[str, str]
    reader_kind: str
    source: QueryInput


def attach_config(
    spark: SparkSession,
    *,
    input_topic: str,
    bootstrap_servers: str,
    output_topic: str,
    key: str | Sequence[str],
    value: str | None,
    state_dir: str | Path,
    agg: str | Sequence[tuple[str, str]],
    window_count: int | None,
    window_time: str | int | None,
    time: str | None,
    input_schema: str | Mapping[str, Any] | Sequence[str] | StructType | None,
    input_format: str,
    schema_registry_url: str | None,
    partitions: int | None,
    max_records_per_trigger: int | None,
    kafka_config: Mapping[str, str] | None,
    checkpointing: Checkpointing | Mapping[str, Any] | None,
    writers: str,
    allowed_lateness: str | int | None,
    input_reader: str,
    trim_every: int | None,
    slide: str | int | None,
    session_gap: str | int | None,
    transform: Transform | None,
    results_topic: str | None,
) -> AttachConfig:
    """`cec_aggregate`'s keywords (its doc), checked in this order; the session is checked (and the input's
    reader chosen) last, once every plain value is known to be right."""
    if checkpointing is None:
        checkpointing = Checkpointing.default()  # bounded recovery unless told otherwise (cec.config)
    elif isinstance(checkpointing, Mapping):
        checkpointing = Checkpointing.from_dict(dict(checkpointing))
    elif not isinstance(checkpointing, Checkpointing):
        raise ConfigError(f"checkpointing must be a cec.Checkpointing, got {checkpointing!r}")
    if writers not in WRITERS:
        raise ConfigError(f"writers must be one of {', '.join(WRITERS)}, got {writers!r}")
    if input_format not in FORMATS:
        raise ConfigError(f"input_format must be one of {', '.join(FORMATS)}, got {input_format!r}")
    if transform is not None:
        check_transform(transform, input_format)
    if results_topic is not None and (not isinstance(results_topic, str) or not results_topic):
        raise ConfigError(f"results_topic must be a topic name, got {results_topic!r}")
    if results_topic is not None and results_topic in (input_topic, output_topic):
        raise ConfigError("results_topic must be a topic of its own, not the input or output topic")
    windows = window_form(
        window_count=window_count,
        window_time=window_time,
        slide=slide,
        session_gap=session_gap,
        time=time,
        input_format=input_format,
    )
    form = aggregate_form(key, value, agg, several=windows.several)
    if time is not None and time in (*form.key_fields, value):
        raise ConfigError("key, value and time must be different columns")
    lateness = None if allowed_lateness is None else parse_lateness_ms(allowed_lateness)
    spec = AggregateSpec(
        form.key_fields[0],
        value,
        form.agg,
        window_count,
        windows.window_ms,
        time,
        json_values=input_format != "cec",
        allowed_lateness=lateness,
        key_fields=form.several_keys,
        aggs=form.aggs,
        slide=windows.slide_ms,
        session_gap=windows.session_gap_ms,
    )
    spec.build()  # validates the aggregate configuration here, not on an executor
    if partitions is not None and partitions < 1:
        raise ConfigError(f"partitions must be >= 1, got {partitions}")
    if max_records_per_trigger is not None and max_records_per_trigger < 1:
        raise ConfigError("max_records_per_trigger must be >= 1")
    trim_every = trim_interval(trim_every)
    # With transform=, a json or registry input's input_schema types its fields (Spark DDL): the data
    # source's own options have no schema then.
    typed_fields = transform is not None and input_format in ("json", "registry")
    format_schema = None if typed_fields else input_schema
    if format_schema is not None and not isinstance(format_schema, (str, Mapping, Sequence)):
        raise ConfigError(
            f"input_schema of a {input_format} input is not a {type(format_schema).__name__} (a Spark "
            "schema types the fields of a json or registry input under transform=)"
        )
    source_options = select_source_options(
        input_format,
        format_schema,
        schema_registry_url,
        spec.key,
        value,
        time,
        key_fields=(spec.key_fields or (spec.key,)) if spec.several else (),
        value_fields=form.value_columns,
        key_array=spec.key_array,
    )
    check_session(spark, embedded_store=False, what="cec_aggregate")
    reader_kind = choose_input_reader(spark, input_reader, input_format, kafka_config)
    source = QueryInput(
        input_topic, bootstrap_servers, source_options, reader_kind, dict(kafka_config or {}),
        Path(state_dir), max_records_per_trigger, transform, fields_schema(input_schema) if typed_fields else None,
    )  # fmt: skip
    if transform is None:
        check_input(source, spec.key, value, time)
    return AttachConfig(
        checkpointing, windows, spec, lateness, trim_every, source_options, reader_kind, source
    )
