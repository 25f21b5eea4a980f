"""The EC cache (design S0): a restart on the same host loads the eventual checkpoint kept beside the
stream index (one snapshot file, `queuestore.ec_cache`) and reads only the log's tail forward, exactly; a
SIGKILL while a snapshot is written leaves the old one; a damaged snapshot (its checksum), one with a
damaged value, one behind or ahead of the log, or one of another log or partition is detected and the log
is read back instead (never trusted blindly), and the cache is written again from there. Real processes
are SIGKILLed, with three input partitions."""

from __future__ import annotations

import logging
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from operators.job import JobSpec, run_job
from queuestore.ec_cache import decode_snapshot, encode_snapshot
from queuestore.sqlite import SqliteQueueStore
from tests.helpers import per_key, results, start_worker

TUPLES = 40_000
IDENTITY = "agg/0"


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


def _kill(spec: JobSpec, tmp_path: Path, at: int, faults: str | None = None) -> None:
    proc = start_worker(spec, tmp_path / f"spec-{at}.json", faults=faults or f"runtime.after_input:{at}")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]


def _cache_path(root: Path) -> Path:
    return SqliteQueueStore(root).ec_cache_path("agg", 0)


def _log_end(root: Path) -> int:
    with SqliteQueueStore(root).reader("agg", 0) as reader:
        return reader.end_offset()


def _leftovers(root: Path) -> list[Path]:
    path = _cache_path(root)
    return [p for p in path.parent.iterdir() if p.name.startswith(f"{path.name}.tmp-")]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "queuestore.ec_cache" and r.levelno >= logging.WARNING
    ]


def test_a_restart_with_the_cache_reads_only_the_tail_and_is_exact(
    tmp_path: Path, reference: dict[str, list[dict[str, Any]]]
) -> None:
    root = tmp_path / "store"
    spec = _spec(root)
    _kill(spec, tmp_path, 12_000)  # the snapshot lags the log by what was applied since the last one
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


def test_a_clean_close_leaves_a_snapshot_with_no_tail(tmp_path: Path) -> None:
    root = tmp_path / "store"
    spec = _spec(root)
    run_job(spec, max_inputs=10_000)
    parts, last, next_offset = decode_snapshot(_cache_path(root).read_bytes(), IDENTITY)
    assert next_offset == _log_end(root) and last is not None and last[0] == next_offset - 1
    stats = run_job(spec, max_inputs=1_000)
    rec = stats.recovery
    assert rec is not None and rec.ec_source == "cache" and rec.records_read == 0
    assert rec.ec_windows == len(parts)


@pytest.mark.parametrize("snapshot", [1, 4])
def test_a_sigkill_while_a_snapshot_is_written_leaves_the_old_one_and_the_restart_is_exact(
    tmp_path: Path, reference: dict[str, list[dict[str, Any]]], snapshot: int
) -> None:
    """The first snapshot: none is left, the log is read back. A later one: the one before it is left
    whole and used, with a longer tail."""
    root = tmp_path / "store"
    spec = _spec(root)
    _kill(spec, tmp_path, 0, faults=f"ec_cache.mid_snapshot:{snapshot}")
    assert _leftovers(root), "the kill was not inside a snapshot's write"
    if snapshot == 1:
        assert not _cache_path(root).exists()
    else:
        decode_snapshot(_cache_path(root).read_bytes(), IDENTITY)  # the old snapshot, whole
    stats = run_job(spec)
    rec = stats.recovery
    assert rec is not None and stats.completed
    if snapshot == 1:
        assert rec.ec_source == "log" and rec.ec_cache_note == "no EC cache"
    else:
        assert rec.ec_source == "cache", rec.ec_cache_note
        assert rec.records_read > 0
    assert not _leftovers(root)  # the torn temporary file was removed, never read
    assert per_key(results(SqliteQueueStore(root), "agg")) == reference


@pytest.mark.parametrize(
    ("where", "note"),
    [
        (0, "not an EC cache snapshot"),
        (10, "holds"),  # the body's length
        (-1, "fails its checksum"),
        (None, "fails its checksum"),  # the middle
    ],
)
def test_a_damaged_snapshot_is_found_by_its_checksum_said_in_one_line_and_rebuilt(
    tmp_path: Path,
    reference: dict[str, list[dict[str, Any]]],
    caplog: pytest.LogCaptureFixture,
    where: int | None,
    note: str,
) -> None:
    root = tmp_path / "store"
    spec = _spec(root)
    _kill(spec, tmp_path, 15_000)
    run_job(spec, max_inputs=3_000)  # a clean close: a whole snapshot
    path = _cache_path(root)
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if where is None else where
    data[at] ^= 0x5A
    path.write_bytes(bytes(data))
    caplog.set_level(logging.WARNING, logger="queuestore.ec_cache")
    stats = run_job(spec, max_inputs=3_000)
    rec = stats.recovery
    assert rec is not None and rec.ec_source == "log"
    assert rec.ec_cache_note.startswith("the EC cache is not used: ") and note in rec.ec_cache_note
    assert "\n" not in rec.ec_cache_note
    said = _warnings(caplog)
    assert len(said) == 1 and note in said[0] and "\n" not in said[0], said
    stats = run_job(spec)  # the cache was written again from the log: trusted once more
    rec = stats.recovery
    assert rec is not None and rec.ec_source == "cache", rec.ec_cache_note
    assert per_key(results(SqliteQueueStore(root), "agg")) == reference


