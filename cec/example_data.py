"""The example inputs the README and docs run `cec run` on, written by `cec demo --make-data DIR`.

Deterministic (a fixed seed per file): the same files on every machine, so a log's topic name, which
`cec run` derives from the operator and the file's content, is the same too.

- `purchases.csv`: `item_id,item_price,item_time`, 50,000 purchases of 1,000 items (`i0` .. `i999`),
  whole prices 1..100, times in epoch milliseconds 100 ms apart from 2024-05-01T00:00:00Z;
- `events.csv`: `user,amount,ts`, 20,000 events of 200 users, amounts in cents, ISO-8601 UTC times
  0-30 s apart;
- `flights.csv`: `carrier,origin,ts,arr_delay,dep_delay`, 20,000 flights of 4 carriers from 10 airports,
  ISO-8601 UTC times that never go back, every 25th flight without an `arr_delay` (diverted);
- `big.csv`: `k,v`, 500,000 rows over 10,000 keys.
"""

from __future__ import annotations

import csv
import random
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cec.exceptions import ConfigError

__all__ = ["EXAMPLE_FILES", "write_example_data"]

_START_MS = 1_714_521_600_000  # 2024-05-01T00:00:00Z
_START = datetime(2024, 5, 1, tzinfo=timezone.utc)
Rows = Iterator[list[str]]


def _iso(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def _purchases() -> Rows:
    rng = random.Random(1)
    yield ["item_id", "item_price", "item_time"]
    for i in range(50_000):
        yield [f"i{rng.randrange(1_000)}", str(rng.randint(1, 100)), str(_START_MS + 100 * i)]


def _events() -> Rows:
    rng = random.Random(2)
    yield ["user", "amount", "ts"]
    at = _START
    for _ in range(20_000):
        at += timedelta(seconds=rng.randint(0, 30))
        yield [f"u{rng.randrange(200)}", f"{rng.randint(1, 50_000) / 100:.2f}", _iso(at)]


def _flights() -> Rows:
    rng = random.Random(3)
    carriers = ["AA", "DL", "UA", "WN"]
    airports = ["ATL", "BOS", "DEN", "DFW", "JFK", "LAS", "LAX", "ORD", "SEA", "SFO"]
    yield ["carrier", "origin", "ts", "arr_delay", "dep_delay"]
    at = _START
    for i in range(20_000):
        at += timedelta(seconds=rng.randint(0, 120))
        dep = rng.randint(-15, 180)
        arr = "" if i % 25 == 24 else str(dep + rng.randint(-20, 30))
        yield [rng.choice(carriers), rng.choice(airports), _iso(at), arr, str(dep)]


def _big() -> Rows:
    rng = random.Random(4)
    yield ["k", "v"]
    for _ in range(500_000):
        yield [f"k{rng.randrange(10_000)}", str(rng.randint(0, 1_000))]


EXAMPLE_FILES: dict[str, Callable[[], Rows]] = {
    "purchases.csv": _purchases,
    "events.csv": _events,
    "flights.csv": _flights,
    "big.csv": _big,
}


def write_example_data(directory: Path) -> list[Path]:
    """Write every example file into `directory` (made if missing; files there are replaced)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot make {directory}: {exc.strerror or exc}") from None
    if not directory.is_dir():
        raise ConfigError(f"{directory} is not a directory")
    written = []
    for name, rows in EXAMPLE_FILES.items():
        path = directory / name
        tmp = path.with_name(f".{name}.tmp")
        try:
            with tmp.open("w", newline="", encoding="utf-8") as f:
                csv.writer(f, lineterminator="\n").writerows(rows())
            tmp.replace(path)
        except OSError as exc:
            raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None
        written.append(path)
    return written
