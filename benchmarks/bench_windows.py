"""Window types side by side on one input: tumbling, hopping, session and five aggregates, at the paper's scale.

One input CSV (keys spread uniformly, event times rising; at the default scale ~86,000 of the 90,000 keys
have a tuple in the current hour, so ~90,000 windows are open at once, the paper's scale), run through
`run_job` on the embedded store, G-open only (`Checkpointing()`, as `cec run --gopen-only`), one key
column. Variants (`--variants`, default all):

- `tumbling`: `--window-time 1h --agg avg` (the single aggregate, `KeyedAggregate`): the baseline;
- `hopping`: `--window-time 1h --slide 15m --agg avg` (k = 4 windows per time, `HoppingAggregate`);
- `session`: `--session-gap 30m --agg avg` (`SessionAggregate`);
- `aggs1`: `--window-time 1h --agg avg:value` (the several-aggregate form with one aggregate, `MultiAggregate`);
- `aggs5`: `--window-time 1h` with avg, sum, min, max and count:* over `value` (`MultiAggregate`);
- `count`, `count-aggs5`: the paper's count windows of 10 (no event time), the single `avg`
  (`KeyedAggregate`'s per-tuple fast path) and the five aggregates: compare these two with each other.

Each run is a process of its own (this script's hidden `--child` mode), so that its CPU seconds
(`getrusage` of the child: user + system) are its own; runs are interleaved per repeat (the order rotates).
Per run: input tuples per CPU second and per wall second, the log's bytes per input tuple (record values
plus message keys, what the store holds) split into footprints (G-open, G-check) and results (R), and a
digest of the results (rows, and a hash of the sorted result rows) that must be equal between trees. Then
each variant's ratio to `tumbling` of the same repeat. With `--lateness` every variant closes by the
watermark instead of by its key's next tuple.

`--before-tree DIR` runs every variant also from another source tree (`git archive main | tar -x -C DIR`
with the C extension copied in), interleaved with this tree: after / before per repeat, in CPU seconds.
The load average is printed beside every run.

    flock /tmp/cec-bench.lock nice -n 5 .venv/bin/python benchmarks/bench_windows.py [--keys 90000] \
        [--tuples 900000] [--hours 3] [--repeats 2] [--variants tumbling,hopping] [--before-tree DIR]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HOUR = 3_600_000
FIVE = [["avg", "value"], ["sum", "value"], ["min", "value"], ["max", "value"], ["count", "*"]]
VARIANTS: dict[str, dict[str, Any]] = {
    "tumbling": {"window_time": "1h"},
    "hopping": {"window_time": "1h", "slide": "15m"},
    "session": {"session_gap": "30m"},
    "aggs1": {"window_time": "1h", "aggs": [["avg", "value"]]},
    "aggs5": {"window_time": "1h", "aggs": FIVE},
    # The paper's count windows (of 10, over input order): the single aggregate's fast path against five.
    "count": {"window_count": 10, "time": None},
    "count-aggs5": {"window_count": 10, "time": None, "aggs": FIVE},
}


def input_rows(keys: int, tuples: int, hours: float, seed: int = 11) -> Iterator[tuple[str, float, int]]:
    """(key, value, ts) of the input: keys drawn uniformly, values multiples of 1/8 (so that any sum of a
    window's values is exact in floats too), event times rising evenly over `hours`."""
    rnd = random.Random(seed)
    span = int(hours * HOUR)
    for i in range(tuples):
        yield f"k{rnd.randrange(keys)}", rnd.randrange(1, 40000) / 8, i * span // tuples


def write_input(path: Path, keys: int, tuples: int, hours: float, seed: int = 11) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["key", "value", "ts"])
        writer.writerows(input_rows(keys, tuples, hours, seed))


# -- one run, in a child process (imports the tree it was started for) ---------------------------------------
def child(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(Path(args.tree).resolve()))
    from cec.config import Checkpointing
    from operators.job import JobSpec, aggregate_operator, build_operator, run_job
    from operators.sinks import iter_payloads
    from queuestore.sqlite import SqliteQueueStore

    variant = VARIANTS[args.variant]
    aggs = variant.get("aggs")
    operator = aggregate_operator(
        "key",
        "value",
        "avg",
        window_count=variant.get("window_count"),
        window_time=variant.get("window_time"),
        time=variant.get("time", "ts"),
        slide=variant.get("slide"),
        session_gap=variant.get("session_gap"),
        allowed_lateness=args.lateness,
        aggs=[tuple(a) for a in aggs] if aggs else None,
    )
    spec = JobSpec(
        operator=operator,
        source={"type": "csv", "path": args.data},
        store={"type": "sqlite", "root": args.root},
        output_topic="agg",
        checkpointing=Checkpointing.default()
        if args.checkpointing == "default"
        else Checkpointing.gopen_only(),
        batch_size=512,
    )
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    stats = run_job(spec)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    kinds: dict[str, dict[str, int]] = {}
    store = SqliteQueueStore(Path(args.root))
    with store.reader("agg", 0) as reader:
        for record in reader.scan_forward(0):
            key = record.meta.key
            entry = kinds.setdefault(record.meta.kind, {"records": 0, "bytes": 0})
            entry["records"] += 1
            entry["bytes"] += len(record.value) + (len(key.encode()) if key else 0)
    rows = sorted(
        json.dumps(p, sort_keys=True, default=str)
        for p in iter_payloads(store, "agg", build_operator(operator).result_schema)
    )
    store.close()
    digest = {"rows": len(rows), "sha256": hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]}
    out = {"seconds": seconds, "cpu_seconds": cpu, "inputs": stats.inputs, "kinds": kinds, "digest": digest}
    Path(args.result).write_text(json.dumps(out))
    return 0


