"""`operators.spark.python_exec`: Spark's Python processes import the installed pyspark, not the zip copy.

1. The launcher takes exactly the bundled zip off PYTHONPATH (every occurrence), keeps every other entry
   in order, and runs the interpreter it was made for with the arguments it was given.
2. Without a bundled zip there is nothing to drop: the interpreter itself is the answer.
3. In a real local session made by `local_session`, a Python task imports pyspark from the installed
   package (with cached bytecode), not from `pyspark.zip`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from operators.spark import python_exec
from operators.spark.python_exec import bundled_pyspark_zip, spark_python

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
