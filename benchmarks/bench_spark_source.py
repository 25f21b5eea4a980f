"""The `cec-kafka` source alone: a streaming read of the purchases topic in micro-batches, `foreachBatch`
counting rows, so that a micro-batch's time is the source's (Kafka read, checksums, payload decoding,
handing the rows to Spark) plus Spark's fixed per-batch cost. Both systems of `bench_spark.py --focus
attached` read their input through this source.

    nice -n 5 .venv/bin/python benchmarks/bench_spark_source.py --tuples 400000 --batches 4 --repeats 2

With `--format json` it measures the `cec-topic` source instead, over an ordinary JSON topic of the same
size (plain confluent-kafka producer, `{"item", "price", "ts"}` values; what `cec_aggregate(input_format=
"json")` reads):

    nice -n 5 .venv/bin/python benchmarks/bench_spark_source.py --format json --tuples 400000 --repeats 2

Prints each run's wall and per-micro-batch triggerExecution (ms); the first run of a driver is its cold
start. Writes benchmarks/out/spark-source.json (`spark-source-json.json` with `--format json`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from bench_spark import Workload, input_offsets, purchases_stream, write_input  # noqa: E402

OUT_JSON = ROOT / "benchmarks" / "out" / "spark-source.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tuples", type=int, default=400_000)
    parser.add_argument("--keys", type=int, default=2_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2, help="runs after the cold one")
    parser.add_argument(
        "--format", choices=("cec", "json"), default="cec", help="cec-kafka or cec-topic (json)"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from operators.spark.datasource import register
    from operators.spark.session import local_session
    from operators.spark.topic_reader import register_topic_source
    from tests.brokers import start_broker

    broker = start_broker()
    work = Path(tempfile.mkdtemp(prefix="bench-spark-source-"))
    w = Workload(
        args.tuples,
        args.keys,
        args.partitions,
        args.batches,
        broker.bootstrap,
        work,
        f"p-{uuid.uuid4().hex[:6]}",
    )
    if args.format == "json":
        _write_json_topic(w)
    else:
        write_input(w)
        w = replace(w, offsets=input_offsets(w))
    spark = local_session(
        f"local[{w.partitions}]", app_name="bench-spark-source", shuffle_partitions=w.partitions
    )
    register(spark)
    register_topic_source(spark)
    runs = []
    for i in range(args.repeats + 1):
        if args.format == "json":
            rows = _json_stream(spark, w)
        else:
            rows = purchases_stream(
                spark, w.input_topic, w.bootstrap, str(work / "source-state"), w.batch_rows
            )
        started = time.perf_counter()
        query = (
            rows.writeStream.foreachBatch(lambda df, _batch: df.count())
            .option("checkpointLocation", str(work / f"checkpoint-{i}"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        wall = time.perf_counter() - started
        batches = [p["durationMs"]["triggerExecution"] for p in query.recentProgress]
        rows_read = sum(p["numInputRows"] for p in query.recentProgress)
        runs.append({"cold": i == 0, "wall_seconds": wall, "trigger_ms": batches, "rows": rows_read})
        print(
            f"{'cold' if i == 0 else 'warm'} run: {rows_read:,} rows in {wall:.2f} s "
            f"({rows_read / wall:,.0f} rows/s); micro-batches {batches} ms",
            file=sys.stderr,
        )
    spark.stop()
    out = OUT_JSON if args.format == "cec" else OUT_JSON.with_name("spark-source-json.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "format": args.format,
                "tuples": w.tuples,
                "offsets": w.offsets,
                "batches": w.batches,
                "runs": runs,
            },
            indent=2,
        )
    )
    return 0


def _write_json_topic(w: Workload) -> None:
    """The purchases as plain JSON values (no cec envelope), keys spread over the partitions."""
    from tests.topic_data import as_json, create_topic, make_purchases, produce

    create_topic(w.bootstrap, w.input_topic, w.partitions)
    purchases = make_purchases(w.tuples, w.keys, w.partitions)
    produce(w.bootstrap, w.input_topic, [(p, None, as_json(rec)) for p, rec in purchases])


def _json_stream(spark: Any, w: Workload) -> Any:
    from operators.spark.topic_reader import TOPIC_FORMAT

    return (
        spark.readStream.format(TOPIC_FORMAT)
        .option("topic", w.input_topic)
        .option("bootstrap.servers", w.bootstrap)
        .option("format", "json")
        .option("key", "item")
        .option("value", "price")
        .option("maxRecordsPerTrigger", str(w.batch_rows))
        .load()
    )


if __name__ == "__main__":
    sys.exit(main())
