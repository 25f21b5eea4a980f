"""`cec run --input-topic` end to end, as a user calls it, on the fixture's broker: topics written by
plain confluent-kafka producers give, per key, the results of the same records in a CSV."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.brokers import Broker
from tests.faultproxy import FaultProxy
from tests.helpers import cec, child_env, wait_for
from tests.topic_data import (
    PURCHASE_AVSC,
    as_json,
    avro_body,
    create_topic,
    encoded,
    make_purchases,
    produce,
    write_csv,
)

PARTITIONS = 3
WINDOW = ["--window-count", "5"]


def per_key(path: Path) -> dict[str, list[tuple[str, str, str]]]:
    out: dict[str, list[tuple[str, str, str]]] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            out.setdefault(row["key"], []).append((row["window"], row["value"], row["count"]))
    return out


def csv_reference(tmp_path: Path, purchases: list[tuple[int, dict[str, Any]]], *extra: str) -> dict[str, Any]:
    data = write_csv(tmp_path / "purchases.csv", purchases)
    out = cec(
        "run",
        str(data),
        "--key",
        "item",
        "--value",
        "price",
        *WINDOW,
        *extra,
        "--results",
        str(tmp_path / "ref.csv"),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    ref = per_key(tmp_path / "ref.csv")
    assert sum(len(v) for v in ref.values()) > 100
    return ref


def topic_run(
    broker: Broker,
    topic: str,
    results: Path,
    *extra: str,
    faults: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return cec(
        "run", "--input-topic", topic, "--bootstrap-servers", broker.bootstrap, "--key", "item", "--value", "price",
        *WINDOW, "--agg", "avg", "--results", str(results), *extra, faults=faults,
        env=None if env is None else {**child_env(faults), **env},
    )  # fmt: skip


class OutputLogProbe:
    """How many records partition 0 of a run's output log holds, asked from the test (one reader kept
    open: its end scans start where the previous one ended); a topic this new may have no leader yet on
    Apache Kafka, which counts as nothing logged yet."""

    def __init__(self, broker: Broker, output: str, state_dir: Path) -> None:
        from queuestore.kafka import KafkaQueueStore

        self.output = output
        self._store = KafkaQueueStore(broker.bootstrap, state_dir)
        self._reader: Any = None

    def logged(self) -> int:
        from queuestore.exceptions import QueueStoreError

        if self._reader is None:
            if not self._store.topic_exists(self.output):
                return 0
            self._reader = self._store.reader(self.output, 0)
        try:
            return int(self._reader.end_offset())
        except QueueStoreError:
            return 0

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._store.close()


def start_topic_run(
    broker: Broker, topic: str, results: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """`topic_run` in the background, to be killed, stopped or stalled from outside."""
    script = Path(sys.executable).parent / "cec"
    return subprocess.Popen(
        [str(script), "run", "--input-topic", topic, "--bootstrap-servers", broker.bootstrap, "--key", "item",
         "--value", "price", *WINDOW, "--results", str(results), *extra],
        env={**child_env(), **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_until_logged(proc: subprocess.Popen[str], probe: OutputLogProbe, records: int) -> None:
    """Wait until the run's log holds `records` records (or the run ended: the caller checks which)."""
    try:
        wait_for(lambda: proc.poll() is not None or probe.logged() >= records, timeout=120, interval=0.01)
    finally:
        probe.close()


@pytest.fixture
def purchases() -> list[tuple[int, dict[str, Any]]]:
    return make_purchases(1500, keys=40, partitions=PARTITIONS)


def _new_topic(broker: Broker, prefix: str) -> str:
    topic = f"{prefix}-{uuid.uuid4().hex[:10]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    return topic


