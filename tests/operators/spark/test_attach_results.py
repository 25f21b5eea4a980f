"""What a PySpark user reads back from `cec_aggregate`, on a real broker and local Spark:

1. `results_topic=`: every result as a plain JSON record (the record `cec run --results-topic` writes: key =
   the window key, value = the result's columns), in the output log's transactions: after the driver is
   SIGKILLed in the middle of a write and restarted, a read_committed consumer that knows nothing of cec
   reads each result exactly once, and they are the results `read_results` gives, whether the executors or
   the driver write the logs, and whether the restart resumes Spark's checkpoint or recovers from the logs; a results topic that is the input or output, or has too few partitions, is
   one line;
2. typed results: a time window's `start`/`end` are TimestampType (a count window's stay integer offsets),
   and a `transform=`'s key column keeps its type;
3. one line per mistake: a misspelled field of a cec queue input (no `input_format`) is one ConfigError
   line before any work, and a CecError raised in a Python worker crosses Py4J as its one line;
4. `register(spark)` is explicit and idempotent.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cec.exceptions import ConfigError
from operators.spark.attach import RESULT_COLUMNS, cec_aggregate, read_results
from operators.spark.config_errors import cec_error_of, cec_errors
from operators.spark.resume import FROM_LOGS, RESUMED
from tests.cec.test_cli_topic import read_results_topic
from tests.operators.spark.result_rows import epoch_ms
from tests.operators.spark.test_attach import _killed_driver
from tests.operators.spark.test_attach_spark_kafka import _connector
from tests.operators.spark.test_attach_topic import (
    JsonTopic,
    _args,
    _assert_equal,
    _kinds,
    _reference,
    _results,
    json_topic,
)
from tests.topic_data import create_topic, produce

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.brokers import Broker

__all__ = ["_connector", "json_topic"]  # module fixtures shared with the modules they come from


def _published(data: JsonTopic, topic: str) -> dict[tuple[str, int], tuple[Any, ...]]:
    """The results topic as a plain read_committed consumer reads it, each result exactly once."""
    rows = read_results_topic(data.bootstrap, topic)
    out: dict[tuple[str, int], tuple[Any, ...]] = {}
    for key, row in rows:
        assert list(row) == RESULT_COLUMNS, row
        assert key == row["key"]  # the Kafka key is the window key
        wid = (row["key"], row["window"])
        assert wid not in out, f"result {wid} published twice"
        out[wid] = tuple(row[c] for c in RESULT_COLUMNS)
    return out


def _as_published(results: dict[str, list[tuple[Any, ...]]]) -> dict[tuple[str, int], tuple[Any, ...]]:
    return {(row[0], row[1]): row for rows in results.values() for row in rows}


@pytest.mark.parametrize(
    ("writers", "hit", "resume", "path"),
    # The executors' writers: the 3rd micro-batch's first write task; the driver's: its sink passes the
    # site once per output partition (3) and micro-batch, so the 5th pass is in the 2nd micro-batch.
    [
        ("executors", 3, True, RESUMED),  # the default: the rerun batch publishes only what it appends
        ("executors", 3, False, FROM_LOGS),
        ("driver", 5, True, FROM_LOGS),  # a driver sink never resumes
    ],
    ids=["executors-resumed", "executors-from-logs", "driver"],
)
def test_results_topic_exactly_once_across_a_driver_sigkill(
    spark: SparkSession,
    json_topic: JsonTopic,
    tmp_path: Path,
    writers: str,
    hit: int,
    resume: bool,
    path: str,
) -> None:
    output = f"avg-rt-{writers}-{uuid.uuid4().hex[:8]}"
    results_topic = f"{output}-results"
    args = _args(
        json_topic, tmp_path, output, input_reader="spark-kafka", results_topic=results_topic, writers=writers,
        resume_checkpoint=resume,
    )  # fmt: skip
    _killed_driver(args, tmp_path / "driver", hit=hit)
    partial = _kinds(json_topic, tmp_path, output)
    published = _published(json_topic, results_topic)
    assert 0 < partial["R"] == len(published)  # exactly the results whose R records are in the log

    query = cec_aggregate(spark, available_now=True, **args)
    assert query.awaitTermination(600) is True and query.exception() is None
    assert query.recovery.resumed
    assert query.cec_progress["recovery"]["path"] == path, query.cec_progress["recovery"]
    results = _results(spark, json_topic, output)
    _assert_equal(results, _reference(json_topic))
    assert _published(json_topic, results_topic) == _as_published(results)


def test_a_results_topic_of_its_own(spark: SparkSession, json_topic: JsonTopic, tmp_path: Path) -> None:
    output = f"avg-rtd-{uuid.uuid4().hex[:8]}"
    args = _args(json_topic, tmp_path, output)
    for taken in (output, json_topic.topic):
        with pytest.raises(ConfigError, match="results_topic must be a topic of its own"):
            cec_aggregate(spark, available_now=True, **{**args, "results_topic": taken})
    small = f"{output}-small"
    create_topic(json_topic.bootstrap, small, 1)  # the output has the input's 3 partitions
    with pytest.raises(
        ConfigError, match=f"results_topic '{small}': .* exists with 1 partitions, 3 requested"
    ):
        cec_aggregate(spark, available_now=True, **{**args, "results_topic": small})


def test_time_windows_read_back_as_timestamps_and_keys_with_their_types(
    spark: SparkSession, spark_kafka_broker: Broker, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, TimestampType

    bootstrap = spark_kafka_broker.bootstrap
    topic = f"json-typed-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 2)
    # Per store s (an integer key, in one partition): one tuple per second; 10 s windows.
    records = [
        (s % 2, {"store": s, "amount": float(i), "ts": 1_700_000_000_000 + i * 1000})
        for i in range(60)
        for s in range(4)
    ]
    produce(bootstrap, topic, [(p, None, json.dumps(r).encode()) for p, r in records])
    output = f"typed-{uuid.uuid4().hex[:8]}"
    query = cec_aggregate(
        spark,
        input_topic=topic,
        input_format="json",
        bootstrap_servers=bootstrap,
        output_topic=output,
        key="store",
        value="amount",
        agg="sum",
        time="ts",
        window_time="10s",
        transform=lambda df: df.withColumn("store", F.col("store") + 100),
        input_schema="store BIGINT, amount DOUBLE, ts BIGINT",
        state_dir=str(tmp_path / "state"),
        checkpoint_location=str(tmp_path / "checkpoints"),
        available_now=True,
    )
    assert query.awaitTermination(600) is True and query.exception() is None
    df = read_results(spark, output, bootstrap)
    types = {f.name: f.dataType for f in df.schema.fields}
    assert types["start"] == TimestampType() and types["end"] == TimestampType()
    assert types["key"] == LongType()
    rows = df.collect()
    # Closed windows: 5 per store (the 6th is still open at the end of the input).
    assert sorted({r["key"] for r in rows}) == [100, 101, 102, 103] and len(rows) == 20
    for r in rows:
        start = epoch_ms(r["start"])
        assert start % 10_000 == 0 and epoch_ms(r["end"]) == start + 10_000
        first = (start - 1_700_000_000_000) // 1000
        assert r["value"] == sum(float(i) for i in range(first, first + 10))


def test_count_windows_keep_integer_positions(
    spark: SparkSession, json_topic: JsonTopic, tmp_path: Path
) -> None:
    from pyspark.sql.types import LongType, StringType

    output = f"avg-count-{uuid.uuid4().hex[:8]}"
    query = cec_aggregate(spark, available_now=True, **_args(json_topic, tmp_path, output))
    assert query.awaitTermination(600) is True and query.exception() is None
    types = {f.name: f.dataType for f in read_results(spark, output, json_topic.bootstrap).schema.fields}
    assert types["start"] == LongType() and types["end"] == LongType() and types["key"] == StringType()


def test_a_misspelled_field_of_a_cec_queue_is_one_line(
    spark: SparkSession, json_topic: JsonTopic, tmp_path: Path
) -> None:
    args = {**_args(json_topic, tmp_path, f"avg-typo-{uuid.uuid4().hex[:8]}"), "key": "tailnum"}
    del args["input_format"]  # the default: a cec queue, whose payload is the purchase schema
    with pytest.raises(ConfigError) as caught:
        cec_aggregate(spark, available_now=True, **args)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("the key field 'tailnum' is not in the payload schema (item_id, item_price")
    assert "input_format='json'" in message


def test_a_cec_error_in_a_python_worker_crosses_py4j_as_one_line(spark: SparkSession) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    @F.udf(LongType())
    def refuse(x: int) -> int:
        from cec.exceptions import ConfigError

        raise ConfigError(f"the field 'tailnum' is not in the payload ({x})")

    with pytest.raises(Exception) as raw:
        spark.range(1).select(refuse("id")).collect()
    assert len(str(raw.value).splitlines()) > 1  # what a user saw before: a traceback
    assert str(cec_error_of(raw.value)) == "the field 'tailnum' is not in the payload (0)"
    with pytest.raises(ConfigError) as caught, cec_errors():
        spark.range(1).select(refuse("id")).collect()
    assert str(caught.value) == "the field 'tailnum' is not in the payload (0)"
    with pytest.raises(ZeroDivisionError), cec_errors():  # anything else passes unchanged
        _ = 1 // 0


def test_register_is_explicit_and_idempotent(spark: SparkSession, json_topic: JsonTopic) -> None:
    from cec.spark import register

    register(spark)
    register(spark)
    rows = (
        spark.read.format("cec-topic")
        .option("topic", json_topic.topic)
        .option("bootstrap.servers", json_topic.bootstrap)
        .option("format", "json")
        .option("key", "item")
        .option("value", "price")
        .load()
        .count()
    )
    assert rows == json_topic.count
