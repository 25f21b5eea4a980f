"""Where a micro-batch goes, per Spark stage: Spark native (`applyInPandasWithState`) and CEC attached
(`cec_aggregate`) over the same purchases topic, in one driver, one after the other, each after a warm-up
query of its own. For each micro-batch it prints Spark's own stage figures from the driver's REST API:
the stage's wall time, its tasks' summed run time, and its rows (input, shuffle read, shuffle write). The
first stage of a batch is the `cec-kafka` source and the shuffle write that both systems share; the
second is the stateful operator (and, for the attached query, its write tasks).

    nice -n 5 .venv/bin/python benchmarks/bench_spark_stages.py --tuples 400000 --batches 4

A diagnostic, not a ratio: both queries share one JVM and machine, one after the other. The throughput
ratios are `bench_spark.py --focus attached` (each system in a driver of its own, interleaved repeats).
Writes benchmarks/out/spark-stages.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

import bench_spark as bench  # noqa: E402

OUT_JSON = ROOT / "benchmarks" / "out" / "spark-stages.json"
UI_PORT = "4147"


def _stamp(text: str | None) -> float:
    return datetime.strptime(text.replace("GMT", ""), "%Y-%m-%dT%H:%M:%S.%f").timestamp() if text else 0.0


def _stages(ui: str, app: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{ui}/api/v1/applications/{app}/stages?status=complete") as answer:
        stages: list[dict[str, Any]] = json.load(answer)
    return stages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tuples", type=int, default=400_000)
    parser.add_argument("--keys", type=int, default=2_000)
    parser.add_argument("--batches", type=int, default=4)
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # The native query's function lives in bench_spark: the executors' Python workers import it from here.
    paths = [str(ROOT / "benchmarks"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)

    from operators.spark.datasource import register
    from operators.spark.session import local_session
    from tests.brokers import start_broker

    broker = start_broker()
    work = Path(tempfile.mkdtemp(prefix="bench-spark-stages-"))
    w = bench.Workload(
        args.tuples, args.keys, 2, args.batches, broker.bootstrap, work, f"p-{uuid.uuid4().hex[:6]}"
    )
    bench.write_input(w)
    w = replace(w, offsets=bench.input_offsets(w))
    warm = w.warmup()
    bench.write_input(warm)
    spark = local_session(
        w.master,
        app_name="bench-spark-stages",
        shuffle_partitions=w.partitions,
        extra_conf={
            "spark.ui.enabled": "true",
            "spark.ui.port": UI_PORT,
            "spark.sql.streaming.stateStore.providerClass": bench.ROCKSDB_PROVIDER,
        },
    )
    register(spark)
    ui, app = spark.sparkContext.uiWebUrl, spark.sparkContext.applicationId
    assert ui is not None

    def native(wl: bench.Workload, name: str, batch_rows: int | None) -> Any:
        spec = bench._native_query_spec(wl, name, batch_rows)
        return bench._native_query(spark, spec, work / f"{name}.progress")

    def attached(wl: bench.Workload, name: str, batch_rows: int | None) -> Any:
        spec = bench._attached_spec(wl, name)
        spec["batch_rows"] = batch_rows
        return bench._streaming_query(bench._attached_query(spark, spec))

    systems = {"native": native, "attached": attached}
    for name, start in systems.items():
        start(warm, f"{name}-warmup", None).awaitTermination()
    out: dict[str, Any] = {"tuples": w.tuples, "keys": w.keys, "batches": w.batches}
    for name, start in systems.items():
        before = {s["stageId"] for s in _stages(ui, app)}
        started = time.perf_counter()
        query = start(w, name, w.batch_rows)
        query.awaitTermination()
        wall = time.perf_counter() - started
        stages = sorted(
            (s for s in _stages(ui, app) if s["stageId"] not in before), key=lambda s: s["stageId"]
        )
        rows = [
            {
                "stage": s["stageId"],
                "tasks": s["numTasks"],
                "wall_s": round(_stamp(s.get("completionTime")) - _stamp(s.get("submissionTime")), 3),
                "task_run_s": s["executorRunTime"] / 1000,
                "input_rows": s.get("inputRecords", 0),
                "shuffle_read_rows": s.get("shuffleReadRecords", 0),
                "shuffle_write_rows": s.get("shuffleWriteRecords", 0),
            }
            for s in stages
        ]
        batches = [
            {"planning_ms": p["durationMs"].get("queryPlanning"), "add_batch_ms": p["durationMs"]["addBatch"]}
            for p in query.recentProgress
        ]
        out[name] = {"wall_seconds": wall, "batches": batches, "stages": rows}
        print(f"{name}: wall {wall:.2f} s; micro-batches (planning, addBatch ms) {batches}", file=sys.stderr)
        for r in rows:
            print(
                f"  stage {r['stage']:3d}: {r['tasks']} tasks, wall {r['wall_s']:.2f} s, tasks ran "
                f"{r['task_run_s']:.2f} s; rows in {r['input_rows']:,}, shuffle read "
                f"{r['shuffle_read_rows']:,}, shuffle write {r['shuffle_write_rows']:,}",
                file=sys.stderr,
            )
    spark.stop()
    OUT_JSON.parent.mkdir(exist_ok=True)
    OUT_JSON.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
