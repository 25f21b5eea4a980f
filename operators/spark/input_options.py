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
    value: str,
    time: str | None,
) -> dict[str, str]:
    """The input's data source options (format name under "format_name"), validated on the driver."""
    if input_format == "cec":
        if input_schema is not None and not isinstance(input_schema, (str, Mapping)):
            raise ConfigError("input_schema of a cec topic is an Avro schema (a name, JSON text or a dict)")
        return {"format_name": FORMAT, "schema": _schema_option(input_schema or "purchase")}
    options = {"format_name": TOPIC_FORMAT, "format": input_format, "key": key, "value": value}
    if time is not None:
        options["time"] = time
    if input_format == "avro":
        if input_schema is None:
            raise ConfigError("input_format='avro' needs input_schema (a dict, JSON text or an .avsc path)")
        if isinstance(input_schema, Mapping):
            options["schema"] = json.dumps(dict(input_schema))
        elif isinstance(input_schema, str):
            options["schema"] = input_schema
            load_avro_schema(
                json.loads(input_schema) if input_schema.lstrip().startswith("{") else input_schema
            )
        else:
            raise ConfigError("input_schema of an avro topic is a dict, JSON text or an .avsc path")
    elif input_format == "csv":
        if input_schema is None or isinstance(input_schema, Mapping):
            raise ConfigError("input_format='csv' needs input_schema: the column names")
        columns = input_schema.split(",") if isinstance(input_schema, str) else list(input_schema)
        options["columns"] = ",".join(c.strip() for c in columns)
    elif input_format == "registry":
        if not registry_url:
            raise ConfigError("input_format='registry' needs schema_registry_url")
        options["schema.registry.url"] = registry_url
    return options
