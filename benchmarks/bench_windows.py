"""Hopping windows (`operators.hopping`) against tumbling windows of the same size, on the same input.

One input CSV (keys spread uniformly, event times rising; at the default scale ~86,000 of the 90,000 keys
have a tuple in the current hour, so ~90,000 windows are open at once, the paper's scale), run through
`run_job` on the embedded store, G-open only (`cec run`'s default), in one process: tumbling `1h` and
hopping `1h` sliding `15m` (k = 4 windows per time), both with one key column and one aggregate. Per
variant: input tuples per second (wall time of the whole job) and the log's bytes per input tuple (record
values plus message keys, what the store holds), split into footprints (G-open, G-check) and results (R),
with the number of records of each kind; then hopping / tumbling. With `--lateness` both close by the
watermark instead of by their key's next tuple.

    nice -n 5 .venv/bin/python benchmarks/bench_windows.py [--keys 90000] [--tuples 900000] [--hours 3]
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cec.config import Checkpointing
from operators.job import JobSpec, aggregate_operator, run_job
from queuestore.sqlite import SqliteQueueStore

HOUR = 3_600_000


def write_input(path: Path, keys: int, tuples: int, hours: float, seed: int = 11) -> None:
    rnd = random.Random(seed)
    span = int(hours * HOUR)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["key", "value", "ts"])
        for i in range(tuples):
            writer.writerow([f"k{rnd.randrange(keys)}", rnd.randrange(1, 40000) / 8, i * span // tuples])


def run_variant(data: Path, root: Path, slide: str | None, lateness: str | None) -> dict[str, Any]:
    spec = JobSpec(
        operator=aggregate_operator(
            "key", "value", "avg", window_time="1h", time="ts", slide=slide, allowed_lateness=lateness
        ),
        source={"type": "csv", "path": str(data)},
        store={"type": "sqlite", "root": str(root)},
        output_topic="agg",
        checkpointing=Checkpointing(),
        batch_size=512,
    )
    started = time.perf_counter()
    stats = run_job(spec)
    seconds = time.perf_counter() - started
    kinds: dict[str, dict[str, int]] = {}
    with SqliteQueueStore(root).reader("agg", 0) as reader:
        for record in reader.scan_forward(0):
            key = record.meta.key
            entry = kinds.setdefault(record.meta.kind, {"records": 0, "bytes": 0})
            entry["records"] += 1
            entry["bytes"] += len(record.value) + (len(key.encode()) if key else 0)
    return {"seconds": seconds, "inputs": stats.inputs, "kinds": kinds}


def summary(run: dict[str, Any]) -> dict[str, float]:
    n = run["inputs"]
    kinds = run["kinds"]
    footprint = sum(kinds.get(k, {}).get("bytes", 0) for k in ("GOPEN", "GCHECK"))
    results = kinds.get("R", {}).get("bytes", 0)
    total = sum(v["bytes"] for v in kinds.values())
    return {
        "tuples_per_s": n / run["seconds"],
        "bytes_per_tuple": total / n,
        "footprint_bytes_per_tuple": footprint / n,
        "result_bytes_per_tuple": results / n,
        "gopens": kinds.get("GOPEN", {}).get("records", 0),
        "results": kinds.get("R", {}).get("records", 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=90_000)
    parser.add_argument("--tuples", type=int, default=900_000)
    parser.add_argument("--hours", type=float, default=3.0)
    parser.add_argument("--lateness", help="close by the watermark with this allowed lateness (e.g. 0)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-windows-") as tmp:
        data = Path(tmp) / "in.csv"
        write_input(data, args.keys, args.tuples, args.hours)
        runs = {
            "tumbling 1h": run_variant(data, Path(tmp) / "tumbling", None, args.lateness),
            "hopping 1h/15m": run_variant(data, Path(tmp) / "hopping", "15m", args.lateness),
        }
    table = {name: summary(run) for name, run in runs.items()}
    tumbling, hopping = table["tumbling 1h"], table["hopping 1h/15m"]
    ratios = {
        name: hopping[name] / tumbling[name] if tumbling[name] else float("nan")
        for name in ("tuples_per_s", "bytes_per_tuple", "footprint_bytes_per_tuple", "result_bytes_per_tuple")
    }
    doc = {
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "variants": table,
        "hopping/tumbling": ratios,
    }
    text = json.dumps(doc, indent=2, default=str)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
