"""Damage fuzzer for stores: random byte flips, cuts and zeroed pages of a real log's SQLite file and
random damage to its stream index's files, then a resumed run and a read, at the store and at the CLI.

Exact or a clear error, nothing in between:
- the resumed run and its results equal the failure-free run's (the damage was repaired, as a damaged
  index is, or hit nothing that is read); the index then answers exactly what the log says; or
- the run or the read fails with one of the product's errors, in one line naming the damaged log file
  (at the CLI: exit code 2, that one line on stderr, no results file). Damage to the index alone is
  never an error. Nothing else (a sqlite3 or RocksDB exception, a TypeError) may come out.

Sized for CI by default; `CEC_DAMAGE_EXAMPLES=N` runs N examples at the store level (and N // 3 at the CLI),
`CEC_DAMAGE_SEED` picks another seed (the default one is fixed, so CI sees the same examples every run).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, seed, settings
from hypothesis import strategies as st

from cec import inspection
from cec.config import Checkpointing
from cec.exceptions import CecError
from cec.records import Kind
from operators.job import JobSpec, run_job
from queuestore.exceptions import QueueStoreError
from queuestore.index import StreamIndex
from queuestore.sqlite import SqliteQueueStore
from recovery.exceptions import RecoveryError
from tests.helpers import cec, per_key, results

EXAMPLES = int(os.environ.get("CEC_DAMAGE_EXAMPLES", "30"))
SEED = int(os.environ.get("CEC_DAMAGE_SEED", "20261126"))
PAGE = 4096


# -- damage ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Damage:
    """One act of damage: `target` "log" (the partition's SQLite file) or "index" (one of the stream
    index's files, the `pick`-th by name); `where` places it in the file (modulo its size or page count),
    counted from its end when `near_end` (the newest page of a log, which every reader meets)."""

    target: str
    kind: str  # flip | cut | zero-page | zero-bytes | delete (index files only)
    pick: int
    where: int
    bits: int
    near_end: bool

    def apply(self, log: Path, index: Path) -> Path | None:
        """Damage the file; returns it (None if there was nothing to damage)."""
        if self.target == "log":
            path = log
        else:
            files = sorted(p for p in index.iterdir() if p.is_file()) if index.is_dir() else []
            if not files:
                return None
            path = files[self.pick % len(files)]
        size = path.stat().st_size
        if self.kind == "delete":
            path.unlink()
            return path
        if size == 0:
            return None
        data = bytearray(path.read_bytes())
        at = size - 1 - self.where % min(size, 2 * PAGE) if self.near_end else self.where % size
        pages = max(1, -(-size // PAGE))
        page = (pages - 1 - self.where % min(pages, 2) if self.near_end else self.where % pages) * PAGE
        if self.kind == "flip":
            data[at] ^= self.bits
        elif self.kind == "cut":
            del data[at:]
        elif self.kind == "zero-page":
            data[page : page + PAGE] = bytes(len(data[page : page + PAGE]))
        else:  # zero-bytes: a short run, as a torn sector
            data[at : at + 1 + self.bits % 64] = bytes(len(data[at : at + 1 + self.bits % 64]))
        path.write_bytes(bytes(data))
        return path


@st.composite
def damages(draw: st.DrawFn) -> list[Damage]:
    out = []
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.sampled_from(["log", "index"]))
        kinds = ["flip", "flip", "cut", "zero-page", "zero-bytes"] + (["delete"] if target == "index" else [])
        out.append(
            Damage(
                target,
                draw(st.sampled_from(kinds)),
                draw(st.integers(0, 63)),
                draw(st.integers(0, 1 << 20)),
                draw(st.integers(1, 255)),
                draw(st.booleans()),
            )
        )
    return out


def _applied(plan: list[Damage], log: Path, index: Path) -> list[tuple[Damage, Path]]:
    done = []
    for damage in plan:
        path = damage.apply(log, index)
        if path is not None:
            done.append((damage, path))
    return done


def _label(done: list[tuple[Damage, Path]]) -> str:
    return "+".join(sorted({f"{d.target}:{d.kind}" for d, _ in done})) or "nothing"


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory per example (hypothesis runs many examples in one test call)."""
    base = Path(tempfile.mkdtemp(prefix="cec-damage-"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _fresh_dir(scratch: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=scratch))


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _assert_clear(error: BaseException, done: list[tuple[Damage, Path]], log: Path) -> None:
    message = str(error)
    assert isinstance(error, CecError | QueueStoreError | RecoveryError), repr(error)
    assert "\n" not in message, message
    assert any(d.target == "log" for d, _ in done), f"damage to the index alone must be repaired: {message}"
    assert str(log) in message, message


# -- the store level: the runtime API, three input partitions -----------------------------------------------
def _spec(root: Path) -> JobSpec:
    return JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "sum",
            "window_count": 5,
        },
        source={
            "type": "generator",
            "count": 900,
            "keys": 120,
            "seed": 3,
            "partitions": 3,
            "invalid_every": 17,
        },
        store={"type": "sqlite", "root": str(root)},
        output_topic="agg",
        checkpointing=Checkpointing(q_target=40, ci_ms=10.0, cp_ms=10.0),
        batch_size=16,
    )


@pytest.fixture(scope="module")
def stopped_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], list[str], Any]:
    """A log stopped twice before the end of its input (two writer sessions: two generations of index
    files), the per-key results and dead letters of a failure-free run, and what `cec inspect --json`
    says of the stopped log."""
    root = tmp_path_factory.mktemp("damage")
    run_job(_spec(root / "ref"))
    reference = SqliteQueueStore(root / "ref")
    spec = _spec(root / "log")
    run_job(spec, max_inputs=300)
    run_job(spec, max_inputs=300)
    return (
        root / "log",
        per_key(results(reference, "agg")),
        sorted(map(repr, results(reference, "agg", Kind.DEAD))),
        _inspected(SqliteQueueStore(root / "log")),
    )


