"""What the attached query's Spark state holds per open window, and what it writes per input tuple.

The processor of `cec_aggregate` (`CecAggregateProcessor`) is driven directly, without a JVM, over one state
partition's share of bench_windows' input (keys uniform, times rising evenly) in micro-batches, as
tests/operators/spark/test_windows_processor.py drives it. After each micro-batch the partition's saved
state (`PartitionState.dump`, the one ValueState Spark writes in full) is measured whole, zlib-compressed
(level 1: a stand-in for the state store's lz4), and by part: key strings, window states, the keys' other
facts, the engine's window-end heap.

    PYTHONHASHSEED=0 .venv/bin/python benchmarks/bench_attached_state.py --kind session
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_windows import input_rows

from operators.base import InputTuple
from operators.spark.packing import PackSpec
from operators.spark.partitioning import partition_groups
from operators.spark.processor import AggregateSpec, CecAggregateProcessor
from operators.spark.state_partition import PartitionState
from operators.spark.topic_reader import TopicOptions, TupleBatches

MINUTE = 60_000


class _Value:
    def __init__(self) -> None:
        self.value: tuple[Any, ...] | None = None

    def exists(self) -> bool:
        return self.value is not None

    def get(self) -> tuple[Any, ...] | None:
        return self.value

    def update(self, value: tuple[Any, ...]) -> None:
        self.value = value


class _Handle:
    def __init__(self) -> None:
        self.states: dict[str, _Value] = {}

    def getValueState(self, name: str, schema: Any) -> _Value:
        return self.states.setdefault(name, _Value())


class _Timers:
    def getCurrentProcessingTimeInMs(self) -> int:
        return 0


def _size(x: Any) -> int:
    return len(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("session", "hopping"), default="session")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--tuples", type=int, default=100_000)
    parser.add_argument("--hours", type=float, default=3.0)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--state-partitions", type=int, default=3)
    args = parser.parse_args(argv)
    options = TopicOptions(topic="t", bootstrap="unused:9092", fmt="json", key="key", value=None, time="ts",
                           pack=PackSpec((1,), "key", None, "ts"), key_fields=("key",),
                           value_fields=("value",), key_array=True)  # fmt: skip
    windows: dict[str, Any] = (
        {"session_gap": 30 * MINUTE} if args.kind == "session" else {"slide": 15 * MINUTE}
    )
    spec = AggregateSpec("key", "value", "avg", None, None if args.kind == "session" else 60 * MINUTE, "ts",
                         json_values=True, allowed_lateness=10 * MINUTE, key_fields=("key",),
                         aggs=(("avg", "value"),), **windows)  # fmt: skip
    # One state partition's share (by the key's hash), over 3 input partitions (by the key).
    share = [
        r for r in input_rows(args.keys, args.tuples, args.hours) if hash(r[0]) % args.state_partitions == 0
    ]
    offsets = [0, 0, 0]
    tuples = []
    for key, value, ts in share:
        j = int(key[1:]) % 3
        tuples.append(InputTuple(j, offsets[j], {"key": key, "value": value, "ts": ts}))
        offsets[j] += 1
    groups = partition_groups(1)
    processor = CecAggregateProcessor(spec, [[(0, 0, 0)]], 0, None, groups)
    handle = _Handle()
    processor.init(handle)  # type: ignore[arg-type]
    batches = TupleBatches(options)
    per = len(tuples) // args.batches + 1
    written = compressed = 0
    for b in range(args.batches):
        chunk = tuples[b * per : (b + 1) * per]
        frames = [batches.of(j, [t for t in chunk if t.partition == j]).to_pandas() for j in range(3)]
        list(processor.handleInputRows((groups[0],), iter(frames), _Timers()))  # type: ignore[arg-type]
        saved = handle.states["cec_partition"].value
        assert saved is not None
        raw = bytes(saved[0])
        written += len(raw)
        compressed += len(zlib.compress(raw, 1))
        state = PartitionState.load(saved)
        facts = list(state.keys.values())
        ends = state.engine[3]
        n = max(1, len(facts))
        print(f"micro-batch {b}: state {len(raw):,} B ({len(zlib.compress(raw, 1)):,} compressed), "
              f"{len(facts):,} keys; per key: key {_size(list(state.keys)) / n:.0f} B, window state "
              f"{_size([f[2] for f in facts]) / n:.0f} B, other facts "
              f"{_size([f[:2] + f[3:] for f in facts]) / n:.0f} B; window-end heap {len(ends):,} entries, "
              f"{_size(ends) / max(1, len(ends)):.0f} B each")  # fmt: skip
    last = PartitionState.load(handle.states["cec_partition"].value)
    clock = time.process_time()
    for _ in range(20):
        last.dump()
    dump_ms = (time.process_time() - clock) / 20 * 1000
    print(f"{args.kind}: {len(tuples):,} tuples, {args.batches} micro-batches: state written "
          f"{written / len(tuples):.1f} B per input tuple ({compressed / len(tuples):.1f} compressed); "
          f"one dump of the last state {dump_ms:.1f} ms CPU")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
