"""Failover to a standby against a cold restart, and the EC cache's restart and steady cost (issue 26).

The workload: the paper's purchases from the generator (`--keys` items, `--tuples` tuples over
`--partitions` input partitions), sum over count windows of 10, U = `--u` (default 100,000, `cec run`'s
default) within CI/CP 5/100 ms, the embedded store (SQLite), each run a real `python -m operators.worker` process.

Per repeat, interleaved (the order rotates):
- `standby`: the primary runs; a standby (`--standby`) starts beside it once its log holds records and
  follows it; the primary is SIGKILLed from outside once its log holds `--kill-at` records (t0), and the
  standby takes over; "kill to caught up" is t0 to the standby's restore path's `caught_up` (a timestamp from
  benchmarks/restart_probe.py, outside the product);
- `cold-cache`: the same kill, then the same job started again (its state directory kept: the EC cache
  on); kill to caught up, the restart's spawn included;
- `cold-nocache`: the same with `ec_cache=False`: the restart reads the extent back;
each with its recovery report (phases, records read, tuples replayed), and the final logs' results are
compared between the three modes (the same results, per key, or the run fails).

Each cold restart also reports its CPU seconds to caught up and inside `recover()` (EC build + load), from
restart_probe's `cpu` field: robust to the machine's load, unlike the wall clock.

`--same-crash`: only the EC cache on against off, each restart from a copy of the same crashed store
directory (the same log, crash point and replay; the order alternates per repeat).

`--steady`: the EC cache's steady cost, full runs without a kill, cache on and off interleaved: the
worker's CPU seconds (user + system, from the kernel) and its throughput on that CPU time, and the bytes
of the EC cache beside the log's.

    flock /tmp/cec-bench.lock nice -n 5 .venv/bin/python benchmarks/bench_standby.py --repeats 2 --steady
Writes benchmarks/out/standby.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from operators.job import JobSpec  # noqa: E402
from operators.standby import read_status  # noqa: E402
from queuestore.sqlite import SqliteQueueStore  # noqa: E402
from tests.helpers import results  # noqa: E402

__all__ = ["main"]

BOOT = HERE / "probe_boot"
TOPIC = "agg"


def _spec(
    root: Path,
    args: argparse.Namespace,
    *,
    ec_cache: bool = True,
    stats: Path | None = None,
    epoch: float | None = None,
) -> JobSpec:
    """`epoch`: with `--rate`, when the live input's first tuple arrives (the primary and its standby or
    restart share it: one stream)."""
    live = {} if args.rate is None else {"rate": args.rate, "arrival_epoch": epoch}
    return JobSpec(
        operator={"type": "aggregate", "key_field": "item_id", "value_field": "item_price", "agg": "sum",
                  "window_count": 10},
        source={"type": "generator", "count": args.tuples, "keys": args.keys, "seed": 3,
                "partitions": args.partitions, **live},
        store={"type": "sqlite", "root": str(root)},
        output_topic=TOPIC,
        checkpointing={"u_target": args.u, "ci_ms": 5, "cp_ms": 100},
        ec_cache=ec_cache,
        stats_path=None if stats is None else str(stats),
    )  # fmt: skip


def _env(probe: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("CEC_TEST_KILL", "CEC_FAULTS", "CEC_BENCH_PROFILE", "CEC_BENCH_PROBE"):
        env.pop(name, None)
    paths = [str(ROOT)]
    if probe is not None:
        env["CEC_BENCH_PROBE"] = str(probe)
        paths = [str(BOOT), str(HERE), str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    return env


def _worker(spec: JobSpec, path: Path, probe: Path | None, *extra: str) -> subprocess.Popen[bytes]:
    path.write_text(spec.to_json())
    return subprocess.Popen(
        [sys.executable, "-m", "operators.worker", str(path), *extra],
        env=_env(probe),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _log_end(store: SqliteQueueStore) -> int:
    if not store.topic_exists(TOPIC):
        return 0
    with store.reader(TOPIC, 0) as reader:
        return reader.end_offset()


def _wait(condition: Any, what: str, timeout: float = 600.0, interval: float = 0.002) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(interval)


def _caught_up(probe: Path, field: str = "t") -> float:
    """The wall clock (`t`) or the restart's own CPU seconds (`cpu`) when it was caught up."""
    for line in probe.read_text().splitlines():
        event = json.loads(line)
        if event["ev"] == "caught_up:enter":
            return float(event[field])
    raise RuntimeError(f"{probe}: no caught_up event (the restart did not recover?)")


