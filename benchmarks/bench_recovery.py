"""The CEC paper's experiments (section IV), scaled to this machine, on the embedded store.

- baseline impact (paper fig. 5): throughput with G-open footprints only vs. the same operator writing
  results only (no fault tolerance), for fast windows (size 1) and slow windows (size 1000), 2 keys;
- effect of Q (fig. 6) and of U (fig. 7): 100k-tuple-class workload (many keys, window 10), a crash in the
  middle: G-checks emitted, extent at the crash, EC reconstruction + load time, tuples replayed, recovery
  time; throughput relative to G-open only;
- effect of the checkpoint period CP with CI fixed (figs. 8, 9): extent at the crash and throughput.

Every figure is reported beside a baseline measured in the same run (ratios), because these machines are
shared and noisy. A "crash" here stops the operator after half the input with everything produced durable
(the log a SIGKILL at that instant would leave; the tests SIGKILL real processes), then a fresh runtime
recovers from the log and finishes.

    .venv/bin/python benchmarks/bench_recovery.py            # full run, ~3-5 minutes
    .venv/bin/python benchmarks/bench_recovery.py --quick    # smaller, ~1 minute
Writes benchmarks/out/recovery.json and benchmarks/recovery.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cec.config import Checkpointing
from operators.job import JobSpec, run_job
from operators.runtime import RunStats

__all__ = ["main"]

HERE = Path(__file__).resolve().parent


def _spec(
    root: Path,
    count: int,
    keys: int,
    window: int,
    q: int | None,
    u: int | None,
    ci: float = 5.0,
    cp: float = 100.0,
) -> JobSpec:
    return JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "avg",
            "window_count": window,
        },
        source={"type": "generator", "count": count, "keys": keys, "seed": 42},
        store={"type": "sqlite", "root": str(root)},
        output_topic="agg",
        checkpointing=Checkpointing(q_target=q, u_target=u, ci_ms=ci, cp_ms=cp),
        batch_size=512,
    )


def _run(spec: JobSpec, *, stop_after: int | None = None, footprints: bool = True) -> RunStats:
    spec.footprints = footprints
    return run_job(spec, max_inputs=stop_after)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure(
    label: str,
    count: int,
    keys: int,
    window: int,
    q: int | None,
    u: int | None,
    ci: float = 5.0,
    cp: float = 100.0,
) -> dict[str, Any]:
    """A failure-free run (throughput), then a crashed run recovered (recovery figures)."""
    with tempfile.TemporaryDirectory() as tmp:
        full = _run(_spec(Path(tmp) / "full", count, keys, window, q, u, ci, cp))
        crashed = _spec(Path(tmp) / "crash", count, keys, window, q, u, ci, cp)
        before = _run(crashed, stop_after=count // 2)
        after = _run(crashed)
    rec = after.recovery
    assert rec is not None
    row = {
        "label": label,
        "Q": q,
        "U": u,
        "CI": ci,
        "CP": cp,
        "tuples_per_s": full.inputs / full.seconds,
        "gchecks": full.gchecks,
        "gopens": full.gopens,
        "open_windows_at_crash": rec.ec_windows,
        "extent": rec.extent_records,
        "ec_build_ms": rec.ec_build_seconds * 1000,
        "ec_load_ms": rec.ec_load_seconds * 1000,
        "ec_rate_per_s": rec.records_read / max(rec.ec_build_seconds, 1e-9),
        "replayed": rec.tuples_replayed,
        "skipped": rec.tuples_skipped,
        "recovery_ms": rec.recovery_seconds * 1000,
        "crash_inputs": before.inputs,
    }
    _say(
        f"  {label:<22} {row['tuples_per_s']:>9,.0f} tuples/s  G-check {row['gchecks']:>8,}  "
        f"extent {row['extent']:>8,}  EC {row['ec_build_ms'] + row['ec_load_ms']:7.1f} ms  "
        f"replayed {row['replayed']:>8,}  recovery {row['recovery_ms']:7.1f} ms"
    )
    return row


def baseline(count: int, window: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        rows = {}
        for name, footprints in (("native", False), ("gopen", True), ("native2", False), ("gopen2", True)):
            stats = _run(_spec(Path(tmp) / name, count, 2, window, None, None), footprints=footprints)
            rows[name] = stats.inputs / stats.seconds
    native = (rows["native"] + rows["native2"]) / 2
    gopen = (rows["gopen"] + rows["gopen2"]) / 2
    _say(
        f"  window {window:>5}: native {native:,.0f} tuples/s, G-open only {gopen:,.0f} tuples/s "
        f"(ratio {gopen / native:.3f})"
    )
    return {
        "window": window,
        "native_tuples_per_s": native,
        "gopen_tuples_per_s": gopen,
        "ratio": gopen / native,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 4, figsize=(17, 11))
    for row_axes, (name, xkey, xlabel) in zip(
        axes,
        (
            ("q", "Q", "Q (x open windows)"),
            ("u", "U", "U (x open windows)"),
            ("cp", "CP", "CP (ms), CI fixed"),
        ),
        strict=True,
    ):
        rows = result[name]
        xs = [r["x"] for r in rows]
        panels = (
            ("gchecks", "G-checks emitted"),
            ("extent", "extent at the crash (records)"),
            ("ec_ms", "EC reconstruction + load (ms)"),
            ("replayed", "tuples replayed"),
        )
        for ax, (key, title) in zip(row_axes, panels, strict=True):
            ys = [r["ec_build_ms"] + r["ec_load_ms"] if key == "ec_ms" else r[key] for r in rows]
            ax.plot(xs, ys, marker="o")
            ax.set_title(f"{title} vs {xkey}")
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
    fig.suptitle("CEC recovery trade-offs (embedded store); throughput ratios in RESULTS.md")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    # Many tuples per key, so that windows close and reopen many times during the run (as in the paper's
    # minutes-long runs) and checkpoint slots have time to move the oldest footprint forward.
    count, keys = (150_000, 1_500) if args.quick else (400_000, 4_000)
    started = time.perf_counter()
    result: dict[str, Any] = {"count": count, "keys": keys, "window": 10}

    _say("baseline impact (2 keys): results-only vs. G-open footprints")
    result["baseline"] = [baseline(count, w) for w in (1, 1000)]

    _say(f"G-open only, {count:,} tuples, {keys:,} keys, window 10")
    reference = measure("G-open only", count, keys, 10, None, None)
    result["gopen_only"] = reference
    openwins = max(reference["open_windows_at_crash"], 1)

    _say("effect of Q (multiples of the open windows at the crash), CI=5 ms CP=100 ms")
    result["q"] = []
    for mult in (1, 2, 4, 8):
        row = measure(f"Q={mult}x openwins", count, keys, 10, mult * openwins, None)
        row["x"] = mult
        row["throughput_ratio"] = row["tuples_per_s"] / reference["tuples_per_s"]
        result["q"].append(row)

    _say("effect of U (multiples of the open windows, in input tuples), CI=5 ms CP=100 ms")
    result["u"] = []
    for mult in (1, 2, 4, 8):
        u = mult * openwins
        row = measure(f"U={u:,}", count, keys, 10, None, u)
        row["x"] = mult
        row["throughput_ratio"] = row["tuples_per_s"] / reference["tuples_per_s"]
        result["u"].append(row)

    _say("effect of CP with CI=10 ms and Q = open windows (always a candidate to checkpoint)")
    result["cp"] = []
    for cp in (25.0, 50.0, 100.0, 250.0):
        row = measure(f"CP={cp:g} ms", count, keys, 10, openwins, None, ci=10.0, cp=cp)
        row["x"] = cp
        row["throughput_ratio"] = row["tuples_per_s"] / reference["tuples_per_s"]
        result["cp"].append(row)

    result["seconds"] = time.perf_counter() - started
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    (out / "recovery.json").write_text(json.dumps(result, indent=2))
    plot(result, HERE / "recovery.png")
    _say(f"done in {result['seconds']:.0f} s: benchmarks/out/recovery.json, benchmarks/recovery.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
