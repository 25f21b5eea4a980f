"""What one Spark driver of the attached query costs in CPU: its start against each micro-batch (CI time).

The crash tests of `cec_aggregate` start a driver per kill (tests/operators/spark/attach_driver.py: a fresh
process, `local_session("local[2,3]")`, `cec_aggregate(available_now=True)`), so the suite's time is mostly
driver starts and micro-batches. This runs such drivers over test_attach's purchases (4,000 tuples, 3
partitions, on the broker of tests/brokers.py) and reports the CPU seconds of the driver's whole process
tree (driver Python, JVM, Spark's Python processes), sampled from /proc at each phase (imports, session,
query started, end of input) and at the end of every micro-batch, split by process kind. CPU, not wall
time: these machines are shared, and the suite is CPU-bound.

Variants compare session settings in one run, alternating A B B A per `--repeats` pair, e.g. pyspark's own
Python daemon against the one `local_session` names (`operators.spark.daemon`):

    CEC_TEST_BROKER=apache-kafka SPARK_SUBMIT_OPTS="$(.venv/bin/python -c \\
        'from tests.spark_cds import driver_jvm_options as o; print(o())')" \\
    nice -n 10 .venv/bin/python benchmarks/bench_driver_cost.py --rows 600 --repeats 2 \\
        --variant 'pyspark-daemon={"spark.python.daemon.module": "pyspark.daemon"}' --variant 'default={}'

Writes benchmarks/out/driver-cost.json. (The kernel's rusage of the driver undercounts the Python workers,
which pyspark's daemon detaches; the /proc samples are the figures to use.)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TICK = os.sysconf("SC_CLK_TCK")
KINDS = ("driver", "jvm", "python_workers")


# -- CPU of a process tree, from /proc ------------------------------------------------------------------
def _processes() -> dict[int, tuple[int, float, str]]:
    """pid -> (parent pid, CPU seconds of it and its reaped children, command line)."""
    out: dict[int, tuple[int, float, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu = sum(int(f) for f in fields[11:15]) / TICK  # utime, stime, cutime, cstime
        out[int(entry)] = (int(fields[1]), cpu, cmd)
    return out


def tree_cpu(root: int) -> dict[str, float]:
    """CPU seconds of `root`'s process tree by kind (the driver itself, the JVM, Spark's Python processes)."""
    procs = _processes()
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, (ppid, _, _) in procs.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    out = dict.fromkeys(KINDS, 0.0)
    for pid in tree & procs.keys():
        _, cpu, cmd = procs[pid]
        kind = "driver" if pid == root else "jvm" if "java" in cmd.split(" ", 1)[0] else "python_workers"
        out[kind] += cpu
    return out


# -- one driver (a child process) -----------------------------------------------------------------------
def child(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    me = os.getpid()
    marks: list[tuple[str, float, dict[str, float]]] = [("exec", time.time(), tree_cpu(me))]

    def mark(name: str) -> None:
        marks.append((name, time.time(), tree_cpu(me)))

    from operators.spark.attach import cec_aggregate
    from operators.spark.session import local_session

    mark("imported")
    spark = local_session("local[2,3]", app_name="cec-driver-cost", extra_conf=spec["session_conf"] or None)
    mark("session")
    query = cec_aggregate(spark, available_now=True, **spec["args"])
    mark("query_started")
    batches: list[tuple[int, float, dict[str, float]]] = []
    done = threading.Event()

    def sample_batches() -> None:
        seen = -1
        while not done.is_set():
            progress = query.query.lastProgress
            if progress is not None and int(progress.batchId) != seen:
                seen = int(progress.batchId)
                batches.append((seen, time.time(), tree_cpu(me)))
            done.wait(0.05)

    sampler = threading.Thread(target=sample_batches, daemon=True)
    sampler.start()
    query.awaitTermination()
    done.set()
    sampler.join()
    mark("end_of_input")
    count = query.batches
    spark.stop()
    Path(spec["out"]).write_text(json.dumps({"marks": marks, "batches": batches, "micro_batches": count}))
    return 0


# -- the parent -----------------------------------------------------------------------------------------
def _total(cpu: dict[str, float]) -> float:
    return sum(cpu.values())


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    """Per phase and per micro-batch CPU (whole tree and by kind) of one driver's samples."""
    marks = raw["marks"]
    phases = {}
    for (_, _, before), (name, _, after) in itertools.pairwise(marks):
        phases[name] = {k: round(after[k] - before[k], 3) for k in KINDS} | {
            "total": round(_total(after) - _total(before), 3)
        }
    started = next(cpu for name, _, cpu in marks if name == "query_started")
    per_batch, previous = [], started
    for _, _, cpu in raw["batches"]:
        per_batch.append(
            {k: round(cpu[k] - previous[k], 3) for k in KINDS}
            | {"total": round(_total(cpu) - _total(previous), 3)}
        )
        previous = cpu
    steady = per_batch[1:]
    return {
        "micro_batches": raw["micro_batches"],
        "phases": phases,
        "batches": per_batch,
        "first_batch_cpu": per_batch[0]["total"] if per_batch else None,
        "steady_batch_cpu_median": statistics.median(b["total"] for b in steady) if steady else None,
        "steady_python_workers_median": statistics.median(b["python_workers"] for b in steady)
        if steady
        else None,
        "query_cpu": phases["end_of_input"]["total"],
        "session_cpu": phases["session"]["total"],
        "query_start_cpu": phases["query_started"]["total"],
    }


