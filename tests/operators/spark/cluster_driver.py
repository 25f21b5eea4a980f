"""A Spark driver against a standalone cluster: one application that runs a list of jobs in order, each a
`cec_aggregate` to the end of its input (Trigger.AvailableNow), optionally preceded by the refusal checks
and followed by Spark's own aggregation of the same records, on the cluster.

`python -m tests.operators.spark.cluster_driver ARGS.json`. A separate process because Spark allows one SparkContext
per process and the suite's `spark` fixture is a local one; one application for all the jobs of a test
module because starting executors is the slow part here (up to minutes on a loaded 2-core machine).
ARGS: `master`, `conf` (extra Spark settings) and `jobs`, each with
- `aggregate`: the keyword arguments of `cec_aggregate` that are plain data (`checkpointing` as a dict);
- `status`: a file rewritten (atomically) at least every second while the query runs, {"batches",
  "active"}: what a test waits on before it kills an executor mid-run;
- `go` (optional): the job starts only once this file exists (the test that watches it is ready);
- `refusals` (optional): a directory for the embedded-store check (a SQLite `SparkOperatorHost` pipeline
  on this non-local master must be refused before it runs);
- `native` (optional): {"records": JSON file of [partition, offset, record], "key", "value", "window"}:
  also compute Spark's own count-window aggregation of those records;
- `result`: the summary written (atomically) at the end of the job.
A job that fails writes {"error": ...} as its result, and the next jobs still run.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from cec.exceptions import ConfigError


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def session(master: str, conf: dict[str, str]) -> Any:
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName("cec-cluster-test")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def native_aggregate(spark: Any, native: dict[str, Any]) -> list[list[Any]]:
    """Spark's own aggregation of the records: number each key's valid tuples in input order (partition,
    offset), cut count windows of `window`, average the value per closed window. Rows: [key, window,
    value, count]."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    key, value, window = native["key"], native["value"], int(native["window"])
    records = json.loads(Path(native["records"]).read_text())
    schema = StructType(
        [
            StructField("partition", LongType()),
            StructField("offset", LongType()),
            StructField("k", StringType()),
            StructField("v", DoubleType()),
        ]
    )
    rows = [(p, o, str(r[key]), float(r[value])) for p, o, r in records]
    order = Window.partitionBy("k").orderBy("partition", "offset")
    out = (
        spark.createDataFrame(rows, schema)
        .repartition(2)
        .withColumn("window", F.floor((F.row_number().over(order) - 1) / window))
        .groupBy("k", "window")
        .agg(F.avg("v").alias("value"), F.count("*").alias("count"))
        .where(F.col("count") == window)
        .collect()
    )
    return [[r["k"], int(r["window"]), float(r["value"]), int(r["count"])] for r in out]


def refusals(spark: Any, root: Path) -> dict[str, str]:
    """The one-line errors a cluster master gets for what only works in local mode."""
    from operators.spark.host import SparkOperatorHost
    from tests.operators.spark.pipelines import filter_aggregate

    out: dict[str, str] = {}
    pipeline = filter_aggregate({"type": "sqlite", "root": str(root / "sqlite")}, count=100, keys=5)
    try:
        SparkOperatorHost(spark, pipeline).run()
    except ConfigError as exc:
        out["sqlite_host"] = str(exc)
    return out


def run_job(spark: Any, job: dict[str, Any]) -> dict[str, Any]:
    from operators.spark.attach import cec_aggregate

    status = Path(job["status"])
    out: dict[str, Any] = {}
    if job.get("refusals"):
        out["refusals"] = refusals(spark, Path(job["refusals"]))
    go = job.get("go")
    while go and not Path(go).exists():
        time.sleep(0.05)
    begin = time.perf_counter()
    # AvailableNow also with a U target: the handle stops the query once drained (its G-check timers would
    # otherwise keep Spark planning no-data micro-batches for ever: measured here before attach-core
    # a7d9bd8, 19+ batches after the input's end).
    query = cec_aggregate(spark, available_now=True, **job["aggregate"])
    while query.isActive:
        _write(status, {"batches": query.batches, "active": True, "run_id": query.runId})
        query.awaitTermination(1)
    query.awaitTermination()
    out["query_seconds"] = time.perf_counter() - begin
    _write(status, {"batches": query.batches, "active": False, "run_id": query.runId})
    failure = query.exception()
    if failure is not None:
        raise RuntimeError(f"the attached query failed: {failure}")
    out["batches"] = query.batches
    out["run_id"] = query.runId  # one run of one query from start to end: it was never restarted
    out["resumed"] = query.recovery.resumed
    out["executor_python"] = (
        spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("sys").executable).collect()[0]
    )
    if job.get("native"):
        begin = time.perf_counter()
        out["native"] = native_aggregate(spark, job["native"])
        out["native_seconds"] = time.perf_counter() - begin
    return out


def main(argv: list[str]) -> int:
    from operators.spark.datasource import register

    args = json.loads(Path(argv[0]).read_text())
    started = time.perf_counter()
    spark = session(args["master"], args.get("conf", {}))
    register(spark)
    session_seconds = time.perf_counter() - started
    for job in args["jobs"]:
        try:
            out = run_job(spark, job)
        except Exception as exc:  # reported to the test that owns the job; the next job still runs
            out = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
            _write(Path(job["status"]), {"batches": -1, "active": False})
        _write(Path(job["result"]), {"session_seconds": session_seconds, **out})
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