def _inspected(store: SqliteQueueStore) -> Any:
    """What `cec inspect --json` prints."""
    return inspection.topic_json("agg", inspection.inspect_topic(store, "agg"))


def _index_matches_log(store: SqliteQueueStore) -> None:
    with store.reader("agg", 0) as reader:
        metas = [r.meta for r in reader.scan_forward(0)]
        end = reader.end_offset()
    closed = {m.key: m.seq for m in metas if m.kind == "R" and m.key is not None}
    with StreamIndex(store.index_path("agg", 0), "agg/0", read_only=True) as index:
        assert index.next_offset == end
        assert dict(index.closed_windows()) == closed


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@seed(SEED)
@given(plan=damages())
def test_a_resumed_run_on_a_damaged_store_is_exact_or_one_clear_error(
    stopped_log: tuple[Path, dict[str, Any], list[str], Any], scratch: Path, plan: list[Damage]
) -> None:
    base, want_results, want_dead, want_inspect = stopped_log
    root = _fresh_dir(scratch) / "log"
    shutil.copytree(base, root)
    store = SqliteQueueStore(root)
    log, index = root / "agg" / "0.sqlite", store.index_path("agg", 0)
    done = _applied(plan, log, index)
    # Read-only first, as `cec inspect` reads it: the log as it was, or one clear error.
    try:
        inspected = _inspected(store)
    except Exception as error:
        _assert_clear(error, done, log)
        event(f"inspect: clear error, after {_label(done)}")
    else:
        assert inspected == want_inspect, _label(done)
        event(f"inspect: as before, after {_label(done)}")
    warnings = _Warnings()
    logging.getLogger("queuestore.index").addHandler(warnings)
    try:
        run_job(_spec(root))
        got = per_key(results(store, "agg")), sorted(map(repr, results(store, "agg", Kind.DEAD)))
    except Exception as error:
        _assert_clear(error, done, log)
        event(f"run: clear error ({type(error).__name__}) after {_label(done)}")
        return
    finally:
        logging.getLogger("queuestore.index").removeHandler(warnings)
    rebuilt = [m for m in warnings.messages if "rebuilding it from the log" in m]
    assert len(rebuilt) <= 1, rebuilt
    assert got == (want_results, want_dead), _label(done)
    _index_matches_log(store)
    event(f"run: exact{' (index rebuilt)' if rebuilt else ''} after {_label(done)}")


# -- the CLI: cec inspect, then cec run again on the same --store-dir -----------------------------------------


def _run_args(data: Path, store: Path, results_path: Path) -> list[str]:
    return [
        "run",
        str(data),
        "--key",
        "k",
        "--value",
        "v",
        "--window-count",
        "4",
        "--results",
        str(results_path),
        "--store-dir",
        str(store),
        "--quiet",
    ]


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str, bytes, str]:
    """(input, store, topic, results CSV, `cec inspect --json`) of one finished `cec run`."""
    root = tmp_path_factory.mktemp("cli-damage")
    rng = random.Random(5)
    data = root / "in.csv"
    data.write_text("k,v\n" + "".join(f"k{rng.randrange(300)},{rng.randrange(100)}\n" for _ in range(1500)))
    out = cec(*_run_args(data, root / "store", root / "results.csv"))
    assert out.returncode == 0, out.stderr
    (topic,) = [p.name for p in (root / "store").iterdir() if p.is_dir() and p.name.startswith("run-")]
    inspected = cec("inspect", topic, "--json", "--store-dir", str(root / "store"))
    assert inspected.returncode == 0, inspected.stderr
    return data, root / "store", topic, (root / "results.csv").read_bytes(), inspected.stdout


def _assert_clear_line(
    out: subprocess.CompletedProcess[str], done: list[tuple[Damage, Path]], log: Path
) -> None:
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("cec: error: "), lines[0]
    assert any(d.target == "log" for d, _ in done), f"damage to the index alone must be repaired: {lines[0]}"
    assert str(log) in lines[0], lines[0]


@settings(
    max_examples=max(4, EXAMPLES // 3),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@seed(SEED)
@given(plan=damages())
def test_cec_inspect_and_run_again_on_a_damaged_store_are_exact_or_one_clear_line(
    cli_run: tuple[Path, Path, str, bytes, str], scratch: Path, plan: list[Damage]
) -> None:
    data, base, topic, want_results, want_inspect = cli_run
    here = _fresh_dir(scratch)
    store = here / "store"
    shutil.copytree(base, store)
    log, index = store / topic / "0.sqlite", store / "index" / f"{topic}.0.rocksdb"
    done = _applied(plan, log, index)

    inspected = cec("inspect", topic, "--json", "--store-dir", str(store))
    if inspected.returncode == 0:
        assert not inspected.stderr, inspected.stderr
        assert json.loads(inspected.stdout) == json.loads(want_inspect), _label(done)
        event(f"inspect: as before, after {_label(done)}")
    else:
        _assert_clear_line(inspected, done, log)
        event(f"inspect: one line, after {_label(done)}")

    again = here / "again.csv"
    rerun = cec(*_run_args(data, store, again))
    if rerun.returncode == 0:
        assert not rerun.stderr, rerun.stderr
        assert again.read_bytes() == want_results, _label(done)
        event(f"run again: exact, after {_label(done)}")
    else:
        _assert_clear_line(rerun, done, log)
        assert not again.exists(), "a failed run must leave no results file"
        event(f"run again: one line, after {_label(done)}")
