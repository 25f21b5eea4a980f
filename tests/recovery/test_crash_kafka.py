"""Exact recovery with the output log on Kafka, several input partitions that drift apart, and SIGKILLs of a
real operator process: mid-run, during the replay that recovers from it, and right after the next EC build.
The log a recovering run leaves when it is killed is whatever prefix the producer had made durable, so
this is the multi-partition recovery-of-a-recovery case on a real broker."""

from __future__ import annotations

import itertools
import signal
from pathlib import Path

import pytest

from cec.records import Kind
from operators.job import JobSpec, run_job
from queuestore.kafka import KafkaQueueStore
from queuestore.sqlite import SqliteQueueStore
from tests.brokers import Broker
from tests.helpers import log_records, per_key, results, start_worker


def _spec(store: dict[str, object], partitions: int, topic: str) -> JobSpec:
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
            "count": 100_000,
            "keys": 300,
            "seed": 5,
            "partitions": partitions,
            "invalid_every": 50,
            "interleave": 17,
        },
        store=store,
        output_topic=topic,
        batch_size=64,
    )


@pytest.mark.parametrize("partitions", [2, 3])
def test_sigkill_mid_run_and_during_recovery_on_kafka(
    kafka_broker: Broker, tmp_path: Path, partitions: int
) -> None:
    topic = f"crash-{partitions}-{tmp_path.name[-20:]}".replace("_", "-")
    run_job(_spec({"type": "sqlite", "root": str(tmp_path / "ref")}, partitions, "agg"))
    ref = SqliteQueueStore(tmp_path / "ref")
    want = results(ref, "agg")

    spec = _spec(
        {
            "type": "kafka",
            "bootstrap_servers": kafka_broker.bootstrap,
            "state_dir": str(tmp_path / "state"),
            # Small transactions, and few records in flight: what a killed run leaves is close to what it
            # produced (the writer is asynchronous; without a bound a loaded machine may leave it far behind).
            "commit_records": 40,
            "max_outstanding": 512,
        },
        partitions,
        topic,
    )
    # First kill mid-run, at the 40,000th of 100,000 input tuples (a SIGKILL the process sends itself:
    # an outside kill on a log-size condition landed after the run's end on a quiet machine, where the
    # whole run takes about a second). The log then holds whatever prefix the producer made durable,
    # which must be a real one; then kills inside the replay that recovers from it, and after the next
    # EC build.
    checker = KafkaQueueStore(kafka_broker.bootstrap, tmp_path / "check")
    proc = start_worker(spec, tmp_path / "spec.json", faults="runtime.after_input:40000")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    with checker.reader(topic, 0) as reader:
        assert reader.end_offset() >= 1500, "the killed run left less than 1,500 records in its log"
    for faults in ("runtime.replaying:150", "recovery.after_ec_build:1"):
        proc = start_worker(spec, tmp_path / "spec.json", faults=faults)
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == -signal.SIGKILL, (faults, err.decode()[-2000:])
    proc = start_worker(spec, tmp_path / "spec.json")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err.decode()[-3000:]

    store = checker
    try:
        got = results(store, topic)
        assert per_key(got) == per_key(want)
        assert len(got) == len(want)
        records = log_records(store, topic)
        kinds = [r.kind for r in records]
        assert kinds.count(Kind.EOS) == 1 and kinds[-1] is Kind.EOS
        for before, after in itertools.pairwise(records):
            assert all(a >= b for a, b in zip(after.pos, before.pos, strict=True))
    finally:
        store.close()
