"""Never a silent empty answer from `cec_aggregate` (issue 25), on a real broker and local Spark:

1. a JSON topic whose field names differ from the ones the query names (every record dead-lettered): each
   micro-batch is logged as a warning with the first reason and reported in `lastProgress["cec"]`, and the
   bounded query fails in `awaitTermination()` with one line that gives the count and the first reason,
   as `cec run` refuses such a run;
2. a topic where some records are bad: the query ends normally, its progress counts the dead letters, and
   `read_dead_letters` gives exactly those records (input partition, offset, reason, raw) from Spark.
The dead-letter watch's rules themselves are checked without Spark (`test_watch_*`).
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cec.config import Checkpointing
from operators.exceptions import DeadLetteredInputError
from operators.spark.attach import cec_aggregate
from operators.spark.dead_letters import DeadLetterWatch
from operators.spark.results import DEAD_LETTER_COLUMNS, read_dead_letters
from tests.brokers import Broker
from tests.topic_data import create_topic, make_purchases, produce

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PARTITIONS = 2
TRIGGER_ROWS = 150
LOGGER = "operators.spark.dead_letters"


def _topic(bootstrap: str, values: list[tuple[int, bytes]]) -> tuple[str, list[tuple[int, int, bytes]]]:
    """A new topic holding `values` (partition, value), and each one's (partition, offset, value)."""
    topic = f"dead-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTITIONS)
    produce(bootstrap, topic, [(p, None, v) for p, v in values])
    offsets = [0] * PARTITIONS
    placed = []
    for p, v in values:  # one producer, in order, no transactions: offsets are dense per partition
        placed.append((p, offsets[p], v))
        offsets[p] += 1
    return topic, placed


def _args(bootstrap: str, topic: str, root: Path, output: str) -> dict[str, Any]:
    return {
        "input_topic": topic,
        "input_format": "json",
        "bootstrap_servers": bootstrap,
        "output_topic": output,
        "key": "item",
        "value": "price",
        "agg": "avg",
        "window_count": 5,
        "state_dir": str(root / "state"),
        "checkpoint_location": str(root / "checkpoints"),
        "max_records_per_trigger": TRIGGER_ROWS,
        "available_now": True,
        "query_name": f"cec_{uuid.uuid4().hex[:6]}",
    }


def test_watch_says_an_all_dead_batch_and_refuses_an_all_dead_run(caplog: pytest.LogCaptureFixture) -> None:
    watch = DeadLetterWatch("avg-price")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        watch.batch(0, 10, 10, "missing key 'item'")
    assert [r.getMessage() for r in caplog.records] == [
        "cec: micro-batch 0: every one of its 10 input tuples was dead-lettered (the first: missing key "
        "'item'); read them with read_dead_letters(spark, 'avg-price', bootstrap_servers)"
    ]
    with pytest.raises(DeadLetteredInputError) as caught:
        watch.check()
    assert str(caught.value) == (
        "every one of the 10 input tuples was dead-lettered (the first: missing key 'item'); read them with "
        "read_dead_letters(spark, 'avg-price', bootstrap_servers)"
    )
    assert "\n" not in str(caught.value)
    watch.batch(1, 10, 0, None)  # one good batch: the run has an answer
    watch.check()
    assert watch.figures() == {
        "batch_tuples": 10,
        "batch_dead": 0,
        "tuples": 20,
        "dead": 10,
        "share": 0.5,
        "first_reason": "missing key 'item'",
        "all_dead_batches": 1,
    }


def test_watch_says_a_large_share_once(caplog: pytest.LogCaptureFixture) -> None:
    watch = DeadLetterWatch("out")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        watch.batch(0, 10, 2, "price is not a number")  # 20%: nothing to say
        assert not caplog.records
        watch.batch(1, 10, 9, None)  # 55% of the run
        watch.batch(2, 10, 9, None)  # still above: said once only
    assert len(caplog.records) == 1
    assert (
        caplog.records[0]
        .getMessage()
        .startswith(
            "cec: 11 of the 20 input tuples so far were dead-lettered (the first: price is not a number)"
        )
    )
    watch.check()  # a large share is a warning, not a refusal


