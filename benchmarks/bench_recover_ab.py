"""`RecoveryManager.recover()` (EC build, EC load, replay plan) of this tree against another checkout,
interleaved fresh processes, on the paper-scale log that `bench_ec.py` caches (its `--cache` directory).

    nice -n 5 .venv/bin/python benchmarks/bench_recover_ab.py --other /work/main --cache /tmp/ecfast/ec-cache --repeats 3

Prints each run (EC build records/s and EC load windows/s by the report's own timers, the whole call's wall
time and the process's CPU time for it) and, per figure, best and median per tree and the ratio of medians.
The CPU-time ratio is the code's own cost; on a shared machine the wall figures mostly measure the load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _one(cache: Path) -> dict[str, float]:
    from operators.aggregate import KeyedAggregate
    from queuestore.factory import open_store
    from recovery.manager import RecoveryManager

    info = json.loads((cache / "log.json").read_text())
    store = open_store({"type": "sqlite", "root": str(cache / "store")})
    reader = store.reader("agg", 0)
    reader.hint_end(int(info["records"]))
    op = KeyedAggregate(key_field="item_id", value_field="item_price", window_count=10)
    cpu, wall = time.process_time(), time.perf_counter()
    report = RecoveryManager(reader, op.decode_state).recover(1).report
    return {
        "build": report.records_read / report.ec_build_seconds,
        "load": report.ec_windows / report.ec_load_seconds,
        "recover_s": time.perf_counter() - wall,
        "cpu_s": time.process_time() - cpu,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--other", required=True, help="a checkout with its C accelerator built")
    p.add_argument("--cache", required=True, help="bench_ec.py's cache directory (log.json + store/)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        sys.path.insert(0, args.worker)
        print(json.dumps(_one(Path(args.cache))))
        return 0
    trees = {"this": str(REPO), "other": str(Path(args.other).resolve())}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(args.repeats):
        for name, tree in trees.items():
            cmd = [sys.executable, __file__, "--other", args.other, "--cache", args.cache, "--worker", tree]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=tree)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            runs[name].append(result)
            print(f"{name}: {result} (load average {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    for figure, best in (("build", max), ("load", max), ("recover_s", min), ("cpu_s", min)):
        this = [r[figure] for r in runs["this"]]
        other = [r[figure] for r in runs["other"]]
        print(
            f"{figure}: this best {best(this):,.3f} median {statistics.median(this):,.3f}; other best "
            f"{best(other):,.3f} median {statistics.median(other):,.3f}; this/other (medians) "
            f"{statistics.median(this) / statistics.median(other):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
