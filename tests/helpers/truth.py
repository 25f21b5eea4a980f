"""Plain-Python truths of the aggregates' windows, from their definitions and no cec code: tumbling
(count and time), hopping and session windows of several aggregates over composite keys, with SQL's null
rule (an aggregate skips a null or absent value, `count:*` counts rows) and exactly rounded sums
(`math.fsum`). Rows are dicts of the input's fields; a result is a dict in the result schema's column
order (`typed_row`), or as `cec run --results` writes it to CSV (`csv_form`)."""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cec.timeparse import format_time_ms

__all__ = [
    "csv_form",
    "csv_results",
    "hopping_truth",
    "session_truth",
    "sessions_of",
    "typed_row",
    "watermark_session_truth",
]

Agg = tuple[str, str]  # (FUNC, COLUMN), COLUMN "*" for count:*


def _value(func: str, column: str, rows: Sequence[Mapping[str, Any]], single: bool) -> Any:
    if column == "*":
        return float(len(rows)) if single else len(rows)
    xs = [float(r[column]) for r in rows if r.get(column) not in (None, "")]
    if func == "count":
        return float(len(xs)) if single else len(xs)
    if not xs:
        return None
    if func == "sum":
        return math.fsum(xs)
    if func == "avg":
        return math.fsum(xs) / len(xs)
    return min(xs) if func == "min" else max(xs)


def typed_row(
    keys: Sequence[str],
    window: int,
    rows: Sequence[Mapping[str, Any]],
    aggs: Sequence[Agg],
    start: int,
    end: int,
) -> dict[str, Any]:
    """One window's result as the several-aggregate form's columns, in order: one column per key field
    (`key` for one), `window`, `value` for one aggregate or `FUNC_COLUMN` per aggregate (`count:*` is the
    `count` column), `count`, `start`, `end`."""
    names = ["key"] if len(keys) == 1 else list(keys)
    out: dict[str, Any] = {name: rows[0][field] for name, field in zip(names, keys, strict=True)}
    out["window"] = window
    single = len(aggs) == 1
    for func, column in aggs:
        if column == "*" and not single:
            continue  # the `count` column
        out["value" if single else f"{func}_{column}"] = _value(func, column, rows, single)
    out["count"] = len(rows)
    out["start"] = start
    out["end"] = end
    return out


def csv_form(row: Mapping[str, Any]) -> dict[str, str]:
    """A result as `cec run --results` writes it: doubles by `repr`, nulls empty, times in ISO-8601 UTC."""
    out: dict[str, str] = {}
    for name, value in row.items():
        if name in ("start", "end"):
            out[name] = format_time_ms(int(value))
        elif value is None:
            out[name] = ""
        else:
            out[name] = repr(value) if isinstance(value, float) else str(value)
    return out


def csv_results(path: Path) -> list[dict[str, str]]:
    """A results CSV file's rows, sorted."""
    with path.open(newline="") as f:
        return sorted(csv.DictReader(f), key=lambda r: json.dumps(r, sort_keys=True))


def _aggs(aggs: Sequence[str | Agg]) -> list[Agg]:
    out: list[Agg] = []
    for agg in aggs:
        if isinstance(agg, str):
            func, _, column = agg.partition(":")
            out.append((func, column))
        else:
            out.append((agg[0], agg[1]))
    return out


