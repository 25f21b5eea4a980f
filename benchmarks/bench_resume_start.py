"""How long an attached query's restart takes to start when it resumes Spark's checkpoint (issue 26).

One driver (this process, the tests' local session) runs `cec_aggregate` over test_attach's purchases
(4,000 tuples, 3 input and output partitions, on the broker of tests/brokers.py) to the end, then restarts
the same call `--restarts` times: each start checks that the checkpoint agrees with the output logs
(`operators.spark.resume`) and resumes it (nothing left to read). Reported per restart: the wall time of
`cec_aggregate()` (the start: agreement check, output logs opened, query started), of the check alone
(`lastProgress["cec"]["recovery"]["ec_build_s"]`), and to the query's end. `--profile` writes a cProfile
of the last start beside the output.

    CEC_TEST_BROKER=apache-kafka nice -n 5 .venv/bin/python benchmarks/bench_resume_start.py --restarts 3

Writes benchmarks/out/resume-start.json.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="cProfile the last start")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/out/resume-start.json"))
    parser.add_argument("--work", default=None, help="work directory (default: a fresh one under /tmp)")
    opts = parser.parse_args(argv)

    from operators.spark.attach import cec_aggregate
    from operators.spark.session import local_session
    from tests.brokers import start_apache_kafka
    from tests.helpers.attached import run_to_end
    from tests.operators.spark.test_attach import _args, write_purchases

    work = Path(opts.work or f"/tmp/cec-resume-start-{uuid.uuid4().hex[:8]}")
    broker = start_apache_kafka()
    restarts: list[dict[str, Any]] = []
    try:
        purchases = write_purchases(broker.bootstrap, work / "input", partitions=3, seed=13, invalid_every=37)
        spark = local_session("local[2,3]", app_name="cec-resume-start")
        args = _args(purchases, work / "run", f"avg-resume-{uuid.uuid4().hex[:8]}", partitions=3)
        began = time.perf_counter()
        run_to_end(spark, args)
        print(f"first run to its end in {time.perf_counter() - began:.1f} s", file=sys.stderr, flush=True)
        began = time.monotonic()
        for i in range(opts.restarts):
            profile = cProfile.Profile() if opts.profile and i == opts.restarts - 1 else None
            t0 = time.perf_counter()
            if profile is not None:
                profile.enable()
            query = cec_aggregate(spark, available_now=True, **args)
            if profile is not None:
                profile.disable()
                profile.dump_stats(str(Path(opts.out).with_suffix(".prof")))
            started = time.perf_counter() - t0
            query.awaitTermination()
            recovery = query.cec_progress["recovery"]
            row = {
                "start_s": round(started, 3),
                "check_s": round(recovery["ec_build_s"], 3),
                "to_end_s": round(time.perf_counter() - t0, 3),
                "path": recovery["path"],
            }
            restarts.append(row)
            rate = (i + 1) / (time.monotonic() - began) * 60
            print(f"[{i + 1}/{opts.restarts}, {rate:.1f} restarts/min] {row}", file=sys.stderr, flush=True)
        spark.stop()
    finally:
        broker.stop()
    summary = {k: statistics.median(r[k] for r in restarts) for k in ("start_s", "check_s", "to_end_s")}
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(json.dumps({"restarts": restarts, "median": summary}, indent=1))
    print(f"median {summary}; wrote {opts.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
