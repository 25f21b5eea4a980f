"""A session without Spark's Kafka connector, as a user has it before `make spark-kafka-jars` (or on a
cluster started without `--jars`/`--packages`): in a Python process of its own, because Spark keeps one
JVM per process and the suite's session has the connector.

- `cec_aggregate(input_reader="spark-kafka")` stops with one `ConfigError` line that says what is missing
  and how to get it, before anything touches the broker (the bootstrap address below answers nothing);
- `input_reader="auto"` falls back to the Python data source.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.operators.spark.conftest import SPARK_MASTER

ROOT = Path(__file__).resolve().parents[3]

_DRIVER = textwrap.dedent(
    """
    import sys
    from cec.exceptions import CecError
    from operators.spark.attach import cec_aggregate
    from operators.spark.connector import has_kafka_connector
    from operators.spark.kafka_input import choose_input_reader
    from operators.spark.session import local_session

    spark = local_session(sys.argv[1], app_name="cec-no-connector")
    print("connector:", has_kafka_connector(spark))
    print("auto reads through:", choose_input_reader(spark, "auto", "json", None))
    try:
        cec_aggregate(
            spark,
            input_topic="purchases",
            bootstrap_servers="127.0.0.1:1",
            output_topic="averages",
            key="item",
            value="price",
            window_count=10,
            input_format="json",
            input_reader="spark-kafka",
            state_dir=sys.argv[2],
            checkpoint_location=sys.argv[3],
        )
    except CecError as exc:
        print("refused:", type(exc).__name__, repr(str(exc)))
    else:
        print("started")
    spark.stop()
    """
)


def test_spark_kafka_without_the_connector_is_one_clear_line(tmp_path: Path) -> None:
    empty = tmp_path / "no-jars"
    empty.mkdir()
    env = {**os.environ, "CEC_SPARK_KAFKA_JARS": str(empty), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, SPARK_MASTER, str(tmp_path / "state"), str(tmp_path / "ckpt")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "connector: False" in lines
    assert "auto reads through: python" in lines
    (refused,) = [line for line in lines if line.startswith(("refused:", "started"))]
    assert refused.startswith("refused: ConfigError ")
    message = ast.literal_eval(refused.removeprefix("refused: ConfigError "))
    assert "\n" not in message
    assert "input_reader='spark-kafka' needs Spark's Kafka connector" in message
    assert "make spark-kafka-jars" in message
    assert "Traceback" not in done.stdout + done.stderr
    # Nothing was asked of the broker: no client library line about the unreachable address.
    assert "127.0.0.1:1" not in done.stderr
