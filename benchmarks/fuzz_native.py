"""A longer coverage-guided fuzz run of cec's C decoders (tests/cec/fuzz/native_target.py), with the C code
itself instrumented: what CI runs briefly, for minutes.

With clang and its compiler-rt (Debian: `apt-get install clang`), `cec/_native.c` is built into a work
directory with libFuzzer's coverage instrumentation and AddressSanitizer (`-fsanitize=fuzzer-no-link,
address`), and libFuzzer with the ASan runtime is preloaded (one shared library, as atheris documents
for native extensions): libFuzzer then steers by the C code's edges and ASan stops at any out-of-bounds
access. Without clang the installed build is fuzzed, steered by Python coverage only (said in the
report). The corpus is kept in `--corpus` between runs; crashes (an oracle disagreement, an exception,
an ASan report) are saved as `crash-*` files beside it.

    .venv/bin/python benchmarks/fuzz_native.py [--seconds 600] [--corpus DIR] [--no-asan]

Writes benchmarks/out/fuzz_native.json: runs, executions per second, coverage, corpus size, crashes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGET = ROOT / "tests" / "fuzz" / "native_target.py"
_STATS = re.compile(r"#(\d+)\s+(?:DONE|pulse|NEW|REDUCE)\s+cov: (\d+) ft: (\d+) corp: (\d+)/")


def find_clang() -> str | None:
    for name in ("clang", *(f"clang-{v}" for v in range(20, 13, -1))):
        path = shutil.which(name)
        if path:
            return path
    return None


def build_instrumented(clang: str, work: Path, asan: bool) -> tuple[Path, Path]:
    """(the instrumented `_native` build, the library to preload: libFuzzer, with ASan's runtime)."""
    sanitizers = "fuzzer-no-link,address" if asan else "fuzzer-no-link"
    include = sysconfig.get_paths()["include"]
    native = work / "_native.so"
    subprocess.run(
        [clang, "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer", f"-fsanitize={sanitizers}",
         f"-I{include}", str(ROOT / "cec" / "_native.c"), "-o", str(native)],
        check=True,
    )  # fmt: skip
    runtime = Path(
        subprocess.run(
            [clang, "--print-runtime-dir"], check=True, capture_output=True, text=True
        ).stdout.strip()
    )
    if not (runtime / "libclang_rt.fuzzer_no_main-x86_64.a").exists():  # Debian's layout
        resource = subprocess.run(
            [clang, "-print-resource-dir"], check=True, capture_output=True, text=True
        ).stdout
        runtime = Path(resource.strip()) / "lib" / "linux"
    objects: list[str] = []
    if asan:
        # ASan's runtime as objects, less its .preinit_array (not allowed in a shared library).
        extracted = work / "asan"
        extracted.mkdir(exist_ok=True)
        subprocess.run(["ar", "x", str(runtime / "libclang_rt.asan-x86_64.a")], cwd=extracted, check=True)
        objects = [str(p) for p in sorted(extracted.glob("*.o")) if "preinit" not in p.name]
        objects += ["-Wl,--whole-archive", str(runtime / "libclang_rt.asan_cxx-x86_64.a")]
    else:
        objects = ["-Wl,--whole-archive"]
    preload = work / "fuzzer_preload.so"
    subprocess.run(
        [clang, "-shared", "-fPIC", "-o", str(preload), *objects,
         str(runtime / "libclang_rt.fuzzer_no_main-x86_64.a"), "-Wl,--no-whole-archive",
         "-lpthread", "-ldl", "-lrt", "-lm", "-lstdc++"],
        check=True,
    )  # fmt: skip
    return native, preload


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=600)
    parser.add_argument("--corpus", type=Path, default=Path(tempfile.gettempdir()) / "cec-fuzz-native-corpus")
    parser.add_argument("--no-asan", action="store_true", help="coverage instrumentation only")
    args = parser.parse_args()

    from tests.cec.fuzz.oracle import write_seeds

    write_seeds(args.corpus)
    artifacts = args.corpus.parent / f"{args.corpus.name}-crashes"
    artifacts.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    clang = find_clang()
    work = Path(tempfile.mkdtemp(prefix="cec-fuzz-build-"))
    if clang is not None:
        native, preload = build_instrumented(clang, work, asan=not args.no_asan)
        mode = f"C code instrumented ({clang}{'' if args.no_asan else ', AddressSanitizer'})"
        env.update({"CEC_FUZZ_NATIVE_SO": str(native), "LD_PRELOAD": str(preload), "PYTHONMALLOC": "malloc"})
        env["ASAN_OPTIONS"] = "detect_leaks=0:quarantine_size_mb=64:malloc_context_size=10"
    else:
        mode = "installed build, Python coverage only (no clang to instrument the C code)"
    command = [sys.executable, str(TARGET), f"-max_total_time={args.seconds}", "-max_len=4096", "-timeout=20",
               "-rss_limit_mb=6144", "-print_final_stats=1", f"-artifact_prefix={artifacts}/", str(args.corpus)]  # fmt: skip
    print(f"fuzzing {args.seconds} s: {mode}\n  corpus {args.corpus}\n  crashes -> {artifacts}", flush=True)
    started = time.monotonic()
    out = subprocess.run(command, env=env, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    log = out.stdout + out.stderr
    (work / "fuzz.log").write_text(log)
    stats = _STATS.findall(log)
    runs, cov, ft, corpus = (int(x) for x in stats[-1]) if stats else (0, 0, 0, 0)
    crashes = sorted(p.name for p in artifacts.iterdir())
    report = {
        "mode": mode,
        "seconds": round(elapsed, 1),
        "exit_code": out.returncode,
        "runs": runs,
        "exec_per_s": round(runs / elapsed) if elapsed else 0,
        "coverage_edges": cov,
        "features": ft,
        "corpus_inputs": corpus,
        "crashes": crashes,
        "log": str(work / "fuzz.log"),
    }
    for line in log.splitlines():
        if "ERROR" in line or "Traceback" in line or "AssertionError" in line:
            print("  " + line)
    print(json.dumps(report, indent=2))
    out_path = ROOT / "benchmarks" / "out" / "fuzz_native.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if out.returncode == 0 and not crashes else 1


if __name__ == "__main__":
    sys.exit(main())