def hopping_truth(
    rows: list[dict[str, Any]],
    keys: list[str],
    size: int,
    slide: int,
    aggs: Sequence[str | Agg],
    lateness: int | None,
    closed_at: int | None = None,
) -> list[dict[str, str]]:
    """The hopping windows ([start, start + size), start a multiple of `slide`) that hold a tuple and have
    closed, from one input in its order, in `csv_form`: without a lateness a key's window closes at its
    key's first later tuple at or past its end, and a tuple is late when its pane ended at or before its
    key's latest time; with one, at the end windows with end <= the watermark (`closed_at`, or max time -
    lateness) closed, a tuple goes into its windows whose end is past the watermark (max time so far -
    lateness) when it comes, and is late when there is none."""
    pairs = _aggs(aggs)
    accepted: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    latest: dict[tuple[str, ...], int] = {}
    top: int | None = None
    for row in rows:
        key = tuple(str(row[k]) for k in keys)
        t = int(row["ts"])
        pane = t - t % slide
        top = t if top is None else max(top, t)
        if lateness is not None:
            watermark = top - lateness
            if pane + size <= watermark:
                continue  # every window of it has closed
            # It joins the windows whose end is past the watermark when it comes.
            accepted.setdefault(key, []).append({**row, "_joins_after": watermark})
            continue
        if key in latest and pane + slide <= latest[key]:
            continue  # its earliest window has closed
        latest[key] = max(latest.get(key, t), t)
        accepted.setdefault(key, []).append({**row, "_joins_after": None})
    out = []
    for key, tuples in accepted.items():
        limit = (
            latest[key]
            if lateness is None
            else (closed_at if closed_at is not None else (top or 0) - lateness)
        )
        starts = set()
        for r in tuples:
            pane = int(r["ts"]) - int(r["ts"]) % slide
            starts.update(range(pane - size + slide, pane + 1, slide))  # every window holding the time
        for s in sorted(starts):
            if s + size > limit:
                continue
            inside = [
                {**r, **{k: str(r[k]) for k in keys}}
                for r in tuples
                if s <= int(r["ts"]) < s + size
                and (r["_joins_after"] is None or s + size > r["_joins_after"])
            ]
            if not inside:
                continue
            out.append(csv_form(typed_row(keys, s // slide, inside, pairs, s, s + size)))
    return sorted(out, key=lambda r: json.dumps(r, sort_keys=True))


def sessions_of(
    rows: Sequence[dict[str, Any]], gap: int, keys: Sequence[str]
) -> dict[tuple[Any, ...], list[list[dict[str, Any]]]]:
    """Per key: its tuples sorted by time (then by `i`, their input order, if they have one), cut where
    two neighbours are `gap` or more apart."""
    by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_key[tuple(r[k] for k in keys)].append(r)
    out = {}
    for key, rs in by_key.items():
        rs = sorted(rs, key=lambda r: (r["ts"], r.get("i", 0)))
        sessions: list[list[dict[str, Any]]] = [[rs[0]]]
        for prev, r in itertools.pairwise(rs):
            if r["ts"] - prev["ts"] >= gap:
                sessions.append([])
            sessions[-1].append(r)
        out[key] = sessions
    return out


def session_truth(
    rows: Sequence[dict[str, Any]],
    gap: int,
    aggs: Sequence[str | Agg],
    keys: Sequence[str] = ("carrier", "origin"),
    *,
    last_open: bool = True,
) -> list[dict[str, Any]]:
    """The sessions `[first, last + gap)` of `sessions_of`, as `typed_row`s. `last_open`: per key, without
    watermarks (`window` the key's session number; the key's last session stays open); else every session
    closed (a watermark past all of them; `window` = first // gap)."""
    pairs = _aggs(aggs)
    out = []
    for sessions in sessions_of(rows, gap, keys).values():
        for seq, s in enumerate(sessions[:-1] if last_open else sessions):
            number = seq if last_open else s[0]["ts"] // gap
            out.append(typed_row(keys, number, s, pairs, s[0]["ts"], s[-1]["ts"] + gap))
    return sorted(out, key=lambda r: (*(r[k] for k in ("key", *keys) if k in r), r["start"]))


def watermark_session_truth(
    parts: Sequence[Sequence[dict[str, Any]]],
    gap: int,
    lateness: int,
    aggs: Sequence[str | Agg],
    keys: Sequence[str] = ("carrier", "origin"),
) -> list[dict[str, Any]]:
    """The sessions (`sessions_of` over every partition's rows) whose end (last + gap) the final watermark
    (the smallest of the partitions' largest times, less `lateness`) is at or past, as Spark's
    `session_window` emits them; `window` = first // gap."""
    pairs = _aggs(aggs)
    rows = [r for p in parts for r in p]
    watermark = min(max(r["ts"] for r in p) for p in parts if p) - lateness
    out = []
    for sessions in sessions_of(rows, gap, keys).values():
        for s in sessions:
            if watermark < s[-1]["ts"] + gap:
                continue  # still open at the end of the input
            out.append(typed_row(keys, s[0]["ts"] // gap, s, pairs, s[0]["ts"], s[-1]["ts"] + gap))
    return out
