"""Replay after a crash at half of the demo's input: this tree against another checkout, interleaved.

The demo's pipeline on the embedded store (purchases -> filter -> average price per item over count
windows of 10, 500,000 tuples over 100,000 items by default), the aggregate stopped at half its input with
G-opens only (the longest replay: every tuple back to the start) with everything produced durable, as a
SIGKILL there leaves it. The crashed log is built once and cached; each measurement copies it and
recovers in a fresh process, up to the moment replay reaches the crash point. Printed: catch-up wall time
and the process's CPU time up to then (EC build and load included), median over the repeats, as ratios.

    nice -n 5 .venv/bin/python benchmarks/bench_replay.py --other /path/to/older/checkout --repeats 3

`--other` is a checkout with its C accelerator built (e.g. `git archive REF | tar -x -C DIR` plus the
`cec/_native*.so` of a build of that ref).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _specs(root: Path, count: int, keys: int, topic: str) -> tuple[Any, Any]:
    from operators.job import JobSpec

    store = {"type": "sqlite", "root": str(root / "store")}
    filter_spec = JobSpec(
        operator={
            "type": "filter",
            "field": "item_price",
            "op": ">",
            "value": 0,
            "schema": "purchase",
            "time_field": "item_time",
        },
        source={"type": "generator", "count": count, "keys": keys, "seed": 1, "bad_every": 50},
        store=store,
        output_topic="purchases",
        batch_size=512,
        progress=False,
    )
    agg_spec = JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "avg",
            "window_count": 10,
            "time_field": "item_time",
        },
        source={"type": "queue", "topic": "purchases", "schema": "purchase"},
        store=store,
        output_topic=topic,
        batch_size=512,
        progress=False,
    )
    return filter_spec, agg_spec


def _one(root: Path, count: int, keys: int) -> dict[str, float]:
    import operators.runtime as runtime
    from operators.job import run_job

    topic = f"agg-{os.getpid()}"
    shutil.copytree(root / "store" / "agg", root / "store" / topic)
    _, spec = _specs(root, count, keys, topic)
    caught: list[float] = []
    try:  # the restore path's own class; trees before it was split off had it on the runtime
        from operators.local_restore import LocalRestore

        owner, method = LocalRestore, "caught_up"
    except ImportError:
        owner, method = runtime.OperatorRuntime, "_caught_up"  # type: ignore[assignment]
    caught_up = getattr(owner, method)

    def timed(self: Any) -> None:
        caught.append(time.process_time())
        caught_up(self)

    setattr(owner, method, timed)
    cpu = time.process_time()
    try:
        stats = run_job(spec, stop=lambda: bool(caught))
    finally:
        shutil.rmtree(root / "store" / topic, ignore_errors=True)
    r = stats.recovery
    assert r is not None and caught
    return {
        "catch_up_s": r.catch_up_seconds,
        "cpu_s": caught[0] - cpu,
        "replayed": r.tuples_replayed,
        "ec_build_s": r.ec_build_seconds,
        "ec_load_s": r.ec_load_seconds,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--other", required=True, help="the checkout to compare with")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--input", type=int, default=500_000)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "cec-bench-replay"))
    p.add_argument("--worker", nargs=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    root = Path(args.cache) / f"{args.input}-{args.keys}"
    if args.worker:
        sys.path.insert(0, args.worker[0])
        print(json.dumps(_one(root, args.input, args.keys)))
        return 0
    sys.path.insert(0, str(REPO))
    if not (root / "done").exists():
        from operators.job import run_job

        shutil.rmtree(root, ignore_errors=True)
        filter_spec, agg_spec = _specs(root, args.input, args.keys, "agg")
        run_job(filter_spec)
        run_job(agg_spec, max_inputs=args.input // 2)
        (root / "done").write_text("")
    trees = {"this": str(REPO), "other": str(Path(args.other).resolve())}
    runs: dict[str, list[dict[str, float]]] = {"this": [], "other": []}
    for _ in range(args.repeats):
        for name, tree in trees.items():
            cmd = [sys.executable, __file__, "--other", args.other, "--input", str(args.input)]
            cmd += ["--keys", str(args.keys), "--cache", args.cache, "--worker", tree]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=tree)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            runs[name].append(result)
            print(f"{name}: {result} (load average {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    for figure in ("catch_up_s", "cpu_s"):
        this = statistics.median(r[figure] for r in runs["this"])
        other = statistics.median(r[figure] for r in runs["other"])
        print(f"{figure}: this/other {this / other:.2f} (medians {this:.2f} / {other:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
