"""Session settings CEC on Spark refuses, and the data sources without a hidden set-up call.

- `spark.speculation=true` and an embedded SQLite store on a non-local master are refused with one
  ConfigError line (checked on sessions whose SparkContext says so: a stand-in object answering what
  `check_session` reads, since one process can hold only one real SparkContext);
- `spark.read.format("cec-kafka")` / `("cec-topic")` work in a fresh driver process after importing
  `operators.spark.attach`, with no `register(spark)` call (the README's snippet as a user runs it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cec.exceptions import ConfigError
from operators.spark.session import check_session, is_local_master
from tests.brokers import Broker
from tests.helpers import child_env
from tests.topic_data import create_topic, produce


@dataclass
class _Conf:
    settings: dict[str, str]

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.settings.get(key, default)


@dataclass
class _Context:
    master: str
    settings: dict[str, str] = field(default_factory=dict)

    def getConf(self) -> _Conf:
        return _Conf(self.settings)


@dataclass
class _Session:
    sparkContext: _Context


def _session(master: str, **settings: str) -> Any:
    return _Session(_Context(master, dict(settings)))


def test_speculation_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"spark\.speculation=true") as info:
        check_session(_session("local[2]", **{"spark.speculation": "true"}), embedded_store=False, what="x")
    assert "\n" not in str(info.value)
    check_session(_session("local[2]", **{"spark.speculation": "false"}), embedded_store=False, what="x")


@pytest.mark.parametrize("master", ["spark://127.0.0.1:7077", "yarn", "k8s://https://k:443"])
def test_embedded_store_needs_a_local_master(master: str) -> None:
    with pytest.raises(ConfigError, match="SQLite store needs a local") as info:
        check_session(_session(master), embedded_store=True, what="SparkOperatorHost")
    assert "\n" not in str(info.value) and master in str(info.value)
    check_session(_session(master), embedded_store=False, what="cec_aggregate")  # Kafka store: fine


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", "local[2,3]"])
def test_local_masters_may_use_the_embedded_store(master: str) -> None:
    assert is_local_master(_session(master))
    check_session(_session(master), embedded_store=True, what="SparkOperatorHost")


def test_the_real_session_passes(spark: Any) -> None:
    check_session(spark, embedded_store=True, what="tests")


_SNIPPET = """
    import json, sys
    from operators.spark.session import local_session

    spark = local_session("local[1]", app_name="cec-register-test")
    import operators.spark.attach  # noqa: F401  (what `from operators.spark.attach import cec_aggregate` does)

    topic, bootstrap = sys.argv[1], sys.argv[2]
    rows = (
        spark.read.format("cec-topic").option("topic", topic).option("bootstrap.servers", bootstrap)
        .option("format", "json").option("key", "item").option("value", "price").load().collect()
    )
    found = [[r["cec_key"], r["cec_v"], r["cec_error"]] for r in rows]
    print(json.dumps(sorted(found, key=lambda r: (r[0] is None, r[0] or ""))))
    spark.stop()
"""


def test_formats_work_without_a_register_call(spark_kafka_broker: Broker, tmp_path: Path) -> None:
    topic = f"plain-{uuid.uuid4().hex[:8]}"
    create_topic(spark_kafka_broker.bootstrap, topic, 2)
    produce(
        spark_kafka_broker.bootstrap,
        topic,
        [
            (0, None, b'{"item": "a", "price": 1.5}'),
            (1, None, b'{"item": "b", "price": 2}'),
            (1, None, b"oops"),
        ],
    )
    script = tmp_path / "snippet.py"
    script.write_text(textwrap.dedent(_SNIPPET))
    done = subprocess.run(
        [sys.executable, str(script), topic, spark_kafka_broker.bootstrap],
        env=child_env(),
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    rows = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert rows[:2] == [["a", "1.5", None], ["b", "2", None]]
    assert rows[2][0] is None and "JSON" in rows[2][2]
