"""Checks of what a user gave the CLI, made before any work starts: each mistake is one `ConfigError`
(one line, exit code 2) instead of a traceback, or a failure found only at the end of a long run."""

from __future__ import annotations

import csv
import importlib.util
import os
import shutil
import time as _time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cec.exceptions import ConfigError
from cec.timeparse import number_from_text, parse_time_ms

__all__ = [
    "check_csv_input",
    "check_output_file",
    "check_topic_input",
    "prepare_store_dir",
    "require_spark",
]

# Rows looked at before a run to tell a wrong column from a few bad rows: if every one of them fails,
# the column is almost surely the wrong one (a run would dead-letter everything).
PEEK_ROWS = 20


def check_output_file(path: Path, what: str) -> None:
    """`path` can be written: not a directory, in an existing, writable directory."""
    if path.is_dir():
        raise ConfigError(f"{what} {path} is a directory; give a file name")
    parent = path.parent
    if not parent.exists():
        raise ConfigError(f"{what} {path}: directory {parent} does not exist")
    if not parent.is_dir():
        raise ConfigError(f"{what} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigError(f"{what} {path}: no permission to write there")


def prepare_store_dir(given: str | Path) -> Path:
    """The --store-dir, created if missing; a file in its place, or a dir that cannot be created or
    written, is an error."""
    path = Path(given)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--store-dir {path} is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create --store-dir {path}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"--store-dir {path} is not writable")
    return path


def require_spark() -> None:
    """PySpark importable and a Java runtime where Spark looks for one (JAVA_HOME, else PATH)."""
    try:
        found = importlib.util.find_spec("pyspark") is not None
        if found:
            import pyspark  # noqa: F401 - a broken install fails here, not in the middle of a run
    except ImportError:
        found = False
    if not found:
        raise ConfigError(
            "--engine spark (the default) needs PySpark: pip install 'cec-stream[spark]' (and Java 17), "
            "or run without Spark: cec demo --engine local"
        )
    java_home = os.environ.get("JAVA_HOME")
    if not (java_home and (Path(java_home) / "bin" / "java").exists()) and shutil.which("java") is None:
        raise ConfigError(
            "--engine spark needs a Java runtime (Java 17: set JAVA_HOME or put java on PATH), "
            "or run without Spark: cec demo --engine local"
        )


def _number_ok(text: str) -> bool:
    try:
        number_from_text(text)  # the operator's own rule for a number given as text
    except ValueError:
        return False
    return True


def _time_ok(text: str) -> bool:
    try:
        parse_time_ms(text)
    except (ValueError, OverflowError):
        return False
    return True


def check_csv_input(path: Path, columns: Sequence[str], value: str | None, time: str | None) -> None:
    """The header has every column, and the value (and time) columns are readable in at least one of the
    first rows: a wrong column is said now, not after a run that dead-letters every row."""
    rows: list[list[str]] = []
    try:
        # utf-8-sig: a leading byte order mark is not part of the first column's name (as in CsvSource).
        with path.open(newline="", encoding="utf-8-sig", errors="replace") as f:
            reader = csv.reader(f)
            try:
                header = next(reader, None)
            except csv.Error as exc:
                raise ConfigError(f"{path} is not a readable CSV file: {exc}") from None
            for _ in range(PEEK_ROWS):
                try:
                    rows.append(next(reader))
                except StopIteration:
                    break
                except csv.Error:  # a row the run dead-letters (a field over the size limit...), as anywhere
                    continue
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    if not header:
        raise ConfigError(f"{path} is empty: a header row is required")
    missing = [c for c in columns if c not in header]
    if missing:
        raise ConfigError(
            f"{path} has no column {', '.join(map(repr, missing))} (columns: {', '.join(header)})"
        )
    checks = [(value, _number_ok, "numbers")] if value else []  # None: no value column (count:* only)
    if time:
        checks.append((time, _time_ok, "times (integer milliseconds, ISO-8601 or YYYY-MM-DD HH:MM:SS)"))
    for column, ok, what in checks:
        i = header.index(column)
        cells = [row[i] for row in rows if len(row) == len(header) and row[i].strip()]
        if cells and not any(ok(cell) for cell in cells):
            raise ConfigError(
                f"column {column!r} of {path} holds no {what} in its first {len(cells)} values "
                f"(first: {cells[0]!r:.60})"
            )


def check_topic_input(
    source: Mapping[str, Any],
    *,
    peek: int = PEEK_ROWS,
    timeout_s: float = 10.0,
    clock: Callable[[], float] = _time.monotonic,
) -> None:
    """The first records of a bounded topic input (from its pinned start) hold the key, value and time
    fields in the given format: if not one of the first `peek` is usable (every one fails to decode, lacks
    a field, or has no number / no time there), the format or a field name is wrong, and the run is
    refused before it starts. Nothing is committed (the peek has no consumer group)."""
    if source.get("follow") or source.get("format") == "cec":
        return  # a following run may start on an empty topic; a cec queue carries its own schema
    from operators.job import SCHEMAS
    from operators.topic_source import open_topic_source

    reader = open_topic_source({k: v for k, v in source.items() if k != "group_id"}, SCHEMAS)
    seen: list[Any] = []
    try:
        reader.seek([0] * reader.partitions)  # from each partition's pinned start
        deadline = clock() + timeout_s
        while len(seen) < peek and clock() < deadline:
            batch = reader.poll(peek - len(seen))
            if batch is None:
                break
            seen.extend(batch)
    finally:
        reader.close()
    if not seen:
        return
    value, time = source.get("value_field"), source.get("time_field")
    reasons: list[str] = []
    for tup in seen:
        if tup.value is None:
            reasons.append(tup.error or "unreadable")
        elif value and not _number_ok(str(tup.value.get(value))):
            reasons.append(f"field {value!r} is not a number: {tup.value.get(value)!r:.40}")
        elif time and not _time_ok(str(tup.value.get(time))):
            reasons.append(f"field {time!r} is not a time: {tup.value.get(time)!r:.40}")
        else:
            return  # one usable record: the rest are the run's dead letters, if any
    raise ConfigError(
        f"none of the first {len(seen)} records of topic {source.get('topic')!r} is usable as "
        f"--format {source.get('format')} with these fields (the first: {reasons[0]})"
    )