def run_driver(work: Path, args: dict[str, Any], session_conf: dict[str, str]) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    spec, out = work / "spec.json", work / "out.json"
    spec.write_text(json.dumps({"args": args, "session_conf": session_conf, "out": str(out)}))
    with open(work / "driver.log", "wb") as log:
        proc = subprocess.run(
            [sys.executable, __file__, "child", str(spec)], stdout=log, stderr=subprocess.STDOUT, check=False
        )
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(f"the driver failed (exit {proc.returncode}): see {work / 'driver.log'}")
    return summarize(json.loads(out.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=600, help="max_records_per_trigger (4,000 tuples in all)")
    parser.add_argument("--repeats", type=int, default=1, help="A B B A pairs per variant pair")
    parser.add_argument("--variant", action="append", default=[], help="NAME=JSON session conf (repeatable)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/out/driver-cost.json"))
    parser.add_argument("--work", default=None, help="work directory (default: a fresh one under /tmp)")
    opts = parser.parse_args(argv)
    variants = [(name, json.loads(conf)) for name, _, conf in (v.partition("=") for v in opts.variant)]
    variants = variants or [("default", {})]

    from tests.brokers import start_apache_kafka
    from tests.operators.spark.test_attach import _args, write_purchases

    work = Path(opts.work or f"/tmp/cec-driver-cost-{uuid.uuid4().hex[:8]}")
    broker = start_apache_kafka()
    results: list[dict[str, Any]] = []
    try:
        purchases = write_purchases(broker.bootstrap, work / "input", partitions=3, seed=13, invalid_every=37)
        order = [v for _ in range(opts.repeats) for v in (variants + variants[::-1])]
        began = time.monotonic()
        for i, (name, conf) in enumerate(order, 1):
            output = f"avg-cost-{uuid.uuid4().hex[:8]}"
            run = work / f"{i:02d}-{name}"
            args = _args(purchases, run, output, partitions=3, max_records_per_trigger=opts.rows)
            summary = run_driver(run, args, conf) | {"variant": name, "session_conf": conf}
            results.append(summary)
            rate = i / (time.monotonic() - began) * 60
            print(
                f"[{i}/{len(order)}, {rate:.1f} drivers/min] {name}: {summary['micro_batches']} micro-batches, "
                f"query {summary['query_cpu']:.1f} s CPU, first batch {summary['first_batch_cpu']:.1f} s, "
                f"steady batch {summary['steady_batch_cpu_median'] or 0:.2f} s "
                f"(Python workers {summary['steady_python_workers_median'] or 0:.2f} s)",
                file=sys.stderr,
                flush=True,
            )
    finally:
        broker.stop()
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(json.dumps({"rows": opts.rows, "runs": results}, indent=1))
    print(f"wrote {opts.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "child":
        sys.exit(child(sys.argv[2]))
    sys.exit(main())
