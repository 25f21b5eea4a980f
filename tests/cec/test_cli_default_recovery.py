"""Bounded recovery by default (issue 25): `cec run` given no --Q/--U/--recovery-target still G-checks, so
a restart after a SIGKILL replays at most about U = `cec.config.DEFAULT_U_TARGET` input tuples per
partition, even when a few keys stay open from the first offset to the end; `--gopen-only` turns that off
(the replay then reaches back to the first offset). The figures are the run's own report lines; the
results are the same either way."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

from cec.config import DEFAULT_U_TARGET
from tests.brokers import Broker
from tests.helpers import cec
from tests.topic_data import create_topic, produce

PARTITIONS = 2
PER_PARTITION = 150_000
CRASH_AFTER = 140_000
LONG_LIVED = 3  # keys of each partition seen only at its first offsets: their windows never close
# A G-check is made between input batches, so the replay may pass U by up to a batch of the source.
BATCH_SLACK = 5_000
_REPLAYED = re.compile(r"replay: +from \[(\d+)\] to crash point \[(\d+)\]: ([\d,]+) tuples replayed")


def _values() -> list[tuple[int, bytes | None, bytes | None]]:
    values: list[tuple[int, bytes | None, bytes | None]] = []
    for p in range(PARTITIONS):
        values.extend(
            (p, None, json.dumps({"item": f"long-{p}-{i}", "price": 1}).encode()) for i in range(LONG_LIVED)
        )
        values.extend(
            (p, None, json.dumps({"item": f"k{p}-{i % 997}", "price": i % 100}).encode())
            for i in range(PER_PARTITION - LONG_LIVED)
        )
    return values


def _run(broker: Broker, topic: str, results: Path, *extra: str) -> list[tuple[int, int, int]]:
    """Run to the end, each partition's operator SIGKILLed after CRASH_AFTER records and recovered; each
    partition's recovery as (replay start, crash point, tuples replayed), from the report. The crash point
    is what was durable at the kill, which on a loaded machine can be well below CRASH_AFTER."""
    out = cec(
        "run", "--input-topic", topic, "--bootstrap-servers", broker.bootstrap, "--format", "json",
        "--key", "item", "--value", "price", "--window-count", "10", "--results", str(results),
        "--crash-after", str(CRASH_AFTER), "--quiet", *extra, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    replayed = [
        (int(m.group(1)), int(m.group(2)), int(m.group(3).replace(",", "")))
        for m in _REPLAYED.finditer(out.stdout)
    ]
    assert len(replayed) == PARTITIONS and all(count for _, _, count in replayed), out.stdout
    return replayed


def test_a_restart_replays_at_most_the_default_bound(kafka_broker: Broker, tmp_path: Path) -> None:
    # Two topics of the same records: on Kafka a run's output log is named after its input topic.
    topics = [f"long-lived-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    for topic in topics:
        create_topic(kafka_broker.bootstrap, topic, PARTITIONS)
        produce(kafka_broker.bootstrap, topic, _values())

    bounded = _run(kafka_broker, topics[0], tmp_path / "default.csv", "--store-dir", str(tmp_path / "a"))
    assert all(count <= DEFAULT_U_TARGET + BATCH_SLACK for _, _, count in bounded), bounded
    # Where more than U was durable, the G-checks moved the long-lived keys' footprints off the first offsets.
    assert all(start > LONG_LIVED for start, crash, _ in bounded if crash > DEFAULT_U_TARGET + BATCH_SLACK), (
        bounded
    )

    unbounded = _run(
        kafka_broker, topics[1], tmp_path / "gopen.csv", "--store-dir", str(tmp_path / "b"), "--gopen-only"
    )
    # Without G-checks the long-lived keys' G-opens at the first offsets are the replay start.
    assert all(start <= LONG_LIVED for start, _, _ in unbounded), unbounded
    assert (tmp_path / "default.csv").read_bytes() == (tmp_path / "gopen.csv").read_bytes()


def test_gopen_only_with_a_target_is_one_line(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    data.write_text("item,price\na,1\n")
    out = cec(
        "run", str(data), "--key", "item", "--value", "price", "--window-count", "2",
        "--results", str(tmp_path / "out.csv"), "--gopen-only", "--U", "10",
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr == (
        "cec: error: --gopen-only writes no G-checks: give it without --Q, --U and --recovery-target\n"
    )
