"""Damaged stores as a user meets them: `cec run` again on the same --store-dir, `cec inspect`, `cec state`,
`cec recover --dry-run`.

- A damaged stream index is rebuilt from the log, like a missing one: the rerun's results are the first
  run's, with one warning (before: `Exception: Corruption: block checksum mismatch` at every rerun).
- A damaged output log is one line on stderr naming the file and the way out, exit code 2, no results
  file (before: `sqlite3.OperationalError: Could not decode to UTF-8 ...` for a flipped byte in a kind,
  `sqlite3.DatabaseError: database disk image is malformed` for a zeroed page, both as tracebacks).
"""

from __future__ import annotations

import random
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.helpers import cec

WAY_OUT = "restore it from a backup, or start over with a new store directory (--store-dir)"


def run_args(data: Path, store: Path, results: Path) -> list[str]:
    return [
        "run",
        str(data),
        "--key",
        "k",
        "--value",
        "v",
        "--window-count",
        "7",
        "--results",
        str(results),
        "--store-dir",
        str(store),
    ]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(input, store, results) of one finished `cec run`: 3,000 rows over 900 keys, so that the index
    has a closed-window directory several blocks long."""
    root = tmp_path_factory.mktemp("first")
    rng = random.Random(7)
    data = root / "in.csv"
    data.write_text("k,v\n" + "".join(f"k{rng.randrange(900)},{rng.randrange(100)}\n" for _ in range(3000)))
    out = cec(*run_args(data, root / "store", root / "results.csv"), "--quiet")
    assert out.returncode == 0, out.stderr
    return data, root / "store", root / "results.csv"


@pytest.fixture
def again(first_run: tuple[Path, Path, Path], tmp_path: Path) -> tuple[Path, Path, str]:
    """A copy of the first run's store to damage: (input, store, topic)."""
    data, store, _ = first_run
    shutil.copytree(store, tmp_path / "store")
    (topic,) = [p.name for p in (tmp_path / "store").iterdir() if p.is_dir() and p.name.startswith("run-")]
    return data, tmp_path / "store", topic


def _one_line(out: subprocess.CompletedProcess[str], *parts: str) -> None:
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    for part in parts:
        assert part in lines[0], lines[0]


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x5A
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["first block", "footer"])
def test_a_damaged_index_is_rebuilt_at_the_rerun_with_exact_results(
    first_run: tuple[Path, Path, Path], again: tuple[Path, Path, str], tmp_path: Path, where: str
) -> None:
    data, store, topic = again
    index = store / "index" / f"{topic}.0.rocksdb"
    tables = sorted(index.glob("*.sst"))
    assert tables
    for table in tables:
        _flip(table, 40 if where == "first block" else table.stat().st_size - 20)
    out = cec(*run_args(data, store, tmp_path / "again.csv"))
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    warnings = [line for line in out.stderr.splitlines() if "stream index" in line]
    assert len(warnings) == 1, out.stderr
    assert f"the stream index at {index} is damaged (Corruption: " in warnings[0]
    assert warnings[0].endswith("; rebuilding it from the log")
    assert (tmp_path / "again.csv").read_bytes() == first_run[2].read_bytes()
    # Rebuilt for good: the next rerun has nothing to say.
    out = cec(*run_args(data, store, tmp_path / "third.csv"))
    assert out.returncode == 0 and "stream index" not in out.stderr, out.stderr


def _offset_of_text(path: Path, text: bytes) -> int:
    """The file position of a kind's text in a log page (a record's row)."""
    data = path.read_bytes()
    at = data.find(text, 4096 * 4)  # past the schema and the meta table
    assert at > 0
    return at


def test_a_flipped_byte_in_a_records_kind_is_one_line_naming_the_file(
    again: tuple[Path, Path, str], tmp_path: Path
) -> None:
    data, store, topic = again
    log = store / topic / "0.sqlite"
    at = _offset_of_text(log, b"GOPEN")
    raw = bytearray(log.read_bytes())
    raw[at + 1] = 0xFF  # not UTF-8 any more
    log.write_bytes(bytes(raw))
    damaged = f"{log}: {topic}[0] offset "
    out = cec(*run_args(data, store, tmp_path / "again.csv"))
    _one_line(out, "cec: error: ", damaged, "is damaged", WAY_OUT)
    assert not (tmp_path / "again.csv").exists()
    _one_line(cec("inspect", topic, "--store-dir", str(store)), damaged, WAY_OUT)


def _rightmost_leaf(path: Path) -> int:
    """The page holding the newest records, which every reader of the log meets."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        (page,) = conn.execute(
            "SELECT max(pageno) FROM dbstat WHERE name = 'log' AND pagetype = 'leaf'"
        ).fetchone()
    finally:
        conn.close()
    return int(page)


@pytest.mark.parametrize("command", ["run", "inspect", "state", "recover"])
def test_a_zeroed_page_of_the_log_is_one_line_naming_the_file(
    again: tuple[Path, Path, str], tmp_path: Path, command: str
) -> None:
    data, store, topic = again
    log = store / topic / "0.sqlite"
    page = _rightmost_leaf(log)
    with log.open("r+b") as f:
        f.seek((page - 1) * 4096)
        f.write(bytes(4096))
    args = {
        "run": run_args(data, store, tmp_path / "again.csv"),
        "inspect": ["inspect", topic, "--store-dir", str(store)],
        "state": ["state", topic, "--as-of", "pos:2900", "--input", str(data), "--store-dir", str(store)],
        "recover": ["recover", topic, "--dry-run", "--store-dir", str(store)],
    }[command]
    out = cec(*args)
    _one_line(
        out, f"cec: error: the output log {log} is damaged (database disk image is malformed); {WAY_OUT}"
    )
    assert not (tmp_path / "again.csv").exists()
