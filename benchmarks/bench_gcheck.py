"""What one G-check costs.

1. Its encoding (the window state, then the record), with the C accelerator against the pure-Python
   definitions it stands in for, interleaved in one process; CPU time, median of the rounds.
2. With `--path`: the whole G-check as the operator produces it on the embedded store (policy, registry,
   state and record encoding, append, completion and index), one at a time (`gcheck_batch=1`, the code
   before batching) against batched (`gcheck_batch=256`), interleaved rounds in one process. Each round
   runs the paper's aggregate (count windows of 10) G-open only over `--inputs` tuples of `--keys` keys
   (200,000 over 100,000: ~86,000 open windows, the Done-when demo's scale), then G-checks every open
   window in one look with an unlimited budget. Per G-check: the operator time the schedule charges
   (wall, what the duty and the RTO controller see) and the process's CPU time (both threads).

    nice -n 5 .venv/bin/python benchmarks/bench_gcheck.py [--states 20000] [--rounds 7]
    nice -n 5 .venv/bin/python benchmarks/bench_gcheck.py --path [--inputs 200000] [--keys 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cec.native import native
from cec.policy import TargetPolicy
from cec.records import Kind, OutputRecord, RecordCodec
from cec.schedule import CheckpointSchedule
from operators.aggregate import AggState, KeyedAggregate
from operators.runtime import OperatorRuntime
from operators.sources import PurchaseGenerator
from queuestore.output import OutputQueue
from queuestore.sqlite import SqliteQueueStore


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--states", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--path", action="store_true", help="the whole G-check path, one at a time vs batched")
    p.add_argument("--inputs", type=int, default=200_000)
    p.add_argument("--keys", type=int, default=100_000)
    args = p.parse_args(argv)
    if args.path:
        return _path(args)
    if native is None:
        print("the C accelerator is not built (or CEC_NO_NATIVE is set): nothing to compare", file=sys.stderr)
        return 1
    op = KeyedAggregate(key_field="item_id", value_field="item_price", window_count=10)
    codec = RecordCodec()
    rng = random.Random(1)
    states = [
        AggState(
            rng.randrange(2, 9), rng.uniform(1, 500), 1.0, 600.0, rng.randrange(10**6), rng.randrange(10**6)
        )
        for _ in range(args.states)
    ]
    state_codec = op._state_codec

    def with_c() -> None:
        for i, s in enumerate(states):
            state = op.encode_footprint(s)
            codec.encode(OutputRecord(Kind.GCHECK, 250_000 + i, (250_000 + i,), 92_000, str(i), 0, state))

    def in_python() -> None:
        for i, s in enumerate(states):
            state = state_codec.encode(
                {"count": s.count, "total": s.total, "lo": s.lo, "hi": s.hi, "start": s.start, "last": s.last}
            )
            codec.encode_python(
                OutputRecord(Kind.GCHECK, 250_000 + i, (250_000 + i,), 92_000, str(i), 0, state)
            )

    times: dict[str, list[float]] = {"c": [], "python": []}
    for _ in range(args.rounds):
        for name, run in (("c", with_c), ("python", in_python)):
            started = time.process_time()
            run()
            times[name].append((time.process_time() - started) / len(states))
    c, py = statistics.median(times["c"]), statistics.median(times["python"])
    print(
        f"G-check encode (state + record), CPU time per G-check, median of {args.rounds} interleaved rounds: "
        f"C {c * 1e6:.2f} us, Python {py * 1e6:.2f} us, C/Python {c / py:.2f} (load average at the end "
        f"{os.getloadavg()[0]:.1f})"
    )
    return 0


def _gcheck_all(batch: int, inputs: int, keys: int) -> tuple[float, float, float, int]:
    """(charged seconds, process CPU seconds, operator-thread CPU seconds) per G-check, and the G-checks,
    of G-checking every open window."""
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteQueueStore(Path(tmp))
        store.create_topic("agg", 1)
        output = OutputQueue(store, "agg", 0)
        try:
            runtime = OperatorRuntime(
                KeyedAggregate(key_field="item_id", value_field="item_price", window_count=10),
                PurchaseGenerator(inputs, keys, seed=3),
                output,
                policy=TargetPolicy(u_target=10**12),  # wants nothing while the windows open
                schedule=CheckpointSchedule(100.0, 100.0),  # CI = CP: no limit
                gcheck_batch=batch,
            )
            runtime.run(max_inputs=inputs)
            output.flush()
            runtime.policy = TargetPolicy(u_target=1)  # now every open window is wanted
            cpu, own = time.process_time(), time.thread_time()
            runtime._background()
            own = time.thread_time() - own
            output.flush()  # the I/O thread's share of the CPU time
            cpu = time.process_time() - cpu
            g = runtime.stats.gchecks
            return runtime.schedule.spent_seconds / g, cpu / g, own / g, g
        finally:
            output.close()
            store.close()


def _path(args: argparse.Namespace) -> int:
    times: dict[int, list[tuple[float, float, float]]] = {1: [], 256: []}
    gchecks = 0
    for _ in range(args.rounds):
        for batch in (1, 256):
            charged, cpu, own, gchecks = _gcheck_all(batch, args.inputs, args.keys)
            times[batch].append((charged, cpu, own))
    one = [statistics.median(t[i] for t in times[1]) for i in (0, 1, 2)]
    many = [statistics.median(t[i] for t in times[256]) for i in (0, 1, 2)]
    print(
        f"whole G-check path on the embedded store, {gchecks:,} G-checks per round (all open windows), "
        f"median of {args.rounds} interleaved rounds:\n"
        f"  operator time charged per G-check: one at a time {one[0] * 1e6:.1f} us, batched "
        f"{many[0] * 1e6:.1f} us, batched/one {many[0] / one[0]:.2f}\n"
        f"  CPU time per G-check (both threads): one at a time {one[1] * 1e6:.1f} us, batched "
        f"{many[1] * 1e6:.1f} us, batched/one {many[1] / one[1]:.2f}\n"
        f"  CPU time per G-check, operator thread only (store I/O thread excluded): one at a time "
        f"{one[2] * 1e6:.1f} us, batched {many[2] * 1e6:.1f} us, batched/one {many[2] / one[2]:.2f}\n"
        f"  rounds (charged, cpu, operator-thread cpu; us): one {[tuple(round(x * 1e6, 1) for x in t) for t in times[1]]}, "
        f"batched {[tuple(round(x * 1e6, 1) for x in t) for t in times[256]]}\n"
        f"  load average at the end {os.getloadavg()[0]:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
