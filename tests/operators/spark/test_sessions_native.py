"""Session windows with a watermark against Spark's own `session_window` + `withWatermark` on one input.

The same flights (three input partitions, every key on every partition, event times that never decrease
within a partition, sessions often in back-to-back gap-wide slices) go through `cec run`'s engine (`operators.sessions` over a 3-partition cec queue) and
through a real PySpark streaming query: a JSON file source read one file per micro-batch,
`withWatermark("t", LATENESS)`, `groupBy(carrier, origin, session_window("t", GAP))`, append mode. The
input ends with one far tuple per partition, so both watermarks end at the same W (Spark's: the largest
time less the delay; cec's: the smallest of the partitions' largest times less the lateness). What each
has emitted at the end of the bounded input (Spark's last, no-data micro-batch closes what W passed) must
be the same sessions, equal to the plain-Python truth: every session whose end W is at or past.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cec.config import Checkpointing
from operators.job import JobSpec, aggregate_operator, build_operator, run_job
from operators.sinks import iter_payloads
from queuestore.sqlite import SqliteQueueStore
from tests.helpers.flight_queues import write_partitions
from tests.helpers.truth import watermark_session_truth
from tests.operators.test_sessions import AGGS, FLIGHT_SCHEMA, LATENESS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Odd, with every event time even: no two tuples are exactly the gap apart. There the rules differ: cec's
# sessions (as issue 24 words them) join tuples less than the gap apart, Spark's also those exactly the
# gap apart (its sessions merge when one ends where the next starts).
GAP = 31
FIELDS = ("carrier", "origin", "start", "end", "count", "count_arr_delay", "avg_arr_delay", "max_dep_delay")


def _flights(seed: int) -> list[list[dict[str, Any]]]:
    """Per input partition, flights of 30 keys (every key on every partition) up to time 1,500, times
    rising by 0 to 8 ms (a key's next tuple ~40 ms later: sessions of a few tuples, often in back-to-back
    slices), even (GAP); delays whose float sums are exact (multiples of 1/8, small): Spark's `avg` adds
    doubles in its own order, cec's exactly, and on these both are the true mean. Then one tuple of a key
    of its own per partition at the input's latest time: the final watermark of both sides, close behind
    the last sessions."""
    rnd = random.Random(seed)
    parts = []
    for _ in range(3):
        t, rows = rnd.randrange(0, GAP), []
        while t < 1500:
            t += rnd.randrange(0, 9)
            h = rnd.randrange(1 << 30)
            rows.append(
                {
                    "carrier": rnd.choice(["AA", "UA", "DL", "B6", "WN", "NK"]),
                    "origin": rnd.choice(["JFK", "SFO", "ORD", "LAX", "BOS"]),
                    "arr_delay": None if h % 11 == 0 else rnd.randrange(-800, 800) / 8,
                    "dep_delay": None if h % 13 == 0 else float(h % 300) / 3,
                    "ts": t - t % 2,
                }
            )
        parts.append(rows)
    end = max(r["ts"] for rows in parts for r in rows)
    for rows in parts:
        rows.append({"carrier": "ZZ", "origin": "END", "arr_delay": None, "dep_delay": None, "ts": end})
    return parts


def _job(root: Path) -> JobSpec:
    return JobSpec(
        operator=aggregate_operator(
            "carrier",
            None,
            "avg",
            time="ts",
            session_gap=f"{GAP}ms",
            allowed_lateness=f"{LATENESS}ms",
            key_fields=["carrier", "origin"],
            aggs=AGGS,
        ),
        source={"type": "queue", "topic": "flights", "schema": FLIGHT_SCHEMA},
        store={"type": "sqlite", "root": str(root)},
        output_topic="agg",
        checkpointing=Checkpointing(u_target=60, ci_ms=5.0, cp_ms=10.0),
        batch_size=16,
    )


def _row(r: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(r[f] for f in FIELDS)


def _spark_sessions(
    spark: SparkSession, parts: list[list[dict[str, Any]]], root: Path
) -> list[tuple[Any, ...]]:
    from pyspark.sql import functions as F

    source = root / "spark-input"
    source.mkdir()
    rows = sorted((r for rows in parts for r in rows), key=lambda r: r["ts"])
    # Three files by time (one micro-batch each): each later file's times are at or past every earlier
    # one's, so no tuple is behind Spark's watermark, as none is behind cec's.
    third = len(rows) // 3
    for n, chunk in enumerate((rows[:third], rows[third : 2 * third], rows[2 * third :])):
        with (source / f"part-{n}.json").open("w") as out:
            for r in chunk:
                out.write(json.dumps(r) + "\n")
    flights = (
        spark.readStream.schema("carrier STRING, origin STRING, arr_delay DOUBLE, dep_delay DOUBLE, ts LONG")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .withColumn("t", F.timestamp_millis("ts"))
        .withWatermark("t", f"{LATENESS} milliseconds")
    )
    sessions = flights.groupBy("carrier", "origin", F.session_window("t", f"{GAP} milliseconds")).agg(
        F.count(F.lit(1)).alias("count"),
        F.count("arr_delay").alias("count_arr_delay"),
        F.avg("arr_delay").alias("avg_arr_delay"),
        F.max("dep_delay").alias("max_dep_delay"),
    )
    out = sessions.select(
        "carrier",
        "origin",
        F.unix_millis(F.col("session_window.start")).alias("start"),
        F.unix_millis(F.col("session_window.end")).alias("end"),
        "count",
        "count_arr_delay",
        "avg_arr_delay",
        "max_dep_delay",
    )
    name = f"sessions_{root.name}".replace("-", "_")
    query = (
        out.writeStream.format("memory")
        .queryName(name)
        .outputMode("append")
        .option("checkpointLocation", str(root / "spark-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    batches = query.recentProgress
    assert len(batches) >= 3  # the three files, each a micro-batch of its own (and the last, no-data one)
    return sorted(_row(r.asDict()) for r in spark.sql(f"SELECT * FROM {name}").collect())


def test_sessions_closed_by_the_watermark_equal_sparks_session_window_and_the_truth(
    spark: SparkSession, tmp_path: Path
) -> None:
    parts = _flights(3)
    root = tmp_path / "cec"
    write_partitions(root, parts, FLIGHT_SCHEMA)
    spec = _job(root)
    run_job(spec)
    schema = build_operator(spec.operator).result_schema
    cec = sorted(_row(r) for r in iter_payloads(SqliteQueueStore(root), "agg", schema))
    truth = sorted(_row(r) for r in watermark_session_truth(parts, GAP, LATENESS, AGGS))
    native = _spark_sessions(spark, parts, tmp_path)
    # Enough sessions, and among them sessions the watermark passed while the key's slices (t // GAP) ran
    # on without an empty one up to it: closing such a run of slices together would hold them back.
    assert len(truth) > 300
    watermark = max(r["ts"] for rows in parts for r in rows) - LATENESS
    occupied = {(r["carrier"], r["origin"], r["ts"] // GAP) for rows in parts for r in rows}

    def run_end(key: tuple[str, str], slice_: int) -> int:
        while (*key, slice_ + 1) in occupied:
            slice_ += 1
        return slice_

    held = [r for r in truth if (run_end((r[0], r[1]), (r[3] - GAP) // GAP) + 2) * GAP > watermark]
    assert len(held) >= 8
    assert native == truth
    assert cec == truth