def _cpu_in(probe: Path, name: str) -> float:
    """The restart's CPU seconds inside the probe boundary `name` (recovery.manager's `recover`: the EC
    built, from the cache and the tail or read back, and loaded)."""
    events = {e["ev"]: e for e in map(json.loads, probe.read_text().splitlines())}
    return float(events[f"{name}:exit"]["cpu"]) - float(events[f"{name}:enter"]["cpu"])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _finish(proc: subprocess.Popen[bytes], what: str) -> None:
    _, err = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}): {err.decode()[-2000:]}")


def _kill_primary_at(primary: subprocess.Popen[bytes], store: SqliteQueueStore, kill_at: int) -> float:
    # One reader, asked every 10 ms: a new reader every 2 ms took ~0.7 ms of CPU each, a quarter of a core
    # taken from the primary and its standby on a 2-core machine while they ran. The kill's own time is t0.
    # The log is there only once the primary created it (a fast machine asked before that).
    _wait(lambda: store.topic_exists(TOPIC) or primary.poll() is not None, "the primary's log", interval=0.01)
    with store.reader(TOPIC, 0) as reader:
        _wait(
            lambda: reader.end_offset() >= kill_at or primary.poll() is not None,
            "the kill point",
            interval=0.01,
        )
    if primary.poll() is not None:
        raise RuntimeError(f"the primary ended before its log held {kill_at:,} records")
    t0 = time.time()
    os.kill(primary.pid, signal.SIGKILL)
    primary.wait()
    return t0


def _report(stats: Path) -> dict[str, Any]:
    rec: dict[str, Any] = json.loads(stats.read_text())["recovery"]
    return {k: rec.get(k) for k in ("recovery_seconds", "phases", "records_read", "extent_records",
                                     "ec_windows", "tuples_replayed", "ec_source", "ec_cache_note", "replica",
                                     "replica_seconds", "ec_load_seconds", "ec_build_seconds")}  # fmt: skip


def _per_key(store: SqliteQueueStore) -> Counter[str]:
    return Counter(json.dumps(r, sort_keys=True) for r in results(store, TOPIC))


def failover(
    args: argparse.Namespace, work: Path, tag: str, replica: bool = True
) -> tuple[dict[str, Any], Counter[str]]:
    root = work / tag
    store = SqliteQueueStore(root)
    stats = work / f"{tag}.stats.json"
    epoch = time.time()
    primary = _worker(_spec(root, args, epoch=epoch), work / f"{tag}-primary.json", None)
    _wait(lambda: _log_end(store) >= 1, "the primary's first record")
    probe = work / f"{tag}-standby.jsonl"
    flags = ("--standby",) if replica else ("--standby", "--no-replica")
    standby = _worker(
        _spec(root, args, stats=stats, epoch=epoch), work / f"{tag}-standby.json", probe, *flags
    )
    _wait(
        lambda: (
            primary.poll() is not None
            or standby.poll() is not None
            or (
                (s := read_status(store, TOPIC, 0)) is not None
                and s.applied > 0
                and (not replica or s.replica == "applying")
            )
        ),
        "the standby following",
    )
    if primary.poll() is not None or standby.poll() is not None:
        raise RuntimeError("the primary or the standby ended before the standby followed the log")
    t0 = _kill_primary_at(primary, store, args.kill_at)
    status = read_status(store, TOPIC, 0)
    lag = None if status is None else status.lag_records
    cpu_following = _cpu_seconds(standby.pid)
    _finish(standby, "the standby")
    replica_applied = None if status is None else status.replica_applied
    row = {"kill_to_caught_up_s": _caught_up(probe) - t0, "standby_cpu_s_while_following": cpu_following,
           "standby_lag_records_last_status": lag, "replica_applied_last_status": replica_applied,
           "report": _report(stats)}  # fmt: skip
    return row, _per_key(store)


