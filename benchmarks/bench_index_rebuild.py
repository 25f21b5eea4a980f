"""Rebuilding a stream index from its log: checked records (what `StreamIndex.reconcile` does now) against
the metadata taken unchecked (what it did before), in one run on one log.

A damaged or lost index is rebuilt from the whole log; every restart reconciles the records past the
index's end the same way. Since damage must never become an index entry, `reconcile` checks each record's
checksum (`cec.verified.LogVerifier`, in C when built) before it indexes it. This measures what that costs.

The log is a real aggregate job's (generator source, count windows, G-open only: a result and G-opens per
window), written once with `run_job` into a temporary SQLite store. Each variant builds a fresh index from
offset 0; they alternate, and the median of `--repeats` runs is reported with the ratio.

    .venv/bin/python benchmarks/bench_index_rebuild.py [--count 400000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cec.config import Checkpointing  # noqa: E402
from operators.job import JobSpec, run_job  # noqa: E402
from queuestore.index import StreamIndex  # noqa: E402
from queuestore.sqlite import SqliteQueueStore  # noqa: E402


def _unchecked(store: SqliteQueueStore, path: Path) -> int:
    """The former reconcile: every record's metadata indexed as stored."""
    with StreamIndex(path, "agg/0") as index, store.reader("agg", 0) as reader:
        end = reader.end_offset()
        return index._index_records(((r.offset, r.meta) for r in reader.scan_forward(0)), end, None)


def _checked(store: SqliteQueueStore, path: Path) -> int:
    with StreamIndex(path, "agg/0") as index, store.reader("agg", 0) as reader:
        return index.reconcile(reader)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=400_000, help="input tuples of the job (default 400000)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cec-bench-index-"))
    try:
        spec = JobSpec(
            operator={
                "type": "aggregate",
                "key_field": "item_id",
                "value_field": "item_price",
                "agg": "sum",
                "window_count": 10,
            },
            source={"type": "generator", "count": args.count, "keys": 20_000, "seed": 1},
            store={"type": "sqlite", "root": str(root / "store")},
            output_topic="agg",
            checkpointing=Checkpointing(),
        )
        run_job(spec)
        store = SqliteQueueStore(root / "store")
        with store.reader("agg", 0) as reader:
            records = reader.end_offset()
        times: dict[str, list[float]] = {"unchecked (before)": [], "checked (now)": []}
        for i in range(args.repeats):
            for name, build in (("unchecked (before)", _unchecked), ("checked (now)", _checked)):
                path = root / f"index-{name[:3]}-{i}"
                started = time.perf_counter()
                assert build(store, path) == records
                times[name].append(time.perf_counter() - started)
                shutil.rmtree(path)
        print(f"log: {records:,} records ({args.count:,} input tuples), {args.repeats} alternating runs each")
        base = statistics.median(times["unchecked (before)"])
        for name, seconds in times.items():
            median = statistics.median(seconds)
            print(
                f"  {name:20s} {median:7.3f} s median ({records / median:,.0f} records/s), "
                f"{median / base:.2f}x the unchecked rebuild"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
