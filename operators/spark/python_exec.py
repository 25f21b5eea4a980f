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
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["bundled_pyspark_zip", "spark_python"]

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
    directory = Path(tempfile.gettempdir()) / f"cec-python-{os.getuid()}"
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