def run_child(
    tree: Path, variant: str, data: Path, root: Path, lateness: str | None, checkpointing: str
) -> dict[str, Any]:
    result = root.with_suffix(".json")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--tree", str(tree), "--variant", variant,
           "--data", str(data), "--root", str(root), "--result", str(result)]  # fmt: skip
    if lateness is not None:
        cmd += ["--lateness", lateness]
    cmd += ["--checkpointing", checkpointing]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd="/tmp")
    if proc.returncode != 0:
        raise RuntimeError(f"{variant} in {tree} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    run: dict[str, Any] = json.loads(result.read_text())
    run["load_average"] = os.getloadavg()[0]
    return run


def summary(run: dict[str, Any]) -> dict[str, Any]:
    n = run["inputs"]
    kinds = run["kinds"]
    footprint = sum(kinds.get(k, {}).get("bytes", 0) for k in ("GOPEN", "GCHECK"))
    results = kinds.get("R", {}).get("bytes", 0)
    total = sum(v["bytes"] for v in kinds.values())
    return {
        "tuples_per_cpu_s": n / run["cpu_seconds"],
        "tuples_per_s": n / run["seconds"],
        "cpu_seconds": run["cpu_seconds"],
        "bytes_per_tuple": total / n,
        "footprint_bytes_per_tuple": footprint / n,
        "result_bytes_per_tuple": results / n,
        "gopens": kinds.get("GOPEN", {}).get("records", 0),
        "r_records": kinds.get("R", {}).get("records", 0),
        "kinds": kinds,
        "digest": run["digest"],
        "load_average": run["load_average"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=90_000)
    parser.add_argument("--tuples", type=int, default=900_000)
    parser.add_argument("--hours", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated, of " + ",".join(VARIANTS)
    )
    parser.add_argument("--lateness", help="close by the watermark with this allowed lateness (e.g. 0)")
    parser.add_argument(
        "--before-tree", type=Path, help="a second source tree, run interleaved with this one"
    )
    parser.add_argument(
        "--checkpointing",
        choices=("gopen-only", "default"),
        default="gopen-only",
        help="gopen-only (as `cec run --gopen-only`, the default here) or default (`cec run`'s own: "
        "G-checks with U = 100,000)",
    )
    parser.add_argument("--out", type=Path)
    # the hidden child mode: one run
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    trees = {"after": ROOT}
    if args.before_tree is not None:
        trees["before"] = args.before_tree.resolve()
    runs = [(tree, variant) for variant in variants for tree in trees]
    table: dict[str, dict[str, list[dict[str, Any]]]] = {t: {v: [] for v in variants} for t in trees}
    with tempfile.TemporaryDirectory(prefix="bench-windows-") as tmp:
        data = Path(tmp) / "in.csv"
        write_input(data, args.keys, args.tuples, args.hours)
        for r in range(args.repeats):
            shift = r % len(runs)
            for tree, variant in runs[shift:] + runs[:shift]:
                row = summary(
                    run_child(
                        trees[tree],
                        variant,
                        data,
                        Path(tmp) / f"{tree}-{variant}-{r}",
                        args.lateness,
                        args.checkpointing,
                    )
                )
                table[tree][variant].append(row)
                print(
                    f"[{r}] {tree:6} {variant:9} {row['tuples_per_cpu_s']:9,.0f} tuples/cpu-s "
                    f"{row['tuples_per_s']:9,.0f} tuples/s  {row['bytes_per_tuple']:6.2f} B/tuple "
                    f"(footprints {row['footprint_bytes_per_tuple']:5.2f})  {row['digest']}  "
                    f"load {row['load_average']:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
    doc: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items() if k not in ("out", "child")}}
    doc["runs"] = table
    # Ratios to tumbling in the same repeat and tree; after / before per repeat; equal results between trees.
    ratios: dict[str, Any] = {}
    for tree in trees:
        base = table[tree].get("tumbling")
        if not base:
            continue
        for variant in variants:
            ratios.setdefault(tree, {})[variant] = {
                what: [row[what] / b[what] for row, b in zip(table[tree][variant], base, strict=True)]
                for what in (
                    "tuples_per_cpu_s",
                    "tuples_per_s",
                    "bytes_per_tuple",
                    "footprint_bytes_per_tuple",
                )
            }
    doc["ratio_to_tumbling"] = ratios
    if "before" in trees:
        doc["after_over_before"] = {
            v: {
                "tuples_per_cpu_s": [
                    a["tuples_per_cpu_s"] / b["tuples_per_cpu_s"]
                    for a, b in zip(table["after"][v], table["before"][v], strict=True)
                ],
                "same_results": all(
                    a["digest"] == b["digest"]
                    for a, b in zip(table["after"][v], table["before"][v], strict=True)
                ),
                "same_bytes": all(
                    a["bytes_per_tuple"] == b["bytes_per_tuple"]
                    for a, b in zip(table["after"][v], table["before"][v], strict=True)
                ),
            }
            for v in variants
        }
    for tree in trees:
        for variant in variants:
            rows = table[tree][variant]
            print(
                f"{tree:6} {variant:9} median {statistics.median(r['tuples_per_cpu_s'] for r in rows):9,.0f} "
                f"tuples/cpu-s, {rows[0]['bytes_per_tuple']:.2f} B/tuple, "
                f"to tumbling (cpu) {[round(x, 2) for x in ratios.get(tree, {}).get(variant, {}).get('tuples_per_cpu_s', [])]}"
            )
    for variant, entry in doc.get("after_over_before", {}).items():
        print(
            f"after/before {variant:9} {[round(x, 2) for x in entry['tuples_per_cpu_s']]} "
            f"same results {entry['same_results']} same bytes {entry['same_bytes']}"
        )
    text = json.dumps(doc, indent=2, default=str)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
