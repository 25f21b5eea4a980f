"""`cec_aggregate(transform=...)` (operators.spark.transform) on a real broker and local Spark, through both input
readers (Spark's Kafka connector, and the cec-topic Python source's raw records):

1. the plan check: `where`/`withColumn`/`select` (and repartitioning) are accepted; aggregations, joins,
   limits, deduplication, explode, unions, non-deterministic expressions, and a transform that drops or
   changes `partition`/`offset` are refused with one line saying why;
2. the 3-partition JSON topic of test_attach_topic.py (bad and hostile records among the good ones) through
   a filtering and deriving transform: the results equal pandas' aggregation of the same records through
   the same filter and derivation, and the two readers' results and dead letters equal each other; the
   records that cannot be decoded or do not fit the schema are dead letters, the rows the transform
   filters out are not;
3. the driver SIGKILLed in the middle of a sink write, then restarted (each reader): the replay re-reads
   the input through the transform, and the output equals the failure-free results;
4. a misspelled field of the transform's result is one ConfigError line before the query starts.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest

from cec.exceptions import ConfigError
from operators.spark.attach import cec_aggregate
from operators.spark.topic_reader import TopicOptions
from operators.spark.transform import check_plan, sample_schema
from tests.operators.spark.test_attach import _killed_driver
from tests.operators.spark.test_attach_spark_kafka import _connector
from tests.operators.spark.test_attach_topic import (
    WINDOW,
    JsonTopic,
    _args,
    _assert_equal,
    _dead_letters,
    _kinds,
    _results,
    json_topic,
)
from tests.operators.spark.transforms import MIN_PRICE, SCALE, filter_derive
from tests.topic_data import create_topic, produce

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["_connector", "json_topic"]  # module fixtures shared with the modules they come from

SCHEMA = "item STRING, price DOUBLE, ts BIGINT"


@pytest.fixture(scope="module")
def stream(spark: SparkSession) -> DataFrame:
    """A streaming DataFrame shaped like the transform's input (fields plus partition, offset)."""
    from pyspark.sql import functions as F

    rate = spark.readStream.format("rate").load()
    return rate.select(
        F.lit("a").alias("item"),
        F.col("value").cast("double").alias("price"),
        (F.col("value") % 3).cast("int").alias("partition"),
        F.col("value").alias("offset"),
        F.col("timestamp"),
    )


def test_row_wise_transforms_are_accepted(spark: SparkSession, stream: DataFrame) -> None:
    from pyspark.sql import functions as F

    for accepted in (
        lambda df: df.where("price > 3"),
        lambda df: df.withColumn("eur", F.col("price") * 0.9).where(F.col("item").isNotNull()),
        lambda df: df.select("partition", "offset", F.upper("item").alias("item"), "price"),
        lambda df: df.repartition(4).withColumn("h", F.hash("item")),
        filter_derive,
    ):
        check_plan(stream, accepted(stream))


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("aggregate", "it aggregates"),
        ("join", "it joins"),
        ("limit", "it has a limit"),
        ("dedup", "it deduplicates"),
        ("explode", "one record becomes several rows"),
        ("union", "it unions another input"),
        ("rand", "rand(.*) is not deterministic"),
        ("now", "current_timestamp.* is not deterministic"),
        ("uuid", "uuid.* is not deterministic"),
        ("drop offset", "transform dropped the column 'offset'"),
        ("change offset", "transform changed the column 'offset'"),
        ("change partition", "transform changed the column 'partition'"),
    ],
)
def test_other_transforms_are_refused_in_one_line(
    spark: SparkSession, stream: DataFrame, name: str, why: str
) -> None:
    from pyspark.sql import functions as F

    static = spark.createDataFrame([("a", 1)], "item STRING, n INT")
    refused = {
        "aggregate": lambda df: df.groupBy("item").agg(F.sum("price")),
        "join": lambda df: df.join(static, "item"),
        "limit": lambda df: df.limit(10),
        "dedup": lambda df: df.dropDuplicates(["item"]),
        "explode": lambda df: df.withColumn("x", F.explode(F.array(F.lit(1), F.lit(2)))),
        "union": lambda df: df.unionByName(df),
        "rand": lambda df: df.where(F.rand() > 0.5),
        "now": lambda df: df.withColumn("seen", F.current_timestamp()),
        "uuid": lambda df: df.withColumn("id", F.expr("uuid()")),
        "drop offset": lambda df: df.drop("offset"),
        "change offset": lambda df: df.withColumn("offset", F.col("offset") + 1),
        "change partition": lambda df: df.withColumn("partition", F.lit(0)),
    }
    with pytest.raises(ConfigError, match=why) as caught:
        check_plan(stream, refused[name](stream))
    assert "\n" not in str(caught.value)


