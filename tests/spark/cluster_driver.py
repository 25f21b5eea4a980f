"""A Spark driver against a standalone cluster: runs one `cec_aggregate` to the end of its input (Trigger.
AvailableNow) and, if asked, Spark's own count-window aggregation of the same input, on the cluster.

`python -m tests.spark.cluster_driver ARGS.json`. A separate process because Spark allows one SparkContext
per process and the suite's session-wide `spark` fixture is a local one. ARGS:
- `master`: the cluster's URL; `conf`: extra Spark settings;
- `aggregate`: the keyword arguments of `cec_aggregate` that are plain data (`checkpointing` as a dict);
- `status`: a file rewritten (atomically) every ~50 ms while the query runs with {"batches", "active"}:
  what a test waits on before it kills an executor mid-run;
- `native`: {"topic", "schema", "window", "key", "value"} to also compute Spark's own aggregation;
- `result`: the summary written (atomically) at the end, or {"error": one line} when `cec_aggregate`
  refused to start (a ConfigError).
"""

from __future__ import annotations

import json
import sys
import time
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


def native_aggregate(spark: Any, native: dict[str, Any], bootstrap: str) -> list[list[Any]]:
    """Spark's own aggregation: number each key's tuples in input order (partition, offset), cut count windows
    of `window`, average the value per closed window. Rows: [key, window, value, count]."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from operators.spark.datasource import FORMAT

    key, value, window = native["key"], native["value"], int(native["window"])
    reader = spark.read.format(FORMAT).option("topic", native["topic"]).option("bootstrap.servers", bootstrap)
    for name, setting in native.get("options", {}).items():
        reader = reader.option(name, setting)
    rows = reader.load().where(F.col(value).isNotNull())
    order = Window.partitionBy(key).orderBy("cec_partition", "cec_offset")
    out = (
        rows.withColumn("window", F.floor((F.row_number().over(order) - 1) / window))
        .groupBy(key, "window")
        .agg(F.avg(value).alias("value"), F.count("*").alias("count"))
        .where(F.col("count") == window)
        .collect()
    )
    return [[str(r[key]), int(r["window"]), float(r["value"]), int(r["count"])] for r in out]


def main(argv: list[str]) -> int:
    from operators.spark.attach import cec_aggregate
    from operators.spark.datasource import register

    args = json.loads(Path(argv[0]).read_text())
    status, result = Path(args["status"]), Path(args["result"])
    started = time.perf_counter()
    spark = session(args["master"], args.get("conf", {}))
    register(spark)
    out: dict[str, Any] = {"session_seconds": time.perf_counter() - started}
    kwargs = dict(args["aggregate"])
    try:
        query = cec_aggregate(spark, available_now=True, **kwargs)
    except ConfigError as exc:
        _write(result, {**out, "error": str(exc)})
        spark.stop()
        return 0
    begin = time.perf_counter()
    while query.isActive:
        _write(status, {"batches": query.batches, "active": True})
        query.awaitTermination(0.05)
    query.awaitTermination()
    out["query_seconds"] = time.perf_counter() - begin
    _write(status, {"batches": query.batches, "active": False})
    failure = query.exception()
    if failure is not None:
        raise RuntimeError(f"the attached query failed: {failure}")
    out["batches"] = query.batches
    out["resumed"] = query.recovery.resumed
    out["executor_python"] = (
        spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("sys").executable).collect()[0]
    )
    if args.get("native"):
        begin = time.perf_counter()
        out["native"] = native_aggregate(spark, args["native"], kwargs["bootstrap_servers"])
        out["native_seconds"] = time.perf_counter() - begin
    _write(result, out)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
