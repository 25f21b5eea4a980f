"""A measured tree's packages compiled to bytecode before a benchmark starts their processes.

An installed package has its bytecode (pip compiles a wheel's modules when it installs them), and so do the
peers measured beside cec (Quix Streams, PySpark: site-packages). A source tree does not, and where the
environment says PYTHONDONTWRITEBYTECODE (these machines' shells do) every new process compiled cec's ~150
modules again: ~0.1-0.3 s of each process start, of each Spark Python worker's first import, measured in
restarts that meant to measure recovery. The benchmarks that time process starts compile each tree they run
first, the same way for a before and an after tree."""

from __future__ import annotations

import compileall
from pathlib import Path

__all__ = ["PACKAGES", "compile_tree"]

# The packages of the distribution (pyproject.toml's packages), the ones a restart imports.
PACKAGES = ("cec", "operators", "queuestore", "recovery")


def compile_tree(tree: Path) -> None:
    """Bytecode for the packages of `tree` beside their sources (`__pycache__`, as an import writes it),
    where it is missing or older than its source; raises if a module does not compile."""
    for package in PACKAGES:
        directory = tree / package
        if directory.is_dir() and not compileall.compile_dir(directory, quiet=1, workers=0):
            raise RuntimeError(f"{directory}: a module does not compile")
