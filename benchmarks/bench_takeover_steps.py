"""The steps of a restart and of a standby's takeover, in one process, on one log: where a failover's own
time goes once the machine's scheduling is taken out (issue 26; bench_standby.py measures the same end to
end, between processes, where the replica's lag decides).

The log: the paper's purchases (`--keys` items, `--tuples` tuples over 2 input partitions, count windows of
10, cec run's default checkpointing), written by `run_job` on the embedded store, then cut where
`--crash-at` (a share of the finished log's records) puts a crash. Per repeat:
- cold: `RecoveryManager.recover` (EC read back from the log and loaded) and `OperatorInstance.restore`
  (the windows installed), as a restart without a standby pays them;
- takeover: a `LogFollower` follows the cut log and a replica (`operators.replica`) applies the input to its
  crash point, then `recover(followed=..., replica=...)` and `restore`, as a standby's takeover pays them
  after its replica caught up;
and once: CPU seconds per input tuple of the primary (the whole run), the follower and the replica.

Run from the root of the tree to measure (its modules first on sys.path), e.g. before/after:

    (cd /tmp/before && python /work/main/benchmarks/bench_takeover_steps.py --out /tmp/before.json)
    python benchmarks/bench_takeover_steps.py --out benchmarks/out/takeover-steps.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.getcwd())

from operators.engine import OperatorInstance, RunStats
from operators.job import JobSpec, run_job
from operators.job_builders import job_source_spec
from operators.job_runner import _replica
from queuestore.sqlite import SqliteQueueStore
from recovery.manager import RecoveryManager
from recovery.standby import LogFollower

__all__ = ["main"]


def _spec(root: Path, args: argparse.Namespace) -> JobSpec:
    return JobSpec.from_dict(
        {
            "operator": {"type": "aggregate", "key_field": "item_id", "value_field": "item_price", "agg": "sum",
                         "window_count": 10},
            "source": {"type": "generator", "count": args.tuples, "keys": args.keys, "seed": 3, "partitions": 2},
            "store": {"type": "sqlite", "root": str(root)},
            "output_topic": "agg",
        }
    )  # fmt: skip


def _cut(src: Path, dst: Path, crash_at: int) -> None:
    """A copy of the log of `src` that ends at `crash_at` records (a crash there)."""
    shutil.copytree(src / "agg", dst / "agg")
    conn = sqlite3.connect(dst / "agg" / "0.sqlite")
    conn.execute("DELETE FROM log WHERE offset >= ?", (crash_at,))
    conn.commit()
    conn.close()


def _restart(spec: JobSpec, root: Path, *, standby: bool) -> dict[str, Any]:
    operator = spec.operator.build()
    store = SqliteQueueStore(root)
    row: dict[str, Any] = {}
    try:
        with store.reader("agg", 0) as reader:
            follower = replica = None
            if standby:
                follower = LogFollower()
                started = time.process_time()
                while follower.catch_up(reader):
                    pass
                row["follower_cpu_s"] = time.process_time() - started
                replica = _replica(spec, store, job_source_spec(spec))
                started = time.process_time()
                while replica.advance(follower, 1 << 20):
                    pass
                row["replica_cpu_s"], row["replica_applied"] = time.process_time() - started, replica.applied
            started = time.perf_counter()
            recovery = RecoveryManager(reader, operator.decode_state, codec=None).recover(
                2, followed=follower, replica=replica
            )
            recovered = time.perf_counter()
            instance = OperatorInstance(operator, None, 2, stats=RunStats())  # type: ignore[arg-type]
            restore_started = time.perf_counter()
            instance.restore(recovery)
            row.update(
                recover_s=recovered - started,
                restore_s=time.perf_counter() - restore_started,
                windows=recovery.report.ec_windows,
                replica=recovery.report.replica,
            )
            row["total_s"] = row["recover_s"] + row["restore_s"]
            if replica is not None:
                replica.close()
    finally:
        store.close()
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--tuples", type=int, default=1_000_000)
    p.add_argument(
        "--crash-at", type=float, default=0.8, help="the crash, as a share of the finished log's records"
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "out" / "takeover-steps.json"
    )
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="takeover-steps-"))
    try:
        full = work / "full"
        spec = _spec(full, args)
        started = time.process_time()
        run_job(spec)
        primary_cpu = time.process_time() - started
        with SqliteQueueStore(full).reader("agg", 0) as reader:
            crash_at = int(reader.end_offset() * args.crash_at)  # before its EOS: the run had not finished
        print(
            f"primary: {args.tuples / primary_cpu:,.0f} tuples per CPU second; crash at record {crash_at:,}"
        )
        runs: dict[str, list[dict[str, Any]]] = {"cold": [], "takeover": []}
        for rep in range(args.repeats):
            for mode in ("cold", "takeover"):
                root = work / f"{mode}-{rep}"
                _cut(full, root, crash_at)
                row = _restart(_spec(root, args), root, standby=mode == "takeover")
                runs[mode].append(row)
                extra = ""
                if mode == "takeover":
                    extra = (f", replica {row['replica']}; follower {crash_at / row['follower_cpu_s']:,.0f} "
                             f"records and replica {row['replica_applied'] / row['replica_cpu_s']:,.0f} tuples per "
                             "CPU second")  # fmt: skip
                print(f"[{rep}] {mode:8} recover {row['recover_s']:.3f} s, restore {row['restore_s']:.3f} s, "
                      f"{row['windows']:,} windows{extra}", flush=True)  # fmt: skip
                shutil.rmtree(root)
        summary = {
            mode: {k: statistics.median(r[k] for r in rows) for k in ("recover_s", "restore_s", "total_s")}
            for mode, rows in runs.items()
        }
        for mode, figures in summary.items():
            print(f"{mode:8} median: " + ", ".join(f"{k} {v:.3f}" for k, v in figures.items()))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {"tree": os.getcwd(), "keys": args.keys, "tuples": args.tuples, "crash_at": crash_at,
                 "primary_tuples_per_cpu_s": args.tuples / primary_cpu, "loadavg": os.getloadavg(),
                 "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": runs,
                 "summary": summary},
                indent=1,
            )
        )  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
