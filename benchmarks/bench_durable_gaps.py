"""How long the output log's durable end stands still while an operator runs at a live input rate: the
latency a downstream reader (or a standby following the log) sees on top of the operator's own.

The workload of bench_standby.py (the paper's purchases from the generator, 100,000 keys over 2 input
partitions, sum over count windows of 10, U = 100,000 within CI/CP 5/100 ms, EC cache on), the input
arriving at `--rate` tuples per second, on the embedded SQLite store or (`--store kafka`) on the broker
tests/brokers.py starts, where the durable end is the partition's last stable offset (what a read_committed
reader, a standby on another host, can read). One `python -m operators.worker` per run, from
each tree named by `--variant NAME=PATH` (interleaved per repeat: NAME=. is this checkout); this process
reads the log's end every 20 ms and reports the gaps: the longest time it did not move, how many gaps
passed 0.3 s, and the 99th percentile of the age of the end (time since it last moved) over the samples.

    flock /tmp/cec-bench.lock nice -n 5 .venv/bin/python benchmarks/bench_durable_gaps.py \\
        --variant before=/tmp/before --variant after=. --repeats 2

Writes benchmarks/out/durable-gaps.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

import bench_standby  # noqa: E402  (the workload's JobSpec)
from bytecode import compile_tree  # noqa: E402

from queuestore.sqlite import SqliteQueueStore  # noqa: E402

SAMPLE_S = 0.02


class _SqliteEnd:
    def __init__(self, root: Path) -> None:
        self.store = SqliteQueueStore(root)
        self.reader: Any = None

    def ready(self) -> bool:
        return self.store.topic_exists(bench_standby.TOPIC)

    def __call__(self) -> int:
        if self.reader is None:
            self.reader = self.store.reader(bench_standby.TOPIC, 0)
        return int(self.reader.end_offset())

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
        self.store.close()


class _KafkaEnd:
    """The output partition's last stable offset under read_committed, one ListOffsets request each."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka.admin import AdminClient

        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.topic = topic

    def ready(self) -> bool:
        return self.topic in self.admin.list_topics(timeout=10).topics

    def __call__(self) -> int:
        from confluent_kafka.admin import OffsetSpec

        from queuestore.kafka.admin import list_offsets

        return list_offsets(self.admin, self.topic, [0], OffsetSpec.latest(), 10.0)[0]

    def close(self) -> None:
        pass


def _run(tree: Path, args: argparse.Namespace, work: Path, bootstrap: str | None) -> dict[str, Any]:
    root = work / "store"
    spec = bench_standby._spec(root, args, epoch=time.time())
    end: _SqliteEnd | _KafkaEnd = _SqliteEnd(root)
    if bootstrap is not None:
        topic = f"gaps-{work.name}"
        store = {"type": "kafka", "bootstrap_servers": bootstrap, "state_dir": str(root)}
        spec = dataclasses.replace(spec, store=store, output_topic=topic)
        end = _KafkaEnd(bootstrap, topic)
    spec_path = work / "spec.json"
    spec_path.write_text(spec.to_json())
    env = dict(os.environ)
    for name in ("CEC_TEST_KILL", "CEC_FAULTS", "CEC_BENCH_PROFILE", "CEC_BENCH_PROBE"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")])
    started = time.monotonic()
    worker = subprocess.Popen(
        [sys.executable, "-m", "operators.worker", str(spec_path)],
        env=env,
        cwd="/tmp",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    while not end.ready() and worker.poll() is None:
        time.sleep(SAMPLE_S)
    samples: list[tuple[float, int]] = []
    try:
        while worker.poll() is None:
            samples.append((time.monotonic(), end()))
            time.sleep(SAMPLE_S)
    finally:
        end.close()
    _, err = worker.communicate()
    if worker.returncode != 0:
        raise RuntimeError(f"the worker failed ({worker.returncode}): {err.decode()[-2000:]}")
    gaps: list[float] = []
    long_gaps: list[tuple[float, float]] = []  # (seconds after the worker's spawn, length) of those > 0.3 s
    ages: list[float] = []
    moved_at, last = samples[0] if samples else (started, 0)
    for t, e in samples:
        if e != last:
            gaps.append(t - moved_at)
            if gaps[-1] > 0.3:
                long_gaps.append((round(moved_at - started, 2), round(gaps[-1], 2)))
            moved_at, last = t, e
        ages.append(t - moved_at)
    if samples:  # the stretch after the last move (the run's end: its final flush and close) is a gap too
        gaps.append(samples[-1][0] - moved_at)
        if gaps[-1] > 0.3:
            long_gaps.append((round(moved_at - started, 2), round(gaps[-1], 2)))
    ages.sort()
    return {
        "seconds": time.monotonic() - started,
        "records": last,
        "long_gaps": long_gaps,
        "samples": len(samples),
        "longest_gap_s": max(gaps, default=0.0),
        "gaps_over_0_3_s": sum(g > 0.3 for g in gaps),
        "age_p99_s": ages[int(0.99 * (len(ages) - 1))] if ages else 0.0,
        "age_median_s": statistics.median(ages) if ages else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", action="append", required=True, help="NAME=PATH (a checkout or snapshot)")
    p.add_argument(
        "--rate", type=float, default=50_000.0, help="input tuples per second (default %(default)s)"
    )
    p.add_argument("--tuples", type=int, default=1_000_000)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--u", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--store", choices=("sqlite", "kafka"), default="sqlite")
    p.add_argument("--out", type=Path, default=HERE / "out" / "durable-gaps.json")
    args = p.parse_args(argv)
    variants = [(v.partition("=")[0], Path(v.partition("=")[2]).resolve()) for v in args.variant]
    for _, tree in variants:
        compile_tree(tree)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    broker = None
    if args.store == "kafka":
        from tests.brokers import start_broker

        broker = start_broker()
        print(f"broker: {broker.describe()}", flush=True)
    load_before = os.getloadavg()
    try:
        _runs(args, variants, runs, None if broker is None else broker.bootstrap)
    finally:
        if broker is not None:
            broker.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "variants": {name: str(tree) for name, tree in variants},
                "store": args.store if broker is None else broker.describe(),
                "rate": args.rate,
                "tuples": args.tuples,
                "keys": args.keys,
                "loadavg_before": load_before,
                "loadavg_after": os.getloadavg(),
                "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "runs": runs,
            },
            indent=1,
        )
    )
    return 0


def _runs(
    args: argparse.Namespace,
    variants: list[tuple[str, Path]],
    runs: dict[str, list[dict[str, Any]]],
    bootstrap: str | None,
) -> None:
    total = args.repeats * len(variants)
    done, began = 0, time.monotonic()
    for rep in range(args.repeats):
        order = variants if rep % 2 == 0 else variants[::-1]
        for name, tree in order:
            with tempfile.TemporaryDirectory(prefix="cec-durable-gaps-") as tmp:
                row = _run(tree, args, Path(tmp), bootstrap)
            runs[name].append(row)
            done += 1
            rate = done / (time.monotonic() - began)
            print(
                f"[{rep}] {name:8} longest gap {row['longest_gap_s']:.2f} s, gaps > 0.3 s: "
                f"{row['gaps_over_0_3_s']} {row['long_gaps']}, age p99 {row['age_p99_s']:.2f} s, median "
                f"{row['age_median_s']:.3f} s ({row['records']:,} records in {row['seconds']:.1f} s)  "
                f"[{done}/{total} runs, {rate * 60:.1f} runs/min, load {os.getloadavg()[0]:.1f}]",
                flush=True,
            )


if __name__ == "__main__":
    sys.exit(main())
