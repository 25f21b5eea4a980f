"""The results and dead-letter CSV files of a run: their columns, how each column prints, how a file is
written whole (temporary file, then rename) and where an incomplete one goes (`partial_path`)."""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from cec.timeparse import format_time_ms

__all__ = [
    "DEAD_LETTER_COLUMNS",
    "RESULT_COLUMNS",
    "Formats",
    "format_value",
    "partial_path",
    "result_formats",
    "write_dead_letter_csv",
    "write_results_csv",
]

# The results file's columns. The first four keep their order (readers outside the project rely on it).
RESULT_COLUMNS = ["key", "window", "value", "count", "start", "end"]
DEAD_LETTER_COLUMNS = ["partition", "offset", "reason", "raw"]

Formats = Mapping[str, Callable[[Any], str]]


def format_value(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _integer(value: Any) -> str:
    return str(int(value))


def result_formats(operator: Mapping[str, Any]) -> dict[str, Callable[[Any], str]]:
    """How the results of an aggregate operator spec print: counts as integers (`count`, and `value` of
    agg=count); with an event-time column, `start`/`end` as ISO-8601 UTC (a time window's [start, end),
    a count window's first and last tuple's time); without one (count windows only) they stay input
    positions: the offsets of the window's first and last tuple in their input partition (a CSV's data
    row number, 0 = the row after the header; a topic record's offset)."""
    formats: dict[str, Callable[[Any], str]] = {"count": _integer}
    if operator.get("agg") == "count":
        formats["value"] = _integer
    if operator.get("time_field"):
        formats["start"] = formats["end"] = format_time_ms
    return formats


def write_results_csv(
    rows: Iterator[dict[str, Any]], path: Path, columns: list[str], formats: Formats | None = None
) -> int:
    """Columns in `columns` order; a column is printed by `formats[column]` when given, else as is
    (floats by repr: exact)."""
    n = 0
    out = [(c, (formats or {}).get(c, format_value)) for c in columns]
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(columns)
            for row in rows:
                writer.writerow([fmt(row[c]) for c, fmt in out])
                n += 1
    except BaseException:
        tmp.unlink(missing_ok=True)  # a damaged log publishes no partial results file
        raise
    tmp.replace(path)
    return n


def write_dead_letter_csv(rows: Iterator[dict[str, Any]], path: Path) -> int:
    return write_results_csv(rows, path, DEAD_LETTER_COLUMNS)


def partial_path(path: Path) -> Path:
    """Where an incomplete results (or dead-letter) file is written: `out.csv.partial` beside `out.csv`."""
    return path.with_name(path.name + ".partial")
