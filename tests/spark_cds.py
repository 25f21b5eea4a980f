"""The JVM options of the tests' Spark drivers, and the class-data-sharing archive they map.

Every crash test starts Spark driver subprocesses that live for a few micro-batches; most of such a JVM's
CPU goes to starting it: loading and verifying some ten thousand classes and compiling hot code. So the
drivers of the tests (tests/conftest.py puts `driver_jvm_options()` in SPARK_SUBMIT_OPTS, which
spark-submit reads and every driver subprocess inherits) run with

- the C1 JIT only and the serial collector: C2's compiles and the parallel collector's threads do not pay
  back in so short a life, on the 2 cores CI has;
- a dynamic class-data-sharing archive of the classes a driver loads (`make spark-cds` dumps it:
  `python -m tests.spark_cds`), mapped instead of loaded again.

Spark computes the same either way (benchmarks/RESULTS.md, "CI time", has the CPU seconds). The JVM checks
that the archive matches its own build and class path and otherwise runs without it; `-Xlog:cds=off` keeps
that fallback silent, so that no driver's output gains a line. Without the archive (pytest run without
`make`) the drivers run with the two options above only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["ARCHIVE", "JVM_OPTIONS", "driver_jvm_options"]

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT / ".cache" / "spark-cds" / "spark.jsa"
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_QUIET = "-Xlog:cds=off,cds+dynamic=off"


def driver_jvm_options(archive: Path = ARCHIVE) -> str:
    """SPARK_SUBMIT_OPTS for a test's Spark driver: JVM_OPTIONS, and the archive when it is there."""
    if archive.is_file():
        return f"{JVM_OPTIONS} -XX:SharedArchiveFile={archive} {_QUIET}"
    return JVM_OPTIONS


def _workload(scratch: Path) -> None:
    """What a test driver does first, in small: a session with the tests' settings (and Spark's Kafka
    connector when its jars are there), a batch aggregation and a stateful streaming query to its end.
    Then the gateway JVM is stopped and waited for: it writes the archive as it exits."""
    from pyspark import SparkContext

    from operators.spark.session import local_session

    spark = local_session("local[2,3]", app_name="cec-spark-cds")
    spark.range(0, 100_000).selectExpr("id % 7 AS k", "id").groupBy("k").count().collect()
    source = scratch / "in"
    source.mkdir()
    (source / "part.json").write_text("".join(f'{{"k": {i % 5}, "v": {i}}}\n' for i in range(1000)))
    stream = (
        spark.readStream.schema("k LONG, v LONG")
        .json(str(source))
        .groupBy("k")
        .sum("v")
        .writeStream.format("memory")
        .queryName("cds")
        .outputMode("complete")
        .option("checkpointLocation", str(scratch / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    stream.awaitTermination()
    spark.stop()
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if proc is not None:
        proc.stdin.close()  # the gateway JVM exits when its stdin closes (pyspark's protocol)
        proc.wait(timeout=600)


def dump(archive: Path) -> None:
    """Dump the archive of `_workload`'s driver to `archive` (atomically: a JVM never maps half of one)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    partial.unlink(missing_ok=True)
    # Only errors: the dump lists every class it skips (signed jars, generated accessors) as a warning.
    dump_options = f"{JVM_OPTIONS} -XX:ArchiveClassesAtExit={partial} -Xlog:cds=error,cds+dynamic=error"
    env = {**os.environ, "SPARK_SUBMIT_OPTS": dump_options}
    with tempfile.TemporaryDirectory(prefix="cec-spark-cds-") as scratch:
        subprocess.run(
            [sys.executable, "-m", "tests.spark_cds", "--workload", scratch],
            env=env, cwd=ROOT, check=True, timeout=900,
        )  # fmt: skip
    if not partial.is_file():
        raise SystemExit(f"spark-cds: the driver JVM wrote no archive at {partial}")
    partial.replace(archive)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--workload"]:
        _workload(Path(argv[1]))
        return 0
    dump(Path(argv[0]) if argv else ARCHIVE)
    print(f"spark-cds: {ARCHIVE if not argv else argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
