"""Key partitioning computed in Python (operators.spark.partitioning) agrees with Spark's own hash()."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from operators.spark.partitioning import KeyGrouper, partition_groups, spark_hash_string

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _strings() -> list[str | None]:
    rng = random.Random(11)
    alphabet = "abcXYZ019 _-\u00e9\u00fc\u4e2d\u6587\U0001f600"
    out: list[str | None] = [None, "", "a", "ab", "abc", "abcd", "abcde", "\u00e9", "\u4e2d", "\U0001f600"]
    out += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 23))) for _ in range(400)]
    out += [str(i) for i in range(300)]
    return out


def test_string_hash_equals_sparks_hash_for_every_length_and_non_ascii_bytes(spark: SparkSession) -> None:
    from pyspark.sql import functions as F

    values = _strings()
    frame = spark.createDataFrame([(i, v) for i, v in enumerate(values)], "i long, s string")
    got = {r["i"]: r["h"] for r in frame.select("i", F.hash("s").alias("h")).collect()}
    assert got == {i: spark_hash_string(v) for i, v in enumerate(values)}


def test_key_grouper_matches_the_querys_output_partition_in_every_generation(spark: SparkSession) -> None:
    from pyspark.sql import functions as F

    from operators.spark.partitioning import output_partition

    values = _strings()
    partitions = [3, 2, 5]
    frame = spark.createDataFrame([(i, v) for i, v in enumerate(values)], "i long, s string")
    rows = frame.select("i", *[output_partition(F.col("s"), p).alias(f"q{p}") for p in partitions]).collect()
    grouper = KeyGrouper(partitions)
    groups = partition_groups(5)
    for row in rows:
        group, qs = grouper(values[row["i"]])
        assert qs == [row[f"q{p}"] for p in partitions]
        assert group == groups[row["q5"]]
