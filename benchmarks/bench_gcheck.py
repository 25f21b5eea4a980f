"""What one G-check's encoding costs (the window state, then the record), with the C accelerator against
the pure-Python definitions it stands in for, interleaved in one process; CPU time, median of the rounds.

    nice -n 5 .venv/bin/python benchmarks/bench_gcheck.py [--states 20000] [--rounds 7]

The states are the paper's aggregate's (count windows of 10, several tuples in: the full state form); the
records are G-checks as the runtime writes them at the paper's scale (N = 92,000 open windows).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cec.native import native
from cec.records import Kind, OutputRecord, RecordCodec
from operators.aggregate import AggState, KeyedAggregate


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--states", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
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
        f"{__import__('os').getloadavg()[0]:.1f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
