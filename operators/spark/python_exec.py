"""The Python executable Spark starts its Python processes with, in local mode (`local_session`).

Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on the `PYTHONPATH` of every Python process it
starts: the daemon and its workers, each streaming query's Python source runner, and the process in which
`transformWithStateInPandas` learns a processor's state schema at every query start. With PySpark
installed from PyPI, `SPARK_HOME` is the installed `pyspark` package, and that zip is a copy of the very
package beside it. Python caches no bytecode for modules it imports from a zip, so each of those processes
compiles pyspark from source: measured here, `import pyspark.sql.streaming.transform_with_state_driver_worker`
takes 0.77 s from the zip and 0.19 s from the installed package, and a `transformWithStateInPandas` query's
first-batch planning 1.25-1.30 s against 0.74-0.76 s.

`spark_python()` returns a launcher for this interpreter that takes that one zip (the installed package's
own copy, nothing else) off `PYTHONPATH` and then runs the interpreter, so every Spark Python process
imports the installed, byte-compiled pyspark: the same code. It is only used where the launcher's path
exists for every Python process, i.e. a `local[...]` master; executors on other hosts run whatever
`PYSPARK_PYTHON` names there.

Why it is the default wherever cec starts Python work, a session the user built included
(`use_launcher`, called by every cec entry point before it registers or wraps any Python function): Spark
waits a fixed 10 s (not configurable: `PythonWorkerFactory`, Spark 4.x) for a Python process it started
to connect back, and a process that spends most of that compiling pyspark on a loaded machine misses it
("Python worker failed to connect back"). PySpark reads the executable of each Python function when it
wraps it (`SparkContext.pythonExec`, the UDFs, `mapInArrow`, `transformWithStateInPandas` and the Python
data sources alike), so pointing that attribute at the launcher in a running session makes every Python
process started for what is wrapped after it start through the launcher.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["bundled_pyspark_zip", "is_launcher", "spark_python", "use_launcher"]

log = logging.getLogger(__name__)
# Launchers that ran in this process (a temporary directory mounted noexec would make every Spark Python
# process fail to start: a launcher is only handed out once it has run).
_CHECKED: set[str] = set()

_TEMPLATE = """#!/bin/bash
# Written by cec (operators/spark/python_exec.py): runs {interpreter} without the installed pyspark's own
# copy of itself on PYTHONPATH, so that pyspark is imported with cached bytecode (module doc there).
drop={drop}
IFS=: read -r -a entries <<< "$PYTHONPATH"
kept=()
for entry in "${{entries[@]}}"; do
  [[ "$entry" == "$drop" ]] || kept+=("$entry")
done
PYTHONPATH=$(IFS=:; printf '%s' "${{kept[*]}}")
export PYTHONPATH
exec {interpreter} "$@"
"""


def bundled_pyspark_zip() -> Path | None:
    """The installed pyspark package's own `python/lib/pyspark.zip` (what Spark puts on PYTHONPATH when
    SPARK_HOME is that package), or None when there is none (e.g. pyspark from a Spark distribution)."""
    try:
        import pyspark
    except ImportError:
        return None
    if pyspark.__file__ is None:
        return None
    zip_path = Path(pyspark.__file__).resolve().parent / "python" / "lib" / "pyspark.zip"
    return zip_path if zip_path.is_file() else None


def spark_python(interpreter: str | None = None, *, bundled_zip: Path | None = None) -> str:
    """A launcher of `interpreter` (default: this one) without `bundled_zip` (default: the installed
    pyspark's, `bundled_pyspark_zip`) on PYTHONPATH; `interpreter` itself when there is no such zip or no
    bash. Written once per (interpreter, zip) under the temporary directory, atomically."""
    interpreter = interpreter or sys.executable
    drop = bundled_zip if bundled_zip is not None else bundled_pyspark_zip()
    bash = Path("/bin/bash")
    if drop is None or os.name != "posix" or not bash.exists():
        return interpreter
    text = _TEMPLATE.format(interpreter=shlex.quote(interpreter), drop=shlex.quote(str(drop)))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    directory = _launcher_dir()
    directory.mkdir(mode=0o700, exist_ok=True)
    launcher = directory / f"python-{digest}"
    if not launcher.exists() or launcher.read_text() != text:
        partial = directory / f".{launcher.name}.{os.getpid()}"
        partial.write_text(text)
        partial.chmod(0o755)
        partial.replace(launcher)
    if str(launcher) not in _CHECKED:
        try:
            subprocess.run([str(launcher), "-c", "pass"], check=True, capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning(
                "cannot run %s (%s): Spark's Python processes will import pyspark from its zip", launcher, exc
            )
            return interpreter
        _CHECKED.add(str(launcher))
    return str(launcher)


def _launcher_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"cec-python-{os.getuid()}"


def is_launcher(executable: str) -> bool:
    """Is `executable` a launcher `spark_python` wrote?"""
    path = Path(executable)
    return path.parent == _launcher_dir() and path.name.startswith("python-")


def _is_this_interpreter(executable: str) -> bool:
    """Does `executable` (a path, or a name looked up on PATH, as Spark runs it) run this interpreter: the
    same path, or the same file under another name in the same directory (a venv's python3 and python)."""
    found = shutil.which(executable)
    if found is None:
        return False
    this, that = Path(sys.executable).absolute(), Path(found).absolute()
    return this == that or (this.parent == that.parent and this.resolve() == that.resolve())


_WARNED: set[str] = set()


def use_launcher(spark: SparkSession) -> bool:
    """Run the Python processes Spark starts from now on for `spark`'s functions through the launcher
    (module doc), in a local session whose Python is this interpreter (by `PYSPARK_PYTHON` or PySpark's
    default, `python3` on PATH). A Python the user chose otherwise is left alone, with one warning per
    process saying what to set. Idempotent; True when the session's Python runs through the launcher."""
    from operators.spark.session import is_local_master

    context = spark.sparkContext
    current = str(getattr(context, "pythonExec", "") or "")
    if not current or is_launcher(current):
        return bool(current)
    if not is_local_master(spark):
        return False  # executors on other hosts: their PYSPARK_PYTHON (module doc)
    if not _is_this_interpreter(current):
        if current not in _WARNED:
            _WARNED.add(current)
            log.warning(
                "Spark's Python workers run %s, not this interpreter: cec leaves it, but on a loaded machine "
                "they may fail with 'Python worker failed to connect back'; set PYSPARK_PYTHON to "
                "operators.spark.python_exec.spark_python() before the session starts (docs/spark.md)",
                current,
            )
        return False
    launcher = spark_python()
    if launcher == sys.executable:
        return False  # no zip to drop, or no launcher can run here
    context.pythonExec = launcher
    return True
