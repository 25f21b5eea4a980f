"""The coverage-guided fuzz target of the C decoders (tests/cec/fuzz/native_target.py), run briefly in CI: a
bounded number of libFuzzer executions from a fixed seed (not a wall-clock budget), on the installed build.

Here libFuzzer is steered by the Python code's coverage (atheris instruments it); the C code's own
coverage and AddressSanitizer need an instrumented build (clang), which benchmarks/fuzz_native.py makes
for longer runs. Executions: CEC_FUZZ_RUNS (default 20,000: a few seconds).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cec.native import native
from tests.cec.fuzz.oracle import write_seeds
from tests.helpers import child_env

pytest.importorskip("atheris", reason="atheris (the test extra) has no wheel for this platform")
pytestmark = pytest.mark.skipif(native is None, reason="the C accelerator is not built")

TARGET = Path(__file__).with_name("native_target.py")
RUNS = int(os.environ.get("CEC_FUZZ_RUNS", "20000"))


def test_the_c_decoders_agree_with_their_definitions_under_a_coverage_guided_fuzzer(tmp_path: Path) -> None:
    corpus, artifacts = tmp_path / "corpus", tmp_path / "crashes"
    write_seeds(corpus)
    artifacts.mkdir()
    out = subprocess.run(
        [sys.executable, str(TARGET), f"-runs={RUNS}", "-seed=1", "-max_len=4096", "-timeout=60",
         f"-artifact_prefix={artifacts}/", str(corpus)],
        capture_output=True, text=True, timeout=900, env=child_env(),
    )  # fmt: skip
    log = out.stdout + out.stderr
    assert out.returncode == 0 and not list(artifacts.iterdir()), log[-4000:]
    assert f"Done {RUNS} runs" in log, log[-2000:]
