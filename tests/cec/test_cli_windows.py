"""`cec inspect` and `cec state --as-of` on the logs of hopping windows (`cec run --slide`) and session windows
(`cec run --session-gap`): the open windows they show are those of a plain-Python reading of the input
(a hopping part per key and size-aligned period, its slide-wide panes; a session per key, its first and
last time), at the end of the input and at a past input position."""

from __future__ import annotations

import csv
import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import cec

MINUTE = 60_000
SIZE, SLIDE, GAP = 60 * MINUTE, 15 * MINUTE, 30 * MINUTE
WINDOWS = {
    "hopping": ["--window-time", "1h", "--slide", "15m"],
    "session": ["--session-gap", "30m"],
}
KEYS = [(c, o) for c in ("AA", "UA", "DL") for o in ("JFK", "SFO")]


def _rows(n: int) -> list[dict[str, Any]]:
    """Flights in time order, 0 to 40 minutes apart (sessions of 30 minutes break now and then)."""
    rnd = random.Random(3)
    rows, t = [], 0
    for _ in range(n):
        t += rnd.randrange(0, 8 * MINUTE)
        carrier, origin = rnd.choice(KEYS)
        delay = None if rnd.random() < 0.1 else rnd.randrange(-400, 4000) / 4
        rows.append({"carrier": carrier, "origin": origin, "delay": delay, "ts": t})
    return rows


def _csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["carrier", "origin", "delay", "ts"])
        for r in rows:
            writer.writerow(
                [r["carrier"], r["origin"], "" if r["delay"] is None else repr(r["delay"]), r["ts"]]
            )
    return path


def _open_hopping_parts(rows: list[dict[str, Any]]) -> dict[str, tuple[int, int, int, int]]:
    """Per open part, by its id (the key's fields and the period's number): (panes, count, first pane's
    start, latest time). A key's part of a period closes once the key has a row at or past the end of the
    last window of the period's last pane (in time order, no row is late)."""
    by_part: dict[tuple[str, str, int], list[int]] = defaultdict(list)
    latest: dict[tuple[str, str], int] = {}
    for r in rows:
        key = (r["carrier"], r["origin"])
        by_part[(*key, r["ts"] // SIZE)].append(r["ts"])
        latest[key] = r["ts"]
    out = {}
    for (carrier, origin, period), times in by_part.items():
        panes = sorted({t - t % SLIDE for t in times})
        if panes[-1] + SIZE <= latest[(carrier, origin)]:
            continue  # its last window closed
        part = json.dumps([carrier, origin, period], separators=(",", ":"))
        out[part] = (len(panes), len(times), panes[0], max(times))
    return out


def _open_sessions(rows: list[dict[str, Any]]) -> dict[str, tuple[int, int, int]]:
    """Per key (its fields as a JSON array), its open session: (count, first time, last time)."""
    out: dict[str, tuple[int, int, int]] = {}
    for r in rows:
        key = json.dumps([r["carrier"], r["origin"]], separators=(",", ":"))
        count, first, last = out.get(key, (0, r["ts"], r["ts"]))
        if r["ts"] >= last + GAP:
            count, first = 0, r["ts"]
        out[key] = (count + 1, first, r["ts"])
    return out


@pytest.mark.parametrize("window", ["hopping", "session"])
def test_inspect_and_state_as_of_show_the_open_hopping_parts_and_sessions(
    tmp_path: Path, window: str
) -> None:
    rows = _rows(400)
    data = _csv(tmp_path / "flights.csv", rows)
    store = tmp_path / "store"
    out = cec("run", str(data), "--key", "carrier,origin", "--agg", "avg:delay", "--agg", "count:*",
              "--time", "ts", *WINDOWS[window], "--results", str(tmp_path / "out.csv"),
              "--store-dir", str(store))  # fmt: skip
    assert out.returncode == 0, out.stderr
    (topic,) = [
        line.split("\t")[0]
        for line in cec("inspect", "--list", "--store-dir", str(store)).stdout.splitlines()
    ]
    truth: Any = _open_hopping_parts if window == "hopping" else _open_sessions

    inspected = cec("inspect", topic, "--store-dir", str(store), "--json")
    assert inspected.returncode == 0, inspected.stderr
    (partition,) = json.loads(inspected.stdout)["partitions"]
    assert partition["n"] == len(truth(rows)) > 3
    text = cec("inspect", topic, "--store-dir", str(store))
    assert f"eventual checkpoint: {len(truth(rows))} windows" in text.stdout

    for at in (150, 400):
        state = cec("state", topic, "--as-of", f"pos:{at}", "--input", str(data), "--store-dir", str(store))
        assert state.returncode == 0, state.stderr
        windows = json.loads(state.stdout)["windows"]
        if window == "hopping":
            got = {
                w["key"]: (w["state"]["panes"], w["state"]["count"], w["state"]["start"], w["state"]["last"])
                for w in windows
            }
        else:
            got = {w["key"]: (w["state"]["count"], w["state"]["start"], w["state"]["last"]) for w in windows}
        assert got == truth(rows[:at]), at
