"""`python -m operators.worker`: the process the CLI's --crash-after runs (and kills) reports errors in one
line with exit code 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from operators.job import JobSpec, aggregate_operator
from operators.worker import REPORTED_ERROR_EXIT
from tests.helpers import child_env


def test_an_environment_error_in_the_worker_is_one_line(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    data.write_text("item,price\na,1\na,2\n")
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    spec = JobSpec(
        operator=aggregate_operator("item", "price", "avg", window_count=2),
        source={"type": "csv", "path": str(data)},
        store={"type": "sqlite", "root": str(not_a_dir / "store")},  # a store dir under a plain file
        output_topic="out",
    )
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(spec.to_json())
    proc = subprocess.run(
        [sys.executable, "-m", "operators.worker", str(spec_path)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert proc.returncode == REPORTED_ERROR_EXIT, proc.stderr
    assert proc.stderr.startswith("cec: error: NotADirectoryError: ") and proc.stderr.count("\n") == 1, (
        proc.stderr
    )