def test_watch_replay_that_skips_tuples_is_no_dead_batch() -> None:
    watch = DeadLetterWatch("out")
    watch.batch(0, 0, 0, None)  # a no-data micro-batch
    watch.batch(1, 50, 0, None)  # replayed tuples skipped: no records at all
    watch.check()
    assert watch.figures()["all_dead_batches"] == 0


def test_every_record_dead_lettered_fails_the_bounded_query(
    spark: SparkSession,
    spark_kafka_broker: Broker,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bootstrap = spark_kafka_broker.bootstrap
    # The producer's field names are not the query's (item/price): every record lacks the key.
    renamed = [
        (p, json.dumps({"sku": rec["item"], "cost": rec["price"], "ts": rec["ts"]}).encode())
        for p, rec in make_purchases(400, 20, PARTITIONS, seed=3)
    ]
    topic, placed = _topic(bootstrap, renamed)
    output = f"avg-dead-{uuid.uuid4().hex[:8]}"
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        query = cec_aggregate(spark, **_args(bootstrap, topic, tmp_path, output))
        with pytest.raises(DeadLetteredInputError) as caught:
            query.awaitTermination()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("every one of the 400 input tuples was dead-lettered (the first: ")
    assert "item" in message.split("(the first: ", 1)[1], message  # the reason names the missing key
    assert query.exception() is None  # the query itself ran to the end of its input
    warned = [r.getMessage() for r in caplog.records if "micro-batch" in r.getMessage()]
    assert len(warned) >= 2, warned  # 400 tuples at most 150 per micro-batch: several batches, each said
    assert all("every one of its" in w and "dead-lettered" in w for w in warned)
    progress = [p["cec"]["dead_letters"] for p in query.recentProgress if "cec" in p]
    assert sum(p["batch_dead"] for p in progress) == 400
    assert progress[-1]["tuples"] == progress[-1]["dead"] == 400 and progress[-1]["share"] == 1.0
    assert query.dead_letters["all_dead_batches"] == len(warned)

    letters = read_dead_letters(spark, output, bootstrap).collect()
    assert sorted((r["partition"], r["offset"], r["raw"]) for r in letters) == sorted(
        (p, o, v.decode()) for p, o, v in placed
    )
    assert all("item" in r["reason"] for r in letters)


def test_read_dead_letters_gives_the_bad_records(
    spark: SparkSession, spark_kafka_broker: Broker, tmp_path: Path
) -> None:
    bootstrap = spark_kafka_broker.bootstrap
    values: list[tuple[int, bytes]] = []
    bad: dict[tuple[int, bytes], str] = {}  # (partition, value) -> its dead letter's raw
    for i, (p, rec) in enumerate(make_purchases(600, 20, PARTITIONS, seed=4)):
        if i % 10 == 3:
            value = json.dumps({**rec, "price": "lots", "ts": i}).encode()
            # A tuple the aggregate refuses is in its dead letter as the fields the query reads, as JSON
            # (docs/spark.md: the query does not carry each record's bytes through the shuffle).
            bad[(p, value)] = json.dumps({"item": rec["item"], "price": "lots"})
        else:
            value = json.dumps(rec).encode()
        values.append((p, value))
    topic, placed = _topic(bootstrap, values)
    output = f"avg-some-dead-{uuid.uuid4().hex[:8]}"
    query = cec_aggregate(spark, **_args(bootstrap, topic, tmp_path, output))
    query.awaitTermination()  # 10% dead letters: an answer, no error
    assert query.exception() is None
    assert query.checkpointing == Checkpointing.default()  # bounded recovery without checkpointing=
    assert query.dead_letters["dead"] == len(bad) == 60 and query.dead_letters["all_dead_batches"] == 0

    frame = read_dead_letters(spark, output, bootstrap, with_meta=True)
    assert frame.columns[:4] == DEAD_LETTER_COLUMNS
    rows = frame.collect()
    want = sorted((p, o, bad[(p, v)]) for p, o, v in placed if (p, v) in bad)
    assert sorted((r["partition"], r["offset"], r["raw"]) for r in rows) == want
    assert all("price" in r["reason"] for r in rows)
    assert {r["cec_generation"] for r in rows} == {0}
