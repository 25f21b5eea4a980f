"""What only a broker with Kafka's own semantics shows, checked on it (Apache Kafka in CI; skipped on the
Tansu fallback, which has neither, DESIGN-NOTES section 4):

- records of a transaction that a SIGKILLed `cec run` left open are aborted by the restarted run and never
  reach a read_committed reader, of the output log or of `--results-topic`;
- `--trim-every` deletes the head of the output log with `delete_records` (the broker's log start moves),
  and `cec inspect`, `cec state --as-of` and recovery work on the trimmed log, results exact;
- an input topic whose retention dropped records a recovery must replay is refused when the run starts
  again, with one line, never read with a gap.

Fencing of an older writer process by a newer one: tests/queuestore/kafka/test_kafka_store.py
(`test_older_writer_process_is_fenced`).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, OffsetSpec

from operators.job import aggregate_operator
from queuestore.kafka.errors import settles_if_asked_again
from tests.brokers import Broker
from tests.cec.test_cli_topic import (
    PARTITIONS,
    WINDOW,
    _new_topic,
    cec,
    csv_reference,
    per_key,
    read_results_topic,
    results_topic_per_key,
    topic_run,
)
from tests.cec.test_state_as_of import _stopped_run_state
from tests.helpers import child_env, wait_for
from tests.topic_data import as_json, encoded, end_aware_consumer, make_purchases, produce, write_csv

pytestmark = pytest.mark.kafka_transactions

_DEADLINE_S = 60.0
Positions = set[tuple[int, int]]


def _positions(bootstrap: str, topic: str, isolation: str) -> Positions:
    """(partition, offset) of every record a consumer with `isolation` reads from the whole topic."""
    consumer = end_aware_consumer(bootstrap, isolation)
    try:
        partitions = len(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        seen: Positions = set()
        at_end: set[int] = set()
        deadline = time.monotonic() + _DEADLINE_S
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"no end of {topic} within {_DEADLINE_S}s"
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                at_end.add(msg.partition())  # type: ignore[arg-type]
                continue
            at_end.discard(msg.partition())  # type: ignore[arg-type]
            seen.add((msg.partition(), msg.offset()))  # type: ignore[arg-type]
        return seen
    finally:
        consumer.close()


def _offsets(bootstrap: str, topic: str, spec: OffsetSpec) -> list[int]:
    """Asked again on a retriable answer: on a loaded machine a leader may not be known yet
    (NOT_LEADER_FOR_PARTITION), which says nothing about the offsets."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = len(admin.list_topics(topic, timeout=30).topics[topic].partitions)
    request = {TopicPartition(topic, p): spec for p in range(partitions)}

    answers: list[list[int]] = []

    def answered() -> bool:
        try:
            futures = admin.list_offsets(request, request_timeout=30)
            answers.append([futures[tp].result().offset for tp in request])
            return True
        except KafkaException as exc:
            if settles_if_asked_again(exc):
                return False
            raise

    wait_for(answered, _DEADLINE_S, interval=0.1)
    return answers[0]


def _output_topic() -> str:
    return f"out-{uuid.uuid4().hex[:10]}"


