"""Hopping and session windows: `cec_aggregate` against Spark's own stateful aggregation, in one run.

Input: `bench_windows.input_rows` (keys drawn uniformly, values multiples of 1/8, event times rising evenly
over --hours) as JSON values `{"key", "value", "ts"}` keyed by `key` into a topic of 3 partitions
(`bench_window_peers.produce_input`), on the broker `tests.brokers` starts (Apache Kafka 4.3.1 from the
jars with `CEC_TEST_BROKER=apache-kafka`). Query: the mean of `value` per key over
- hopping windows of 1 hour every 15 minutes, and
- session windows with a gap of 30 minutes,
on the event time `ts` (ms), with a watermark of --lateness (default 10 minutes) on both sides.

Systems, each query in a Spark driver process of its own (`local[2,4]`, 3 shuffle = state partitions,
Trigger.AvailableNow, `maxOffsetsPerTrigger` = input / --batches on both sides), after a warm-up run of the
same query over a small topic in the same driver (a cold JVM's first micro-batch is seconds):
- **Spark native**, as a Spark user writes it: Spark's Kafka source, `from_json`, `withWatermark`,
  `groupBy("key", window(t, "1 hour", "15 minutes"))` or `groupBy("key", session_window(t, "30
  minutes"))`, `.agg(avg("value"))`, append mode, the RocksDB state store with changelog checkpointing
  (`bench_spark.ROCKSDB_PROVIDER`, as bench_spark.py's Spark native), a Parquet file sink (exactly-once);
- **cec**: `cec_aggregate(input_format="json", input_reader="spark-kafka", key="key", value="value",
  time="ts", agg="avg", window_time="1h", slide="15m" | session_gap="30m", allowed_lateness=...)`, its
  default checkpointing, output log on the same broker.
The order of the two systems rotates per repeat; the window types alternate within a repeat.

Figures per run: throughput = input tuples / the query's wall time (start() to the end of the bounded
AvailableNow run; session start and warm-up excluded); CPU seconds of the driver's whole process tree over
the query (`spark_trace.tree_cpu`: driver, JVM, Spark's Python processes); bytes written: Spark native's
checkpoint directory (its `state/` part given on its own) and the sink directory; cec's output log (key +
value bytes of its committed records, `bench_spark.log_volume`) and its Spark checkpoint directory.

Results checked: every (key, window start) both sides emitted has the same end and the same mean (within
1e-9 relative; the values are multiples of 1/8, so the sums are exact); the windows only one side emitted
are counted and classified: cec's against the native query's last watermark (a window that ends after it
is still open for Spark in append mode at the end of the input), Spark's by whether cec emitted any later
window of the key (cec's watermark closes a key's sessions a run of consecutive gap-wide slices at a time,
docs/long-runs.md: a session in a run still open at the end of the input is not emitted yet).

    CEC_TEST_BROKER=apache-kafka flock /tmp/cec-bench.lock nice -n 5 .venv/bin/python \\
        benchmarks/bench_spark_windows.py [--keys 10000] [--tuples 100000] [--hours 3] [--repeats 1] \\
        [--out benchmarks/out/spark-windows.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
for _path in (str(ROOT), str(HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from bench_spark import (  # noqa: E402
    CHANGELOG_CONF,
    PROVIDER_CONF,
    ROCKSDB_PROVIDER,
    _Child,
    _progress_json,
    _streaming_query,
    _write_result,
    log_volume,
)
from spark_trace import cpu_delta, tree_cpu  # noqa: E402

MASTER = "local[2,4]"
PARTITIONS = 3
WARMUP_TUPLES, WARMUP_KEYS = 4_000, 200
KINDS = ("hopping", "session")
SYSTEMS = ("native", "cec")
OUT = ROOT / "benchmarks" / "out" / "spark-windows.json"


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def state_bytes(checkpoint: Path) -> int:
    """The bytes of the state store under a Spark checkpoint (its `state/` directories, at any depth: cec's
    checkpoint is one level down, a fresh one per start)."""
    if not checkpoint.exists():
        return 0
    return sum(
        p.stat().st_size
        for p in checkpoint.rglob("*")
        if p.is_file() and "state" in p.relative_to(checkpoint).parts
    )


# -- the driver process: one warm-up and one measured query ---------------------------------------------------
def _native_query(spark: Any, spec: dict[str, Any], topic: str, batch_rows: int, tag: str) -> Any:
    from pyspark.sql import functions as F

    raw = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", spec["bootstrap"])
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(batch_rows))
        .load()
    )
    row = F.from_json(F.col("value").cast("string"), "key string, value double, ts long")
    rows = (
        raw.select(row.alias("r"))
        .select("r.*")
        .withColumn("t", F.timestamp_millis("ts"))
        .withWatermark("t", f"{spec['lateness_minutes']} minutes")
    )
    if spec["kind"] == "hopping":
        window = F.window("t", "1 hour", "15 minutes")
    else:
        window = F.session_window("t", "30 minutes")
    out = (
        rows.groupBy(F.col("key"), window.alias("w"))
        .agg(F.avg("value").alias("value"))
        .select("key", F.unix_millis("w.start").alias("start"), F.unix_millis("w.end").alias("end"), "value")
    )
    work = Path(spec["work"])
    return (
        out.writeStream.format("parquet")
        .option("path", str(work / f"{tag}-sink"))
        .option("checkpointLocation", str(work / f"{tag}-checkpoint"))
        .outputMode("append")
        .trigger(availableNow=True)
        .queryName(tag)
        .start()
    )


def _cec_query(spark: Any, spec: dict[str, Any], topic: str, batch_rows: int, tag: str) -> Any:
    from operators.spark.attach import cec_aggregate

    windows: dict[str, Any] = (
        {"window_time": "1h", "slide": "15m"} if spec["kind"] == "hopping" else {"session_gap": "30m"}
    )
    work = Path(spec["work"])
    return cec_aggregate(
        spark,
        input_topic=topic,
        bootstrap_servers=spec["bootstrap"],
        output_topic=f"{spec['prefix']}{tag}-out",
        key="key",
        value="value",
        time="ts",
        agg="avg",
        allowed_lateness=f"{spec['lateness_minutes']}m",
        input_format="json",
        input_reader="spark-kafka",
        state_dir=str(work / f"{tag}-state"),
        checkpoint_location=str(work / f"{tag}-checkpoint"),
        partitions=PARTITIONS,
        available_now=True,
        max_records_per_trigger=batch_rows,
        trim_every=0,  # never: `_results` reads every window from the whole log after the run
        **windows,
    )


def _results(spark: Any, spec: dict[str, Any], tag: str) -> list[list[Any]]:
    """(key, start ms, end ms, mean) of every window the query emitted."""
    from pyspark.sql import functions as F

    if spec["system"] == "native":
        frame = spark.read.parquet(str(Path(spec["work"]) / f"{tag}-sink"))
    else:
        from operators.spark.attach import read_results

        frame = read_results(spark, f"{spec['prefix']}{tag}-out", spec["bootstrap"]).select(
            "key", F.unix_millis("start").alias("start"), F.unix_millis("end").alias("end"), "value"
        )
    return [[r["key"], r["start"], r["end"], r["value"]] for r in frame.collect()]


def _run_query(spark: Any, spec: dict[str, Any], topic: str, batch_rows: int, tag: str) -> dict[str, Any]:
    cpu_before = tree_cpu()
    begin = time.perf_counter()
    make = _native_query if spec["system"] == "native" else _cec_query
    handle = make(spark, spec, topic, batch_rows, tag)
    query = _streaming_query(handle)
    query.awaitTermination()
    wall = time.perf_counter() - begin
    cpu = cpu_delta(cpu_before, tree_cpu())
    if query.exception() is not None:
        raise RuntimeError(f"query {tag} failed: {query.exception()}")
    progress = [_progress_json(p) for p in query.recentProgress]
    if handle is not query:
        handle.stop()  # cec: closes its output writers
    watermarks = [p.get("eventTime", {}).get("watermark") for p in progress]
    return {
        "wall_seconds": wall,
        "cpu": cpu,
        "batches": len(progress),
        "input_rows": [p.get("numInputRows", 0) for p in progress],
        "last_watermark": next((w for w in reversed(watermarks) if w), None),
        "state_rows": [(p.get("stateOperators") or [{}])[0].get("numRowsTotal") for p in progress],
    }


def child(args_path: Path) -> int:
    from operators.spark.session import local_session

    spec = json.loads(args_path.read_text())
    result_path = Path(spec["result"])
    started = time.perf_counter()
    cpu_at_start = tree_cpu()
    spark = local_session(
        MASTER,
        app_name=f"bench-spark-windows-{spec['system']}",
        shuffle_partitions=PARTITIONS,
        extra_conf={PROVIDER_CONF: ROCKSDB_PROVIDER, CHANGELOG_CONF: "true"},
    )
    out: dict[str, Any] = {"session_seconds": time.perf_counter() - started}
    out["cpu_session_start"] = cpu_delta(cpu_at_start, tree_cpu())
    out["warmup"] = _run_query(spark, spec, spec["warmup_topic"], WARMUP_TUPLES // 4, "warmup")
    out["run"] = _run_query(spark, spec, spec["topic"], spec["batch_rows"], "run")
    rows = _results(spark, spec, "run")
    Path(spec["rows"]).write_text(json.dumps(rows))
    out["results"] = len(rows)
    _write_result(result_path, out)
    spark.stop()
    return 0


def spawn(spec: dict[str, Any], d: Path) -> _Child:
    d.mkdir(parents=True, exist_ok=True)
    spec = {**spec, "work": str(d), "result": str(d / "result.json"), "rows": str(d / "rows.json")}
    (d / "args.json").write_text(json.dumps(spec))
    log = d / "driver.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", str(d / "args.json")],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own session: tree_cpu() counts the driver, its JVM and workers
        )
    return _Child(proc, d / "progress.jsonl", d / "result.json", log)


# -- comparing the two sides ----------------------------------------------------------------------------------
def _ms(iso: str | None) -> int | None:
    if not iso:
        return None
    from datetime import datetime

    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def compare(
    native_rows: list[list[Any]], cec_rows: list[list[Any]], watermark_ms: int | None
) -> dict[str, Any]:
    native = {(k, s): (e, v) for k, s, e, v in native_rows}
    cec = {(k, s): (e, v) for k, s, e, v in cec_rows}
    both = native.keys() & cec.keys()
    differ = [
        w
        for w in both
        if native[w][0] != cec[w][0] or abs(native[w][1] - cec[w][1]) > 1e-9 * max(1.0, abs(native[w][1]))
    ]
    only_cec = cec.keys() - native.keys()
    only_native = native.keys() - cec.keys()
    open_for_spark = sum(1 for w in only_cec if watermark_ms is not None and cec[w][0] > watermark_ms)
    # A session cec has not emitted yet is explained by its documented watermark close (a run of a key's
    # consecutive gap-wide slices closes together): none of the key's later windows was emitted either.
    latest_cec: dict[str, int] = {}
    for k, s in cec:
        latest_cec[k] = max(s, latest_cec.get(k, s))
    in_open_run = sum(1 for k, s in only_native if latest_cec.get(k, s - 1) < s)
    return {
        "native_windows": len(native),
        "cec_windows": len(cec),
        "native_duplicates": len(native_rows) - len(native),
        "cec_duplicates": len(cec_rows) - len(cec),
        "both": len(both),
        "differ": len(differ),
        "differ_examples": [[k, s, native[(k, s)], cec[(k, s)]] for k, s in sorted(differ)[:5]],
        "only_cec": len(only_cec),
        "only_cec_ending_after_native_watermark": open_for_spark,
        "only_cec_examples": [[k, s, *cec[(k, s)]] for k, s in sorted(only_cec)[:5]],
        "only_native": len(only_native),
        "only_native_no_later_cec_window_of_key": in_open_run,
        "only_native_examples": [[k, s, *native[(k, s)]] for k, s in sorted(only_native)[:5]],
        "native_last_watermark_ms": watermark_ms,
    }


def measure(spec: dict[str, Any], d: Path, bootstrap: str, tuples: int) -> dict[str, Any]:
    say(f"{spec['kind']} {spec['system']}: driver starting (load average {os.getloadavg()[0]:.1f})")
    load_before = os.getloadavg()[0]
    result = spawn(spec, d).wait()
    run = result["run"]
    row: dict[str, Any] = {
        "tuples_per_s": tuples / run["wall_seconds"],
        "wall_seconds": run["wall_seconds"],
        "cpu_seconds": run["cpu"]["total"],
        "cpu_by_process": run["cpu"],
        "tuples_per_cpu_s": tuples / run["cpu"]["total"],
        "batches": run["batches"],
        "input_rows": run["input_rows"],
        "state_rows": run["state_rows"],
        "last_watermark": run["last_watermark"],
        "results": result["results"],
        "session_seconds": result["session_seconds"],
        "warmup_seconds": result["warmup"]["wall_seconds"],
        "load_average": [load_before, os.getloadavg()[0]],
    }
    if spec["system"] == "native":
        checkpoint = d / "run-checkpoint"
        row["bytes"] = {
            "checkpoint": dir_bytes(checkpoint),
            "checkpoint_state": state_bytes(checkpoint),
            "sink": dir_bytes(d / "run-sink"),
        }
        row["bytes"]["written"] = row["bytes"]["checkpoint"] + row["bytes"]["sink"]
    else:
        volume = log_volume(bootstrap, f"{spec['prefix']}run-out")
        row["bytes"] = {"output_log": volume["log_bytes"], "log_messages": volume["log_messages"]}
        row["bytes"]["checkpoint"] = dir_bytes(d / "run-checkpoint")
        row["bytes"]["checkpoint_state"] = state_bytes(d / "run-checkpoint")
        row["bytes"]["written"] = row["bytes"]["output_log"] + row["bytes"]["checkpoint"]
    row["bytes_per_tuple"] = row["bytes"]["written"] / tuples
    say(
        f"{spec['kind']} {spec['system']}: {row['tuples_per_s']:,.0f} tuples/s, {row['cpu_seconds']:.1f} CPU s, "
        f"{row['bytes_per_tuple']:.1f} B/tuple, {row['results']:,} windows"
    )
    return row


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(Path(argv[1]))
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--tuples", type=int, default=100_000)
    parser.add_argument("--hours", type=float, default=3.0)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--lateness-minutes", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    from bench_window_peers import produce_input

    from tests.brokers import start_broker

    broker = start_broker()
    say(f"broker {broker.kind} {broker.version} at {broker.bootstrap}")
    doc: dict[str, Any] = {
        "broker": f"{broker.kind} {broker.version}",
        "args": {k: str(v) for k, v in vars(args).items()},
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "repeats": [],
    }
    try:
        with tempfile.TemporaryDirectory(prefix="bench-spark-windows-") as tmp:
            work = Path(tmp)
            topic, warmup = f"windows-{uuid.uuid4().hex[:6]}", f"warmup-{uuid.uuid4().hex[:6]}"
            say(f"writing {args.tuples:,} tuples over {args.keys:,} keys and {args.hours} h to {topic}")
            produce_input(broker.bootstrap, warmup, WARMUP_KEYS, WARMUP_TUPLES, args.hours)
            produce_input(broker.bootstrap, topic, args.keys, args.tuples, args.hours)
            batch_rows = -(-args.tuples // args.batches)
            for repeat in range(args.repeats):
                order = SYSTEMS if repeat % 2 == 0 else SYSTEMS[::-1]
                figures: dict[str, Any] = {"order": list(order)}
                for kind in args.kinds.split(","):
                    rows: dict[str, Any] = {}
                    dirs: list[Path] = []
                    for system in order:
                        prefix = f"r{repeat}-{kind}-{system}-{uuid.uuid4().hex[:4]}-"
                        spec = {
                            "system": system,
                            "kind": kind,
                            "bootstrap": broker.bootstrap,
                            "topic": topic,
                            "warmup_topic": warmup,
                            "batch_rows": batch_rows,
                            "lateness_minutes": args.lateness_minutes,
                            "prefix": prefix,
                        }
                        d = work / prefix.rstrip("-")
                        rows[system] = measure(spec, d, broker.bootstrap, args.tuples)
                        rows[system]["rows_file"] = str(d / "rows.json")
                        dirs.append(d)
                    native_rows = json.loads(Path(rows["native"].pop("rows_file")).read_text())
                    cec_rows = json.loads(Path(rows["cec"].pop("rows_file")).read_text())
                    check = compare(native_rows, cec_rows, _ms(rows["native"]["last_watermark"]))
                    ratios = {
                        "throughput_cec_to_native": rows["cec"]["tuples_per_s"]
                        / rows["native"]["tuples_per_s"],
                        "cpu_rate_cec_to_native": rows["cec"]["tuples_per_cpu_s"]
                        / rows["native"]["tuples_per_cpu_s"],
                        "bytes_cec_to_native": rows["cec"]["bytes_per_tuple"]
                        / rows["native"]["bytes_per_tuple"],
                    }
                    say(f"{kind}: {json.dumps(ratios)}; results: {json.dumps(check)[:600]}")
                    figures[kind] = {**rows, "ratios": ratios, "check": check}
                    for d in dirs:
                        shutil.rmtree(d, ignore_errors=True)
                doc["repeats"].append(figures)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(doc, indent=1) + "\n")
    finally:
        broker.stop()
    doc["ended"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