def cold(
    args: argparse.Namespace, work: Path, tag: str, ec_cache: bool
) -> tuple[dict[str, Any], Counter[str]]:
    root = work / tag
    store = SqliteQueueStore(root)
    stats = work / f"{tag}.stats.json"
    epoch = time.time()
    primary = _worker(_spec(root, args, ec_cache=ec_cache, epoch=epoch), work / f"{tag}-primary.json", None)
    t0 = _kill_primary_at(primary, store, args.kill_at)
    probe = work / f"{tag}-restart.jsonl"
    spawned = time.time()
    restart = _worker(
        _spec(root, args, ec_cache=ec_cache, stats=stats, epoch=epoch), work / f"{tag}-restart.json", probe
    )
    _finish(restart, "the restart")
    caught = _caught_up(probe)
    row = {
        "kill_to_caught_up_s": caught - t0,
        "spawn_to_caught_up_s": caught - spawned,
        # CPU seconds, robust to the machine's load: the restart process to caught up, and its `recover`.
        "restart_cpu_to_caught_up_s": _caught_up(probe, "cpu"),
        "recover_cpu_s": _cpu_in(probe, "recover"),
        "report": _report(stats),
    }
    return row, _per_key(store)


def steady(args: argparse.Namespace, work: Path, tag: str, ec_cache: bool) -> dict[str, Any]:
    root = work / tag
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = _worker(_spec(root, args, ec_cache=ec_cache), work / f"{tag}.json", None)
    _finish(proc, tag)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    store = SqliteQueueStore(root)
    cache = store.ec_cache_path(TOPIC, 0)
    cache_bytes = cache.stat().st_size if cache.is_file() else 0  # one snapshot file (queuestore.ec_cache)
    log_bytes = sum(p.stat().st_size for p in (root / TOPIC).rglob("*") if p.is_file())
    return {"cpu_s": cpu, "tuples_per_cpu_s": args.tuples / cpu, "ec_cache_bytes": cache_bytes,
            "log_bytes": log_bytes, "log_records": _log_end(store)}  # fmt: skip


