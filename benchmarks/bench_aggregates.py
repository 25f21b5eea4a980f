"""Several aggregates (operators.multi_aggregate) against the single aggregate (operators.aggregate).

The paper's workload (purchases, count windows of 10, G-open only) through `run_job` on the embedded
store, in interleaved rounds in one process: the single `avg` (KeyedAggregate: float `+`, the compact
first-tuple footprint), the same `avg` as the several-aggregate form (`aggs=[("avg", ...)]`: exact sum),
and five aggregates at once (avg, sum, min, max, count:*). Per variant: input tuples per second (wall
time of the whole job, median of the rounds) and the log's record bytes per input tuple (what the store
holds: record values, footprints and results), each as a ratio to the single aggregate of the same run.

    nice -n 5 .venv/bin/python benchmarks/bench_aggregates.py [--inputs 100000] [--keys 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cec.config import Checkpointing
from operators.job import JobSpec, run_job
from queuestore.sqlite import SqliteQueueStore

VARIANTS: dict[str, dict[str, Any]] = {
    "single avg (KeyedAggregate)": {"agg": "avg"},
    "aggs=[avg] (MultiAggregate)": {"aggs": [["avg", "item_price"]]},
    "aggs=[avg,sum,min,max,count:*]": {
        "aggs": [
            ["avg", "item_price"],
            ["sum", "item_price"],
            ["min", "item_price"],
            ["max", "item_price"],
            ["count", "*"],
        ],
    },
}


def _run(root: Path, extra: dict[str, Any], inputs: int, keys: int) -> tuple[float, float]:
    spec = JobSpec(
        operator={"type": "aggregate", "key_field": "item_id", "value_field": "item_price", "window_count": 10,
                  **extra},
        source={"type": "generator", "count": inputs, "keys": keys, "seed": 3},
        store={"type": "sqlite", "root": str(root)},
        output_topic="agg",
        checkpointing=Checkpointing(),
        batch_size=512,
    )  # fmt: skip
    started = time.perf_counter()
    run_job(spec)
    seconds = time.perf_counter() - started
    store = SqliteQueueStore(root)
    with store.reader("agg", 0) as reader:
        total = sum(len(r.value) for r in reader.scan_forward(0))
    store.close()
    return inputs / seconds, total / inputs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", type=int, default=100_000)
    p.add_argument("--keys", type=int, default=1_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    sizes: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, (name, extra) in enumerate(VARIANTS.items()):
                rate, per_tuple = _run(Path(tmp) / f"{r}-{i}", extra, args.inputs, args.keys)
                rates[name].append(rate)
                sizes[name] = per_tuple  # deterministic: the same records every round
    base = next(iter(VARIANTS))
    out = {}
    print(
        f"{args.inputs:,} tuples, {args.keys:,} keys, count windows of 10, G-open only, {args.rounds} rounds"
    )
    print(f"{'variant':34} {'tuples/s':>10} {'ratio':>6} {'B/tuple':>8} {'ratio':>6}")
    for name in VARIANTS:
        rate = statistics.median(rates[name])
        ratio = rate / statistics.median(rates[base])
        size_ratio = sizes[name] / sizes[base]
        print(f"{name:34} {rate:10,.0f} {ratio:6.2f} {sizes[name]:8.1f} {size_ratio:6.2f}")
        out[name] = {"tuples_per_s": rate, "throughput_ratio": ratio, "bytes_per_tuple": sizes[name],
                     "bytes_ratio": size_ratio}  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