@pytest.fixture(scope="module")
def long_input(kafka_broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """A topic of 60,000 purchases (~20,000 a partition: a run is still going when its log holds 1,000
    records, to be stopped or stalled from outside) and its results per key (the same rows in a CSV).
    Only read by the tests that use it, each with an output topic and a store of its own: one topic
    and one reference run serve them all."""
    purchases = make_purchases(60_000, keys=300, partitions=PARTITIONS)
    topic = _new_topic(kafka_broker, "purchases-long")
    produce(kafka_broker.bootstrap, topic, encoded(purchases, as_json))
    return topic, csv_reference(tmp_path_factory.mktemp("long-input"), purchases)


@pytest.mark.parametrize("fmt", ["json", "avro"])
@pytest.mark.parametrize("crash", [False, True], ids=["no-crash", "crash-after"])
def test_topic_equals_the_same_records_in_a_csv(
    kafka_broker: Broker, tmp_path: Path, purchases: list[tuple[int, dict[str, Any]]], fmt: str, crash: bool
) -> None:
    topic = _new_topic(kafka_broker, f"purchases-{fmt}")
    extra: list[str] = ["--format", fmt]
    if fmt == "json":
        produce(kafka_broker.bootstrap, topic, encoded(purchases, as_json))
    else:
        produce(kafka_broker.bootstrap, topic, encoded(purchases, avro_body))
        avsc = tmp_path / "purchase.avsc"
        avsc.write_text(json.dumps(PURCHASE_AVSC))
        extra += ["--schema", str(avsc)]
    if crash:
        extra += ["--crash-after", "230"]
    out = topic_run(kafka_broker, topic, tmp_path / "out.csv", *extra)
    assert out.returncode == 0, out.stdout + out.stderr
    assert per_key(tmp_path / "out.csv") == csv_reference(tmp_path, purchases)
    assert f"{PARTITIONS} partition(s)" in out.stdout
    if crash:
        # Each partition's process is killed (where its log then ends depends on what the producer had
        # made durable: the test above kills once the log holds records), restarted, and recovers.
        assert out.stdout.count("operator process SIGKILLed after 230 input records") == PARTITIONS


def test_sigkill_mid_run_and_during_recovery_then_a_restart_stops_where_the_first_run_would(
    kafka_broker: Broker, tmp_path: Path
) -> None:

    purchases = make_purchases(90_000, keys=300, partitions=PARTITIONS)
    topic = _new_topic(kafka_broker, "purchases-kill")
    produce(kafka_broker.bootstrap, topic, encoded(purchases, as_json))
    store, results, output = tmp_path / "store", tmp_path / "out.csv", f"out-{uuid.uuid4().hex[:10]}"
    args = ("--store-dir", str(store), "--output-topic", output)
    # First kill right after the run's third Kafka transaction commit: records of it are durable in the
    # log (a fault site on the operator's path could fire before anything is, the producer delivers in
    # the background) and the run is early in its input whatever the machine's pace. A kill from outside
    # once the log held 1,000 records came, on a fast quiet machine, after the whole bounded input had been
    # processed: the restart found the log complete and had nothing to replay.
    first = topic_run(kafka_broker, topic, results, *args, faults="kafka.after_commit:3")
    assert first.returncode == -signal.SIGKILL, first.stdout + first.stderr
    # Records that arrive after the run first started are not part of this bounded run.
    produce(kafka_broker.bootstrap, topic, encoded(make_purchases(3000, 300, PARTITIONS, seed=3), as_json))
    second = topic_run(kafka_broker, topic, results, *args, faults="runtime.replaying:1")
    assert second.returncode == -signal.SIGKILL, second.stdout + second.stderr  # killed while replaying
    third = topic_run(kafka_broker, topic, results, *args)
    assert third.returncode == 0, third.stdout + third.stderr
    assert per_key(results) == csv_reference(tmp_path, purchases)


class _MockRegistry(BaseHTTPRequestHandler):
    """A local stand-in for a Confluent Schema Registry (127.0.0.1): GET /schemas/ids/{id} only, which
    is all a consumer's client asks for."""

    schemas: dict[int, str] = {}

    def do_GET(self) -> None:
        parts = self.path.split("?")[0].strip("/").split("/")
        schema = (
            self.schemas.get(int(parts[2]))
            if parts[:2] == ["schemas", "ids"] and parts[2].isdigit()
            else None
        )
        if schema is None:
            body, status = {"error_code": 40403, "message": "Schema not found"}, 404
        else:
            body, status = {"schema": schema}, 200
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def mock_registry() -> Iterator[str]:
    _MockRegistry.schemas = {7: json.dumps(PURCHASE_AVSC)}
    server = HTTPServer(("127.0.0.1", 0), _MockRegistry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_registry_wire_format_through_the_registry_client(
    kafka_broker: Broker, tmp_path: Path, purchases: list[tuple[int, dict[str, Any]]], mock_registry: str
) -> None:
    # A real registry when the environment names one is not available here: the client talks HTTP to a
    # local mock registry (see _MockRegistry).
    topic = _new_topic(kafka_broker, "purchases-registry")
    records = encoded(purchases, lambda rec: struct.pack(">bI", 0, 7) + avro_body(rec))
    records.append((1, b"x", struct.pack(">bI", 0, 99) + avro_body(purchases[0][1])))  # unknown schema id
    produce(kafka_broker.bootstrap, topic, records)
    out = topic_run(
        kafka_broker, topic, tmp_path / "out.csv", "--format", "registry", "--schema-registry", mock_registry
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert per_key(tmp_path / "out.csv") == csv_reference(tmp_path, purchases)
    with (tmp_path / "out.dead-letters.csv").open(newline="") as f:
        dead = list(csv.DictReader(f))
    assert [(d["partition"], d["reason"]) for d in dead] == [("1", "schema id 99 is not in the registry")]


def test_bad_records_are_dead_letters_with_partition_offset_and_reason(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    topic = _new_topic(kafka_broker, "purchases-bad")
    good = make_purchases(1000, keys=10, partitions=PARTITIONS)
    records = encoded(good, as_json)
    bad: list[tuple[int, bytes | None, bytes | None]] = [
        (0, b"k", b"not json at all"),
        (1, b"k", as_json({"item": "item1", "ts": 1})),
        (2, None, as_json({"item": None, "price": 1.0, "ts": 2})),
        (0, b"k", avro_body(good[0][1])),
    ]
    records[500:500] = bad
    produce(kafka_broker.bootstrap, topic, records)
    out = topic_run(kafka_broker, topic, tmp_path / "out.csv", "--format", "json")
    assert out.returncode == 0, out.stdout + out.stderr
    assert per_key(tmp_path / "out.csv") == csv_reference(tmp_path, good)
    with (tmp_path / "out.dead-letters.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    dead = sorted((d["partition"], d["reason"].split(":")[0]) for d in rows)
    # A dead letter keeps the record's value as it was read, not a re-encoding of what was decoded.
    assert sorted(d["raw"] for d in rows) == sorted(
        value.decode("utf-8", "backslashreplace") for _, _, value in bad if value is not None
    )
    assert dead == [
        ("0", "not JSON"),
        ("0", "not JSON"),
        ("1", "missing field 'price'"),
        ("2", "null field 'item'"),
    ]
    assert "dead letters: 4 records not processed" in out.stdout


def _dead_letters(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _bad_json_run(
    broker: Broker, tmp_path: Path, bad: list[bytes], *extra: str
) -> tuple[list[tuple[int, dict[str, Any]]], str, subprocess.CompletedProcess[str]]:
    """Good purchases with `bad` (one after another, in partition 0, so that one poll reads them together)
    among them: the good ones, the topic, the run's output."""
    topic = _new_topic(broker, "purchases-hostile")
    good = make_purchases(1200, keys=12, partitions=PARTITIONS)
    records = encoded(good, as_json)
    records[600:600] = [(0, b"item0", value) for value in bad]
    produce(broker.bootstrap, topic, records)
    return good, topic, topic_run(broker, topic, tmp_path / "out.csv", "--format", "json", *extra)


@pytest.mark.parametrize("c_decoder", [True, False], ids=["c-scanner", "python"])
def test_records_that_are_not_one_json_value_each_are_dead_letters_never_other_values(
    kafka_broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, c_decoder: bool
) -> None:
    """Joined with commas into one array (the old batch decoder), these three records read as three
    purchases of item0 (1000, 2000, 3000): not one of them is a JSON value by itself."""
    if not c_decoder:
        monkeypatch.setenv("CEC_NO_NATIVE", "1")
    bad = [
        b'{"item": "item0", "price": 1000.0, "ts": 1}, {"item": "item0", "price": 2000.0, "ts": 2}',
        b'{"item": "item0", "price": 3000.0, "ts": 3, "note": "',  # cut inside a string...
        b'"}',  # ...and the record holding its tail
    ]
    good, _topic, out = _bad_json_run(kafka_broker, tmp_path, bad)
    assert out.returncode == 0, out.stdout + out.stderr
    assert per_key(tmp_path / "out.csv") == csv_reference(tmp_path, good)
    dead = _dead_letters(tmp_path / "out.dead-letters.csv")
    assert sorted(d["raw"] for d in dead) == sorted(value.decode() for value in bad)
    assert all(d["partition"] == "0" and d["reason"].startswith("not JSON: ") for d in dead), dead
    assert "dead letters: 3 records not processed" in out.stdout


def test_poison_json_records_are_dead_letters_through_crashes_and_reruns(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    """Records that made a traceback at every restart (RecursionError; a lone surrogate in the key, which
    UTF-8 cannot hold) are dead letters with a reason; a run killed and recovered replays them as such."""
    bad = [
        b'{"item": "item0", "price": 1.0, "ts": 1, "deep": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"item": "item0", "price": 1.0, "ts": 2, "deep": ' + b'{"a": ' * 1500 + b"1" + b"}" * 1500 + b"}",
        b'{"item": "\\ud800", "price": 1.0, "ts": 3}',
        b'{"item": "item0\\udfff", "price": 1.0, "ts": 4}',
        b'{"item": "item0", "price": 1.0, "ts": 5, "note": "\\udc00 in a field the run never reads"}',
        b'{"item": "item0", "price": NaN, "ts": 6}',
    ]
    args = ("--store-dir", str(tmp_path / "store"), "--crash-after", "300")
    good, topic, out = _bad_json_run(kafka_broker, tmp_path, bad, *args)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert out.stdout.count("operator process SIGKILLed after 300 input records") == PARTITIONS
    want = csv_reference(tmp_path, good)
    assert per_key(tmp_path / "out.csv") == want
    dead = _dead_letters(tmp_path / "out.dead-letters.csv")
    lone = "holds a lone surrogate (not text; UTF-8 cannot hold it)"
    assert sorted(d["reason"] for d in dead) == [
        "not JSON: NaN is not a JSON number",
        "not JSON: nested deeper than 512 levels",
        "not JSON: nested deeper than 512 levels",
        f"not JSON: string '\\ud800' {lone}",
        f"not JSON: string '\\udc00 in a field the run never reads' {lone}",
        f"not JSON: string 'item0\\udfff' {lone}",
    ]
    assert "dead letters: 6 records not processed" in out.stdout
    # Started again on its finished log: the same files, no crash loop.
    first = (tmp_path / "out.csv").read_bytes(), (tmp_path / "out.dead-letters.csv").read_bytes()
    again = topic_run(kafka_broker, topic, tmp_path / "out.csv", "--format", "json", *args[:2])
    assert again.returncode == 0, again.stdout + again.stderr
    assert ((tmp_path / "out.csv").read_bytes(), (tmp_path / "out.dead-letters.csv").read_bytes()) == first


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "avro"], "--format avro needs --schema FILE.avsc"),
        (["--format", "registry"], "--format registry needs --schema-registry URL"),
        (["--format", "csv"], "--format csv needs --columns"),
    ],
)
def test_topic_arguments_are_checked_with_one_line(
    kafka_broker: Broker, tmp_path: Path, args: list[str], message: str
) -> None:
    topic = _new_topic(kafka_broker, "purchases-args")
    out = topic_run(kafka_broker, topic, tmp_path / "out.csv", *args)
    assert out.returncode == 2
    assert out.stderr.startswith("cec: error: " + message) and out.stderr.count("\n") == 1, out.stderr


def test_missing_topic_is_one_line(kafka_broker: Broker, tmp_path: Path) -> None:
    out = topic_run(kafka_broker, f"missing-{uuid.uuid4().hex[:6]}", tmp_path / "out.csv")
    assert out.returncode == 2 and "does not exist" in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert not os.path.exists(tmp_path / "out.csv")


def test_follow_keeps_the_results_current_until_stopped_and_commits_lag_positions(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    topic = _new_topic(kafka_broker, "purchases-follow")
    first = make_purchases(900, keys=30, partitions=PARTITIONS)
    later = make_purchases(600, keys=30, partitions=PARTITIONS, seed=11)
    produce(kafka_broker.bootstrap, topic, encoded(first, as_json))
    (tmp_path / "ref1").mkdir()
    (tmp_path / "ref2").mkdir()
    want_first = csv_reference(tmp_path / "ref1", first)
    want_all = csv_reference(tmp_path / "ref2", first + later)
    results = tmp_path / "out.csv"
    script = Path(sys.executable).parent / "cec"
    proc = subprocess.Popen(
        [str(script), "run", "--input-topic", topic, "--bootstrap-servers", kafka_broker.bootstrap, "--key", "item",
         "--value", "price", *WINDOW, "--results", str(results), "--store-dir", str(tmp_path / "store"), "--follow"],
        env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(
            lambda: proc.poll() is None and results.exists() and per_key(results) == want_first, timeout=120
        )
        produce(kafka_broker.bootstrap, topic, encoded(later, as_json))  # after the run started: followed
        wait_for(lambda: proc.poll() is None and per_key(results) == want_all, timeout=120)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert per_key(results) == want_all
    group = out.split("lag in consumer group ")[1].split()[0]
    monitor = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": group})
    try:
        committed = monitor.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)
    finally:
        monitor.close()
    ends = [sum(1 for p, _ in first + later if p == q) for q in range(PARTITIONS)]
    assert [tp.offset for tp in committed] == ends


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--value", "cost"], "missing field 'cost'"),
        (["--time", "item"], "field 'item' is not a time"),
        (["--format", "csv", "--columns", "item,price,ts"], "is not a number"),
    ],
    ids=["field", "time", "format"],
)
def test_a_wrong_field_or_format_is_refused_from_the_first_records_before_the_run(
    kafka_broker: Broker, tmp_path: Path, extra: list[str], message: str
) -> None:
    topic = _new_topic(kafka_broker, "purchases-peek")
    produce(
        kafka_broker.bootstrap, topic, encoded(make_purchases(300, keys=10, partitions=PARTITIONS), as_json)
    )
    out = topic_run(kafka_broker, topic, tmp_path / "out.csv", "--store-dir", str(tmp_path / "st"), *extra)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("cec: error: none of the first") and out.stderr.count("\n") == 1, out.stderr
    assert message in out.stderr
    assert not (tmp_path / "out.csv").exists() and out.stdout == ""


def read_results_topic(
    bootstrap: str, topic: str, enough: int | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """Every committed record of a results topic, as a consumer that knows nothing of cec reads it: a
    plain read_committed consumer, to the end of every partition (or until it has `enough` records)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,  # Tansu holds every fetch for the full wait
        }
    )
    try:
        meta = consumer.list_topics(timeout=30).topics.get(topic)
        if meta is None or not meta.partitions:
            return []  # not created yet
        partitions = len(meta.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        rows: list[tuple[str, dict[str, Any]]] = []
        at_end: set[int] = set()

        def drained() -> bool:
            msg = consumer.poll(0.2)
            if msg is None:
                return False
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                at_end.add(msg.partition())
                return len(at_end) == partitions
            at_end.discard(msg.partition())
            rows.append((msg.key().decode(), json.loads(msg.value())))
            return enough is not None and len(rows) >= enough

        wait_for(drained, timeout=60, interval=0)
        return rows
    finally:
        consumer.close()


def results_topic_per_key(rows: list[tuple[str, dict[str, Any]]]) -> dict[str, list[tuple[str, str, str]]]:
    """The results topic in the results CSV's shape (key -> [(window, value, count)]), after checking
    that every record is keyed by its window key and that no (key, window) occurs twice."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    seen: set[tuple[str, int]] = set()
    for key, row in rows:
        assert key == row["key"], (key, row)
        assert (key, row["window"]) not in seen, f"result {key} window {row['window']} published twice"
        seen.add((key, row["window"]))
        out.setdefault(key, []).append((str(row["window"]), repr(float(row["value"])), str(row["count"])))
    return out


@pytest.mark.kafka_transactions
def test_results_topic_holds_each_result_once_through_crash_after(
    kafka_broker: Broker, tmp_path: Path, purchases: list[tuple[int, dict[str, Any]]]
) -> None:
    topic = _new_topic(kafka_broker, "purchases-results")
    produce(kafka_broker.bootstrap, topic, encoded(purchases, as_json))
    results_topic = f"results-{uuid.uuid4().hex[:10]}"
    out = topic_run(
        kafka_broker, topic, tmp_path / "out.csv", "--results-topic", results_topic, "--crash-after", "230"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("operator process SIGKILLed after 230 input records") == PARTITIONS
    want = csv_reference(tmp_path, purchases)
    assert per_key(tmp_path / "out.csv") == want
    assert results_topic_per_key(read_results_topic(kafka_broker.bootstrap, results_topic)) == want


@pytest.mark.kafka_transactions
def test_results_topic_holds_each_result_once_through_an_outside_sigkill(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    purchases = make_purchases(150_000, keys=300, partitions=PARTITIONS)
    topic = _new_topic(kafka_broker, "purchases-results-kill")
    produce(kafka_broker.bootstrap, topic, encoded(purchases, as_json))
    results_topic = f"results-{uuid.uuid4().hex[:10]}"
    results = tmp_path / "out.csv"
    args = ("--store-dir", str(tmp_path / "store"), "--results-topic", results_topic)
    script = Path(sys.executable).parent / "cec"
    proc = subprocess.Popen(
        [str(script), "run", "--input-topic", topic, "--bootstrap-servers", kafka_broker.bootstrap, "--key", "item",
         "--value", "price", *WINDOW, "--results", str(results), *args],
        env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        # Killed once results are committed to the results topic, mid-run (its records are few next to
        # the log's, so a read of it is cheap enough to poll).
        wait_for(
            lambda: (
                proc.poll() is not None
                or len(read_results_topic(kafka_broker.bootstrap, results_topic, enough=300)) >= 300
            ),
            timeout=120,
            interval=0.05,
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run ended before 300 results were committed"
    want = csv_reference(tmp_path, purchases)
    before = read_results_topic(kafka_broker.bootstrap, results_topic)
    assert 300 <= len(before) < sum(len(v) for v in want.values())
    again = topic_run(kafka_broker, topic, results, *args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert per_key(results) == want
    assert results_topic_per_key(read_results_topic(kafka_broker.bootstrap, results_topic)) == want


def test_results_topic_on_the_embedded_store_is_one_line(tmp_path: Path) -> None:
    data = write_csv(tmp_path / "purchases.csv", make_purchases(50, keys=5, partitions=1))
    out = cec(
        "run", str(data), "--key", "item", "--value", "price", *WINDOW, "--results", str(tmp_path / "out.csv"),
        "--results-topic", "results",
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.startswith("cec: error: --results-topic needs --bootstrap-servers"), out.stderr
    assert out.stderr.count("\n") == 1, out.stderr


def test_an_error_inside_a_crash_after_worker_is_one_line(kafka_broker: Broker, tmp_path: Path) -> None:
    # The registry is reached only by the operator processes (the first record's schema id), so the error
    # is raised inside a --crash-after worker; the CLI must not add a line or a traceback of its own.
    topic = _new_topic(kafka_broker, "purchases-registry-down")
    purchases = make_purchases(60, keys=6, partitions=PARTITIONS)
    produce(
        kafka_broker.bootstrap, topic, encoded(purchases, lambda r: struct.pack(">bI", 0, 7) + avro_body(r))
    )
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        registry = f"http://127.0.0.1:{closed.getsockname()[1]}"
    out = topic_run(
        kafka_broker, topic, tmp_path / "out.csv", "--format", "registry", "--schema-registry", registry,
        "--crash-after", "5",
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    ours = [line for line in out.stderr.splitlines() if not line.startswith("%")]  # librdkafka's own log
    assert len(ours) == 1 and ours[0].startswith(f"cec: error: schema registry {registry} unreachable"), (
        out.stderr
    )
    assert "Traceback" not in out.stderr


@pytest.mark.kafka_transactions
def test_results_topic_of_a_csv_run_on_kafka(
    kafka_broker: Broker, tmp_path: Path, purchases: list[tuple[int, dict[str, Any]]]
) -> None:
    data = write_csv(tmp_path / "purchases.csv", purchases)
    results_topic = f"results-{uuid.uuid4().hex[:10]}"
    out = cec(
        "run", str(data), "--key", "item", "--value", "price", *WINDOW, "--results", str(tmp_path / "out.csv"),
        "--bootstrap-servers", kafka_broker.bootstrap, "--results-topic", results_topic, "--crash-after", "700",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    want = per_key(tmp_path / "out.csv")
    assert want == csv_reference(tmp_path, purchases)
    assert results_topic_per_key(read_results_topic(kafka_broker.bootstrap, results_topic)) == want


def test_keys_follow_one_rule_and_are_never_merged(kafka_broker: Broker, tmp_path: Path) -> None:
    """JSON 5 and "5" are one key, as true and "true" are; "True", " k" and "k" are keys of their own; a
    float key is a dead letter. A message key that is not UTF-8 (`--key @key`) is a dead letter, never
    folded into the text key that spells its bytes."""
    topic = _new_topic(kafka_broker, "purchases-keys")
    keys: list[Any] = [5, "5", True, "true", "True", "True", " k", " k", "k", "k", 5.0]
    values = [(1, None, as_json({"item": k, "price": 1.0 + i})) for i, k in enumerate(keys * 2)]
    produce(kafka_broker.bootstrap, topic, values)
    out = cec(
        "run", "--input-topic", topic, "--bootstrap-servers", kafka_broker.bootstrap, "--key", "item",
        "--value", "price", "--window-count", "4", "--agg", "count", "--results", str(tmp_path / "out.csv"),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    got = per_key(tmp_path / "out.csv")
    # Partitions 0 and 2 hold every key twice over: "5" and "true" 4 tuples each (one window of 4);
    # "True", " k" and "k" 4 each too; nothing else.
    assert got == {k: [("0", "4", "4")] for k in ("5", "true", "True", " k", "k")}
    with (tmp_path / "out.dead-letters.csv").open(newline="", encoding="utf-8") as f:
        reasons = [row["reason"] for row in csv.DictReader(f)]
    assert (
        reasons == ["key 'item' is a floating-point number (5.0): a key is text, an integer or a boolean"] * 2
    )

    by_message_key = _new_topic(kafka_broker, "purchases-msgkeys")
    records = [(2, k, as_json({"price": 2.0})) for k in (b"\xff", b"\\xff") * 4]
    produce(kafka_broker.bootstrap, by_message_key, records)
    out = cec(
        "run", "--input-topic", by_message_key, "--bootstrap-servers", kafka_broker.bootstrap, "--key", "@key",
        "--value", "price", "--window-count", "4", "--agg", "count", "--results", str(tmp_path / "msg.csv"),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert per_key(tmp_path / "msg.csv") == {"\\xff": [("0", "4", "4")]}
    with (tmp_path / "msg.dead-letters.csv").open(newline="", encoding="utf-8") as f:
        dead = [row["reason"] for row in csv.DictReader(f)]
    assert dead == ["key '@key' is not valid UTF-8: b'\\xff'"] * 4


@pytest.mark.parametrize(
    ("signum", "trimmed"),
    [(signal.SIGTERM, False), (signal.SIGINT, True)],
    ids=["sigterm", "sigint-trimmed"],
)
def test_a_bounded_run_stopped_before_its_end_says_so_and_a_rerun_completes_it(
    kafka_broker: Broker, tmp_path: Path, long_input: tuple[str, dict[str, Any]], signum: int, trimmed: bool
) -> None:
    """A supervisor's SIGTERM (or Ctrl-C) to a bounded run: exit 128 + the signal, one line saying the input
    was not finished, no results file that reads as complete (a trimmed run's rows so far are in
    `out.csv.partial`); the same command again resumes from the log and completes exactly."""

    topic, want = long_input
    store, results, output = tmp_path / "store", tmp_path / "out.csv", f"out-{uuid.uuid4().hex[:10]}"
    args = [
        "--store-dir",
        str(store),
        "--output-topic",
        output,
        *(["--trim-every", "2000"] if trimmed else []),
    ]
    proc = start_topic_run(kafka_broker, topic, results, *args)
    try:
        wait_until_logged(proc, OutputLogProbe(kafka_broker, output, tmp_path / "check"), 1000)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signum, err
    name = signal.Signals(signum).name
    written = (
        f"the results so far are in {results}.partial (incomplete)"
        if trimmed
        else "no results file was written"
    )
    assert err == (
        f"cec: stopped by {name} before the end of the input: {written}; run the same command again to resume "
        "from its log\n"
    )
    assert not results.exists()
    assert Path(f"{results}.partial").exists() == trimmed
    again = topic_run(kafka_broker, topic, results, *args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert per_key(results) == want
    assert not Path(f"{results}.partial").exists()
    assert not Path(f"{results}.partial").with_name("out.dead-letters.csv.partial").exists()


@pytest.mark.parametrize("recreate", [False, True], ids=["deleted", "deleted-and-created-again"])
def test_deleting_the_input_topic_while_it_is_read_is_one_line(
    kafka_broker: Broker, tmp_path: Path, recreate: bool
) -> None:
    """A consumer of assigned partitions waits silently forever on a deleted topic (and on a topic created
    again, whose offsets start over): the source notices when nothing arrives and says what happened (a
    following run, so that nothing can finish it first)."""
    if kafka_broker.kind == "tansu":
        pytest.skip("Tansu's metadata for a deleted topic crashes librdkafka itself (docs/kafka.md)")
    from confluent_kafka.admin import AdminClient

    topic = _new_topic(kafka_broker, "purchases-deleted")
    produce(
        kafka_broker.bootstrap, topic, encoded(make_purchases(3000, keys=30, partitions=PARTITIONS), as_json)
    )
    store, output = tmp_path / "store", f"out-{uuid.uuid4().hex[:10]}"
    script = Path(sys.executable).parent / "cec"
    proc = subprocess.Popen(
        [str(script), "run", "--input-topic", topic, "--bootstrap-servers", kafka_broker.bootstrap, "--key", "item",
         "--value", "price", *WINDOW, "--results", str(tmp_path / "out.csv"), "--store-dir", str(store),
         "--output-topic", output, "--follow"],
        env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    probe = OutputLogProbe(kafka_broker, output, tmp_path / "check")
    try:
        # Reading: its output log has records (the results file may exist before: trimming is on by default
        # with --follow, and its results writer starts the file before the run reads anything).
        try:
            wait_for(lambda: proc.poll() is not None or probe.logged() > 0, timeout=120)
        finally:
            probe.close()
        assert proc.poll() is None, proc.communicate()
        admin.delete_topics([topic])[topic].result()
        if recreate:
            wait_for(lambda: topic not in admin.list_topics(timeout=30).topics, timeout=60)
            create_topic(kafka_broker.bootstrap, topic, PARTITIONS)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if " INFO cec.progress: " not in line]  # every 5 s
    assert len(lines) == 1 and lines[0].startswith(
        f"cec: error: the input topic {topic!r} was deleted "  # "while ..." or "and created again ..."
    ), err


@pytest.mark.kafka_transactions  # the fault proxy's broker is Apache Kafka
def test_kafka_config_reaches_every_kafka_client_of_the_run(
    fault_proxy: FaultProxy,
    proxied_broker: Broker,
    tmp_path: Path,
    purchases: list[tuple[int, dict[str, Any]]],
) -> None:
    """`--kafka-config FILE`: its properties go to every client the run makes (the input's consumer and
    admin, the output log's writers and readers, the results topic's), here a client.id that the proxy in
    front of the broker sees on every request; the results are those of a run without it."""
    topic = _new_topic(proxied_broker, "purchases-config")
    produce(proxied_broker.bootstrap, topic, encoded(purchases, as_json))
    config = tmp_path / "client.properties"
    config.write_text("# every client of the run\nclient.id = cfg-probe\nsocket.timeout.ms: 20000\n\n")
    out = cec(
        "run", "--input-topic", topic, "--bootstrap-servers", fault_proxy.address, "--key", "item", "--value",
        "price", *WINDOW, "--results", str(tmp_path / "out.csv"), "--results-topic", f"res-{topic}",
        "--store-dir", str(tmp_path / "store"), "--kafka-config", str(config),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert per_key(tmp_path / "out.csv") == csv_reference(tmp_path, purchases)
    assert set(fault_proxy.clients()) == {"cfg-probe"} and sum(fault_proxy.requests().values()) > 100
    assert fault_proxy.requests()["EndTxn"] > 0 and fault_proxy.requests()["Fetch"] > 0


def test_a_mistake_in_the_kafka_config_file_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SASL_SSL\nsasl.password\n")
    out = cec("inspect", "--list", "--bootstrap-servers", "127.0.0.1:1", "--kafka-config", str(config))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == f"cec: error: {config}:2: not a key=value line: 'sasl.password'\n"
    missing = cec(
        "inspect", "--list", "--bootstrap-servers", "127.0.0.1:1", "--kafka-config", str(tmp_path / "none")
    )
    assert missing.returncode == 2 and missing.stderr.startswith("cec: error: cannot read the Kafka client")
    assert missing.stderr.count("\n") == 1


def test_a_broker_that_stops_answering_is_one_line_and_a_rerun_completes(
    kafka_broker: Broker, tmp_path: Path, long_input: tuple[str, dict[str, Any]]
) -> None:
    """The broker stalls (SIGSTOP) mid-run for longer than the store waits: one line naming the broker and
    the way out, exit 2; once it answers again the same command completes exactly."""
    if kafka_broker.pid is None:
        pytest.skip("needs a broker process this test session started (to stall it)")

    topic, want = long_input
    store, results, output = tmp_path / "store", tmp_path / "out.csv", f"out-{uuid.uuid4().hex[:10]}"
    args = ["--store-dir", str(store), "--output-topic", output]
    proc = start_topic_run(kafka_broker, topic, results, *args, env={"CEC_KAFKA_REQUEST_TIMEOUT": "4"})
    stalled = False
    try:
        wait_until_logged(proc, OutputLogProbe(kafka_broker, output, tmp_path / "check"), 1000)
        assert proc.poll() is None, "the run ended before the broker could be stalled"
        os.kill(kafka_broker.pid, signal.SIGSTOP)
        stalled = True
        _, err = proc.communicate(timeout=300)
    finally:
        if stalled:
            os.kill(kafka_broker.pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 2, err
    lines = [line for line in err.strip().splitlines() if " INFO cec.progress: " not in line]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"cec: error: Kafka at {kafka_broker.bootstrap} did not answer for 4 s ("), err
    assert lines[0].endswith("run the same command again to resume from it"), err
    again = topic_run(kafka_broker, topic, results, *args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert per_key(results) == want


# docs/kafka.md's bound on a broker's death mid-run: the one line comes within 3 x CEC_KAFKA_REQUEST_TIMEOUT;
# LOADED_SLACK_S is what a loaded machine may add to starting and stopping the run's own threads.
DEATH_TIMEOUT_S = 4
LOADED_SLACK_S = 30


@pytest.mark.parametrize("follow", [False, True], ids=["while-writing", "while-following"])
def test_a_broker_that_dies_mid_run_is_one_line_without_the_clients_retries(
    kafka_broker: Broker, tmp_path: Path, follow: bool
) -> None:
    """The broker process is SIGKILLed mid-run (a broker of this test's own), while the run writes its log
    or while it follows a topic it has read to the end: the bound docs/kafka.md states. Exit 2 within
    3 x CEC_KAFKA_REQUEST_TIMEOUT (waited for as a condition); on stderr nothing of the client library
    (it printed ~1,400 lines of refused reconnections before, issue 25), at most one closing progress line
    per instance beside the periodic ones, and last the one line naming the broker and how to resume."""
    if kafka_broker.kind != "apache-kafka":
        pytest.skip("starts an Apache Kafka broker of its own to kill")
    from tests.brokers import _from_apache_kafka

    own = _from_apache_kafka()
    try:
        assert own.pid is not None
        topic = _new_topic(own, "purchases-death")
        rows = 3_000 if follow else 60_000
        produce(own.bootstrap, topic, encoded(make_purchases(rows, keys=300, partitions=PARTITIONS), as_json))
        group = "cec-out-death"  # the run's monitoring consumer group: cec-<output topic>
        script = Path(sys.executable).parent / "cec"
        proc = subprocess.Popen(
            [str(script), "run", "--input-topic", topic, "--bootstrap-servers", own.bootstrap, "--key", "item",
             "--value", "price", *WINDOW, "--results", str(tmp_path / "out.csv"), "--store-dir",
             str(tmp_path / "store"), "--output-topic", "out-death", *(["--follow"] if follow else [])],
            env={**child_env(), "CEC_KAFKA_REQUEST_TIMEOUT": str(DEATH_TIMEOUT_S)}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            if follow:
                wait_for(
                    lambda: proc.poll() is not None or _delivered_all(own, group, topic),
                    timeout=120,
                    interval=0.05,
                )
            else:
                wait_for(
                    lambda: proc.poll() is not None or _logged_any(own, "out-death"),
                    timeout=120,
                    interval=0.01,
                )
            assert proc.poll() is None, "the run ended before the broker could be killed"
            os.kill(own.pid, signal.SIGKILL)
            wait_for(
                lambda: proc.poll() is not None, timeout=3 * DEATH_TIMEOUT_S + LOADED_SLACK_S, interval=0.05
            )
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    finally:
        own.stop()
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    *before, last = lines
    assert last.startswith(
        f"cec: error: Kafka at {own.bootstrap} did not answer for {DEATH_TIMEOUT_S} s ("
    ), err
    assert last.endswith("run the same command again to resume from it"), err
    assert all(" INFO cec.progress: " in line for line in before), err  # nothing of the client library
    assert sum(", done in " in line for line in before) <= PARTITIONS, err  # each instance's closing line


def _delivered_all(broker: Broker, group: str, topic: str) -> bool:
    """Whether a following run (its monitoring group `group`) has been delivered every record of `topic`."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    monitor = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = [monitor.get_watermark_offsets(tp, timeout=10)[1] for tp in parts]
        return [tp.offset for tp in monitor.committed(parts, timeout=10)] == ends
    except KafkaException:  # e.g. the group's coordinator is still loading: says nothing yet
        return False
    finally:
        monitor.close()


def _logged_any(broker: Broker, prefix: str = "cec-run-") -> bool:
    """Whether some output log of `broker` (a `cec-run-*` topic, or one named from `prefix`) holds a record
    yet."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
    if not topics:
        return False
    request = {TopicPartition(topics[0], 0): OffsetSpec.latest()}
    try:
        return any(f.result().offset > 0 for f in admin.list_offsets(request, request_timeout=10).values())
    except Exception:  # a topic this new may have no leader yet
        return False
