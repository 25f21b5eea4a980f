"""A coverage-guided fuzz target (atheris, libFuzzer) of cec's C decoders: the topic source's JSON scanner
and flat Avro decoder (`cec/_native.c`), checked against their definitions (tests/cec/fuzz/oracle.py).

An input is a mode byte and records separated by 0x1E: an even mode checks the JSON scanner (holding
one of `oracle.WANTED`), an odd one the Avro decoder. A disagreement or any exception is a crash, which
libFuzzer saves as an artifact (the input that shows it).

    python tests/cec/fuzz/native_target.py -runs=20000 -seed=1 CORPUS_DIR   # libFuzzer's flags
`CEC_FUZZ_NATIVE_SO`: a build of `_native` to fuzz instead of the installed one (benchmarks/fuzz_native.py
builds one instrumented for coverage, with AddressSanitizer).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # run as a script: the repo's packages and tests/
    sys.path.insert(0, str(ROOT))

import atheris  # noqa: E402

with atheris.instrument_imports(include=["operators.formats", "tests.cec.fuzz.oracle"]):
    from tests.cec.fuzz import oracle

NATIVE = oracle.load_native(os.environ.get("CEC_FUZZ_NATIVE_SO"))


def test_one_input(data: bytes) -> None:
    if not data:
        return
    raws = data[1:].split(oracle.SEPARATOR)[:8]
    if data[0] % 2 == 0:
        oracle.check_json(NATIVE, raws, oracle.WANTED[data[0] // 2 % len(oracle.WANTED)])
    else:
        oracle.check_avro(NATIVE, raws)


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
