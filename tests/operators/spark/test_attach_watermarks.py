"""Event-time watermarks on the attached query: `cec_aggregate(..., allowed_lateness=...)`, the engine's
watermarks (`recovery.contract`, "watermarks") on a real broker and real local Spark:

1. over one input partition and one state partition, the same results and dead letters as
   `cec run --input-topic ... --allowed-lateness` over the same topic (one instance, the same watermark):
   idle keys' windows close, late tuples are dead letters "late";
2. after the driver is SIGKILLed mid-write, and SIGKILLed again in the micro-batch in which the
   restart's recovery ends (a crash during recovery), a restart closes exactly the windows the
   failure-free run closed and dead-letters the same tuples, with two drifting input partitions and two
   state partitions;
3. refusals: a restart with another partition count, a log written without watermarks.
"""

from __future__ import annotations

import csv
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cec.exceptions import ConfigError
from cec.timeparse import parse_time_ms
from operators.spark.attach import RESULT_COLUMNS, cec_aggregate, read_results
from queuestore.kafka import KafkaQueueStore
from tests.brokers import Broker
from tests.helpers import cec, log_records
from tests.helpers.attached import run_to_end
from tests.helpers.topic_flights import logged_dead_letters
from tests.operators.spark.result_rows import epoch_ms
from tests.operators.spark.test_attach import _killed_driver
from tests.topic_data import as_json, create_topic, encoded, produce

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

WINDOW = "200ms"
LATENESS = "50ms"
Rows = list[tuple[str, int, float, int, int, int]]


def _records(partitions: int, count: int = 3000) -> list[tuple[int, dict[str, Any]]]:
    """(partition, record): keys live in one partition each; event times increase within a partition
    (partition p runs ahead of the others by p ms), a few keys go idle after the first tenth of the
    input (only the watermark closes their last window), and every 97th record is 400 ms behind its
    partition's clock (late: a dead letter)."""
    out: list[tuple[int, dict[str, Any]]] = []
    for i in range(count):
        p = i % partitions
        key = f"idle{p}-{i % 3}" if i < count // 10 and i % 5 == 0 else f"k{p}-{(i * 7) % 11}"
        ts = i + p * 7
        if i % 97 == 96:
            ts -= 400
        out.append((p, {"item": key, "price": (i % 40) / 4, "ts": ts}))
    return out


def _topic(broker: Broker, records: list[tuple[int, dict[str, Any]]], partitions: int) -> str:
    topic = f"wm-{uuid.uuid4().hex[:10]}"
    create_topic(broker.bootstrap, topic, partitions)
    produce(broker.bootstrap, topic, encoded(records, as_json))
    return topic


def _args(broker: Broker, topic: str, root: Path, output: str, **extra: Any) -> dict[str, Any]:
    return {
        "input_topic": topic,
        "bootstrap_servers": broker.bootstrap,
        "input_format": "json",
        "output_topic": output,
        "key": "item",
        "value": "price",
        "time": "ts",
        "window_time": WINDOW,
        "agg": "sum",
        "state_dir": str(root / "state"),
        "checkpoint_location": str(root / "checkpoints"),
        "max_records_per_trigger": 700,
        **extra,
    }


def _spark_results(spark: SparkSession, broker: Broker, output: str) -> Rows:
    rows = read_results(spark, output, broker.bootstrap).collect()
    return sorted(tuple(epoch_ms(r[c]) for c in RESULT_COLUMNS) for r in rows)  # type: ignore[misc]


def _lateness(reason: str) -> str:
    """A dead letter's reason with a late tuple's wording folded into "late" (see its use)."""
    return "late" if reason.startswith(("late:", "late tuple:")) else reason


def test_allowed_lateness_closes_idle_windows_as_cec_run_does(
    spark: SparkSession, kafka_broker: Broker, tmp_path: Path
) -> None:
    records = _records(1)
    topic = _topic(kafka_broker, records, 1)
    flags = ["--key", "item", "--value", "price", "--time", "ts", "--window-time", WINDOW, "--agg", "sum"]
    ran = cec("run", "--input-topic", topic, "--bootstrap-servers", kafka_broker.bootstrap, "--format", "json",
              *flags, "--allowed-lateness", LATENESS, "--results", str(tmp_path / "run.csv"),
              "--store-dir", str(tmp_path / "run-store"))  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    with (tmp_path / "run.csv").open(newline="") as f:
        # start and end as ISO-8601 (the results file of a time field), back to ms.
        want = sorted((r["key"], int(r["window"]), float(r["value"]), int(r["count"]), parse_time_ms(r["start"]),
                       parse_time_ms(r["end"])) for r in csv.DictReader(f))  # fmt: skip
    with (tmp_path / "run.dead-letters.csv").open(newline="") as f:
        want_dead = sorted((int(r["partition"]), int(r["offset"]), r["reason"]) for r in csv.DictReader(f))

    output = f"wm-one-{uuid.uuid4().hex[:8]}"
    run_to_end(spark, _args(kafka_broker, topic, tmp_path, output, partitions=1, allowed_lateness=LATENESS))
    got = _spark_results(spark, kafka_broker, output)
    assert got == want
    assert {key for key, *_ in got if key.startswith("idle")} == {f"idle0-{i}" for i in range(3)}
    dead = logged_dead_letters(kafka_broker, tmp_path, output)
    assert dead == want_dead and dead and all(reason.startswith("late:") for _, _, reason in dead)

    # Without the watermark the idle keys' last windows never close.
    plain = f"wm-plain-{uuid.uuid4().hex[:8]}"
    run_to_end(spark, _args(kafka_broker, topic, tmp_path / "plain", plain, partitions=1))
    closed = Counter(key for key, *_ in _spark_results(spark, kafka_broker, plain))
    assert sum(n for key, n in closed.items() if key.startswith("idle")) < sum(
        1 for key, *_ in got if key.startswith("idle")
    )


