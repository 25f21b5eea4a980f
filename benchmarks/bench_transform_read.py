"""`cec_aggregate(transform=...)`: what reading the source twice per micro-batch costs (issue 25).

With a transform, the input is decoded once into rows and dead letters and then split: the rows go through
the user's transform, the dead letters bypass it, and the two are unioned (`operators.spark.transform.
transformed_input`). Spark plans each side of the union as its own scan of the source, so each micro-batch
reads its records twice and decodes them twice. This benchmark runs the same query both ways over a topic
with no bad record (so the dead-letter side is empty and both ways give the same results): "two reads" is
the shipped plan, "one read" is the same plan without the dead-letter side (which only such an input
allows). Each run is a child process (its own JVM and Python workers, `local_session`); its CPU seconds are
its whole process tree's, taken by the child itself just before it stops Spark (`tree_cpu_s`: the driver,
the JVM and every Python process, live ones from /proc, ended ones through their parents' counts), the two
ways interleaved, with the load average beside each figure.

    CEC_TEST_BROKER=apache-kafka flock /tmp/cec-bench.lock nice -n 5 \
        .venv/bin/python benchmarks/bench_transform_read.py --tuples 300000 --rounds 2

Writes benchmarks/out/transform-read.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OUT_JSON = ROOT / "benchmarks" / "out" / "transform-read.json"
WAYS = ("two reads", "one read")
SCHEMA = "item STRING, price DOUBLE, ts BIGINT"


def _transform(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.where("price >= 1").withColumn("price_k", F.col("price") / 1000)


def one_read_input(
    spark: Any, opts: Any, struct: Any, transform: Any, kafka_rows: Any, types: Any = None
) -> Any:
    """`transformed_input` without the dead-letter side of the union: one scan of the source. Only equal
    to it on an input without dead letters (what this benchmark produces)."""
    from pyspark.sql import functions as F

    from operators.spark import transform as tf

    decoder = tf.FieldDecoder(opts, struct)
    decoded = kafka_rows.select("partition", "offset", "timestamp", "value").mapInArrow(
        decoder, decoder.output_schema()
    )
    good = decoded.drop(tf.ERROR_COLUMN, tf.RAW_COLUMN)
    user = transform(good)
    tf.check_plan(good, user)
    fields = tf.operator_fields(opts)
    types_of = {f.name: f.dataType for f in user.schema.fields}
    taken = [tf._as_input(name, types_of[name], is_time=name == opts.time) for name in fields]
    kept = user.select(
        "partition", "offset", *taken, F.lit(None).cast("string").alias(tf.ERROR_COLUMN),
        F.lit(None).cast("binary").alias(tf.RAW_COLUMN),
    )  # fmt: skip
    return kept.mapInArrow(tf.TransformedPacker(opts, fields), opts.read_schema())


def tree_cpu_s(root: int) -> float:
    """CPU seconds of `root` and its descendants: each live process's own user+system time plus what its
    ended, reaped children used (/proc/PID/stat fields 14-17), read from the top down."""
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = sum(int(f) for f in fields[11:15])
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child_pid, parent in parents.items():
            if parent == pid and child_pid not in tree:
                tree.add(child_pid)
                frontier.append(child_pid)
    return sum(times.get(pid, 0) for pid in tree) / os.sysconf("SC_CLK_TCK")


def child(args: argparse.Namespace) -> int:
    """One run: the query to the end of the topic, then its result count (stdout, JSON)."""
    from operators.spark import wiring
    from operators.spark.attach import cec_aggregate
    from operators.spark.results import read_results
    from operators.spark.session import local_session

    if args.way == "one read":
        wiring.transformed_input = one_read_input  # type: ignore[assignment]
    spark = local_session("local[2,3]")
    root = Path(tempfile.mkdtemp(prefix="cec-bench-tf-"))
    output = f"tf-read-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    query = cec_aggregate(
        spark, input_topic=args.topic, input_format="json", bootstrap_servers=args.bootstrap,
        output_topic=output, key="item", value="price_k", agg="avg", window_count=50,
        transform=_transform, input_schema=SCHEMA, input_reader=args.reader,
        state_dir=str(root / "state"), checkpoint_location=str(root / "ckpt"), available_now=True,
        max_records_per_trigger=args.trigger,
    )  # fmt: skip
    assert query.awaitTermination(3600) and query.exception() is None
    wall = time.monotonic() - started
    results = read_results(spark, output, args.bootstrap).count()
    print(json.dumps({"wall_s": wall, "results": results, "cpu_s": tree_cpu_s(os.getpid())}))
    spark.stop()
    return 0


def _child_run(way: str, reader: str, bootstrap: str, topic: str, trigger: int) -> dict[str, Any]:
    load = os.getloadavg()[0]
    done = subprocess.run(
        [sys.executable, __file__, "--child", "--way", way, "--reader", reader, "--bootstrap", bootstrap,
         "--topic", topic, "--trigger", str(trigger)],
        capture_output=True, text=True, check=False, cwd=ROOT,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{way} ({reader}) failed:\n{done.stderr[-3000:]}")
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    return {"way": way, "reader": reader, "load_1m": load, **doc}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tuples", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved runs of each way")
    parser.add_argument("--trigger", type=int, default=50_000, help="max_records_per_trigger")
    parser.add_argument("--readers", default="spark-kafka,python")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)
    parser.add_argument("--reader", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)

    from tests.brokers import start_broker
    from tests.topic_data import create_topic, produce

    broker = start_broker()
    try:
        topic = f"tf-read-in-{uuid.uuid4().hex[:8]}"
        create_topic(broker.bootstrap, topic, args.partitions)
        records = [
            (i % args.partitions, None,
             json.dumps({"item": f"k{i % 2000}", "price": float(i % 997), "ts": i}).encode())
            for i in range(args.tuples)
        ]  # fmt: skip
        produce(broker.bootstrap, topic, records)
        runs = []
        for round_ in range(args.rounds):
            for reader in args.readers.split(","):
                for way in WAYS if round_ % 2 == 0 else reversed(WAYS):
                    run = _child_run(way, reader, broker.bootstrap, topic, args.trigger)
                    runs.append(run)
                    print(
                        f"{reader:11} {way:9}  cpu {run['cpu_s']:7.1f} s  wall {run['wall_s']:6.1f} s  "
                        f"results {run['results']:,}  load {run['load_1m']:.1f}",
                        flush=True,
                    )
        for reader in args.readers.split(","):
            cpu = {w: sum(r["cpu_s"] for r in runs if r["reader"] == reader and r["way"] == w) for w in WAYS}
            print(f"{reader}: CPU two reads / one read = {cpu['two reads'] / cpu['one read']:.2f}")
        OUT_JSON.parent.mkdir(parents=True, exist_ok=True)
        OUT_JSON.write_text(
            json.dumps({"tuples": args.tuples, "broker": broker.describe(), "runs": runs}, indent=1)
        )
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
