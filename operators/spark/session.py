"""A SparkSession configured for hosting CEC operators and the cec-kafka data source.

Why each setting (DESIGN-NOTES section 4):
- `local[N,F]`: plain `local[N]` fails a job on its first task failure; F is the per-task attempt budget
  (`spark.task.maxFailures` in local mode) that lets Spark relaunch a killed operator task;
- the Python workers must run this interpreter (the venv that has the project installed), not whatever
  `python3` is first on PATH; with a local master, through `operators.spark.python_exec.spark_python`,
  so that Spark's Python processes import the installed pyspark with cached bytecode instead of
  compiling the copy Spark puts first on their path (~0.55 s per process start, measured);
- the UI is off (tests, CI) and shuffle partitions are small (they equal output partitions in the
  Structured Streaming design);
- for a local master, the Python daemon is `operators.spark.daemon` (pyspark's own, after importing what
  cec's tasks import and freezing the garbage collector: a micro-batch's Python workers 0.8 -> 0.15 s
  of CPU; its module doc), unless the session's conf names another;
- Spark's Kafka connector is on the classpath (`spark.jars`) when its jars are there
  (`operators.spark.connector`: `make spark-kafka-jars`), so that `format("kafka")` reads and writes Kafka
  and `cec_aggregate` can read an ordinary topic through it.
"""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "DAEMON_MODULE",
    "check_session",
    "is_local_master",
    "local_session",
    "session_conf",
    "task_max_failures",
]

# Named, not imported: importing it loads pandas and freezes the collector, which only its daemon wants.
DAEMON_MODULE = "operators.spark.daemon"
_LOCAL = re.compile(r"local\[(\d+|\*)(?:\s*,\s*(\d+))?\]")


def local_session(
    master: str = "local[2,3]",
    *,
    app_name: str = "cec",
    shuffle_partitions: int = 2,
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """Get or create the process's SparkSession with the settings above (Spark keeps one per process)."""
    from pyspark.sql import SparkSession

    from operators.spark.python_exec import spark_python

    # Read when the SparkContext starts (the Python every Spark Python process runs; a PYSPARK_PYTHON the
    # user set wins); the conf key below covers a session whose JVM was started before it was set.
    python = os.environ.get("PYSPARK_PYTHON")
    if python is None:  # the launcher (and its one check) only when it will be used
        python = os.environ["PYSPARK_PYTHON"] = spark_python() if _is_local(master) else sys.executable
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", _slots(master) or "2")
        .config("spark.pyspark.python", python)
        .config("spark.pyspark.driver.python", sys.executable)
    )
    for key, value in session_conf(master, extra_conf).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def session_conf(master: str, extra_conf: dict[str, str] | None = None) -> dict[str, str]:
    """The settings `local_session` adds to its fixed ones: the caller's `extra_conf`, the Python daemon
    for a local master (where the caller names none), and the Kafka connector's jars."""
    from operators.spark.connector import jars_conf

    conf = dict(extra_conf or {})
    if _is_local(master):
        conf.setdefault("spark.python.daemon.module", DAEMON_MODULE)
    conf.update(jars_conf(conf.get("spark.jars")))
    return conf


def _is_local(master: str) -> bool:
    """Does this master run every task on this host (`local`, `local[N]`, `local[N,F]`)?"""
    master = master.strip()
    return master == "local" or _LOCAL.fullmatch(master) is not None


def _slots(master: str) -> str | None:
    m = _LOCAL.fullmatch(master.strip())
    if m is None or m.group(1) == "*":
        return None
    return m.group(1)


def task_max_failures(spark: SparkSession) -> int:
    """How many attempts Spark gives one task before failing its job.

    `local[N,F]` -> F; `local[N]`/`local` -> 1 (no retry at all); otherwise `spark.task.maxFailures`
    (Spark's default 4). A long-running operator task spends one attempt per crash of its worker, so a
    partition that crashes F times within one job fails the job; `SparkOperatorHost` then resubmits it.
    """
    sc = spark.sparkContext
    master = (sc.master or "").strip()
    m = _LOCAL.fullmatch(master)
    if m is not None:
        return int(m.group(2)) if m.group(2) else 1
    if master == "local":
        return 1
    return int(sc.getConf().get("spark.task.maxFailures", "4") or "4")


def is_local_master(spark: SparkSession) -> bool:
    """Does every task of this session run on this host (`local`, `local[N]`, `local[N,F]`)?"""
    return _is_local(spark.sparkContext.master or "")


def check_session(spark: SparkSession, *, embedded_store: bool, what: str) -> None:
    """Refuse settings under which CEC on Spark cannot keep its guarantees, with one clear line:

    - an embedded (SQLite) store on a cluster: its logs would live on whichever executor's disk a task
      happened to run, and a relaunched task on another host would find none (use a Kafka store);
    - `spark.speculation=true`: a speculative copy of an operator task would be a second writer of its
      output partition (refused rather than relied on fencing, so the answer never depends on timing).

    Then points the session's Python processes at the launcher (`python_exec.use_launcher`), before the
    entry point that checks it (cec_aggregate, SparkOperatorHost) wraps any Python function.
    """
    from cec.exceptions import ConfigError

    conf = spark.sparkContext.getConf()
    if (conf.get("spark.speculation", "false") or "false").strip().lower() == "true":
        raise ConfigError(f"{what} refuses spark.speculation=true: set it to false for this application")
    if embedded_store and not is_local_master(spark):
        raise ConfigError(
            f"{what}: the embedded SQLite store needs a local[...] master (master is "
            f"{spark.sparkContext.master!r}; its logs would live on one executor's disk): use a Kafka store "
            "(bootstrap servers) on a cluster"
        )
    from operators.spark.python_exec import use_launcher

    use_launcher(spark)