def test_allowed_lateness_recovers_identically_after_driver_sigkills(
    spark: SparkSession, kafka_broker: Broker, tmp_path: Path
) -> None:
    records = _records(2, count=4000)
    topic = _topic(kafka_broker, records, 2)
    reference = f"wm-ref-{uuid.uuid4().hex[:8]}"
    run_to_end(
        spark,
        _args(kafka_broker, topic, tmp_path / "ref", reference, partitions=2, allowed_lateness=LATENESS),
    )
    want = _spark_results(spark, kafka_broker, reference)
    assert any(key.startswith("idle") for key, *_ in want)

    output = f"wm-kill-{uuid.uuid4().hex[:8]}"
    # From the logs: the watermark restored from the crash records' marks, the second kill in the replay.
    args = _args(
        kafka_broker,
        topic,
        tmp_path,
        output,
        partitions=2,
        allowed_lateness=LATENESS,
        resume_checkpoint=False,
    )
    _killed_driver(args, tmp_path / "first", hit=3)
    # Killed again while recovering: the restart's first micro-batch only replays (its tuples lie below the
    # crash points, or past one partition's crash point while the other still replays: held back), so it
    # writes nothing; the second is the one in which recovery ends, the tuples held back are applied and
    # the restart's first records are written, and the kill lands half way through them.
    _killed_driver(args, tmp_path / "recovering", hit=2)
    query = run_to_end(spark, args)
    assert query.recovery.resumed and query.recovery.ec_windows > 0
    assert _spark_results(spark, kafka_broker, output) == want
    # The same tuples are dead letters, for the same reasons. Which of the aggregate's two lateness checks
    # names a late tuple (behind its key's open window, or in a window the watermark closed, with W) depends
    # on W at that tuple, and W on how the input partitions interleave: a state partition applies a
    # micro-batch's tuples in (j, o) order, and a restart's micro-batches start at other offsets than the
    # failure-free run's. Results cannot depend on it (an on-time tuple is never behind W); the reason's
    # wording can.
    got_dead, want_dead = (
        logged_dead_letters(kafka_broker, tmp_path, output),
        logged_dead_letters(kafka_broker, tmp_path, reference),
    )
    assert [(j, o, _lateness(reason)) for j, o, reason in got_dead] == [
        (j, o, _lateness(reason)) for j, o, reason in want_dead
    ]
    assert any(reason.startswith("late") for *_, reason in want_dead)
    # Every record of the recovered logs carries the event-time marks the watermark is restored from.
    store = KafkaQueueStore(kafka_broker.bootstrap, tmp_path / "marks")
    try:
        assert all(len(r.marks) == 2 for q in range(2) for r in log_records(store, output, q))
    finally:
        store.close()


def test_allowed_lateness_refuses_what_it_cannot_resume(
    spark: SparkSession, kafka_broker: Broker, tmp_path: Path
) -> None:
    topic = _topic(kafka_broker, _records(2, count=400), 2)
    output = f"wm-refuse-{uuid.uuid4().hex[:8]}"
    run_to_end(spark, _args(kafka_broker, topic, tmp_path, output, partitions=2))  # no watermarks: no marks
    with pytest.raises(ConfigError, match="another allowed_lateness setting"):
        cec_aggregate(
            spark, **_args(kafka_broker, topic, tmp_path, output, partitions=2, allowed_lateness="0")
        )
    with pytest.raises(ConfigError, match="cannot resume after a change of partitions"):
        cec_aggregate(
            spark, **_args(kafka_broker, topic, tmp_path, output, partitions=3, allowed_lateness="0")
        )
    with pytest.raises(ConfigError, match="needs a time window"):
        cec_aggregate(
            spark,
            **{**_args(kafka_broker, topic, tmp_path, output), "window_time": None, "window_count": 3},
            allowed_lateness="1s",
        )
