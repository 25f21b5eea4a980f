"""`operators.spark.daemon`, the Python daemon of a local session (`operators.spark.session`).

1. `session_conf` names it for a local master only, and a daemon the caller names wins.
2. In a real local session made by `local_session`, a Python task runs in a worker forked from it: cec's
   task modules are already imported when the task starts, and what was imported before the fork is
   frozen out of the collector's passes.
3. Its module imports cleanly in a fresh interpreter and leaves the collector frozen (what the daemon's
   process does before it forks).
"""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from operators.spark.session import DAEMON_MODULE, session_conf

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DAEMON_KEY = "spark.python.daemon.module"


@pytest.mark.parametrize("master", ["local", "local[2]", "local[2,3]", "local[*]"])
def test_a_local_master_gets_the_cec_daemon(master: str) -> None:
    assert session_conf(master)[DAEMON_KEY] == DAEMON_MODULE


@pytest.mark.parametrize("master", ["spark://127.0.0.1:7077", "yarn", "k8s://https://10.0.0.1:443"])
def test_another_master_keeps_pysparks_daemon(master: str) -> None:
    assert DAEMON_KEY not in session_conf(master)


def test_a_daemon_the_caller_names_wins() -> None:
    conf = session_conf("local[2]", {DAEMON_KEY: "pyspark.daemon", "spark.sql.shuffle.partitions": "3"})
    assert conf[DAEMON_KEY] == "pyspark.daemon"
    assert conf["spark.sql.shuffle.partitions"] == "3"


def test_a_local_sessions_python_tasks_run_in_workers_forked_from_it(spark: SparkSession) -> None:
    named = spark.sparkContext.getConf().get(DAEMON_KEY)
    if named != DAEMON_MODULE:
        pytest.skip(f"this session names another daemon ({named!r}): it was not made by local_session")

    def task_view(_: object) -> tuple[bool, int]:
        """Inside a Python task: were cec's task modules imported before it started; is the GC frozen?"""
        import gc

        return "operators.spark.processor" in sys.modules, gc.get_freeze_count()

    views = spark.sparkContext.parallelize(range(4), 2).map(task_view).collect()
    assert views and all(imported for imported, _ in views), views
    assert all(frozen > 10_000 for _, frozen in views), views


def test_the_daemon_module_preloads_and_freezes_in_a_fresh_interpreter() -> None:
    probe = (
        "import gc, sys, runpy; runpy.run_module('operators.spark.daemon', run_name='preload');"
        "print(int('operators.spark.writer' in sys.modules), gc.get_freeze_count())"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    imported, frozen = out.stdout.split()
    assert imported == "1"
    assert int(frozen) > 10_000
