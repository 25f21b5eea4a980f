"""Recovery planning of the attached aggregation: on the driver (before) vs on the executors (now).

The part of a restart that issue 10 moved: reading every output log back (EC, closed-window directory)
and building the fresh query's initial state. Before (main at 5716416): `plan_recovery` on the driver, then
`spark.createDataFrame` of one Python row per loaded window or key. Now: `operators.spark.planning`,
one `mapInArrow` task per output partition, the initial state cached on the executors.

Input: P output logs written as an attached run leaves them, synthetic: K keys, half of them with a closed
window (G-open, R) followed by an open one, the other half with one open window (G-open), so the EC holds K
windows and the closed-window directory K/2 keys. Each measured step: plan + `initial.count()` (the
initial state materialised, as the query's first batch does). Old and new alternate `--repeats` times in
one Spark session (`local[2]`), so a drift of the shared machine's load falls on both sides; the ratio is
per pair, the median reported.

    nice -n 5 .venv/bin/python benchmarks/bench_attach_planning.py --keys 100000
Writes benchmarks/out/attach-planning-<keys>.json. Progress on stderr.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cec.records import Kind, OutputRecord, RecordCodec  # noqa: E402
from operators.spark.generations import Generation  # noqa: E402
from operators.spark.planning import plan_recovery  # noqa: E402
from queuestore.kafka import KafkaQueueStore  # noqa: E402
from queuestore.output import OutputQueue  # noqa: E402

BEFORE = "5716416"  # main before issue 10's planning on the executors


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _old_planning() -> Any:
    """`operators/spark/planning.py` as it was at BEFORE, loaded as a module of its own."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{BEFORE}:operators/spark/planning.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="old-planning-")) / "old_planning.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_planning", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_planning"] = module
    spec.loader.exec_module(module)
    return module


def write_logs(store: KafkaQueueStore, topic: str, partitions: int, keys: int) -> int:
    """The logs (module doc): pos grows by one tuple per record on the record's own input partition."""
    codec = RecordCodec()
    store.create_topic(topic, partitions)
    state = bytes(24)
    written = 0
    for q in range(partitions):
        out = OutputQueue(store, topic, q)
        try:
            pos = [0, 0]
            n = 0
            for k in range(q, keys, partitions):
                key = str(k)
                j = k % 2
                seqs = (0, 1) if k % 4 < 2 else (0,)
                for seq in seqs:
                    pos[j] += 1
                    n += 1
                    record = OutputRecord(Kind.GOPEN, sum(pos), tuple(pos), n, key, seq, state)
                    out.append(codec.encode(record), record.meta())
                    if seq == 0 and len(seqs) == 2:
                        pos[j] += 1
                        n -= 1
                        record = OutputRecord(Kind.R, sum(pos), tuple(pos), n, key, seq, None, b"r")
                        out.append(codec.encode(record), record.meta())
                        written += 1
                    written += 1
            out.flush()
        finally:
            out.close()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    from pyspark.sql import SparkSession

    from operators.spark.processor import INIT_SCHEMA
    from operators.spark.session import local_session
    from tests.brokers import start_broker

    old = _old_planning()
    broker = start_broker()
    work = Path(tempfile.mkdtemp(prefix="bench-attach-planning-"))
    result: dict[str, Any] = {
        "keys": args.keys,
        "partitions": args.partitions,
        "before": BEFORE,
        "loadavg_start": os.getloadavg(),
    }
    spark: SparkSession | None = None
    try:
        store = KafkaQueueStore(broker.bootstrap, work / "state")
        topic = f"agg-plan-{uuid.uuid4().hex[:6]}"
        started = time.perf_counter()
        result["records"] = write_logs(store, topic, args.partitions, args.keys)
        say(
            f"{result['records']:,} records over {args.partitions} logs in {time.perf_counter() - started:.1f} s"
        )
        gens = [Generation(0, topic, args.partitions)]
        spark = local_session("local[2]", app_name="bench-attach-planning")
        spark.range(4).count()  # the JVM warm before the first measured step

        def run_old() -> dict[str, Any]:
            outputs = [OutputQueue(store, topic, q) for q in range(args.partitions)]
            try:
                begin = time.perf_counter()
                rec = old.plan_recovery(store, gens, outputs, 2)
                planned = time.perf_counter() - begin
                rows: list[tuple[Any, ...]] = [
                    (
                        k,
                        w.seq,
                        True,
                        w.state,
                        w.generation,
                        list(w.pos_w),
                        False,
                        list(w.pos_w),
                        -1,
                        -1,
                        -1,
                        -1,
                    )
                    for k, w in rec.windows.items()
                ]
                rows.extend(
                    (k, s, False, None, -1, None, False, None, -1, -1, -1, -1)
                    for k, s in rec.next_seq.items()
                )
                initial = spark.createDataFrame(rows, INIT_SCHEMA)
                count = initial.count()
                return {"seconds": time.perf_counter() - begin, "plan_seconds": planned, "rows": count,
                        "windows": rec.ec_windows, "start": list(rec.start)}  # fmt: skip
            finally:
                for out in outputs:
                    out.close()

        def run_new() -> dict[str, Any]:
            outputs = [OutputQueue(store, topic, q) for q in range(args.partitions)]
            try:
                begin = time.perf_counter()
                rec = plan_recovery(spark, store, gens, outputs, 2)
                planned = time.perf_counter() - begin
                assert rec.initial is not None
                count = rec.initial.count()
                seconds = time.perf_counter() - begin
                rec.release()
                return {"seconds": seconds, "plan_seconds": planned, "rows": count, "windows": rec.ec_windows,
                        "start": list(rec.start), "driver_rows": rec.driver_rows}  # fmt: skip
            finally:
                for out in outputs:
                    out.close()

        pairs = []
        for i in range(args.repeats):
            order = ("old", "new") if i % 2 == 0 else ("new", "old")
            pair: dict[str, Any] = {"order": list(order)}
            for side in order:
                pair[side] = run_old() if side == "old" else run_new()
                say(
                    f"repeat {i}: {side} {pair[side]['seconds']:.2f} s (plan {pair[side]['plan_seconds']:.2f} s, "
                    f"{pair[side]['rows']:,} initial rows; load {os.getloadavg()[0]:.1f})"
                )
            assert pair["old"]["rows"] == pair["new"]["rows"] and pair["old"]["start"] == pair["new"]["start"]
            assert pair["old"]["windows"] == pair["new"]["windows"] == args.keys
            pair["ratio_new_to_old"] = pair["new"]["seconds"] / pair["old"]["seconds"]
            say(f"repeat {i}: new / old {pair['ratio_new_to_old']:.2f}")
            pairs.append(pair)
        result["pairs"] = pairs
        result["median_ratio_new_to_old"] = statistics.median(p["ratio_new_to_old"] for p in pairs)
        store.close()
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
    result["loadavg_end"] = os.getloadavg()
    out = ROOT / "benchmarks" / "out" / f"attach-planning-{args.keys}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    say(
        f"planning + initial state, executors / driver: median {result['median_ratio_new_to_old']:.2f}; {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