def same_crash(args: argparse.Namespace, work: Path, rep: int) -> dict[str, dict[str, Any]]:
    """One primary (the EC cache on) SIGKILLed once its log holds `--kill-at` records; its store directory
    (log, index, cache) copied twice and each copy restarted, the cache on and off (the order alternates):
    the same crash, the same log and the same replay, only the EC's source differs. The restarts' results
    must be the same."""
    root = work / f"same-{rep}-primary"
    primary = _worker(_spec(root, args, ec_cache=True), work / f"same-{rep}-primary.json", None)
    _kill_primary_at(primary, SqliteQueueStore(root), args.kill_at)
    rows: dict[str, dict[str, Any]] = {}
    outputs: dict[str, Counter[str]] = {}
    for mode in ("on", "off") if rep % 2 == 0 else ("off", "on"):
        copy = work / f"same-{rep}-{mode}"
        shutil.copytree(root, copy)
        stats, probe = work / f"same-{rep}-{mode}.stats.json", work / f"same-{rep}-{mode}.jsonl"
        spawned = time.time()
        spec = _spec(copy, args, ec_cache=mode == "on", stats=stats)
        _finish(_worker(spec, work / f"same-{rep}-{mode}.json", probe), f"the restart, cache {mode}")
        rows[mode] = {
            "spawn_to_caught_up_s": _caught_up(probe) - spawned,
            "restart_cpu_to_caught_up_s": _caught_up(probe, "cpu"),
            "recover_cpu_s": _cpu_in(probe, "recover"),
            "loadavg": os.getloadavg()[0],
            "report": _report(stats),
        }
        outputs[mode] = _per_key(SqliteQueueStore(copy))
        shutil.rmtree(copy, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    if outputs["on"] != outputs["off"]:
        raise RuntimeError(f"repeat {rep}: the restarts' results differ")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--tuples", type=int, default=500_000)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--kill-at", type=int, default=60_000, help="log records when the primary is killed")
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="a live input: tuples per second over all partitions (default: the whole input at once, the "
        "primary running flat out with its standby beside it on the same cores)",
    )
    p.add_argument("--u", type=int, default=100_000, help="U (default: cec run's default, 100,000)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--modes",
        default="standby,standby-noreplica,cold-cache,cold-nocache",
        help="comma-separated, interleaved per repeat: standby (with its replica, design S2), "
        "standby-noreplica (S1: follows the log only), cold-cache, cold-nocache",
    )
    p.add_argument("--steady", action="store_true", help="also the EC cache's steady cost")
    p.add_argument("--out", type=Path, default=HERE / "out" / "standby.json")
    p.add_argument(
        "--same-crash",
        action="store_true",
        help="only the EC cache on against off, each restart from a copy of the same crashed store",
    )
    args = p.parse_args(argv)
    if args.same_crash:
        return _main_same_crash(args)
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in args.modes.split(",")}
    steady_runs: dict[str, list[dict[str, Any]]] = {"cache-on": [], "cache-off": []}
    with tempfile.TemporaryDirectory(prefix="cec-standby-") as tmp:
        work = Path(tmp)
        for rep in range(args.repeats):
            modes = list(runs)
            modes = modes[rep % len(modes) :] + modes[: rep % len(modes)]
            outputs: dict[str, Counter[str]] = {}
            for mode in modes:
                tag = f"{mode}-{rep}"
                if mode.startswith("standby"):
                    row, outputs[mode] = failover(args, work, tag, replica=mode == "standby")
                else:
                    row, outputs[mode] = cold(args, work, tag, ec_cache=mode == "cold-cache")
                row["loadavg"] = os.getloadavg()[0]
                runs[mode].append(row)
                rep_ = row["report"]
                print(f"[{rep}] {mode:12} kill to caught up {row['kill_to_caught_up_s']:6.2f} s  "
                      f"({rep_['ec_source']}: {rep_['records_read']:,} records read, {rep_['ec_windows']:,} windows, "
                      f"{rep_['tuples_replayed']:,} replayed, replica {rep_.get('replica') or '-'} "
                      f"({rep_.get('replica_seconds') or 0:.2f} s; EC load {rep_.get('ec_load_seconds') or 0:.2f} s); phases "
                      f"{ {k: round(v, 2) for k, v in (rep_['phases'] or {}).items()} })  "
                      f"loadavg {row['loadavg']:.1f}", flush=True)  # fmt: skip
                shutil.rmtree(work / tag, ignore_errors=True)
            first = outputs[modes[0]]
            if any(out != first for out in outputs.values()):
                raise RuntimeError(f"repeat {rep}: the modes' results differ")
            print(f"[{rep}] the modes' results are the same ({sum(first.values()):,} results)", flush=True)
        if args.steady:
            for rep in range(args.repeats):
                order = ["cache-on", "cache-off"] if rep % 2 == 0 else ["cache-off", "cache-on"]
                for mode in order:
                    row = steady(args, work, f"steady-{mode}-{rep}", ec_cache=mode == "cache-on")
                    row["loadavg"] = os.getloadavg()[0]
                    steady_runs[mode].append(row)
                    print(f"[{rep}] steady {mode:9} {row['cpu_s']:6.2f} CPU s, {row['tuples_per_cpu_s']:,.0f} "
                          f"tuples/CPU s, EC cache {row['ec_cache_bytes']:,} B beside a log of "
                          f"{row['log_bytes']:,} B ({row['log_records']:,} records)  loadavg {row['loadavg']:.1f}",
                          flush=True)  # fmt: skip
                shutil.rmtree(work / f"steady-cache-on-{rep}", ignore_errors=True)
                shutil.rmtree(work / f"steady-cache-off-{rep}", ignore_errors=True)
    summary: dict[str, Any] = {}
    for mode, rows in runs.items():
        summary[mode] = statistics.median(r["kill_to_caught_up_s"] for r in rows)
    ratios: dict[str, list[float]] = {}

    def ratio(name: str, a: str, b: str, value: Any) -> None:
        if a in runs and b in runs:
            ratios[name] = [round(value(x) / value(y), 3) for x, y in zip(runs[a], runs[b], strict=True)]

    def phases(row: dict[str, Any], names: tuple[str, ...]) -> float:
        return sum((row["report"]["phases"] or {}).get(name, 0.0) for name in names)

    def kill_to_caught_up(row: dict[str, Any]) -> float:
        return float(row["kill_to_caught_up_s"])

    ratio("standby/standby-noreplica", "standby", "standby-noreplica", kill_to_caught_up)
    ratio("standby/cold-nocache", "standby", "cold-nocache", kill_to_caught_up)
    ratio("standby/cold-cache", "standby", "cold-cache", kill_to_caught_up)
    ratio("cold-cache/cold-nocache", "cold-cache", "cold-nocache", kill_to_caught_up)
    # What the EC cache can change: opening it (in "index"), building the EC (cache + tail, or the extent
    # read back) and loading it; the replay is the same either way.
    for label, names in (
        ("index+ec_build", ("index", "ec_build")),
        ("index+ec_build+ec_load", ("index", "ec_build", "ec_load")),
    ):
        ratio(
            f"cold-cache/cold-nocache {label}", "cold-cache", "cold-nocache", lambda r, n=names: phases(r, n)
        )
    for key in ("restart_cpu_to_caught_up_s", "recover_cpu_s"):
        ratio(f"cold-cache/cold-nocache {key}", "cold-cache", "cold-nocache", lambda r, k=key: r[k])
    for mode, value in summary.items():
        print(f"{mode:17} kill to caught up, median {value:.2f} s")
    for name, values in ratios.items():
        print(f"{name}: per repeat {values}")
    if "standby" in summary:
        print(f"standby failover <= 1 s: {'reached' if summary['standby'] <= 1.0 else 'not reached'}")
    if "cold-cache/cold-nocache" in ratios:
        print("EC cache restart <= 0.5x the restart without it: "
              f"{'reached' if max(ratios['cold-cache/cold-nocache']) <= 0.5 else 'not reached'}")  # fmt: skip
    if args.steady:
        on, off = steady_runs["cache-on"], steady_runs["cache-off"]
        cpu_ratio = [round(a["cpu_s"] / b["cpu_s"], 3) for a, b in zip(on, off, strict=True)]
        print(f"steady: CPU seconds cache on / off per repeat {cpu_ratio}; EC cache bytes / log bytes "
              f"{[round(a['ec_cache_bytes'] / a['log_bytes'], 3) for a in on]}")  # fmt: skip
        summary["steady_cpu_on_over_off"] = cpu_ratio
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "keys": args.keys, "tuples": args.tuples, "partitions": args.partitions, "kill_at": args.kill_at, "rate": args.rate,
        "u": args.u,
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": runs, "steady": steady_runs, "ratios": ratios, "summary": summary,
    }, indent=1))  # fmt: skip
    return 0


