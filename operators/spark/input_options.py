"""The options of an attached query's input data source (`cec_aggregate(input_format=..., input_schema=...)`),
validated on the driver so that a mistake is one ConfigError there, never a traceback on an executor."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from cec.exceptions import ConfigError
from operators.formats import load_avro_schema
from operators.spark.datasource import FORMAT, PAYLOAD_SCHEMAS
from operators.spark.topic_reader import TOPIC_FORMAT

__all__ = ["source_options"]


def _schema_option(schema: str | Mapping[str, Any]) -> str:
    if isinstance(schema, str):
        if schema not in PAYLOAD_SCHEMAS:
            json.loads(schema)  # a JSON schema text: let the data source validate it
        return schema
    return json.dumps(dict(schema))


def source_options(
    input_format: str,
    input_schema: str | Mapping[str, Any] | Sequence[str] | None,
    registry_url: str | None,
    key: str,
    value: str | None,
    time: str | None,
    *,
    key_fields: Sequence[str] = (),
    value_fields: Sequence[str] = (),
    key_array: bool = False,
) -> dict[str, str]:
    """The input's data source options (format name under "format_name"), validated on the driver.
    `key_fields`, `value_fields`: several aggregates (`operators.spark.topic_reader.TopicOptions`); a field
    that the input's schema (avro, csv) does not have is refused here."""
    if input_format == "cec":
        if key_fields:
            raise ConfigError(
                "several aggregates or a composite key read an ordinary topic (input_format json, avro, "
                "registry or csv); a cec queue input takes one key and one agg"
            )
        if input_schema is not None and not isinstance(input_schema, (str, Mapping)):
            raise ConfigError("input_schema of a cec topic is an Avro schema (a name, JSON text or a dict)")
        return {"format_name": FORMAT, "schema": _schema_option(input_schema or "purchase")}
    options = {"format_name": TOPIC_FORMAT, "format": input_format, "key": key}
    if value is not None:
        options["value"] = value
    if key_fields:
        options["keys"] = json.dumps(list(key_fields))
        options["values"] = json.dumps(list(value_fields))
        options["keyArray"] = "true" if key_array else "false"
    if time is not None:
        options["time"] = time
    known: list[str] | None = None  # the fields the input's schema gives, where the driver knows them
    if input_format == "avro":
        if input_schema is None:
            raise ConfigError("input_format='avro' needs input_schema (a dict, JSON text or an .avsc path)")
        if isinstance(input_schema, Mapping):
            options["schema"] = json.dumps(dict(input_schema))
            loaded = dict(input_schema)
        elif isinstance(input_schema, str):
            options["schema"] = input_schema
            loaded = load_avro_schema(
                json.loads(input_schema) if input_schema.lstrip().startswith("{") else input_schema
            )
        else:
            raise ConfigError("input_schema of an avro topic is a dict, JSON text or an .avsc path")
        fields = loaded.get("fields")
        if isinstance(fields, list):
            known = [f["name"] for f in fields if isinstance(f, Mapping) and isinstance(f.get("name"), str)]
    elif input_format == "csv":
        if input_schema is None or isinstance(input_schema, Mapping):
            raise ConfigError("input_format='csv' needs input_schema: the column names")
        columns = input_schema.split(",") if isinstance(input_schema, str) else list(input_schema)
        options["columns"] = ",".join(c.strip() for c in columns)
        known = [c.strip() for c in columns]
    elif input_format == "registry":
        if not registry_url:
            raise ConfigError("input_format='registry' needs schema_registry_url")
        options["schema.registry.url"] = registry_url
    if known is not None and key_fields:
        _check_fields(known, input_format, key_fields, value_fields, time)
    return options


def _check_fields(
    known: Sequence[str],
    input_format: str,
    key_fields: Sequence[str],
    value_fields: Sequence[str],
    time: str | None,
) -> None:
    """One ConfigError for a key field, value column or time field that the input's schema lacks (the
    pseudo-fields @timestamp and @key come from the Kafka record)."""
    from operators.topic_tuples import KEY_FIELD, TIMESTAMP_FIELD

    have = set(known) | {KEY_FIELD, TIMESTAMP_FIELD}
    for role, names in (("key", key_fields), ("value", value_fields), ("time", [time] if time else [])):
        for name in names:
            if name not in have:
                raise ConfigError(
                    f"{role} field {name!r} is not in the {input_format} input's schema ({', '.join(known)})"
                )
