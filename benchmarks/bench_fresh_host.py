"""A fresh host's restart, from the process's spawn to caught up at the crash point: cec before/after
(NAME=PATH variants, each a checkout or snapshot with its C extension built or copied in, first on
PYTHONPATH) against Quix Streams at-least-once on the same input topic, interleaved in every repeat
(issue 26: target <= 0.1x Quix).

The setup of bench_quix.py's recovery phase: the paper's purchases (`--keys` items, JSON, one partition)
on the broker tests/brokers.py starts (Apache Kafka from `make kafka-jars`), count windows of 10.
- cec: `cec run --recovery-target T` SIGKILLed once it applied N/2 tuples (tests/killpoints), its
  `--store-dir` deleted, the same command started again with a fresh one; "restart to caught up" is from
  the restart's spawn to the restore path's `caught_up` (a timestamp from benchmarks/restart_probe.py,
  wrapped from outside the product), beside the run's own report (recovery time and its phases, where
  the variant reports them; the records its index had left to take in at the start);
- Quix ALO: SIGKILLed when it processes offset N/2, its `state_dir` deleted, started again; "restart to
  caught up" is from the restart's spawn to processing offset N/2 again (its changelog restore, group
  join and reprocessing included).
Each variant's packages are compiled to bytecode first, as an installed package has them and as Quix's are
(benchmarks/bytecode.py): figures before 2026-11-28 22:00 paid ~0.1-0.3 s of compiling per cec process start.

    flock /tmp/cec-bench.lock nice -n 5 .venv/bin/python benchmarks/bench_fresh_host.py \\
        --variant before=/tmp/eccache26-before --variant after=. --repeats 2
Writes benchmarks/out/fresh-host.json.
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

import bench_quix  # noqa: E402  (the input, the cec command line and the Quix worker)
from bytecode import compile_tree  # noqa: E402

__all__ = ["main"]

BOOT = HERE / "probe_boot"


def _env(tree: Path, probe: Path, kill_at: int | None) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("CEC_TEST_KILL", "CEC_FAULTS", "CEC_BENCH_PROFILE"):
        env.pop(name, None)
    env["CEC_BENCH_PROBE"] = str(probe)
    if kill_at is not None:
        env["CEC_TEST_KILL"] = f"runtime.after_input:{kill_at}"
    env["PYTHONPATH"] = os.pathsep.join([str(BOOT), str(HERE), str(tree), env.get("PYTHONPATH", "")])
    return env


def _probe(probe: Path, spawned: float) -> dict[str, float]:
    """The restart's boundaries the probe saw, in seconds after the spawn (first event of each name), and
    the same split for every variant: the index reconcile (none where the index was deferred), the
    recover call (EC build and load), the restore, the replay (first tuple applied to caught up)."""
    at: dict[str, float] = {}
    for line in probe.read_text().splitlines():
        event = json.loads(line)
        at.setdefault(event["ev"], float(event["t"]) - spawned)
    if "caught_up:enter" not in at:
        raise RuntimeError(f"{probe}: no caught_up event (the restart did not recover?)")

    def span(name: str) -> float:
        return at.get(f"{name}:exit", 0.0) - at.get(f"{name}:enter", 0.0)

    return {
        "interpreter_s": at["interpreter"],
        "to_store_open_s": at.get("open_store:enter", 0.0),
        "output_queue_s": span("output_queue"),
        "index_reconcile_s": span("index_reconcile"),
        "to_run_s": at.get("run:enter", 0.0),
        "recover_call_s": span("recover"),
        "restore_s": span("restore"),
        "replay_s": at["caught_up:enter"] - at.get("first_apply", at["caught_up:enter"]),
        "caught_up_s": at["caught_up:enter"],
    }


def cec_restart(
    bootstrap: str, topic: str, count: int, tag: str, tree: Path, work: Path, target_s: float
) -> dict[str, Any]:
    out_topic = f"{tag}-out"
    extra = ["--recovery-target", f"{target_s * 1000:.0f}ms"]
    first, second = work / f"{tag}-store-1", work / f"{tag}-store-2"
    probe1, probe2 = work / f"{tag}-run1.jsonl", work / f"{tag}-run2.jsonl"
    cmd1 = bench_quix._cec_cmd(bootstrap, topic, out_topic, first, extra)
    rc = subprocess.run(cmd1, env=_env(tree, probe1, count // 2), cwd="/tmp", stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL).returncode  # fmt: skip
    if rc != -signal.SIGKILL:
        raise RuntimeError(f"{tag}: run 1 was to be SIGKILLed at {count // 2} inputs, exited {rc}")
    shutil.rmtree(first)  # the state directory is lost with the process: a fresh host
    cmd2 = bench_quix._cec_cmd(bootstrap, topic, out_topic, second, extra)
    spawned = time.time()
    proc = subprocess.run(cmd2, env=_env(tree, probe2, None), cwd="/tmp", capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{tag}: restart failed ({proc.returncode}): {proc.stderr[-2000:]}")
    stats = bench_quix._cec_stats(second, out_topic)
    rec = stats["recovery"]
    probed = _probe(probe2, spawned)
    return {
        "restart_to_caught_up_s": probed["caught_up_s"],
        "probe": probed,
        "recovery_s": rec["recovery_seconds"],
        "phases": rec.get("phases"),
        "index_deferred": rec.get("index_deferred"),
        "directory_records_read": rec.get("directory_records_read"),
        "records_read": rec["records_read"],
        "extent": rec["extent_records"],
        "ec_windows": rec["ec_windows"],
        "replayed": rec["tuples_replayed"],
        "target_s": target_s,
        "target_met": rec["recovery_seconds"] <= target_s,
    }


def quix_restart(bootstrap: str, topic: str, count: int, tag: str, work: Path) -> dict[str, Any]:
    state = work / f"{tag}-state"
    half = count // 2
    guarantee = bench_quix.GUARANTEE["quix-alo"]
    rc, _ = bench_quix._quix_run(bootstrap, topic, count, guarantee, tag, state, crash_at=half)
    if rc != -signal.SIGKILL:
        raise RuntimeError(f"{tag}: Quix was to be SIGKILLed at offset {half}, exited {rc}")
    shutil.rmtree(state, ignore_errors=True)  # the state directory is lost with the process
    spawned = time.time()
    rc, marks = bench_quix._quix_run(bootstrap, topic, count, guarantee, tag, state, recover_until=half)
    if rc != 0 or "recovered" not in marks or "started_epoch" not in marks:
        raise RuntimeError(f"{tag}: Quix recovery run failed (exit {rc}, marks {marks})")
    return {
        "restart_to_caught_up_s": marks["started_epoch"] + marks["recovered"] - spawned,
        "from_assignment_s": marks["recovered"] - marks.get("assigned", 0.0),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", action="append", required=True, help="NAME=PATH (the first is the base)")
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--tuples", type=int, default=500_000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--recovery-target", type=float, default=2.0, help="seconds (default %(default)s)")
    p.add_argument("--out", type=Path, default=HERE / "out" / "fresh-host.json")
    args = p.parse_args(argv)
    variants = [(v.partition("=")[0], Path(v.partition("=")[2]).resolve()) for v in args.variant]
    bench_quix.ensure_quix_venv()
    for _name, tree in variants:  # as installed: Quix's bytecode is in its site-packages (bytecode.py)
        compile_tree(tree)
    from tests.brokers import start_broker

    load_before = os.getloadavg()
    broker = start_broker()
    print(f"broker: {broker.describe()}", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    runs["quix-alo"] = []
    try:
        with tempfile.TemporaryDirectory(prefix="cec-fresh-host-") as tmp:
            topic = f"fresh-host-in-{args.keys}"
            bench_quix.produce_input(broker.bootstrap, topic, args.tuples, args.keys)
            systems: list[tuple[str, Path | None]] = [*variants, ("quix-alo", None)]
            for rep in range(args.repeats):
                shift = rep % len(systems)
                for name, tree in systems[shift:] + systems[:shift]:
                    tag = f"{name}-{rep}"
                    if tree is None:
                        row = quix_restart(broker.bootstrap, topic, args.tuples, tag, Path(tmp))
                    else:
                        row = cec_restart(broker.bootstrap, topic, args.tuples, tag, tree, Path(tmp),
                                          args.recovery_target)  # fmt: skip
                    runs[name].append(row)
                    print(f"[{rep}] {name:9} restart to caught up {row['restart_to_caught_up_s']:7.2f} s  "
                          + (f"recovery time {row['recovery_s']:.2f} s (target {'met' if row['target_met'] else 'MISSED'}), "
                             f"phases {row['phases']}, index deferred {row['index_deferred']}, "
                             f"EC records read {row['records_read']:,}, directory {row['directory_records_read']}; "
                             f"probe {dict((k, round(v, 2)) for k, v in row['probe'].items())}"
                             if tree is not None else f"(from assignment {row['from_assignment_s']:.2f} s)")
                          + f"  loadavg {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    finally:
        broker.stop()
    summary: dict[str, Any] = {}
    quix = runs["quix-alo"]
    for name, _ in variants:
        ratios = [
            a["restart_to_caught_up_s"] / q["restart_to_caught_up_s"]
            for a, q in zip(runs[name], quix, strict=True)
        ]
        summary[name] = {
            "restart_to_caught_up_s": statistics.median(r["restart_to_caught_up_s"] for r in runs[name]),
            "vs_quix_per_repeat": [round(x, 3) for x in ratios],
            "vs_quix_median": statistics.median(ratios),
            "target_met": [r["target_met"] for r in runs[name]],
        }
        print(f"{name:9} restart to caught up, median {summary[name]['restart_to_caught_up_s']:.2f} s; "
              f"/ Quix ALO per repeat {summary[name]['vs_quix_per_repeat']} (median "
              f"{summary[name]['vs_quix_median']:.3f}; target <= 0.1: "
              f"{'reached' if summary[name]['vs_quix_median'] <= 0.1 else 'not reached'}); recovery target "
              f"{args.recovery_target} s met {summary[name]['target_met']}")  # fmt: skip
    summary["quix-alo"] = {
        "restart_to_caught_up_s": statistics.median(r["restart_to_caught_up_s"] for r in quix)
    }
    print(f"quix-alo  restart to caught up, median {summary['quix-alo']['restart_to_caught_up_s']:.2f} s")
    base = variants[0][0]
    for name, _ in variants[1:]:
        ratios = [
            a["restart_to_caught_up_s"] / b["restart_to_caught_up_s"]
            for a, b in zip(runs[name], runs[base], strict=True)
        ]
        print(f"{name}/{base} restart to caught up: per repeat {[round(x, 3) for x in ratios]}, "
              f"median {statistics.median(ratios):.3f}")  # fmt: skip
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