def _main_same_crash(args: argparse.Namespace) -> int:
    load_before = os.getloadavg()
    runs: list[dict[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="cec-standby-") as tmp:
        for rep in range(args.repeats):
            rows = same_crash(args, Path(tmp), rep)
            runs.append(rows)
            for mode in ("on", "off"):
                row, rep_ = rows[mode], rows[mode]["report"]
                print(f"[{rep}] cache {mode:3} spawn to caught up {row['spawn_to_caught_up_s']:6.2f} s, "
                      f"CPU to caught up {row['restart_cpu_to_caught_up_s']:5.2f} s, recover() CPU "
                      f"{row['recover_cpu_s']:5.3f} s ({rep_['ec_source']}: {rep_['records_read']:,} records read, "
                      f"{rep_['ec_windows']:,} windows, {rep_['tuples_replayed']:,} replayed; phases "
                      f"{ {k: round(v, 2) for k, v in (rep_['phases'] or {}).items()} })  "
                      f"loadavg {row['loadavg']:.1f}", flush=True)  # fmt: skip
    ratios = {
        key: [round(r["on"][key] / r["off"][key], 3) for r in runs]
        for key in ("spawn_to_caught_up_s", "restart_cpu_to_caught_up_s", "recover_cpu_s")
    }
    for key, values in ratios.items():
        print(f"cache on / off, {key}: per repeat {values}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "keys": args.keys, "tuples": args.tuples, "partitions": args.partitions, "kill_at": args.kill_at, "rate": args.rate,
        "u": args.u, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "same_crash": runs, "ratios": ratios,
    }, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
