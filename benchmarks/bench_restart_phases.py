"""Where a `cec run --input-topic` restart's time goes, and how far the replay was from the controller's U.

The recovery phase of bench_kafka_streams.py / bench_quix.py at the paper's scale, cec alone, with probes:
the input topic of those scripts (the paper's purchases as JSON, `--keys` items, one partition) on the
broker tests/brokers.py starts (Apache Kafka from `make kafka-jars`); `cec run` over it with
`--recovery-target`, SIGKILLed once it applied N/2 tuples (`runtime.after_input`, tests/killpoints), its
`--store-dir` deleted, then restarted with a fresh one, as those scripts do. Both processes carry
benchmarks/restart_probe.py (timestamps at method boundaries, wrapped from outside the product):

- run 1 (until the kill): every measurement interval of the G-check controller, i.e. the replay size u and
  extent q it measured against the U and Q it aimed at, the budget and the duty spent;
- run 2 (the restart): process start (spawn to interpreter), imports and CLI, store open, output queue
  (writer + index open), index reconcile (the fresh --store-dir's index rebuilt from the log), the input
  source, EC build + load (`RecoveryManager.recover`), restore, replay (first tuple applied to caught up).

    flock /tmp/cec-bench.lock nice -n 5 .venv/bin/python benchmarks/bench_restart_phases.py --repeats 3
Writes benchmarks/out/restart-phases.json (every event of every run, and the summary printed).
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
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

BOOT = HERE / "probe_boot"


def _env(probe: Path, kill_at: int | None, profile: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CEC_TEST_KILL", None)
    env.pop("CEC_BENCH_PROFILE", None)
    env["CEC_BENCH_PROBE"] = str(probe)
    if profile:
        env["CEC_BENCH_PROFILE"] = profile
    if kill_at is not None:
        env["CEC_TEST_KILL"] = f"runtime.after_input:{kill_at}"
    env["PYTHONPATH"] = os.pathsep.join([str(BOOT), str(HERE), str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _events(probe: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in probe.read_text().splitlines() if line.strip()]


def _at(events: list[dict[str, Any]], name: str, last: bool = False) -> float:
    times = [e["t"] for e in events if e["ev"] == name]
    if not times:
        raise RuntimeError(f"no {name} event (the probe did not see it)")
    return times[-1] if last else times[0]


def _warnings(stderr: str | None) -> list[str]:
    return [line for line in (stderr or "").splitlines() if "WARNING" in line][:5]


def one_repeat(
    bootstrap: str, topic: str, count: int, tag: str, work: Path, target_s: float, profile: str | None = None
) -> dict[str, Any]:
    out_topic = f"{tag}-out"
    extra = ["--recovery-target", f"{target_s * 1000:.0f}ms"]
    first, second = work / f"{tag}-store-1", work / f"{tag}-store-2"
    probe1, probe2 = work / f"{tag}-run1.jsonl", work / f"{tag}-run2.jsonl"
    cmd1 = bench_quix._cec_cmd(bootstrap, topic, out_topic, first, extra)
    run1 = subprocess.run(cmd1, env=_env(probe1, count // 2), cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)  # fmt: skip
    rc = run1.returncode
    if rc != -signal.SIGKILL:
        raise RuntimeError(f"run 1 was to be SIGKILLed at {count // 2} inputs, exited {rc}")
    shutil.rmtree(first)  # the state directory is lost with the process
    cmd2 = bench_quix._cec_cmd(bootstrap, topic, out_topic, second, extra)
    spawned = time.time()
    proc = subprocess.run(cmd2, env=_env(probe2, None, profile), cwd=ROOT, capture_output=True, text=True)
    ended = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"restart failed ({proc.returncode}): {proc.stderr[-2000:]}")
    stats = bench_quix._cec_stats(second, out_topic)
    rec = stats["recovery"]
    e1, e2 = _events(probe1), _events(probe2)
    measures = [e for e in e1 if e["ev"] == "measure"]
    last = measures[-1]
    late = measures[len(measures) // 2 :]  # the second half of run 1: N near its plateau
    t = {name: _at(e2, name) for name in (
        "interpreter", "open_store:enter", "open_store:exit", "output_queue:enter", "index_reconcile:enter",
        "index_reconcile:exit", "output_queue:exit", "run:enter", "recover:enter", "recover:exit",
        "first_apply", "caught_up:enter")}  # fmt: skip
    phases = {
        "process_start_s": t["interpreter"] - spawned,
        "imports_cli_s": t["open_store:enter"] - t["interpreter"],
        "store_open_s": t["open_store:exit"] - t["open_store:enter"],
        "writer_and_index_open_s": t["index_reconcile:enter"] - t["output_queue:enter"],
        "index_reconcile_s": t["index_reconcile:exit"] - t["index_reconcile:enter"],
        "source_and_runtime_s": t["run:enter"] - t["output_queue:exit"],
        "recover_call_s": t["recover:exit"] - t["recover:enter"],
        "ec_build_s": rec["ec_build_seconds"],
        "ec_load_s": rec["ec_load_seconds"],
        "restore_seek_s": t["first_apply"] - t["recover:exit"],
        "replay_s": t["caught_up:enter"] - t["first_apply"],
        "spawn_to_caught_up_s": t["caught_up:enter"] - spawned,
        "recovery_s": rec["recovery_seconds"],
        "process_s": ended - spawned,
    }
    gc_inside = {
        e["ev"].removesuffix(":exit"): e["gc_s"] for e in e2 if e["ev"].endswith(":exit") and "gc_s" in e
    }
    return {
        "tag": tag,
        "target_s": target_s,
        "phases": phases,
        "gc_s": gc_inside,  # the cyclic GC's seconds inside each boundary of the restart
        "replayed": rec["tuples_replayed"],
        "replay_span": rec["replay_span"],
        "crash_pos": rec["crash_pos"],
        "replay_rate": rec["tuples_replayed"] / phases["replay_s"] if phases["replay_s"] > 0 else None,
        "extent": rec["extent_records"],
        "ec_windows": rec["ec_windows"],
        "run1": {
            "intervals": len(measures),
            "last": last,
            "u_over_U_late": [m["u"] / m["U"] for m in late if m["U"]],
            "q_over_Q_late": [m["q"] / m["Q"] for m in late if m["Q"]],
            "budget_short_late": sum(bool(m["budget_short"]) for m in late),
            "late": len(late),
            "warnings": _warnings(run1.stderr),
        },
        "run2_warnings": _warnings(proc.stderr),
        "run2_stats": {
            k: stats.get(k)
            for k in (
                "checkpoint_duty",
                "checkpoint_budget",
                "q_target",
                "u_target",
                "checkpoint_refusal",
                "checkpoint_note",
            )
        },
        "events": {"run1": e1, "run2": e2},
    }


def report(runs: list[dict[str, Any]]) -> None:
    keys = list(runs[0]["phases"])
    print(f"{'phase of the restart':28}" + "".join(f"{r['tag']:>12}" for r in runs) + f"{'median':>10}")
    for k in keys:
        vals = [r["phases"][k] for r in runs]
        print(f"{k:28}" + "".join(f"{v:12.3f}" for v in vals) + f"{statistics.median(vals):10.3f}")
    for r in runs:
        last, run1 = r["run1"]["last"], r["run1"]
        ratios = run1["u_over_U_late"]
        print(
            f"{r['tag']}: target {r['target_s']} s; run 1 at its last interval before the kill: inputs "
            f"{last['inputs']:,}, N={last['n']:,}, u={last['u']:,} vs U={last['U']:,}, q={last['q']:,} vs "
            f"Q={last['Q']:,}, budget {last['budget']:.0%}, duty {last['duty']:.0%}, G-checks {last['gchecks_made']:,} "
            f"in {last['gcheck_seconds']:.2f} s, planned replay rate {last['replay_rate']:,.0f}/s; u/U over its "
            f"second half median {statistics.median(ratios):.2f} (max {max(ratios):.2f}), budget spent in "
            f"{run1['budget_short_late']}/{run1['late']} intervals. Restart: replayed {r['replayed']:,} "
            f"(span {r['replay_span']:,}) at {r['replay_rate'] or 0:,.0f} tuples/s; cyclic GC inside: "
            + ", ".join(f"{k} {v:.2f} s" for k, v in r.get("gc_s", {}).items() if v >= 0.01)
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--tuples", type=int, default=500_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--recovery-target", type=float, default=2.0, help="seconds (default %(default)s)")
    p.add_argument("--out", type=Path, default=HERE / "out" / "restart-phases.json")
    p.add_argument(
        "--profile",
        help="an event name of restart_probe.BOUNDARIES (e.g. restore): cProfile it in each restart, the "
        "stats saved beside --out and their top printed",
    )
    args = p.parse_args(argv)
    from tests.brokers import start_broker

    load_before = os.getloadavg()
    broker = start_broker()
    print(f"broker: {broker.describe()}", flush=True)
    runs: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="cec-restart-") as tmp:
            topic = f"restart-in-{args.keys}"
            bench_quix.produce_input(broker.bootstrap, topic, args.tuples, args.keys)
            for rep in range(args.repeats):
                runs.append(one_repeat(broker.bootstrap, topic, args.tuples, f"r{rep}", Path(tmp),
                                       args.recovery_target, args.profile))  # fmt: skip
                print(f"repeat {rep} done, loadavg {os.getloadavg()}", flush=True)
                if args.profile:
                    prof = Path(tmp) / f"r{rep}-run2.jsonl.{args.profile}.prof"
                    kept = args.out.with_name(f"{args.out.stem}-r{rep}.{args.profile}.prof")
                    kept.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(prof, kept)
                    pstats.Stats(str(kept)).sort_stats("cumulative").print_stats(20)
    finally:
        broker.stop()
    report(runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "keys": args.keys, "tuples": args.tuples, "recovery_target_s": args.recovery_target,
        "broker": broker.describe(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": runs,
    }, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