def test_a_transform_must_return_the_streaming_frame(spark: SparkSession, stream: DataFrame) -> None:
    with pytest.raises(ConfigError, match="must return a DataFrame"):
        check_plan(stream, 42)  # type: ignore[arg-type]
    static = spark.createDataFrame([(0, 0)], "partition INT, offset BIGINT")
    with pytest.raises(ConfigError, match="streaming DataFrame"):
        check_plan(stream, static)


def _truth(data: JsonTopic) -> dict[str, list[tuple[Any, ...]]]:
    """pandas: the records that decode and fit SCHEMA, through `filter_derive`, per key in offset order,
    count windows of WINDOW tuples (value = mean price_k; start/end = first/last offset)."""
    rows = []
    for p, o, raw in data.records:
        if (p, o) in data.bad:
            continue
        rec = json.loads(raw)
        rows.append({"partition": p, "offset": o, "item": rec["item"], "price": float(rec["price"])})
    df = pd.DataFrame(rows)
    df = df[df["price"] >= MIN_PRICE].assign(price_k=lambda d: d["price"] / SCALE)
    df = df.sort_values(["partition", "offset"])
    out: dict[str, list[tuple[Any, ...]]] = {}
    for key, group in df.groupby("item", sort=False):
        group = group.reset_index(drop=True)
        for w in range(len(group) // WINDOW):
            chunk = group.iloc[w * WINDOW : (w + 1) * WINDOW]
            out.setdefault(str(key), []).append(
                (
                    key,
                    w,
                    chunk["price_k"].mean(),
                    WINDOW,
                    int(chunk["offset"].iloc[0]),
                    int(chunk["offset"].iloc[-1]),
                )
            )
    return out


READERS = ("spark-kafka", "python")


def _transform_args(
    data: JsonTopic, root: Path, output: str, transform: Any, reader: str = "spark-kafka"
) -> dict[str, Any]:
    return _args(
        data,
        root,
        output,
        value="price_k",
        transform=transform,
        input_schema=SCHEMA,
        input_reader=reader,
    )


def _expected_letters(data: JsonTopic) -> set[tuple[int, int]]:
    """Bad records that cannot become rows: not JSON at all, or a price that is not a number."""
    letters = set()
    for p, o, raw in data.records:
        if (p, o) not in data.bad:
            continue
        try:
            rec = json.loads(raw)
        except (ValueError, RecursionError):  # a hostile record: 3000 nested arrays
            letters.add((p, o))
            continue
        if not isinstance(rec, dict) or isinstance(rec.get("price"), str):
            letters.add((p, o))
    return letters


def _run(spark: SparkSession, args: dict[str, Any]) -> Any:
    query = cec_aggregate(spark, available_now=True, **args)
    assert query.awaitTermination(600) is True and query.exception() is None
    return query


def test_filtering_and_deriving_transform_equals_pandas_through_both_readers(
    spark: SparkSession, json_topic: JsonTopic, tmp_path: Path
) -> None:
    want = _truth(json_topic)
    assert sum(len(v) for v in want.values()) > 100
    got, letters = {}, {}
    for reader in READERS:
        output = f"avg-tf-{reader}-{uuid.uuid4().hex[:8]}"
        _run(spark, _transform_args(json_topic, tmp_path / reader, output, filter_derive, reader))
        got[reader] = _results(spark, json_topic, output)
        _assert_equal(got[reader], want)
        letters[reader] = _dead_letters(json_topic, tmp_path / reader, output)
        assert letters[reader].keys() <= json_topic.bad.keys()
        assert _expected_letters(json_topic) <= letters[reader].keys()
        lots = [pos for pos, why in json_topic.bad.items() if why == "price not a number"]
        assert lots and all("does not fit input_schema" in letters[reader][pos] for pos in lots)
    assert got["python"] == got["spark-kafka"]
    assert letters["python"] == letters["spark-kafka"]


@pytest.mark.parametrize("reader", READERS)
def test_exact_after_driver_sigkill_with_a_transform(
    spark: SparkSession, json_topic: JsonTopic, tmp_path: Path, reader: str
) -> None:
    output = f"avg-tf-kill-{uuid.uuid4().hex[:8]}"
    # The transform named for the driver script; from the logs: the replay from T re-reads through it.
    args = {
        **_transform_args(json_topic, tmp_path, output, "filter_derive", reader),
        "resume_checkpoint": False,
    }
    _killed_driver(args, tmp_path / "driver", hit=3)
    want = _truth(json_topic)
    partial = _kinds(json_topic, tmp_path, output)
    total = sum(len(v) for v in want.values())
    assert 0 < partial["R"] < total, (partial, total)

    query = _run(spark, {**args, "transform": filter_derive})
    rec = query.recovery
    assert rec.resumed and rec.ec_windows > 0
    assert 0 < sum(rec.start) < json_topic.count  # the replay starts inside the input, from T
    _assert_equal(_results(spark, json_topic, output), want)
    assert _expected_letters(json_topic) <= _dead_letters(json_topic, tmp_path, output).keys()  # each once


def test_a_misspelled_field_is_one_line(spark: SparkSession, json_topic: JsonTopic, tmp_path: Path) -> None:
    args = _transform_args(json_topic, tmp_path, f"avg-tf-typo-{uuid.uuid4().hex[:8]}", filter_derive)
    with pytest.raises(
        ConfigError,
        match=r"field 'price_kk' is not a column of transform's result \(item, price, ts, partition, offset, timestamp, price_k\)",
    ) as caught:
        cec_aggregate(spark, available_now=True, **{**args, "value": "price_kk"})
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match=r"transform failed: .*no_such_column") as caught:
        cec_aggregate(
            spark, available_now=True, **{**args, "transform": lambda df: df.where("no_such_column > 1")}
        )
    assert "\n" not in str(caught.value)


