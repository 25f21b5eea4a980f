"""The README's PySpark section runs as written.

Every ```python block of the README section "## On Spark" is extracted and executed, in order, in one
namespace, against the fixture broker: the only substitutions are the bootstrap servers
("localhost:9092"), the two local paths (state dir and Spark checkpoint, to a temporary directory) and the
two topic names (made unique, so that a long-lived broker never hands the test an old topic). The input
topic the snippet reads is written first, in the format the snippet declares (`input_format="json"`: JSON
objects; otherwise CEC records with the `purchase` payload, cec_aggregate's default), and the results the
snippet shows must be the plain per-key count-window average of that input.
"""

from __future__ import annotations

import json
import re
import textwrap
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cec.records import AvroCodec, Kind, OutputRecord, RecordCodec
from operators.job import SCHEMAS
from operators.sources import PurchaseGenerator
from queuestore.kafka import KafkaQueueStore
from tests.brokers import Broker

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

README = Path(__file__).resolve().parents[3] / "README.md"
SECTION = "## On Spark"
BOOTSTRAP = "localhost:9092"
PATHS = ("/var/lib/cec", "/tmp/ckpt")
TOPICS = ("purchases", "avg-price")
COUNT = 1200
KEYS = 20
PARTITIONS = 2


def readme_section(text: str, heading: str) -> str:
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else len(text)]


def python_blocks(section: str) -> list[str]:
    """The ```python blocks of a Markdown section, dedented (they may sit inside a list item)."""
    pattern = re.compile(r"^([ \t]*)```python\n(.*?)^\1```", re.M | re.S)
    return [textwrap.dedent(m.group(2)) for m in pattern.finditer(section)]


def test_readme_section_has_the_snippets() -> None:
    blocks = python_blocks(readme_section(README.read_text(), SECTION))
    code = "\n".join(blocks)
    assert "cec_aggregate(" in code and "read_results(" in code
    for literal in (BOOTSTRAP, *PATHS, *(f'"{t}"' for t in TOPICS)):
        assert literal in code, f"the test substitutes {literal!r}, which the README no longer uses"


def _write_input(bootstrap: str, topic: str, root: Path, json_values: bool) -> dict[tuple[str, int], float]:
    """The purchases topic in the snippet's format, and its count-window averages (window 10, as in the
    README), per (key, window)."""
    gen = PurchaseGenerator(COUNT, KEYS, seed=5, partitions=PARTITIONS)
    expected: dict[tuple[str, int], float] = {}
    open_prices: dict[str, list[int]] = {}
    closed: dict[str, int] = {}
    rows = [[gen.tuple_at(j, o) for o in range(gen.sizes[j])] for j in range(PARTITIONS)]
    for partition in rows:
        for value in partition:
            key, prices = str(value["item_id"]), open_prices.setdefault(str(value["item_id"]), [])
            prices.append(int(value["item_price"] or 0))
            if len(prices) == 10:
                expected[(key, closed.get(key, 0))] = sum(prices) / 10
                closed[key] = closed.get(key, 0) + 1
                prices.clear()
    if json_values:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        for j, partition in enumerate(rows):
            for value in partition:
                producer.produce(topic, json.dumps(value).encode(), partition=j)
        assert producer.flush(30) == 0
        return expected
    codec, payloads = RecordCodec(), AvroCodec(SCHEMAS["purchase"])
    store = KafkaQueueStore(bootstrap, root)
    try:
        store.create_topic(topic, PARTITIONS)
        for j, partition in enumerate(rows):
            with store.writer(topic, j) as writer:
                for value in partition:
                    record = OutputRecord(
                        Kind.R, int(value["item_time"] or 0), (), 0, payload=payloads.encode(value)
                    )
                    writer.append(codec.encode(record), record.meta())
    finally:
        store.close()
    return expected


def test_readme_pyspark_section_runs_as_written(
    spark: SparkSession, spark_kafka_broker: Broker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = "\n".join(python_blocks(readme_section(README.read_text(), SECTION)))
    names = {t: f"{t}-{uuid.uuid4().hex[:8]}" for t in TOPICS}
    code = code.replace(BOOTSTRAP, spark_kafka_broker.bootstrap)
    for i, path in enumerate(PATHS):
        code = code.replace(path, str(tmp_path / f"path{i}"))
    for topic, unique in names.items():
        code = code.replace(f'"{topic}"', f'"{unique}"')
    expected = _write_input(
        spark_kafka_broker.bootstrap, names["purchases"], tmp_path / "input", 'input_format="json"' in code
    )
    namespace: dict[str, Any] = {"__name__": "readme"}
    exec(compile(code, str(README), "exec"), namespace)  # the README, as a user runs it

    shown = capsys.readouterr().out
    assert re.search(r"\|\s*key\|\s*window\|\s*value\|\s*count\|", shown), shown[-2000:]
    query = namespace["query"]
    assert query.exception() is None and not query.isActive
    from operators.spark.attach import read_results

    rows = read_results(spark, names["avg-price"], spark_kafka_broker.bootstrap).collect()
    got = {(str(r["key"]), int(r["window"])): float(r["value"]) for r in rows}
    assert len(got) == len(rows) and got.keys() == expected.keys()
    for wid, value in expected.items():
        assert got[wid] == pytest.approx(value, rel=1e-12), wid
