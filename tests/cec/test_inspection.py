"""`cec inspect` (cec/inspection.py) as a user calls it, on the embedded store and on Kafka."""

from __future__ import annotations

import json
from pathlib import Path

from cec.inspection import KIND_NAMES, inspect_topic
from operators.job import JobSpec, instance_spec, run_job
from tests.conftest import StoreBackend
from tests.helpers import cec


def _two_partition_log(backend: StoreBackend, topic: str, sizes: tuple[int, int] = (900, 300)) -> None:
    """An aggregate over a two-partition generator, each instance bounded differently, so the partitions
    hold different kind counts."""
    template = JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "avg",
            "window_count": 5,
        },
        source={"type": "generator", "count": 2000, "keys": 40, "seed": 3, "partitions": 2},
        store=backend.spec,
        output_topic=topic,
        output_partitions=2,
        batch_size=1,
    )
    for p, size in enumerate(sizes):
        run_job(instance_spec(template, p), max_inputs=size)


def _store_args(backend: StoreBackend) -> list[str]:
    args = ["--store-dir", str(backend.root)]
    if backend.name == "kafka":
        assert backend.bootstrap is not None
        args += ["--bootstrap-servers", backend.bootstrap]
    return args


def test_json_has_the_contract_names_and_per_partition_counts(store_backend: StoreBackend) -> None:
    topic = store_backend.topic("insp")
    _two_partition_log(store_backend, topic)
    out = cec("inspect", topic, "--json", *_store_args(store_backend))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert set(doc) == {"topic", "partitions"} and doc["topic"] == topic
    parts = doc["partitions"]
    assert [p["partition"] for p in parts] == [0, 1]
    for p in parts:
        assert set(p) == {"partition", "start_offset", "end_offset", "counts", "n", "extent", "crash_pos"}
        assert set(p["counts"]) == set(KIND_NAMES)
        assert p["start_offset"] == 0
        assert p["crash_pos"] is not None and len(p["crash_pos"]) == 1
    # Each partition's own counts: the longer-running instance produced more of every kind it produced.
    # (a crash point is the newest record's pos: the last tuples may have produced no record)
    assert 800 < parts[0]["crash_pos"][0] <= 900 and 200 < parts[1]["crash_pos"][0] <= 300
    assert parts[0]["counts"]["R"] > parts[1]["counts"]["R"] > 0
    assert parts[0]["counts"]["EOS"] == parts[1]["counts"]["EOS"] == 0
    # The same figures as the library's own scan, partition by partition.
    store = store_backend()
    for p, summary in zip(parts, inspect_topic(store, topic), strict=True):
        assert p == summary.as_json()
        assert sum(p["counts"].values()) > 0
        if store_backend.name == "sqlite":  # dense offsets: every record counted once
            assert sum(p["counts"].values()) == p["end_offset"]


def test_text_lines_show_each_partition_its_own_counts(tmp_path: Path) -> None:
    backend = StoreBackend("sqlite", tmp_path / "store")
    _two_partition_log(backend, "agg")
    out = cec("inspect", "agg", "--store-dir", str(backend.root))
    assert out.returncode == 0, out.stderr
    first = [line for line in out.stdout.splitlines() if line.startswith("agg[")]
    assert len(first) == 2 and first[0].split(":", 2)[2] != first[1].split(":", 2)[2]


def test_list_names_every_topic_first_on_its_line(store_backend: StoreBackend) -> None:
    topics = sorted(store_backend.topic("lst") for _ in range(2))
    for topic in topics:
        _two_partition_log(store_backend, topic, (50, 20))
    out = cec("inspect", "--list", *_store_args(store_backend))
    assert out.returncode == 0, out.stderr
    listed = [line.split("\t")[0] for line in out.stdout.splitlines()]
    for topic in topics:
        assert topic in listed
        assert f"{topic}\t2 partition(s)" in out.stdout.splitlines()
    assert not any(name.startswith("cec-meta.") for name in listed)  # attachments are not topics


def test_missing_store_dir_is_one_line_and_never_created(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-store"
    for args in (["some-topic"], ["--list"], ["some-topic", "--json"]):
        out = cec("inspect", *args, "--store-dir", str(missing))
        assert out.returncode == 2
        assert out.stderr.strip() == f"cec: error: store dir {missing} does not exist"
        assert "Traceback" not in out.stderr
        assert not missing.exists()


def test_user_mistakes_are_one_line(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    store = tmp_path / "store"
    _two_partition_log(StoreBackend("sqlite", store), "agg", (10, 10))
    cases = {
        ("inspect", "agg", "--store-dir", str(a_file)): f"store dir {a_file} is not a directory",
        ("inspect", "nope", "--store-dir", str(store)): "no topic 'nope'",
        ("inspect", "--store-dir", str(store)): "give a TOPIC to inspect, or --list",
        ("inspect", "agg", "--list", "--store-dir", str(store)): "give a TOPIC to inspect, or --list",
        ("inspect", "agg"): "give --store-dir DIR",
    }
    for args, message in cases.items():
        out = cec(*args)
        assert out.returncode == 2, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr, (args, out.stderr)


def test_version_comes_from_the_installed_package() -> None:
    from importlib.metadata import version

    from cec.cli import DISTRIBUTION

    out = cec("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"cec {version(DISTRIBUTION)}" and DISTRIBUTION == "cec-stream"


def test_every_package_ships_py_typed() -> None:
    import importlib.resources

    for package in ("cec", "queuestore", "operators", "recovery"):
        assert importlib.resources.files(package).joinpath("py.typed").is_file(), package
