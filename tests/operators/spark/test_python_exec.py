"""`operators.spark.python_exec`: Spark's Python processes import the installed pyspark, not the zip copy.

1. The launcher takes exactly the bundled zip off PYTHONPATH (every occurrence), keeps every other entry
   in order, and runs the interpreter it was made for with the arguments it was given.
2. Without a bundled zip there is nothing to drop: the interpreter itself is the answer.
3. In a real local session made by `local_session`, a Python task imports pyspark from the installed
   package (with cached bytecode), not from `pyspark.zip`; so does one in a local session the user built
   (no `local_session`) once a cec entry point ran (`use_launcher`), and a Python the user chose is left
   alone with one warning line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from operators.spark import python_exec
from operators.spark.python_exec import bundled_pyspark_zip, is_launcher, spark_python, use_launcher

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_the_launcher_drops_only_the_bundled_zip(tmp_path: Path) -> None:
    bundled = tmp_path / "lib dir" / "pyspark.zip"  # a space: the path is quoted in the script
    bundled.parent.mkdir()
    bundled.write_bytes(b"")
    launcher = spark_python(sys.executable, bundled_zip=bundled)
    assert launcher != sys.executable and os.access(launcher, os.X_OK)
    assert spark_python(sys.executable, bundled_zip=bundled) == launcher  # written once, reused
    other = str(tmp_path / "other.zip")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(bundled), "/a", other, str(bundled), "/b"])}
    probe = "import json, os, sys; print(json.dumps([os.environ['PYTHONPATH'], sys.argv[1:]]))"
    out = subprocess.run([launcher, "-c", probe, "x y", "z"], env=env, capture_output=True, check=True)
    path, args = json.loads(out.stdout)
    assert path == os.pathsep.join(["/a", other, "/b"])
    assert args == ["x y", "z"]


def test_without_a_bundled_zip_spark_runs_the_interpreter_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(python_exec, "bundled_pyspark_zip", lambda: None)
    assert spark_python("/opt/python3") == "/opt/python3"


def test_a_local_sessions_python_tasks_import_the_installed_pyspark(spark: SparkSession) -> None:
    bundled = bundled_pyspark_zip()
    if bundled is None:
        pytest.skip("this pyspark has no bundled pyspark.zip (not a pip install): nothing to drop")
    if os.environ.get("PYSPARK_PYTHON") != spark_python():
        pytest.skip("PYSPARK_PYTHON was set before the session started: the user's choice wins")
    where = (
        spark.sparkContext.parallelize([0], 1)
        .map(lambda _: (__import__("pyspark").__file__, __import__("os").environ.get("PYTHONPATH", "")))
        .collect()[0]
    )
    import pyspark

    assert where[0] == pyspark.__file__ and str(bundled) not in where[1].split(os.pathsep), where


def test_a_launcher_that_cannot_run_is_not_handed_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A temporary directory mounted noexec would stop every Spark Python process: the interpreter is
    used instead of a launcher that does not run."""
    bundled = tmp_path / "pyspark.zip"
    bundled.write_bytes(b"")
    monkeypatch.setattr(python_exec.tempfile, "gettempdir", lambda: str(tmp_path))
    # A launcher of an interpreter that does not exist cannot run: exec fails, so does the check.
    assert spark_python(str(tmp_path / "no-such-python"), bundled_zip=bundled) == str(
        tmp_path / "no-such-python"
    )


USER_SESSION = """
import json, os
from pyspark.sql import SparkSession

def where(spark):
    # A Python task's pyspark and PYTHONPATH: where the process Spark started imports pyspark from.
    return spark.sparkContext.parallelize([0], 1).map(
        lambda _: (__import__("pyspark").__file__, __import__("os").environ.get("PYTHONPATH", ""))
    ).collect()[0]

spark = SparkSession.builder.master("local[2]").appName("cec-user-session").getOrCreate()
before = where(spark)
import cec.spark
cec.spark.register(spark)  # what cec_aggregate, read_results and read_dead_letters do first
after = where(spark)
columns = spark.read.format("cec-topic").option("topic", "t").option("bootstrap.servers", "127.0.0.1:1") \\
    .option("key", "a").option("value", "b").load().columns  # its planner runs in a Python process too
print(json.dumps({"exec": spark.sparkContext.pythonExec, "before": before, "after": after, "columns": columns}))
spark.stop()
"""


def test_a_users_own_local_session_runs_its_python_through_the_launcher_once_cec_registers() -> None:
    """A session the user built (no `local_session`), its Python this interpreter: once cec's entry point
    ran, Spark's Python processes import the installed pyspark, not the zip (the compile that made 4 of 7
    queries miss Spark's fixed 10 s connect-back on a loaded machine, issue 25). Before it they import the
    zip: that is what the test would see without `use_launcher`."""
    bundled = bundled_pyspark_zip()
    if bundled is None:
        pytest.skip("this pyspark has no bundled pyspark.zip (not a pip install): nothing to drop")
    import pyspark

    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, "-c", USER_SESSION], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout.splitlines()[-1])
    assert str(bundled) in doc["before"][1].split(os.pathsep)  # Spark's own default: the zip first
    assert is_launcher(doc["exec"]), doc["exec"]
    assert doc["after"][0] == pyspark.__file__, doc
    assert str(bundled) not in doc["after"][1].split(os.pathsep), doc
    assert doc["columns"][:2] == ["cec_partition", "cec_offset"]


def test_a_python_of_the_users_choice_is_left_alone_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class Context:
        master = "local[2]"
        pythonExec = "/opt/other-venv/bin/python"

    class Session:
        sparkContext = Context()

    monkeypatch.setattr(python_exec, "_WARNED", set())
    session: Any = Session()
    with caplog.at_level("WARNING", logger=python_exec.__name__):
        assert use_launcher(session) is False
        assert use_launcher(session) is False
    assert Context.pythonExec == "/opt/other-venv/bin/python"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "failed to connect back" in warnings[0] and "\n" not in warnings[0]
    Context.master = "spark://elsewhere:7077"  # executors on other hosts: their own PYSPARK_PYTHON
    Context.pythonExec = sys.executable
    assert use_launcher(session) is False and Context.pythonExec == sys.executable
