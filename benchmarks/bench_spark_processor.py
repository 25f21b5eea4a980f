"""The attached query's processor alone, without a JVM: CPU of its calls for one state partition.

Drives `CecAggregateProcessor.handleInputRows` as Spark's Python worker does (packed input frames, one call per
micro-batch, the partition's state as one value: a stand-in for Spark's state handle that keeps it), for
`--keys` keys over `--batches` micro-batches of `--keys` tuples (every key once per batch; the paper's
aggregate, count windows of 10, so no window closes before the tenth batch: the state of `--keys` open
windows is loaded and stored by every call). Each repeat runs every tree in a process of its own (import
isolation), in an order rotated per repeat; a run's time covers the calls and everything the calls leave
to do (the interpreter's cyclic collector included: the next call would pay it). Times are the process's CPU
seconds (single-threaded, so less disturbed by a loaded machine than wall time).

    nice -n 5 .venv/bin/python benchmarks/bench_spark_processor.py [--keys 100000] [--batches 4] [--repeats 3] \
        [--before-tree /tmp/before] [--fresh]

`--fresh`: the shape of the end-to-end figure (`bench_spark.py --keys 100000 --tuples 100000`, where nearly every
tuple is its key's first): `--keys` tuples in all, each micro-batch's of keys not met before, so every tuple opens
a window and emits its G-open row, and each call's output frame is converted to Arrow as Spark's Python worker
does (the emission path, which the default shape, every key in every batch, hardly runs after the first batch).

With `--before-tree`, the ratio after / before is of throughput (before's seconds / after's), per repeat and
as a median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def _run_tree(tree: Path, keys: int, batches: int, fresh: bool = False) -> float:
    """One tree's run in this process (`tree` first on sys.path); the calls' seconds. `fresh`: each
    micro-batch has keys / batches tuples of keys not met before (every tuple opens a window and emits its
    G-open), and the output frames are converted to Arrow as Spark's Python worker does."""
    sys.path.insert(0, str(tree))
    from pyspark.sql.types import DoubleType

    import operators
    from operators.spark.packing import Packer, PackSpec, packed_schema
    from operators.spark.processor import AggregateSpec, CecAggregateProcessor, partition_groups

    assert Path(operators.__file__).resolve().is_relative_to(tree.resolve()), operators.__file__

    class _State:
        def __init__(self) -> None:
            self.value: object = None

        def exists(self) -> bool:
            return self.value is not None

        def get(self) -> object:
            return self.value

        def update(self, value: object) -> None:
            self.value = value

    class _Handle:
        def __init__(self) -> None:
            self.states: dict[str, _State] = {}

        def getValueState(self, name: str, schema: object) -> _State:
            return self.states.setdefault(name, _State())

    class _Timers:
        def getCurrentProcessingTimeInMs(self) -> int:
            return 0

    schema = packed_schema(DoubleType(), None, errors=False, generations=1)
    packer = Packer(PackSpec((1,), "k", "v"), schema)
    names = [f"k{i}" for i in range(keys)]
    inputs = []
    per_batch = keys // batches
    for b in range(batches):
        frames = []
        batch_names = names[b * per_batch : (b + 1) * per_batch] if fresh else names
        base = b * per_batch // 2 if fresh else b * keys // 2
        for j in (0, 1):  # two input partitions, each key in one
            mine = [(base + i // 2, k, float(i + b)) for i, k in enumerate(batch_names) if i % 2 == j]
            for start in range(0, len(mine), 2000):  # source chunks
                chunk = mine[start : start + 2000]
                frames.append(
                    packer.pack(j, [t[0] for t in chunk], [t[1] for t in chunk], [t[2] for t in chunk])
                )
        inputs.append([f.to_pandas() for f in frames])
    groups = partition_groups(1)
    processor = CecAggregateProcessor(
        AggregateSpec("item", "price", "avg", 10, None, None), [[(0, 0)]], 0, None, groups
    )
    processor.init(_Handle())  # type: ignore[arg-type]
    from pyspark.sql.pandas.types import to_arrow_schema

    from operators.spark.processor import EMIT_SCHEMA

    emit = to_arrow_schema(EMIT_SCHEMA)
    started = time.process_time()  # CPU, not wall: the machine is shared
    rows = 0
    for frames in inputs:
        for out in processor.handleInputRows((groups[0],), iter(frames), _Timers()):  # type: ignore[arg-type]
            rows += len(out)
            if fresh:  # what the worker's serializer does with the frame (pa.Array.from_pandas per column)
                import pyarrow as pa

                pa.RecordBatch.from_arrays(
                    [pa.Array.from_pandas(out[f.name], type=f.type) for f in emit], schema=emit
                )
    del processor, out
    import gc

    gc.collect()  # what the calls left to the collector is theirs
    seconds = time.process_time() - started
    if rows < (per_batch if fresh else keys):
        raise SystemExit(f"{tree}: {rows} rows for {keys} keys: the processor did not run")
    return seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--before-tree", type=Path, default=None)
    p.add_argument(
        "--fresh",
        action="store_true",
        help="the end-to-end figure's shape: each micro-batch has keys / batches tuples of new keys (a G-open "
        "per tuple), the output frames converted to Arrow",
    )
    p.add_argument("--one-tree", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one_tree is not None:
        print(json.dumps({"seconds": _run_tree(args.one_tree, args.keys, args.batches, args.fresh)}))
        return 0
    trees = {"after": HERE}
    if args.before_tree is not None:
        trees["before"] = args.before_tree
    seconds: dict[str, list[float]] = {name: [] for name in trees}
    tuples = args.keys if args.fresh else args.keys * args.batches
    shape = "of new keys (a G-open each), output to Arrow" if args.fresh else "(every key once per batch)"
    print(f"processor alone: {args.keys:,} keys, {args.batches} micro-batches of {tuples // args.batches:,} "
          f"tuples {shape}, "
          f"{args.repeats} repeats; trees: " + ", ".join(f"{n} {t}" for n, t in trees.items()))  # fmt: skip
    names = list(trees)
    for r in range(args.repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            cmd = [sys.executable, __file__, "--one-tree", str(trees[name]), "--keys", str(args.keys),
                   "--batches", str(args.batches), *(["--fresh"] if args.fresh else [])]  # fmt: skip
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            s = json.loads(out.strip().splitlines()[-1])["seconds"]
            seconds[name].append(s)
            print(
                f"  repeat {r + 1}/{args.repeats}: {name:6s} {s:6.2f} s  {tuples / s:10,.0f} tuples/s",
                flush=True,
            )
    for name in names:
        print(
            f"{name}: median {statistics.median(seconds[name]):.2f} s ({tuples / statistics.median(seconds[name]):,.0f} tuples/s)"
        )
    if "before" in seconds:
        ratios = [b / a for a, b in zip(seconds["after"], seconds["before"], strict=True)]
        print(f"after / before throughput: median {statistics.median(ratios):.2f} (per repeat "
              + ", ".join(f"{x:.2f}" for x in ratios) + ")")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