def test_a_damaged_value_under_a_good_checksum_is_refused(
    tmp_path: Path, reference: dict[str, list[dict[str, Any]]]
) -> None:
    """The snapshot's checksum is not the only check: each value's own checksum is verified too (a
    snapshot written from a damaged value would pass its own)."""
    root = tmp_path / "store"
    spec = _spec(root)
    _kill(spec, tmp_path, 15_000)
    run_job(spec, max_inputs=3_000)
    path = _cache_path(root)
    parts, last, next_offset = decode_snapshot(path.read_bytes(), IDENTITY)
    key = next(iter(parts))
    offset, kind, t, window_key, seq, value = parts[key]
    parts[key] = (offset, kind, t, window_key, seq, value[:-3] + bytes([value[-3] ^ 0x40]) + value[-2:])
    path.write_bytes(encode_snapshot(IDENTITY, next_offset, last, parts))
    stats = run_job(spec, max_inputs=3_000)
    rec = stats.recovery
    assert rec is not None and rec.ec_source == "log"
    assert rec.ec_cache_note == "the EC cache holds a damaged value"
    stats = run_job(spec)
    assert stats.recovery is not None and stats.recovery.ec_source == "cache"
    assert per_key(results(SqliteQueueStore(root), "agg")) == reference


@pytest.mark.parametrize("damage", ["empty", "cut", "garbage", "directory"])
def test_unreadable_cache_files_are_never_an_error(
    tmp_path: Path, reference: dict[str, list[dict[str, Any]]], damage: str
) -> None:
    root = tmp_path / "store"
    spec = _spec(root)
    _kill(spec, tmp_path, 15_000)
    path = _cache_path(root)
    data = path.read_bytes()
    path.unlink()
    if damage == "directory":  # e.g. what an older version left at the path
        path.mkdir()
        (path / "CURRENT").write_bytes(b"MANIFEST-000001\n")
    else:
        path.write_bytes(
            {"empty": b"", "cut": data[: len(data) * 2 // 3], "garbage": bytes(range(256)) * 9}[damage]
        )
    stats = run_job(spec)
    rec = stats.recovery
    assert rec is not None and stats.completed
    assert rec.ec_source == "log" and rec.ec_cache_note
    assert per_key(results(SqliteQueueStore(root), "agg")) == reference


def test_a_cache_behind_the_log_reads_the_tail_and_one_ahead_of_it_is_refused(
    tmp_path: Path, reference: dict[str, list[dict[str, Any]]]
) -> None:
    root = tmp_path / "store"
    spec = _spec(root)
    _kill(spec, tmp_path, 10_000)
    run_job(spec, max_inputs=2_000)
    behind = tmp_path / "behind"
    shutil.copyfile(_cache_path(root), behind)  # the cache as of now
    run_job(spec, max_inputs=5_000)  # the log goes on
    shutil.copyfile(behind, _cache_path(root))  # the older cache: behind the log by 5,000 tuples' records
    stats = run_job(spec, max_inputs=2_000)
    rec = stats.recovery
    assert rec is not None and rec.ec_source == "cache"
    assert rec.records_read > 1_000  # the whole tail the older cache had not seen, read forward
    ahead = tmp_path / "ahead"
    shutil.copyfile(_cache_path(root), ahead)
    # The log cut back (a store restored from an older copy): a cache ahead of it is refused.
    shutil.rmtree(root)
    _kill(spec, tmp_path, 6_000)
    shutil.copyfile(ahead, _cache_path(root))
    stats = run_job(spec)
    rec = stats.recovery
    assert rec is not None and rec.ec_source == "log"
    assert "ahead of the log" in rec.ec_cache_note
    assert per_key(results(SqliteQueueStore(root), "agg")) == reference


def test_a_cache_from_another_log_or_partition_is_refused(
    tmp_path: Path, reference: dict[str, list[dict[str, Any]]]
) -> None:
    other_root = tmp_path / "other"
    other = _spec(other_root, seed=8)
    run_job(other, max_inputs=8_000)  # a shorter log of another input, same topic name
    root = tmp_path / "store"
    spec = _spec(root)
    _kill(spec, tmp_path, 20_000)
    shutil.copyfile(_cache_path(other_root), _cache_path(root))
    stats = run_job(spec, max_inputs=2_000)
    rec = stats.recovery
    assert rec is not None and rec.ec_source == "log"
    assert "is not the log's record at offset" in rec.ec_cache_note
    # This log's own cache, but labelled as another partition's: refused before anything else is read.
    parts, last, next_offset = decode_snapshot(_cache_path(root).read_bytes(), IDENTITY)
    _cache_path(root).write_bytes(encode_snapshot("agg/1", next_offset, last, parts))
    stats = run_job(spec)
    rec = stats.recovery
    assert rec is not None and rec.ec_source == "log"
    assert rec.ec_cache_note == "the EC cache is not used: the snapshot is of 'agg/1', not 'agg/0'"
    assert per_key(results(SqliteQueueStore(root), "agg")) == reference
