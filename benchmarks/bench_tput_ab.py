"""Before/after of `cec run --input-topic` steady throughput: the same input topic (the paper's purchases,
JSON, 1,000 keys, one partition), each variant's code in its own `cec run` process, interleaved repeats
(the order rotates). A variant is NAME=PYTHONPATH: e.g. a worktree of the commit before a change (with its
C extension built or copied in). Figures: RunStats inputs/seconds (what bench_quix.py reports for cec) and
the CPU seconds of the whole `cec run` process (CLI start and results pass included), which a loaded
machine disturbs far less than wall-clock rates.

    nice -n 5 .venv/bin/python benchmarks/bench_tput_ab.py 127.0.0.1:49092 100000 6 base=/path/to/old-worktree tput=.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from bench_quix import produce_input  # noqa: E402


def main() -> int:
    boot, count, reps, variants = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    topic = f"ab-in-{os.getpid()}"
    produce_input(boot, topic, count, 1000)
    work = Path(f"/tmp/bench-tput-ab-{os.getpid()}")
    work.mkdir()
    names = [v.partition("=")[0] for v in variants]
    rates: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    cec = Path(sys.executable).with_name("cec")
    for r in range(reps):
        for v in variants[r % len(variants) :] + variants[: r % len(variants)]:
            name, _, path = v.partition("=")
            env = dict(os.environ, PYTHONPATH=str(Path(path).resolve()))
            tag = f"{name}-{r}"
            store, out = work / f"{tag}-store", f"{topic}-{tag}-out"
            cmd = [str(cec), "run", "--input-topic", topic, "--bootstrap-servers", boot, "--format", "json",
                   "--key", "item_id", "--value", "item_price", "--window-count", "10", "--agg", "avg",
                   "--output-topic", out, "--results", str(work / f"{tag}.csv"), "--store-dir", str(store)]  # fmt: skip
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd="/tmp")
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if proc.returncode:
                print(proc.stderr[-2000:])
                return 1
            cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
            stats = json.loads((store / f".{out}.0.stats.json").read_text())
            rates[name].append(stats["inputs"] / stats["seconds"])
            cpus[name].append(cpu)
            print(f"[{r}] {name:8} {rates[name][-1]:9,.0f} tuples/s  cpu {cpu:6.2f} s", flush=True)
    base = names[0]
    for n in names[1:]:
        wall = [a / b for a, b in zip(rates[n], rates[base], strict=True)]
        cpu = [b / a for a, b in zip(cpus[n], cpus[base], strict=True)]
        print(
            f"{n}/{base} tuples/s per repeat {[f'{x:.2f}' for x in wall]}, median {statistics.median(wall):.2f}"
        )
        print(f"{base}/{n} CPU s per repeat {[f'{x:.2f}' for x in cpu]}, median {statistics.median(cpu):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
