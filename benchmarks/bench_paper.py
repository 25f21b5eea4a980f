"""The CEC paper's section IV at its own scale: 100,000 keys, count windows of 10, 500,000 tuples, crash at half.

The paper's aggregate (average price per item) over the paper's purchases (`PurchaseGenerator`, seed 42),
through the library a user calls (`operators.job.run_job` with a `JobSpec` and a `Checkpointing`), on the
embedded store, a fresh store per configuration. This is the aggregate stage of
`cec demo --engine local --input 500000 --keys 100000 --window 10` without the demo's filter in front. Each
configuration runs to half the input and stops with everything it produced durable (the log a SIGKILL at
that point leaves; the tests and `benchmarks/bench_quix.py` SIGKILL real processes), then a fresh runtime
recovers from the log and finishes the input.

Sweeps (the paper's figs. 6-9), each beside "G-open only" (no G-checks) measured in the same run:
- Q (extent target, in multiples of the windows open at the crash), U none;
- U (replay target, input tuples), Q none;
- CP with CI = 5 ms (checkpoint budget CI/CP), Q = the open windows (always a candidate to G-check);
- the policies: the demo's targets (Q=20,000, U=100,000), `recovery_target` (1 s and 3 s), cost-benefit.

Per configuration: G-checks produced (both runs), the real checkpoint duty before the crash (time spent
producing G-checks / run time, `RunStats.checkpoint_duty`, and over the time the policy wanted G-checks,
`RunStats.checkpoint_duty_wanted`) beside its budget, extent at the crash, EC
build and EC load time, EC build rate, tuples replayed, recovery time (EC build + load + replay to the
crash point), and the throughput of the run up to the crash (tuples/s; ratio to G-open only).

    nice -n 10 .venv/bin/python benchmarks/bench_paper.py           # the paper's scale: ~10-20 minutes
    .venv/bin/python benchmarks/bench_paper.py --quick              # 60k tuples, 12k keys: ~1-2 minutes
Writes benchmarks/out/paper.json and benchmarks/paper_{q,u,cp,policies}.png.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cec.config import Checkpointing
from operators.job import JobSpec, run_job

__all__ = ["main"]

HERE = Path(__file__).resolve().parent


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure(label: str, count: int, keys: int, window: int, checkpointing: Checkpointing) -> dict[str, Any]:
    """One configuration on a fresh store: run to half the input, then recover and finish."""
    with tempfile.TemporaryDirectory(prefix="bench-paper-") as tmp:
        spec = JobSpec(
            operator={
                "type": "aggregate",
                "key_field": "item_id",
                "value_field": "item_price",
                "agg": "avg",
                "window_count": window,
            },
            source={"type": "generator", "count": count, "keys": keys, "seed": 42},
            store={"type": "sqlite", "root": tmp},
            output_topic="agg",
            checkpointing=checkpointing,
            batch_size=512,
        )
        gc.collect()
        before = run_job(spec, max_inputs=count // 2)
        gc.collect()
        after = run_job(spec)
    rec = after.recovery
    assert rec is not None, "the second run must recover"
    row = {
        "label": label,
        "Q": checkpointing.q_target,
        "U": checkpointing.u_target,
        "CI": checkpointing.ci_ms,
        "CP": checkpointing.cp_ms,
        "recovery_target": checkpointing.recovery_target,
        "policy": checkpointing.policy,
        "tuples_per_s": before.inputs / before.seconds,
        "gchecks": before.gchecks + after.gchecks,
        "gchecks_before_crash": before.gchecks,
        "gopens": before.gopens + after.gopens,
        "duty": before.checkpoint_duty,
        "duty_wanted": before.checkpoint_duty_wanted,
        "budget": before.checkpoint_budget,
        "duty_after": after.checkpoint_duty,
        "refusal": before.checkpoint_refusal,
        "q_in_force": before.q_target,
        "u_in_force": before.u_target,
        "open_windows_at_crash": rec.ec_windows,
        "extent": rec.extent_records,
        "ec_build_ms": rec.ec_build_seconds * 1000,
        "ec_load_ms": rec.ec_load_seconds * 1000,
        "ec_rate_per_s": rec.records_read / max(rec.ec_build_seconds, 1e-9),
        "replayed": rec.tuples_replayed,
        "recovery_ms": rec.recovery_seconds * 1000,
        "replay_ms": max(rec.recovery_seconds - rec.ec_build_seconds - rec.ec_load_seconds, 0.0) * 1000,
        "crash_inputs": before.inputs,
    }
    _say(
        f"  {label:<26} {row['tuples_per_s']:>8,.0f} t/s  G-check {row['gchecks']:>7,}  duty "
        f"{row['duty']:6.1%} (wanted {row.get('duty_wanted', 0.0):6.1%})/{row['budget']:5.1%}  extent {row['extent']:>7,}  EC {row['ec_build_ms']:6.0f}"
        f"+{row['ec_load_ms']:5.0f} ms  replayed {row['replayed']:>7,}  recovery {row['recovery_ms']:7.0f} ms"
    )
    return row


def plot_sweep(rows: list[dict[str, Any]], xs: list[Any], xlabel: str, title: str, base: dict[str, Any],
               path: Path) -> None:  # fmt: skip
    """The paper's panels for one sweep: recovery time (EC build / EC load / replay), extent and replay,
    G-checks, throughput and duty."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pos = list(range(len(rows)))
    names = [str(x) for x in xs]
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.4))
    build = [r["ec_build_ms"] / 1000 for r in rows]
    load = [r["ec_load_ms"] / 1000 for r in rows]
    replay = [r["replay_ms"] / 1000 for r in rows]
    ax = axes[0]
    ax.bar(pos, build, label="EC build")
    ax.bar(pos, load, bottom=build, label="EC load")
    ax.bar(pos, replay, bottom=[b + lo for b, lo in zip(build, load, strict=True)], label="replay")
    ax.axhline(base["recovery_ms"] / 1000, color="grey", ls="--", label="G-open only")
    ax.set_title("recovery time (s)")
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.plot(pos, [r["extent"] for r in rows], marker="o", label="extent at the crash (records)")
    ax.plot(pos, [r["replayed"] for r in rows], marker="s", label="tuples replayed")
    ax.plot(pos, [r["open_windows_at_crash"] for r in rows], ls=":", color="grey", label="open windows")
    ax.set_title("extent and replay")
    ax.legend(fontsize=8)
    ax = axes[2]
    ax.bar(pos, [r["gchecks"] for r in rows])
    ax.set_title("G-checks produced")
    ax = axes[3]
    ax.plot(
        pos,
        [r["tuples_per_s"] / base["tuples_per_s"] for r in rows],
        marker="o",
        label="throughput / G-open only",
    )
    ax.plot(pos, [r["duty"] for r in rows], marker="s", label="real checkpoint duty")
    ax.plot(
        pos,
        [r.get("duty_wanted", 0.0) for r in rows],
        marker="o",
        label="duty while the policy wanted G-checks",
    )
    ax.plot(pos, [r["budget"] for r in rows], ls="--", marker="x", label="duty budget")
    ax.set_ylim(0, max(1.1, *(r["tuples_per_s"] / base["tuples_per_s"] for r in rows)) * 1.05)
    ax.set_title("overhead")
    ax.legend(fontsize=8)
    for ax in axes:
        ax.set_xticks(pos, names, fontsize=8)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=85)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="60,000 tuples over 12,000 keys")
    parser.add_argument("--input", type=int, help="tuples (default 500,000)")
    parser.add_argument("--keys", type=int, help="keys (default 100,000)")
    parser.add_argument(
        "--only",
        help="sweeps to run, comma-separated of q,u,cp,policies,mtbf (default all; run in the order "
        "u,cp,policies,mtbf,q); the figures go to benchmarks/out/paper-<sweeps>.json",
    )
    args = parser.parse_args(argv)
    count = args.input or (60_000 if args.quick else 500_000)
    keys = args.keys or (12_000 if args.quick else 100_000)
    window = 10
    only = set((args.only or "q,u,cp,policies,mtbf").split(","))
    unknown = only - {"q", "u", "cp", "policies", "mtbf"}
    if unknown:
        parser.error(f"unknown sweep(s): {', '.join(sorted(unknown))}")
    started = time.perf_counter()
    result: dict[str, Any] = {
        "count": count,
        "keys": keys,
        "window": window,
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "load_average_start": os.getloadavg(),
    }
    _say(f"{count:,} tuples over {keys:,} keys, count windows of {window}, crash at {count // 2:,}")
    base = measure("G-open only", count, keys, window, Checkpointing())
    result["gopen_only"] = base
    openwins = max(base["open_windows_at_crash"], 1)
    scale = count / 500_000  # U values are the paper's at full scale

    out = HERE / "out"
    out.mkdir(exist_ok=True)
    suffix = "-quick" if args.quick else ""
    titles = {
        "q": ("Q (x open windows at the crash)", "effect of the extent target Q (paper fig. 6)"),
        "u": ("U (input tuples)", "effect of the replay target U (paper fig. 7)"),
        "cp": ("CP (ms), CI = 5 ms", "effect of the checkpoint period CP (paper figs. 8-9)"),
        "policies": ("policy", "checkpoint policies"),
        "mtbf": ("MTBF the cost-benefit policy plans for (s)", "cost-benefit policy against the MTBF"),
    }
    figures = f"paper{suffix}" + (f"-{'-'.join(sorted(only))}" if args.only else "")

    def save(name: str) -> None:
        """After every sweep, so that a run cut short keeps what it measured."""
        result["seconds"] = time.perf_counter() - started
        result["load_average_end"] = os.getloadavg()
        (out / f"{figures}.json").write_text(json.dumps(result, indent=2))
        xlabel, title = titles[name]
        rows = result[name]
        plot_sweep(
            rows, [r["x"] for r in rows], xlabel,
            f"{title}: {count:,} tuples, {keys:,} keys, window {window}, crash at half (embedded store)",
            base, HERE / f"paper_{name}{suffix}.png",
        )  # fmt: skip

    def sweep(name: str, points: list[tuple[Any, str, Checkpointing]]) -> None:
        rows = []
        for x, label, cp in points:
            row = measure(label, count, keys, window, cp)
            row["x"] = x
            row["throughput_ratio"] = row["tuples_per_s"] / base["tuples_per_s"]
            row["recovery_ratio"] = row["recovery_ms"] / base["recovery_ms"]
            rows.append(row)
        result[name] = rows
        save(name)

    # At this scale (5 tuples per key on average) almost every window is still open at the crash: the
    # extent is the open windows, so U, not Q, is what makes G-checks worth producing; U first.
    if "u" in only:
        _say("effect of U (input tuples), CI=5 ms CP=100 ms")
        sweep("u", [(u, f"U={int(u * scale):,}", Checkpointing(u_target=int(u * scale)))
                    for u in (25_000, 50_000, 100_000, 200_000)])  # fmt: skip
    if "cp" in only:
        u_cp = int(50_000 * scale)
        _say(f"effect of CP with CI=5 ms, U = {u_cp:,}")
        sweep("cp", [(cp, f"CP={cp:g} ms", Checkpointing(u_target=u_cp, ci_ms=5.0, cp_ms=cp))
                     for cp in (10.0, 25.0, 50.0, 100.0)])  # fmt: skip
    if "policies" in only:
        _say("policies")
        sweep("policies", [
            ("targets", "targets Q=20k U=100k", Checkpointing(q_target=20_000, u_target=int(100_000 * scale))),
            ("rto 3s", "recovery_target=3s", Checkpointing(recovery_target="3s")),
            ("rto 1s", "recovery_target=1s", Checkpointing(recovery_target="1s")),
            ("cost-benefit", "cost-benefit", Checkpointing(policy="cost-benefit")),
        ])  # fmt: skip
    if "mtbf" in only:
        # The policy settles near u = sqrt(g N lambda R MTBF) (its class doc): at this scale ~0.9M tuples
        # for an hour, so only MTBFs of minutes make G-checks worth their cost within the run.
        _say("cost-benefit policy against the MTBF it plans for")
        sweep("mtbf", [(m, f"cost-benefit MTBF={m:g} s", Checkpointing(policy="cost-benefit", mtbf=m))
                       for m in (10.0, 60.0, 600.0, 3600.0)])  # fmt: skip
    if "q" in only:
        _say(f"effect of Q (x the {openwins:,} open windows at the crash), CI=5 ms CP=100 ms")
        sweep("q", [(m, f"Q={m}x ({int(m * openwins):,})", Checkpointing(q_target=int(m * openwins)))
                    for m in (1, 1.25, 1.5, 2)])  # fmt: skip

    _say(f"done in {result['seconds']:.0f} s: benchmarks/out/{figures}.json, benchmarks/paper_*{suffix}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
