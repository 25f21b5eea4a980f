"""Trimming over a long run: retained log records against input tuples, with and without trimming.

The paper's aggregate (avg per item over tumbling count windows) on the generator, SQLite store, a U
target, and a registered consumer that reads the results as they come and acknowledges them (as `cec
run`'s results writer does). Every trim records (input tuples, records retained); the run without
trimming records its whole log at the same points. Prints a table and writes a plot.

    .venv/bin/python benchmarks/bench_trim.py --tuples 1000000 --plot benchmarks/trim.png
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from cec.config import Checkpointing
from cec.records import Kind
from operators.job import JobSpec, run_job
from queuestore.sqlite import SqliteQueueStore


def job(root: Path, tuples: int, keys: int, trim_every: int | None) -> JobSpec:
    return JobSpec(
        operator={"type": "aggregate", "key_field": "item_id", "value_field": "item_price", "agg": "avg",
                  "window_count": 10},
        source={"type": "generator", "count": tuples, "keys": keys, "seed": 1, "partitions": 1},
        store={"type": "sqlite", "root": str(root)},
        output_topic="agg",
        checkpointing=Checkpointing(u_target=20_000, ci_ms=10.0, cp_ms=10.0),
        trim_every=trim_every,
    )  # fmt: skip


def follow_results(store: SqliteQueueStore, done: threading.Event, counts: list[int]) -> None:
    """The registered consumer: reads every record, counts the results, acknowledges as it goes."""
    store.acknowledge("agg", 0, "results", 0)
    offset = 0
    while True:
        with store.reader("agg", 0) as reader:
            records = reader.read_forward(offset, 8192)
        for stored in records:
            counts[0] += stored.meta.kind == Kind.R.value
            if stored.meta.kind == Kind.EOS.value:
                return
            offset = stored.offset + 1
        if records:
            store.acknowledge("agg", 0, "results", offset)
        elif done.is_set():
            return
        else:
            time.sleep(0.005)


def run(
    root: Path, tuples: int, keys: int, trim_every: int | None
) -> tuple[list[tuple[int, int]], int, float]:
    store = SqliteQueueStore(root)
    store.create_topic("agg", 1)
    done, counts = threading.Event(), [0]
    consumer = threading.Thread(target=follow_results, args=(store, done, counts))
    consumer.start()
    started = time.perf_counter()
    try:
        stats = run_job(job(root, tuples, keys, trim_every))
    finally:
        done.set()
        consumer.join()
    return stats.retained_samples, counts[0], time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tuples", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--trim-every", type=int, default=10_000)
    parser.add_argument("--plot", type=Path, default=None, help="write the plot here (PNG)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        samples, results, seconds = run(Path(tmp) / "trim", args.tuples, args.keys, args.trim_every)
        whole = SqliteQueueStore(Path(tmp) / "trim")
        with whole.reader("agg", 0) as reader:
            produced, kept = reader.end_offset(), reader.end_offset() - reader.start_offset()
    print(
        f"{args.tuples:,} tuples, {args.keys:,} keys, U=20,000, trim every {args.trim_every:,} records: "
        f"{seconds:.1f} s, {results:,} results read by the registered consumer"
    )
    print(f"log produced {produced:,} records, retained at the end {kept:,}")
    print(f"{'input tuples':>14} {'retained':>10}")
    step = max(1, len(samples) // 20)
    for inputs, retained in samples[::step]:
        print(f"{inputs:>14,} {retained:>10,}")
    if samples:
        print(f"max retained {max(r for _, r in samples):,} records over {len(samples)} trims")
    if args.plot and samples:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        xs = [i for i, _ in samples]
        ax.plot(xs, [r for _, r in samples], label="retained (trimmed)")
        ax.plot(
            xs,
            [i * produced / args.tuples for i in xs],
            "--",
            label="log produced (all kept without trimming)",
        )
        ax.set_xlabel("input tuples")
        ax.set_ylabel("log records")
        ax.set_title("retained output log over a long run")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=90)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
