"""Read an operator's output queue as its consumers see it: results only, control tuples dropped by kind,
every record's checksum checked first (`cec.verified`)."""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from cec.exceptions import CodecError
from cec.records import AvroCodec, Kind, RecordCodec
from cec.timeparse import format_time_ms
from cec.verified import verified_records
from queuestore.base import QueueStore

__all__ = [
    "RESULT_COLUMNS",
    "count_kinds",
    "iter_payloads",
    "result_formats",
    "write_dead_letter_csv",
    "write_outputs",
    "write_results_csv",
]

# The results file's columns. The first four keep their order (readers outside the project rely on it).
RESULT_COLUMNS = ["key", "window", "value", "count", "start", "end"]

Formats = Mapping[str, Callable[[Any], str]]


def iter_payloads(
    store: QueueStore, topic: str, schema: dict[str, Any], kind: Kind = Kind.R
) -> Iterator[dict[str, Any]]:
    """Decoded payloads of every `kind` record of every partition, partition by partition in log order.

    Every record is checked before it is filtered by kind: a damaged or missing record of any kind raises
    `DamagedLogError`, so results are never silently dropped or used.
    """
    codec, payloads = RecordCodec(), AvroCodec(schema)
    wanted = kind.value
    for p in range(store.partitions(topic)):
        with store.reader(topic, p) as reader:
            for verified in verified_records(reader, codec=codec, decode=(wanted,)):
                if verified.meta.kind != wanted:
                    continue
                record = verified.record
                assert record is not None
                if record.payload is None:
                    raise CodecError(f"{reader.where(verified.offset)}: a {wanted} record without payload")
                yield payloads.decode(record.payload)


def count_kinds(store: QueueStore, topic: str, partition: int | None = None) -> Counter[str]:
    """How many records of each kind a topic (or one of its partitions) holds, every one checked."""
    counts: Counter[str] = Counter()
    codec = RecordCodec()
    partitions = range(store.partitions(topic)) if partition is None else [partition]
    for p in partitions:
        with store.reader(topic, p) as reader:
            counts.update(v.meta.kind for v in verified_records(reader, codec=codec))
    return counts


def _fmt(value: Any) -> str:
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
    out = [(c, (formats or {}).get(c, _fmt)) for c in columns]
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
    return write_results_csv(rows, path, ["partition", "offset", "reason", "raw"])


def write_outputs(
    store: QueueStore,
    topic: str,
    result_schema: dict[str, Any],
    dead_letter_schema: dict[str, Any],
    results: tuple[Path, list[str]],
    dead_letters: Path,
    formats: Formats | None = None,
) -> tuple[int, int, Counter[str]]:
    """What a run hands its user, from ONE checked pass over the log (results and dead letters are few
        next to the footprints, so they are held until the pass is done): the results CSV (path, columns),
        the dead-letter CSV, and the count of every kind. A damaged log writes neither file. `formats`: how
    result columns print (`result_formats`)."""
    codec = RecordCodec()
    found: dict[str, list[dict[str, Any]]] = {Kind.R.value: [], Kind.DEAD.value: []}
    decoders = {Kind.R.value: AvroCodec(result_schema), Kind.DEAD.value: AvroCodec(dead_letter_schema)}
    counts: Counter[str] = Counter()
    for p in range(store.partitions(topic)):
        with store.reader(topic, p) as reader:
            for verified in verified_records(reader, codec=codec, decode=tuple(found)):
                kind = verified.meta.kind
                counts[kind] += 1
                rows = found.get(kind)
                if rows is None:
                    continue
                record = verified.record
                assert record is not None
                if record.payload is None:
                    raise CodecError(f"{reader.where(verified.offset)}: a {kind} record without payload")
                rows.append(decoders[kind].decode(record.payload))
    path, columns = results
    n_results = write_results_csv(iter(found[Kind.R.value]), path, columns, formats)
    n_dead = write_dead_letter_csv(iter(found[Kind.DEAD.value]), dead_letters)
    return n_results, n_dead, counts
