"""docs/spark.md's hopping and session window snippets run as written.

The ```python blocks of the bullet "Hopping and session windows" are executed, in order, in one namespace
holding `spark`, `cec_aggregate` and `read_results` (the section's import), against the fixture broker:
the only substitutions are the bootstrap servers, the two local paths and the topic names (made unique).
The input topic is written first (JSON flights over 3 partitions, each carrier on one, event times rising,
then far-future tuples that close every window under the watermark), and the results each snippet shows
must be the plain-Python truth of that input (`tests.helpers.truth`).
"""

from __future__ import annotations

import json
import re
import textwrap
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cec.spark import cec_aggregate, read_results
from tests.brokers import Broker
from tests.helpers.topic_flights import FLUSH_TS, Record, flights_topic, flush_records
from tests.helpers.truth import csv_form, hopping_truth, session_truth
from tests.operators.spark.result_rows import epoch_ms

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DOC = Path(__file__).resolve().parents[3] / "docs" / "spark.md"
BULLET = "- **Hopping and session windows**"
BOOTSTRAP = "localhost:9092"
PATHS = ("/var/lib/cec", "/tmp/ckpt")
TOPICS = ("flights", "hourly-delays", "delay-sessions")
MINUTE = 60_000
CARRIERS = ["AA", "UA", "DL"]
STATE_PARTITIONS = 2  # the snippets' partitions=


def _blocks() -> list[str]:
    text = DOC.read_text()
    start = text.index(BULLET)
    end = text.index("\n- ", start + len(BULLET))
    pattern = re.compile(r"^([ \t]*)```python\n(.*?)^\1```", re.M | re.S)
    return [textwrap.dedent(m.group(2)) for m in pattern.finditer(text[start:end])]


def _records() -> list[Record]:
    """Flights: each carrier on one input partition, its times rising by 1 to 50 minutes (sessions of 30
    minutes break now and then), some delays null."""
    out: list[Record] = []
    clock = {c: 0 for c in CARRIERS}
    for i in range(900):
        h = (i * 2654435761) % 2**32
        carrier = CARRIERS[h % 3]
        clock[carrier] += (1 + (h >> 7) % 50) * MINUTE
        record: dict[str, Any] = {"carrier": carrier, "origin": ["JFK", "SFO", "ORD"][(h >> 3) % 3],
                                  "ts": clock[carrier], "dep_delay": (h >> 11) % 90 - 10}  # fmt: skip
        if h % 7:
            record["arr_delay"] = (h % 10_000) / 7 - 40
        out.append((CARRIERS.index(carrier), record))
    return out


def _sorted(rows: Any) -> list[dict[str, str]]:
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))


def test_the_docs_have_the_snippets() -> None:
    code = "\n".join(_blocks())
    assert 'slide="15m"' in code and 'session_gap="30m"' in code
    for literal in (BOOTSTRAP, *PATHS, *(f'"{t}"' for t in TOPICS)):
        assert literal in code, f"the test substitutes {literal!r}, which docs/spark.md no longer uses"


def test_the_hopping_and_session_snippets_run_as_written_and_give_the_truth(
    spark: SparkSession, kafka_broker: Broker, tmp_path: Path
) -> None:
    real = _records()
    records = real + flush_records(3, STATE_PARTITIONS, ["carrier", "origin"])
    topic = flights_topic(kafka_broker, records, 3)
    suffix = uuid.uuid4().hex[:8]
    outputs = {t: f"{t}-{suffix}" for t in TOPICS[1:]}
    code = "\n".join(_blocks())
    code = code.replace(BOOTSTRAP, kafka_broker.bootstrap)
    code = code.replace(PATHS[0], str(tmp_path / "state")).replace(PATHS[1], str(tmp_path / "ckpt"))
    code = code.replace(f'"{TOPICS[0]}"', f'"{topic}"')
    for name, unique in outputs.items():
        code = code.replace(f'"{name}"', f'"{unique}"')
    exec(
        compile(code, str(DOC), "exec"),
        {"spark": spark, "cec_aggregate": cec_aggregate, "read_results": read_results},
    )

    rows = [r for _, r in real]
    hourly = read_results(spark, outputs["hourly-delays"], kafka_broker.bootstrap).collect()
    got = _sorted(
        csv_form({k: epoch_ms(v) for k, v in r.asDict().items()}) for r in hourly if r["carrier"] != "ZZ"
    )
    aggs = [("avg", "arr_delay"), ("max", "dep_delay"), ("count", "*")]
    in_time = sorted(rows, key=lambda r: r["ts"])  # the truth's watermark: the largest time so far
    want = hopping_truth(
        in_time, ["carrier", "origin"], 60 * MINUTE, 15 * MINUTE, aggs, 10 * MINUTE, FLUSH_TS
    )
    assert len(want) > 100 and got == want

    sessions = read_results(spark, outputs["delay-sessions"], kafka_broker.bootstrap).collect()
    got = _sorted(
        csv_form({k: epoch_ms(v) for k, v in r.asDict().items()}) for r in sessions if r["key"] != "ZZ"
    )
    want = _sorted(csv_form(r) for r in session_truth(rows, 30 * MINUTE, [("avg", "arr_delay")], ["carrier"]))
    assert len(want) > 20 and got == want
