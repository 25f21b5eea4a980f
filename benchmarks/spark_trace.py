"""Where a Spark driver process's work goes, measured so that a loaded machine disturbs it little: the CPU
seconds of its whole process tree, and Spark's own per-stage task metrics from its event log.

Used by `bench_spark.py --cpu-seconds` inside each driver process (the `--native-child` mode), so both
trees of a `--before-tree` run are measured by the same code.

- `tree_cpu()`: the CPU seconds (user + system) of every process in this process's session, by kind: the
  driver (this Python process), the JVM, and each kind of Spark Python process (the daemon and the workers
  it forks, a streaming query's Python source runner, ...). A process's own time plus the time of the
  children it has reaped: a Python worker that exited is counted in its daemon's. Differences of two calls
  give a query's CPU seconds. The driver is started in a session of its own (`start_new_session`), and
  neither the JVM nor PySpark's Python processes leave it.
- `stage_summary()`: from the event log (`event_log_conf`), per query and micro-batch, every Spark job and
  stage that ran within it, with its tasks' summed executorRunTime, executorCpuTime, deserialization,
  GC, result size, shuffle and input records/bytes, and the SQL metrics its tasks reported (the Python
  operators' rows and bytes sent and received among them). Jobs are given to a batch by the time they were
  submitted (the batch's progress: `timestamp` to `timestamp + triggerExecution`): the jobs a foreachBatch
  sink starts run in a thread that does not carry the stream's local properties.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["cpu_delta", "event_log_conf", "progress_window", "stage_summary", "tree_cpu"]

_TICK = os.sysconf("SC_CLK_TCK")


def _kind(pid: int, cmdline: list[str]) -> str:
    if pid == os.getpid():
        return "driver"
    if cmdline and Path(cmdline[0]).name == "java":
        return "jvm"
    if "-m" in cmdline[:-1]:
        return cmdline[cmdline.index("-m") + 1]  # pyspark.daemon (and its forked workers), source runners
    return "other:" + (Path(cmdline[0]).name if cmdline else "?")


def tree_cpu() -> dict[str, float]:
    """CPU seconds of this session's processes so far, by kind (module doc), and their sum ("total")."""
    session = os.getsid(0)
    out: Counter[str] = Counter()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # exited meanwhile: its time is in its parent's reaped children's
            continue
        fields = stat.rsplit(")", 1)[1].split()  # fields[0] is field 3 of proc(5): the state
        if int(fields[3]) != session:
            continue
        ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime, stime, cutime, cstime
        out[_kind(pid, [c for c in cmdline if c])] += ticks / _TICK
    result = dict(out)
    result["total"] = sum(out.values())
    return result


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds between two `tree_cpu()` readings, by kind."""
    return {k: round(after.get(k, 0.0) - before.get(k, 0.0), 3) for k in sorted({*before, *after})}


def event_log_conf(directory: Path) -> dict[str, str]:
    """Spark settings that write the session's event log, uncompressed, to `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": directory.resolve().as_uri(),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }


def _ms(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000


def progress_window(progress: dict[str, Any]) -> tuple[float, float]:
    """A micro-batch's [start, end] in epoch ms, from its StreamingQueryProgress JSON."""
    start = _ms(progress["timestamp"])
    return start, start + float(progress.get("durationMs", {}).get("triggerExecution", 0))


_TASK_FIELDS = {
    "run_ms": ("Executor Run Time",),
    "cpu_ms": ("Executor CPU Time",),  # ns in the log
    "deserialize_ms": ("Executor Deserialize Time",),
    "gc_ms": ("JVM GC Time",),
    "result_bytes": ("Result Size",),
    "shuffle_read_records": ("Shuffle Read Metrics", "Total Records Read"),
    "shuffle_read_bytes": ("Shuffle Read Metrics", "Local Bytes Read"),
    "shuffle_write_records": ("Shuffle Write Metrics", "Shuffle Records Written"),
    "shuffle_write_bytes": ("Shuffle Write Metrics", "Shuffle Bytes Written"),
    "input_records": ("Input Metrics", "Records Read"),
}


def _dig(metrics: dict[str, Any], path: tuple[str, ...]) -> float:
    value: Any = metrics
    for name in path:
        if not isinstance(value, dict):
            return 0.0
        value = value.get(name, 0)
    return float(value or 0)


def stage_summary(directory: Path, windows: dict[str, list[tuple[int, float, float]]]) -> dict[str, Any]:
    """Per query name and batch id, the jobs submitted within the batch's window and their stages' summed
    task metrics (module doc). `windows`: query name -> [(batch id, start ms, end ms)]."""
    logs = sorted(p for p in directory.iterdir() if p.is_file() and not p.name.endswith(".inprogress"))
    if not logs:
        return {"error": f"no finished event log in {directory}"}
    jobs: dict[int, dict[str, Any]] = {}
    stages: dict[int, dict[str, Any]] = {}
    tasks: dict[int, Counter[str]] = defaultdict(Counter)
    sql: dict[int, Counter[str]] = defaultdict(Counter)
    for line in logs[-1].read_text().splitlines():
        event = json.loads(line)
        kind = event.get("Event")
        if kind == "SparkListenerJobStart":
            job = event["Job ID"]
            jobs[job] = {"submitted": float(event["Submission Time"]), "stages": event["Stage IDs"]}
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            if "Completion Time" not in info:
                continue
            stages[info["Stage ID"]] = {
                "name": info["Stage Name"].split(" at ")[0],
                "tasks": info["Number of Tasks"],
                "wall_ms": info["Completion Time"] - info.get("Submission Time", info["Completion Time"]),
                "rdds": sorted({r["Name"] for r in info.get("RDD Info", [])})[:12],
            }
        elif kind == "SparkListenerTaskEnd":
            stage = event["Stage ID"]
            metrics = event.get("Task Metrics") or {}
            for name, path in _TASK_FIELDS.items():
                value = _dig(metrics, path)
                if name == "cpu_ms":
                    value /= 1e6
                if name == "shuffle_read_bytes":
                    value += _dig(metrics, ("Shuffle Read Metrics", "Remote Bytes Read"))
                tasks[stage][name] += value
            for acc in (event.get("Task Info") or {}).get("Accumulables", []):
                name, update = acc.get("Name", ""), acc.get("Update")
                if not name.startswith("internal.") and isinstance(update, (int, float, str)):
                    try:
                        sql[stage][name] += float(update)
                    except ValueError:
                        continue
    out: dict[str, Any] = {}
    for query, batches in windows.items():
        per_batch = []
        for batch, start, end in batches:
            batch_jobs = sorted(j for j, info in jobs.items() if start <= info["submitted"] <= end)
            rows = []
            for job in batch_jobs:
                for stage in sorted(jobs[job]["stages"]):
                    if stage not in stages:
                        continue  # skipped (its shuffle output reused)
                    rows.append(
                        {
                            "job": job,
                            "stage": stage,
                            **stages[stage],
                            **{k: round(v, 1) for k, v in tasks[stage].items()},
                            "sql": {k: round(v, 1) for k, v in sorted(sql[stage].items())},
                        }
                    )
            per_batch.append({"batch": batch, "jobs": len(batch_jobs), "stages": rows})
        out[query] = per_batch
    return out
