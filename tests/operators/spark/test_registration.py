"""`spark.read.format("cec-kafka")` / `format("cec-topic")` in a session that nothing of cec registered
(issue 25: DATA_SOURCE_NOT_FOUND when the session was created after `import cec.spark`): Spark itself
registers the data sources of the top-level modules `pyspark_cec_kafka` and `pyspark_cec_topic` (its
automatic registration of `pyspark_*` modules with a `DefaultSource`), once per JVM, so a child process
with a fresh JVM checks it: a session made after the import, with no `register(spark)`. The child runs
from the repository root, where an editable install's top-level modules are on the Python path (an
installed wheel has them in site-packages)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyspark_cec_kafka
import pyspark_cec_topic
from operators.spark.datasource import CecKafkaDataSource
from operators.spark.topic_reader import CecTopicDataSource

ROOT = Path(__file__).resolve().parents[3]

CHILD = """
import cec.spark  # the import the README shows, before the session exists
from pyspark.sql import SparkSession

spark = SparkSession.builder.master("local[1]").appName("cec-registration").getOrCreate()
for name, options in (("cec-kafka", {}), ("cec-topic", {"key": "a", "value": "b"})):
    reader = spark.read.format(name).option("topic", "t").option("bootstrap.servers", "127.0.0.1:1")
    print(name, ",".join(reader.options(**options).load().columns))
spark.stop()
"""


def test_the_modules_are_the_data_sources() -> None:
    assert pyspark_cec_kafka.DefaultSource is CecKafkaDataSource
    assert pyspark_cec_topic.DefaultSource is CecTopicDataSource


def test_a_session_made_after_the_import_reads_both_formats_without_register() -> None:
    from pyspark.sql.datasource import CaseInsensitiveDict

    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.startswith("cec-"))
    assert lines["cec-topic"] == "cec_partition,cec_offset,cec_error,cec_key,cec_v,cec_time"
    # The cec-kafka source's own columns for these options, as it gives them in this process.
    options = CaseInsensitiveDict({"topic": "t", "bootstrap.servers": "127.0.0.1:1"})
    assert lines["cec-kafka"] == ",".join(CecKafkaDataSource(options).schema().fieldNames())