def test_the_input_schema_is_inferred_from_the_first_records(spark_kafka_broker: Any) -> None:
    bootstrap = spark_kafka_broker.bootstrap
    topic = f"json-infer-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 2)
    values = [
        {"item": "a", "n": 1, "x": 1, "ok": True, "tags": [1]},
        {"item": "b", "n": 2, "x": 2.5, "ok": False, "extra": None},
        {"item": 3, "n": 3, "x": 3},
    ]
    produce(
        bootstrap,
        topic,
        [(i % 2, None, json.dumps(v).encode()) for i, v in enumerate(values)] + [(1, None, b"{bad")],
    )
    opts = TopicOptions.parse(
        {"topic": topic, "bootstrap.servers": bootstrap, "format": "json", "key": "item", "value": "n"}
    )
    got = sample_schema(opts)
    assert got.simpleString() == "struct<item:string,n:bigint,x:double,ok:boolean,tags:string,extra:string>"


def test_what_a_transform_cannot_read_is_one_line_before_any_work(
    spark: SparkSession, json_topic: JsonTopic, tmp_path: Path
) -> None:
    args = _transform_args(json_topic, tmp_path, f"avg-tf-no-{uuid.uuid4().hex[:8]}", filter_derive)
    refused = {
        "transform must be a function": {"transform": "price > 20"},
        "transform= reads an ordinary topic": {"input_format": "cec", "input_schema": None},
        r"input_schema 'item STRNG' is not a Spark DDL schema": {"input_schema": "item STRNG"},
        r"input_schema field 'when' is date": {"input_schema": "item STRING, price DOUBLE, when DATE"},
    }
    for why, change in refused.items():
        with pytest.raises(ConfigError, match=why) as caught:
            cec_aggregate(spark, available_now=True, **{**args, **change})
        assert "\n" not in str(caught.value), why
    assert not json_topic_has(json_topic, args["output_topic"])  # refused before any topic was made


def json_topic_has(data: JsonTopic, topic: str) -> bool:
    from confluent_kafka.admin import AdminClient

    return topic in AdminClient({"bootstrap.servers": data.bootstrap}).list_topics(timeout=30).topics
