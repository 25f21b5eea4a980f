"""The EC cache (design S0): a restart on the same host loads the eventual checkpoint kept beside the
stream index and reads only the log's tail forward, exactly; a damaged cache, one behind or ahead of the
log, or one from another log is detected and the log is read back instead (never trusted blindly), and the
cache is written again from there. Real processes are SIGKILLed, with three input partitions."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options, Rdict

from operators.job import JobSpec, run_job
from queuestore.ec_cache import pack_row, unpack_row
from queuestore.sqlite import SqliteQueueStore
from tests.helpers import per_key, results, start_worker

TUPLES = 40_000


def _spec(root: Path, *, seed: int = 7, ec_cache: bool = True) -> JobSpec:
    return JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "sum",
            "window_count": 6,
        },
        source={
            "type": "generator",
            "count": TUPLES,
            "keys": 300,
            "seed": seed,
            "partitions": 3,
            "invalid_every": 41,
            "interleave": 13,
        },
        # A kill after n tuples loses at most this many appended records (the writer's back-pressure): the
        # killed log holds what about n tuples produced, and the EC cache followed it (the default, 32,768,
        # is twice this whole log: a kill could find nothing durable yet).
        store={"type": "sqlite", "root": str(root), "max_outstanding": 512},
        output_topic="agg",
        checkpointing={"u_target": 2000, "ci_ms": 20, "cp_ms": 40},
        batch_size=64,
        ec_cache=ec_cache,
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("ref")
    run_job(_spec(root, ec_cache=False))
    return per_key(results(SqliteQueueStore(root), "agg"))


def _kill(spec: JobSpec, tmp_path: Path, at: int) -> None:
    proc = start_worker(spec, tmp_path / f"spec-{at}.json", faults=f"runtime.after_input:{at}")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]


def _cache_path(root: Path) -> Path:
    return SqliteQueueStore(root).ec_cache_path("agg", 0)


def _log_end(root: Path) -> int:
    with SqliteQueueStore(root).reader("agg", 0) as reader:
        return reader.end_offset()


def test_a_restart_with_the_cache_reads_only_the_tail_and_is_exact(
    tmp_path: Path, reference: dict[str, list[dict[str, Any]]]
) -> None:
    root = tmp_path / "store"
    spec = _spec(root)
    _kill(spec, tmp_path, 12_000)  # the cache lags the log by what the killed run's last poll left
    end = _log_end(root)
    stats = run_job(spec, max_inputs=8_000)
    rec = stats.recovery
    assert rec is not None
    assert rec.ec_source == "cache", rec.ec_cache_note
    assert rec.records_read < rec.extent_records  # the tail forward, not the extent back
    assert rec.log_end == end
    _kill(spec, tmp_path, 9_000)  # and again, from the cache this restart went on writing
    stats = run_job(spec)
    rec = stats.recovery
    assert rec is not None and stats.completed
    assert rec.ec_source == "cache", rec.ec_cache_note
    assert rec.records_read < rec.extent_records
    assert per_key(results(SqliteQueueStore(root), "agg")) == reference


def _flip_one_cached_value(path: Path) -> str:
    db = Rdict(str(path), Options(raw_mode=True))
    try:
        it = db.iter()
        it.seek(b"P")
        key = bytes(it.key())
        offset, kind, t, window_key, seq, value = unpack_row(bytes(it.value()))
        it = None
        damaged = value[:-3] + bytes([value[-3] ^ 0x40]) + value[-2:]
        db[key] = pack_row((offset, kind, t, window_key, seq, damaged))
    finally:
        db.close()
    return key[1:].decode()


def test_a_damaged_cache_value_is_detected_and_the_log_read_back(
    tmp_path: Path, reference: dict[str, list[dict[str, Any]]]
) -> None:
    root = tmp_path / "store"
    spec = _spec(root)
    _kill(spec, tmp_path, 15_000)
    run_job(spec, max_inputs=3_000)  # writes the cache (from the log)
    _flip_one_cached_value(_cache_path(root))
    stats = run_job(spec, max_inputs=3_000)
    rec = stats.recovery
    assert rec is not None and rec.ec_source == "log"
    assert rec.ec_cache_note == "the EC cache holds a damaged value"
    stats = run_job(spec)  # the cache was written again from the log: trusted once more
    assert stats.recovery is not None and stats.recovery.ec_source == "cache"
    assert per_key(results(SqliteQueueStore(root), "agg")) == reference


def test_damaged_cache_files_are_never_an_error(
    tmp_path: Path, reference: dict[str, list[dict[str, Any]]]
) -> None:
    root = tmp_path / "store"
    spec = _spec(root)
    _kill(spec, tmp_path, 15_000)
    run_job(spec, max_inputs=3_000)
    for file in _cache_path(root).iterdir():
        if file.suffix == ".sst" or file.name.startswith("MANIFEST"):
            data = bytearray(file.read_bytes())
            data[len(data) // 2] ^= 0xFF
            file.write_bytes(bytes(data))
    for file in _cache_path(root).iterdir():
        if file.suffix == ".log":  # the write-ahead log: a torn or damaged batch ends what it holds
            data = bytearray(file.read_bytes())
            if data:
                data[len(data) // 2] ^= 0xFF
                file.write_bytes(bytes(data))
    stats = run_job(spec)  # whatever RocksDB makes of it: the cache checked out, or the log read back
    rec = stats.recovery
    assert rec is not None and stats.completed
    assert per_key(results(SqliteQueueStore(root), "agg")) == reference


def test_a_cache_behind_the_log_reads_the_tail_and_one_ahead_of_it_is_refused(
    tmp_path: Path, reference: dict[str, list[dict[str, Any]]]
) -> None:
    root = tmp_path / "store"
    spec = _spec(root)
    _kill(spec, tmp_path, 10_000)
    run_job(spec, max_inputs=2_000)
    behind = tmp_path / "behind"
    shutil.copytree(_cache_path(root), behind)  # the cache as of now
    run_job(spec, max_inputs=5_000)  # the log goes on
    shutil.rmtree(_cache_path(root))
    shutil.copytree(behind, _cache_path(root))  # the older cache: behind the log by 5,000 tuples' records
    stats = run_job(spec, max_inputs=2_000)
    rec = stats.recovery
    assert rec is not None and rec.ec_source == "cache"
    assert rec.records_read > 1_000  # the whole tail the older cache had not seen, read forward
    ahead = tmp_path / "ahead"
    shutil.copytree(_cache_path(root), ahead)
    # The log cut back (a store restored from an older copy): a cache ahead of it is refused.
    shutil.rmtree(root)
    _kill(spec, tmp_path, 6_000)
    shutil.rmtree(_cache_path(root), ignore_errors=True)
    shutil.copytree(ahead, _cache_path(root))
    stats = run_job(spec)
    rec = stats.recovery
    assert rec is not None and rec.ec_source == "log"
    assert "ahead of the log" in rec.ec_cache_note
    assert per_key(results(SqliteQueueStore(root), "agg")) == reference


def test_a_cache_from_another_log_is_refused(
    tmp_path: Path, reference: dict[str, list[dict[str, Any]]]
) -> None:
    other_root = tmp_path / "other"
    other = _spec(other_root, seed=8)
    run_job(other, max_inputs=8_000)  # a shorter log of another input, same topic name
    root = tmp_path / "store"
    spec = _spec(root)
    _kill(spec, tmp_path, 20_000)
    shutil.rmtree(_cache_path(root), ignore_errors=True)
    shutil.copytree(_cache_path(other_root), _cache_path(root))
    stats = run_job(spec)
    rec = stats.recovery
    assert rec is not None and rec.ec_source == "log"
    assert "is not the log's record at offset" in rec.ec_cache_note
    assert per_key(results(SqliteQueueStore(root), "agg")) == reference
