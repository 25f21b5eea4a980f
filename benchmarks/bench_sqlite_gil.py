"""SQLite from a helper thread beside a thread that keeps the GIL busy: why the embedded store's group commit
inserts its rows in a few multi-row statements (`queuestore.sqlite.writer.insert_rows`).

`sqlite3` gives up the GIL around every row's step (an INSERT of `executemany`, a row of `fetchall`) and
must take it back before the next; beside a thread running Python, each take waits for that thread's switch
interval. This times, in a scratch database (WAL, as the store), `--rows` rows written and read alone and
beside a spinning thread: one INSERT per row (`executemany`), `insert_rows`' multi-row statements, and a
row-by-row `fetchall` of them (the reads of the store, which only the results writer's drain thread of a
trimming run does off the main thread).

    nice -n 5 .venv/bin/python benchmarks/bench_sqlite_gil.py --rows 32768
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from queuestore.sqlite.files import _COLUMNS  # noqa: E402
from queuestore.sqlite.writer import insert_rows  # noqa: E402


def _beside_busy(work: Callable[[], object], busy: bool) -> float:
    """Seconds `work` takes in a thread of its own, with another thread spinning in Python if `busy`."""
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    spinner = threading.Thread(target=spin) if busy else None
    if spinner is not None:
        spinner.start()
    took: list[float] = []

    def timed() -> None:
        started = time.perf_counter()
        work()
        took.append(time.perf_counter() - started)

    worker = threading.Thread(target=timed)
    worker.start()
    worker.join()
    stop.set()
    if spinner is not None:
        spinner.join()
    return took[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=32_768)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cec-sqlite-gil-") as tmp:
        conn = sqlite3.connect(Path(tmp) / "log.db", isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(
            "CREATE TABLE log (offset INTEGER PRIMARY KEY, kind TEXT, time INTEGER, key TEXT, seq INTEGER, "
            "value BLOB)"
        )
        base = [0]

        def rows() -> list[tuple[object, ...]]:
            first = base[0]
            base[0] += args.rows
            return [(first + i, "R", i, f"k{i % 1000}", 1, b"x" * 40) for i in range(args.rows)]

        def per_row() -> None:
            batch = rows()
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(f"INSERT INTO log ({_COLUMNS}) VALUES (?,?,?,?,?,?)", batch)
            conn.execute("COMMIT")

        def multi_row() -> None:
            batch = rows()
            conn.execute("BEGIN IMMEDIATE")
            insert_rows(conn, batch)
            conn.execute("COMMIT")

        def read() -> None:
            conn.execute(f"SELECT {_COLUMNS} FROM log ORDER BY offset LIMIT ?", (args.rows,)).fetchall()

        for name, work in (("INSERT per row", per_row), ("multi-row INSERTs", multi_row), ("fetchall", read)):
            work()  # once untimed: statements prepared and cached, pages warm, as in a running store
            alone = _beside_busy(work, busy=False)
            busy = _beside_busy(work, busy=True)
            print(
                f"{name:18} {args.rows:,} rows: alone {alone:.3f} s, beside a busy thread {busy:.3f} s "
                f"({busy / alone:.0f}x)",
                flush=True,
            )
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
