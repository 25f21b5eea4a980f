"""`cec state --as-of` (cec/state_as_of.py, recovery/as_of.py) equals the state a run stopped at that point holds."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from cec.config import Checkpointing
from cec.exceptions import ConfigError
from cec.policy import make_policy
from cec.records import AvroCodec
from cec.state_as_of import AsOf, _topic_source, state_as_of
from operators.job import JobSpec, aggregate_operator, build_operator, run_job
from operators.runtime import OperatorRuntime
from operators.sources import CsvSource, PurchaseGenerator
from queuestore.output import OutputQueue
from queuestore.sqlite import SqliteQueueStore
from tests.brokers import Broker
from tests.conftest import StoreBackend
from tests.helpers import cec, child_env, wait_for
from tests.topic_data import as_json, create_topic, encoded, make_purchases, produce, write_csv

State = dict[tuple[str, int], dict[str, Any]]


def _csv(path: Path, rows: int, *, seed: int) -> list[int]:
    """A CSV of `rows` rows over 60 keys with mostly increasing times (some late, some bad values);
    returns the time column."""
    rng = random.Random(seed)
    times, t = [], 1_000
    with path.open("w") as f:
        f.write("key,value,ts\n")
        for _ in range(rows):
            t += rng.choice((0, 3, 10, 40))
            ts = t - 500 if rng.random() < 0.03 else t  # late for its key's window now and then
            value = "oops" if rng.random() < 0.01 else f"{rng.uniform(-5, 50):.3f}"
            f.write(f"k{rng.randrange(60)},{value},{ts}\n")
            times.append(ts)
    return times


def _stopped_run_state(tmp_path: Path, data: Path, operator_spec: dict[str, Any], k: int) -> State:
    """The windows a run of the operator over `data`, stopped after exactly k tuples, holds in memory."""
    store = SqliteQueueStore(tmp_path / f"stopped-{k}")
    store.create_topic("ref", 1)
    operator = build_operator(operator_spec)
    source = CsvSource(data)
    output = OutputQueue(store, "ref", 0)
    try:
        runtime = OperatorRuntime(
            operator, source, output, batch_size=1, policy=make_policy(Checkpointing(u_target=30))
        )
        runtime.run(max_inputs=k)
    finally:
        output.close()
        source.close()
        store.close()
    assert operator.state_schema is not None
    codec = AvroCodec(operator.state_schema)
    return {(w.key, w.seq): codec.decode(operator.encode_state(w.state)) for w in runtime.registry}


def _only_topic(store_dir: Path) -> str:
    """The one output topic of a run's store (`cec state` must not add any)."""
    (topic,) = [
        line.split("\t")[0]
        for line in cec("inspect", "--list", "--store-dir", str(store_dir)).stdout.splitlines()
    ]
    return topic


def _state_cli(store_dir: Path, data: Path, at: str, topic: str | None = None) -> State:
    """`topic`: the store's one topic if the caller knows it already (each `cec` call is a process)."""
    topic = topic or _only_topic(store_dir)
    out = cec("state", topic, "--as-of", at, "--input", str(data), "--store-dir", str(store_dir))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["topic"] == topic
    return {(w["key"], w["window"]): w["state"] for w in doc["windows"]}


