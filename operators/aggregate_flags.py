"""`cec run`'s aggregate flags (`--key`, `--value`, repeatable `--agg FUNC[:COLUMN]`) as an operator spec,
and how that operator's results print.

One key and one `--agg` without a column (`--agg avg`, the default) keep the single aggregate
(`operators.aggregate.KeyedAggregate`, its spec and results exactly as before, so every log written
before several aggregates existed resumes); `--key a,b` or any `--agg FUNC:COLUMN` (or several `--agg`)
give the several-aggregate form (`operators.multi_aggregate`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cec.exceptions import ConfigError
from operators.aggregate import RESULT_SCHEMA
from operators.multi_aggregate import ALL_ROWS, parse_agg

__all__ = ["AggregateFlags", "aggregate_flags", "key_columns", "result_layout", "value_columns"]


class AggregateFlags(dict[str, Any]):
    """The `operators.job.aggregate_operator` arguments the flags give: key, value, agg, and for the
    several-aggregate form key_fields and aggs."""


def aggregate_flags(key: str, value: str | None, agg_flags: Sequence[str] | None) -> AggregateFlags:
    """The aggregate the flags describe. ConfigError (one line) for an empty key column, an unknown
    aggregate, a missing column, a repeated aggregate."""
    key_fields = [k.strip() for k in key.split(",")]
    if not all(key_fields):
        raise ConfigError(f"--key {key!r} has an empty column name")
    if len(set(key_fields)) != len(key_fields):
        raise ConfigError(f"--key {key!r} names a column twice")
    flags = list(agg_flags or ["avg"])
    if len(key_fields) == 1 and len(flags) == 1 and ":" not in flags[0]:
        func, column = parse_agg(flags[0], value)
        return AggregateFlags(key=key_fields[0], value=column, agg=func)
    aggs = [parse_agg(text, value) for text in flags]
    seen = set()
    for func, column in aggs:
        if (func, column) in seen:
            raise ConfigError(f"--agg {func}:{column} is given twice")
        seen.add((func, column))
    for func, column in aggs:
        if column in key_fields:
            raise ConfigError(f"--agg {func}:{column}: {column!r} is a --key column")
    out = AggregateFlags(key=key_fields[0], value=value, agg=aggs[0][0], aggs=aggs)
    if len(key_fields) > 1:
        out["key_fields"] = key_fields
    return out


def key_columns(spec: Mapping[str, Any]) -> list[str]:
    """The key columns of an aggregate operator spec (one, or a composite key's)."""
    return list(spec.get("key_fields") or [spec["key_field"]])


def value_columns(spec: Mapping[str, Any]) -> list[str]:
    """The columns an aggregate operator spec reads numbers from."""
    aggs = spec.get("aggs")
    if not aggs:
        return [spec["value_field"]]
    return list(dict.fromkeys(column for _, column in aggs if column != ALL_ROWS))


def _null_or(fmt: Callable[[Any], str]) -> Callable[[Any], str]:
    def format_nullable(value: Any) -> str:
        return "" if value is None else fmt(value)  # SQL null: an empty CSV field

    return format_nullable


def _plain(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def result_layout(
    spec: Mapping[str, Any], formats: Mapping[str, Callable[[Any], str]]
) -> tuple[dict[str, Any], list[str], dict[str, Callable[[Any], str]]]:
    """The result schema, CSV columns and column formats of an aggregate operator spec, from the single
    aggregate's `formats` (`operators.sinks.result_formats`): a null aggregate prints as an empty field."""
    from operators.job import build_operator

    if not {"aggs", "key_fields", "slide_ms", "session_gap_ms"} & spec.keys():
        return RESULT_SCHEMA, [f["name"] for f in RESULT_SCHEMA["fields"]], dict(formats)
    schema = build_operator(spec).result_schema
    columns = [f["name"] for f in schema["fields"]]
    out = dict(formats)
    for field in schema["fields"]:
        if isinstance(field["type"], list):  # a nullable aggregate
            out[field["name"]] = _null_or(out.get(field["name"], _plain))
    return schema, columns, out
