"""`cec recover --dry-run` (cec/dry_run.py): says what the next recovery does, and changes nothing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from operators.job import JobSpec, run_job
from tests.conftest import StoreBackend
from tests.helpers import cec


def _spec(backend: StoreBackend, topic: str) -> JobSpec:
    # Two input partitions drifting apart (interleave), one instance: a replay start per input partition.
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
            "count": 20_000,
            "keys": 150,
            "seed": 9,
            "partitions": 2,
            "interleave": 4,
        },
        store=backend.spec,
        output_topic=topic,
        checkpointing={"u_target": 400, "ci_ms": 20, "cp_ms": 40},
        batch_size=16,
    )


def _snapshot(backend: StoreBackend, topic: str) -> dict[str, str]:
    """Every byte the store and its local state hold (files by content hash), plus, on Kafka, every record
    of the partition with its offset."""
    files = {}
    for path in sorted(backend.root.rglob("*")):
        if not path.is_file():
            continue
        if path.name.endswith("-shm") or (path.name.endswith("-wal") and path.stat().st_size == 0):
            # SQLite's shared-memory index and an empty WAL: any reader of a WAL database opens them (a
            # read-only connection cannot remove them again); they hold no record.
            continue
        files[str(path.relative_to(backend.root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    if backend.name == "kafka":
        store = backend()
        with store.reader(topic, 0) as reader:
            for record in reader.scan_forward(0):
                files[f"kafka:{record.offset}"] = hashlib.sha256(record.value).hexdigest()
    return files


def _args(backend: StoreBackend) -> list[str]:
    args = ["--store-dir", str(backend.root)]
    if backend.bootstrap:
        args += ["--bootstrap-servers", backend.bootstrap]
    return args


def test_dry_run_predicts_the_recovery_and_changes_nothing(store_backend: StoreBackend) -> None:
    topic = store_backend.topic("dry")
    spec = _spec(store_backend, topic)
    run_job(spec, max_inputs=9_000)  # stopped mid-input: the log a crash there leaves
    before = _snapshot(store_backend, topic)

    out = cec("recover", "--dry-run", topic, "--json", *_args(store_backend))
    assert out.returncode == 0, out.stderr
    (plan,) = json.loads(out.stdout)["partitions"]
    assert _snapshot(store_backend, topic) == before  # not a byte, not an offset
    text = cec("recover", "--dry-run", topic, *_args(store_backend))
    assert text.returncode == 0 and "replay: from" in text.stdout and "estimated recovery:" in text.stdout
    assert _snapshot(store_backend, topic) == before

    # No lock left behind: a writer takes the partition at once.
    store = store_backend()
    store.writer(topic, 0).close()

    assert len(plan["crash_pos"]) == 2 and len(plan["replay_start"]) == 2
    assert plan["replay_tuples"] == sum(
        c - s for s, c in zip(plan["replay_start"], plan["crash_pos"], strict=True)
    )
    assert not plan["finished"] and plan["estimated_seconds"] > 0

    # What the real recovery then does is what the dry run said.
    stats = run_job(spec, max_inputs=0)
    assert stats.recovery is not None
    rec = stats.recovery
    assert list(rec.crash_pos) == plan["crash_pos"]
    assert list(rec.replay_start) == plan["replay_start"]
    assert rec.ec_windows == plan["ec_windows"]
    assert rec.extent_records == plan["extent"]
    assert rec.replay_span == plan["replay_tuples"]


def test_dry_run_mistakes_are_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    cases = {
        ("recover", "t", "--store-dir", str(missing)): "only --dry-run is supported",
        ("recover", "--dry-run", "t", "--store-dir", str(missing)): f"store dir {missing} does not exist",
        ("recover", "--dry-run", "t", "--store-dir", str(tmp_path)): "no topic 't'",
    }
    for args, message in cases.items():
        out = cec(*args)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr, out.stderr
    assert not missing.exists()