def test_a_transaction_a_killed_run_left_open_never_reaches_read_committed_readers(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    """`cec run --input-topic --results-topic` SIGKILLed inside a commit: its records and results are
    delivered, the transaction is open. The restarted run aborts it (init_transactions) and recovers; a
    read_committed reader of the output log or of the results topic sees none of those records, though
    they are in both topics, and reads each result exactly once."""
    purchases = make_purchases(6_000, keys=60, partitions=PARTITIONS, seed=5)
    topic = _new_topic(kafka_broker, "purchases-killed-txn")
    produce(kafka_broker.bootstrap, topic, encoded(purchases, as_json))
    output, results_topic = _output_topic(), f"results-{uuid.uuid4().hex[:10]}"
    args = (
        "--output-topic",
        output,
        "--results-topic",
        results_topic,
        "--store-dir",
        str(tmp_path / "store"),
        "--trim-every",
        "0",  # on by default with --results-topic: a trim would delete the aborted records checked below
    )
    # Commits by record count, not by the wall clock: the fifth commit exists however fast the machine is.
    killed = topic_run(
        kafka_broker,
        topic,
        tmp_path / "out.csv",
        *args,
        faults="kafka.before_commit:5",
        env={"CEC_KAFKA_COMMIT_INTERVAL": "3600", "CEC_KAFKA_COMMIT_RECORDS": "200"},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr

    open_records: dict[str, Positions] = {}
    for name in (output, results_topic):
        # The open transaction holds back read_committed readers at its first record: everything past
        # that is the killed run's (one writer per partition), delivered and uncommitted.
        open_records[name] = _positions(kafka_broker.bootstrap, name, "read_uncommitted") - _positions(
            kafka_broker.bootstrap, name, "read_committed"
        )
        assert open_records[name], f"the kill left no delivered record uncommitted in {name}"

    again = topic_run(kafka_broker, topic, tmp_path / "out.csv", *args)
    assert again.returncode == 0, again.stdout + again.stderr
    want = csv_reference(tmp_path, purchases)
    assert per_key(tmp_path / "out.csv") == want
    assert results_topic_per_key(read_results_topic(kafka_broker.bootstrap, results_topic)) == want
    for name, left_open in open_records.items():
        assert left_open <= _positions(kafka_broker.bootstrap, name, "read_uncommitted")  # still there
        assert not left_open & _positions(kafka_broker.bootstrap, name, "read_committed"), name


def _kill_after(n: int) -> str:
    return f"runtime.after_input:{n}"


def _inspect(broker: Broker, output: str, store: Path) -> dict[str, Any]:
    out = cec("inspect", output, "--json", "--bootstrap-servers", broker.bootstrap, "--store-dir", str(store))
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def test_trimming_deletes_the_head_and_the_trimmed_log_inspects_answers_and_recovers(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    """`--trim-every` on Apache Kafka: `delete_records` moves the broker's log start of every output
    partition while the run goes on. The run is SIGKILLed then; on that trimmed log `cec inspect` reports
    the log start and the crash point, `cec state --as-of` a point past the log start equals the state of
    a run stopped there, and the restarted run recovers from it with results equal to the reference.
    Failed before on Kafka: the stream index was written only at the end of a run, so the log was never
    trimmed while it ran; and a backward read reaching below the log start came back empty, so the
    trimmed log looked empty to `cec inspect` and to recovery."""
    # Every partition is trimmed once its log is a few trim intervals past the results writer's commit
    # interval (a due point every 2,000 records, at which the operator waits for the writer to be within
    # 12,000 offsets): counts, not the machine's pace, so long before the input ends. Measured: every
    # partition trimmed by ~25,000-30,000 inputs (its log at ~11,000-12,500 records); 80,000 a partition
    # leave the outside kill over 50,000 inputs of slack (480,000 before: six times what it needs).
    purchases = make_purchases(240_000, keys=40, partitions=PARTITIONS, seed=11)
    topic = _new_topic(kafka_broker, "purchases-trim")
    produce(kafka_broker.bootstrap, topic, encoded(purchases, as_json))
    output, store = _output_topic(), tmp_path / "store"
    args = ("--output-topic", output, "--store-dir", str(store), "--trim-every", "2000", "--U", "40")
    run = [
        str(Path(sys.executable).parent / "cec"), "run", "--input-topic", topic, "--bootstrap-servers",
        kafka_broker.bootstrap, "--key", "item", "--value", "price", *WINDOW, "--agg", "avg",
        "--results", str(tmp_path / "out.csv"), *args,
    ]  # fmt: skip
    proc = subprocess.Popen(run, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def trimmed() -> bool:
        starts = _offsets(kafka_broker.bootstrap, output, OffsetSpec.earliest())
        return len(starts) == PARTITIONS and min(starts) > 0

    try:
        # The log is trimmed up to what the results writer acknowledged (every 10,000 log offsets).
        wait_for(lambda: proc.poll() is not None or trimmed(), timeout=240, interval=0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=_DEADLINE_S)
    assert proc.returncode == -signal.SIGKILL, (
        f"the run ended before its log was trimmed: {err.decode()[-2000:]}"
    )

    log_starts = _offsets(kafka_broker.bootstrap, output, OffsetSpec.earliest())
    doc = _inspect(kafka_broker, output, store)
    for part, log_start in zip(doc["partitions"], log_starts, strict=True):
        # The first record kept (a transaction marker may stand at the log start itself).
        assert log_start <= part["start_offset"] < part["end_offset"], (part, log_start)
        assert part["crash_pos"] is not None and part["extent"] > 0, part
    k = min(p["crash_pos"][0] for p in doc["partitions"]) - 1

    spec = aggregate_operator("item", "price", "avg", window_count=5)
    rows = [r for r in purchases if r[0] == 0]  # the state of partition 0's windows is checked
    want_state = _stopped_run_state(tmp_path, write_csv(tmp_path / "p0.csv", rows), spec, k)
    got = cec(
        "state", output, "--as-of", f"pos:{k}", "--bootstrap-servers", kafka_broker.bootstrap,
        "--store-dir", str(store),
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    windows = json.loads(got.stdout)["windows"]
    assert {(w["key"], w["window"]): w["state"] for w in windows if w["partition"] == 0} == want_state
    assert want_state

    again = topic_run(kafka_broker, topic, tmp_path / "out.csv", *args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert per_key(tmp_path / "out.csv") == csv_reference(tmp_path, purchases)
    after = _offsets(kafka_broker.bootstrap, output, OffsetSpec.earliest())
    assert all(a >= b for a, b in zip(after, log_starts, strict=True)), (after, log_starts)


def test_input_retention_shorter_than_the_replay_is_refused_when_the_run_starts_again(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    """The input topic's retention drops what a killed run's recovery must replay (the broker's own
    retention, not a stand-in): the restarted run stops with one line naming topic, partition and
    offsets, before it writes anything; nothing is read with a gap."""
    purchases = make_purchases(6_000, keys=40, partitions=PARTITIONS, seed=13)
    topic = _new_topic(kafka_broker, "purchases-retention")
    produce(kafka_broker.bootstrap, topic, encoded(purchases, as_json))
    results = tmp_path / "out.csv"
    args = ("--store-dir", str(tmp_path / "store"))
    killed = topic_run(kafka_broker, topic, results, *args, faults=_kill_after(2_000))
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr

    ends = _offsets(kafka_broker.bootstrap, topic, OffsetSpec.latest())
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    retention = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET)],
    )
    for future in admin.incremental_alter_configs([retention]).values():
        future.result(30)
    # The broker deletes on its retention check (every second here): every record is past 1 ms.
    wait_for(
        lambda: _offsets(kafka_broker.bootstrap, topic, OffsetSpec.earliest()) == ends,
        timeout=_DEADLINE_S,
        interval=0.2,
    )
    before = results.read_bytes() if results.exists() else b""

    again = topic_run(kafka_broker, topic, results, *args)
    assert again.returncode == 2, again.stdout + again.stderr
    assert "Traceback" not in again.stderr
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "cec: error: input retention shorter than the replay needs: "
    ), again.stderr
    assert f"topic {topic!r} partition" in lines[0]
    assert (results.read_bytes() if results.exists() else b"") == before
