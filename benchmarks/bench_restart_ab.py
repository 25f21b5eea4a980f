"""Before/after of a `cec run --input-topic` recovery at the paper's scale: each variant's code (NAME=PATH,
a checkout or snapshot with its C extension built or copied in, first on PYTHONPATH) killed and restarted
on the same input topic, interleaved (the order rotates per repeat).

The recovery phase of bench_quix.py / bench_kafka_streams.py for cec alone, with a fixed target: the
paper's purchases (`--keys` items, JSON, one partition) on the broker tests/brokers.py starts; `cec run
--recovery-target T` SIGKILLed once it applied N/2 tuples, its --store-dir deleted, the same command
started again with a fresh one. The kill: tests/killpoints (`runtime.after_input`) for a tree that has
them, else the production fault site the code before issue 23 read (`CEC_FAULTS=runtime.after_input:n`).
Figures per run: the restarted run's own recovery report (recovery time, EC build, EC load, tuples
replayed) and the restarted process's wall time (spawn to exit, the rest of the input included).

    flock /tmp/cec-bench.lock nice -n 5 .venv/bin/python benchmarks/bench_restart_ab.py \\
        --variant before=/tmp/before-snapshot --variant after=. --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import bench_quix  # noqa: E402  (the input and the cec command line of the recovery phase)

__all__ = ["main"]

FIGURES = ("recovery_s", "ec_build_s", "ec_load_s", "catch_up_s", "replayed", "restart_wall_s")


def _env(tree: Path, kill_at: int | None) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("CEC_TEST_KILL", "CEC_FAULTS"):
        env.pop(name, None)
    paths = [str(tree)]
    if kill_at is not None:
        boot = tree / "tests" / "killpoints" / "boot"
        if boot.is_dir():
            env["CEC_TEST_KILL"] = f"runtime.after_input:{kill_at}"
            paths.insert(0, str(boot))
        else:
            env["CEC_FAULTS"] = f"runtime.after_input:{kill_at}"
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    return env


def one_run(
    bootstrap: str, topic: str, count: int, tag: str, tree: Path, work: Path, target_s: float
) -> dict[str, Any]:
    out_topic = f"{tag}-out"
    extra = ["--recovery-target", f"{target_s * 1000:.0f}ms"]
    first, second = work / f"{tag}-store-1", work / f"{tag}-store-2"
    cmd1 = bench_quix._cec_cmd(bootstrap, topic, out_topic, first, extra)
    rc = subprocess.run(cmd1, env=_env(tree, count // 2), cwd="/tmp", stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL).returncode  # fmt: skip
    if rc != -signal.SIGKILL:
        raise RuntimeError(f"{tag}: run 1 was to be SIGKILLed at {count // 2} inputs, exited {rc}")
    shutil.rmtree(first)  # the state directory is lost with the process
    cmd2 = bench_quix._cec_cmd(bootstrap, topic, out_topic, second, extra)
    spawned = time.perf_counter()
    proc = subprocess.run(cmd2, env=_env(tree, None), cwd="/tmp", capture_output=True, text=True)
    wall = time.perf_counter() - spawned
    if proc.returncode != 0:
        raise RuntimeError(f"{tag}: restart failed ({proc.returncode}): {proc.stderr[-2000:]}")
    stats = bench_quix._cec_stats(second, out_topic)
    rec = stats["recovery"]
    return {
        "recovery_s": rec["recovery_seconds"],
        "ec_build_s": rec["ec_build_seconds"],
        "ec_load_s": rec["ec_load_seconds"],
        "catch_up_s": rec["catch_up_seconds"],
        "replayed": rec["tuples_replayed"],
        "restart_wall_s": wall,
        "u_target_at_end": stats.get("u_target"),
        "target_s": target_s,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--variant", action="append", required=True, help="NAME=PATH (two or more; the first is the base)"
    )
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--tuples", type=int, default=500_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--recovery-target", type=float, default=2.0, help="seconds (default %(default)s)")
    p.add_argument("--out", type=Path, default=HERE / "out" / "restart-ab.json")
    args = p.parse_args(argv)
    variants = [(v.partition("=")[0], Path(v.partition("=")[2]).resolve()) for v in args.variant]
    if len(variants) < 2:
        p.error("give two or more --variant NAME=PATH")
    from tests.brokers import start_broker

    load_before = os.getloadavg()
    broker = start_broker()
    print(f"broker: {broker.describe()}", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    try:
        with tempfile.TemporaryDirectory(prefix="cec-restart-ab-") as tmp:
            topic = f"restart-ab-in-{args.keys}"
            bench_quix.produce_input(broker.bootstrap, topic, args.tuples, args.keys)
            for rep in range(args.repeats):
                shift = rep % len(variants)
                for name, tree in variants[shift:] + variants[:shift]:
                    row = one_run(broker.bootstrap, topic, args.tuples, f"{name}-{rep}", tree, Path(tmp),
                                  args.recovery_target)  # fmt: skip
                    runs[name].append(row)
                    print(f"[{rep}] {name:8} " + "  ".join(f"{k} {row[k]:,.2f}" for k in FIGURES)
                          + f"  loadavg {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    finally:
        broker.stop()
    base = variants[0][0]
    summary: dict[str, Any] = {}
    for name, _ in variants:
        summary[name] = {k: statistics.median(r[k] for r in runs[name]) for k in FIGURES}
        print(f"{name:8} medians: " + "  ".join(f"{k} {summary[name][k]:,.2f}" for k in FIGURES))
    for name, _ in variants[1:]:
        for k in FIGURES:
            ratios = [a[k] / b[k] for a, b in zip(runs[name], runs[base], strict=True) if b[k]]
            if ratios:
                print(
                    f"{name}/{base} {k}: per repeat {[round(x, 2) for x in ratios]}, median {statistics.median(ratios):.2f}"
                )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "variants": {name: str(tree) for name, tree in variants}, "keys": args.keys, "tuples": args.tuples,
        "recovery_target_s": args.recovery_target, "broker": broker.describe(),
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": runs, "summary": summary,
    }, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