def _run(data: Path, store_dir: Path, *extra: str) -> None:
    out = cec(
        "run", str(data), "--key", "key", "--value", "value", *extra, "--results", str(store_dir.parent / "r.csv"),
        "--store-dir", str(store_dir), "--U", "40", "--ci-ms", "20", "--cp-ms", "40",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("crash", [False, True], ids=["clean-log", "log-with-a-recovery"])
def test_count_windows_as_of_a_position_equal_a_run_stopped_there(tmp_path: Path, crash: bool) -> None:
    data = tmp_path / "in.csv"
    _csv(data, 3_000, seed=11)
    store_dir = tmp_path / "store"
    _run(data, store_dir, "--window-count", "7", *(["--crash-after", "1700"] if crash else []))
    spec = aggregate_operator("key", "value", "avg", window_count=7)
    topic = _only_topic(store_dir)
    for k in (1, 555, 1700, 2222, 3_000):
        want = _stopped_run_state(tmp_path, data, spec, k)
        assert want, k
        assert _state_cli(store_dir, data, f"pos:{k}", topic) == want, k
    assert _only_topic(store_dir) == topic


def test_time_windows_as_of_a_logical_time_equal_a_run_stopped_before_it_passed(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    times = _csv(data, 2_500, seed=12)
    store_dir = tmp_path / "store"
    _run(data, store_dir, "--time", "ts", "--window-time", "200ms")
    spec = aggregate_operator("key", "value", "sum", window_time="200ms", time="ts")
    topic = _only_topic(store_dir)
    for t in (times[300], times[1500] + 1, times[-1]):
        k = next((i for i, ts in enumerate(times) if ts > t), len(times))  # the first tuple past t
        want = _stopped_run_state(tmp_path, data, spec, k)
        assert _state_cli(store_dir, data, str(t), topic) == want, t
    # Positions on time windows: a tuple that closes a window writes its R unclaimed (pos = its own
    # offset), so the cut must leave out records stamped exactly with the point.
    for k in (400, 1201, 1999):
        want = _stopped_run_state(tmp_path, data, spec, k)
        assert _state_cli(store_dir, data, f"pos:{k}", topic) == want, k
    assert _only_topic(store_dir) == topic


def test_csv_format_and_mistakes(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    _csv(data, 400, seed=13)
    store_dir = tmp_path / "store"
    _run(data, store_dir, "--window-count", "5")
    (topic,) = [
        line.split("\t")[0]
        for line in cec("inspect", "--list", "--store-dir", str(store_dir)).stdout.splitlines()
    ]
    out = cec(
        "state",
        topic,
        "--as-of",
        "pos:200",
        "--input",
        str(data),
        "--store-dir",
        str(store_dir),
        "--format",
        "csv",
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "partition,key,window,count,total,lo,hi,start,last" and len(lines) > 1
    other = tmp_path / "other.csv"
    _csv(other, 400, seed=14)
    cases = {
        ("--as-of", "pos:200"): "give it again with --input FILE",
        ("--as-of", "pos:200", "--input", str(other)): "is not the input this log was built from",
        ("--as-of", "pos:1,2", "--input", str(data)): "so pos: takes 1 offset(s)",
        ("--as-of", "yesterday", "--input", str(data)): "give a logical time",
    }
    for args, message in cases.items():
        out = cec("state", topic, *args, "--store-dir", str(store_dir))
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr, out.stderr


def test_as_of_parses_positions_and_times() -> None:
    assert AsOf.parse("pos:5,7") == AsOf(positions=(5, 7))
    assert AsOf.parse("1500") == AsOf(time=1500)
    assert AsOf.parse("1970-01-01T00:00:01.5Z") == AsOf(time=1500)
    assert AsOf.parse("1970-01-01 00:00:02") == AsOf(time=2000)


def test_generator_input_on_both_stores_through_the_library(
    store_backend: StoreBackend, tmp_path: Path
) -> None:
    """The input recorded with the log is replayed by itself (a generator needs no --input), and a Kafka
    log (offsets with gaps: transaction markers) is cut and copied the same way."""
    topic = store_backend.topic("asof")
    spec = JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "max",
            "window_count": 9,
        },
        source={"type": "generator", "count": 4_000, "keys": 120, "seed": 21},
        store=store_backend.spec,
        output_topic=topic,
        checkpointing={"u_target": 300, "ci_ms": 20, "cp_ms": 40},
    )
    run_job(spec)
    store = store_backend()
    for k in (700, 2_345):
        reference = SqliteQueueStore(tmp_path / f"ref-{k}")
        reference.create_topic("ref", 1)
        operator = build_operator(spec.operator)
        source = PurchaseGenerator(4_000, 120, seed=21)
        output = OutputQueue(reference, "ref", 0)
        try:
            runtime = OperatorRuntime(operator, source, output, batch_size=1)
            runtime.run(max_inputs=k)
        finally:
            output.close()
            reference.close()
        codec = AvroCodec(operator.state_schema or {})
        want = {(w.key, w.seq): codec.decode(operator.encode_state(w.state)) for w in runtime.registry}
        got = {(w.key, w.window): w.state for w in state_as_of(store, topic, AsOf(positions=(k,)))}
        assert got == want and want, k


def _caught_up(bootstrap: str, group: str, topic: str, partitions: int) -> bool:
    """Whether a following run (its monitoring consumer group `group`) has been delivered every record of
    `topic`: it applies a delivered batch before it looks at a stop request, so a SIGTERM then stops it
    with all of them applied (operators.topic_source, "Lag")."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    from queuestore.kafka.errors import settles_if_asked_again

    monitor = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        ends = [
            monitor.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)
        ]
        committed = monitor.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    except KafkaException as exc:
        if settles_if_asked_again(exc):
            return False  # e.g. NOT_COORDINATOR while the group's coordinator moves: says nothing yet
        raise
    finally:
        monitor.close()
    return [tp.offset for tp in committed] == ends


@pytest.mark.parametrize("follow", [False, True], ids=["bounded-run", "following-run"])
def test_kafka_topic_input_as_of_a_position_equal_a_run_stopped_there(
    kafka_broker: Broker, tmp_path: Path, follow: bool
) -> None:
    """A `cec run --input-topic` log over a 2-partition JSON topic is replayed from what the log recorded
    (no --input): instance p reads input partition p, so pos:K is its first K tuples. A `--follow` run's
    log records no end offsets: `cec state` reads the topic as that run did, bounded by the as-of point
    (it failed with "end_offsets has 0 entries" before)."""
    purchases = make_purchases(1_200, keys=50, partitions=2, seed=31)
    topic = f"asof-in-{uuid.uuid4().hex[:10]}"
    create_topic(kafka_broker.bootstrap, topic, 2)
    produce(kafka_broker.bootstrap, topic, encoded(purchases, as_json))
    output_topic = f"asof-out-{uuid.uuid4().hex[:10]}"
    store_dir = tmp_path / "store"
    kafka = ("--bootstrap-servers", kafka_broker.bootstrap, "--store-dir", str(store_dir))
    run = (
        "run", "--input-topic", topic, *kafka, "--key", "item", "--value", "price", "--window-count", "6",
        "--agg", "avg", "--output-topic", output_topic, "--results", str(tmp_path / "r.csv"),
        "--U", "40", "--ci-ms", "20", "--cp-ms", "40",
    )  # fmt: skip
    if follow:  # never ends by itself: stopped (SIGTERM) once it has been delivered the whole topic
        script = Path(sys.executable).parent / "cec"
        proc = subprocess.Popen(
            [str(script), *run, "--follow", "--trim-every", "0"],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            group = f"cec-{output_topic}"  # the run's monitoring group (cec/cli/run_topic.py)
            wait_for(
                lambda: proc.poll() is not None or _caught_up(kafka_broker.bootstrap, group, topic, 2),
                timeout=240,
                interval=0.2,
            )
            assert proc.poll() is None, proc.communicate()[1][-2000:]
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=240)
        assert proc.returncode in (0, 130, 143, -signal.SIGTERM), err[-2000:]
    else:
        out = cec(*run)
        assert out.returncode == 0, out.stderr
    spec = aggregate_operator("item", "price", "avg", window_count=6)
    inputs = [write_csv(tmp_path / f"p{p}.csv", [r for r in purchases if r[0] == p]) for p in (0, 1)]
    assert min(sum(1 for r in purchases if r[0] == p) for p in (0, 1)) > 450
    for k in (1, 237, 450):
        want: State = {}
        for p, data in enumerate(inputs):  # a reference store per partition: each starts an empty log
            (tmp_path / f"ref{p}").mkdir(exist_ok=True)
            want.update(_stopped_run_state(tmp_path / f"ref{p}", data, spec, k))
        got = cec("state", output_topic, "--as-of", f"pos:{k}", *kafka)
        assert got.returncode == 0, got.stderr
        windows = json.loads(got.stdout)["windows"]
        assert {w["partition"] for w in windows} == {0, 1}
        assert {(w["key"], w["window"]): w["state"] for w in windows} == want and want, k


def test_a_topic_log_from_before_the_source_was_kept_names_what_is_missing() -> None:
    """Logs written before `record_source` existed have only the topic's identity: one clear error."""
    identity = {
        "type": "topic",
        "bootstrap_servers": "b:9092",
        "topic": "t",
        "format": "json",
        "partitions": 2,
    }
    with pytest.raises(ConfigError, match=r"out\[1\] was written before .*key/value/time fields"):
        _topic_source(identity, None, "out[1]")
