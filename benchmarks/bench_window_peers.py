"""Hopping windows side by side: `cec run` against Quix Streams' `hopping_window` on one topic, one broker.

Input: `bench_windows.input_rows` (at the default scale 900,000 tuples, 90,000 keys drawn uniformly, event
times rising over 3 hours: ~90,000 windows open at once, the paper's scale) as JSON values
`{"key", "value", "ts"}` keyed by `key` into a topic of 3 partitions (a key in one partition) on the broker
`tests.brokers` starts (Apache Kafka 4.3.1 from the jars of `make kafka-jars` with
`CEC_TEST_BROKER=apache-kafka`). Query: the mean of `value` per key over hopping windows of 1 hour every 15
minutes on the event time `ts`.

- **cec**: `cec run --input-topic T --format json --key key --value value --time ts --window-time 1h
  --slide 15m --agg avg` (one operator instance per input partition, the output log on the same broker;
  `cec run`'s default checkpointing);
- **Quix**: Quix Streams 3.28 (its own venv, as bench_quix.py), `processing_guarantee="at-least-once"` (its
  default), the event time from `ts` (`timestamp_extractor`), `.hopping_window(3600000, 900000).mean()
  .final()` (RocksDB state + changelog topic), results to an output topic.

Per system, each its own process, systems interleaved in every repeat (the order rotates):
- **throughput**: input tuples / seconds, cec: the instances' own run time (longest instance), Quix: first
  to last message processed (its group join and start-up excluded, which favours Quix); and the CPU
  seconds of the whole process (`getrusage` of the child: start-up and, for cec, its results pass
  included);
- **bytes written per input tuple**: cec's output log topic; Quix's output and changelog topics;
- **recovery after SIGKILL at half the input with the state directory lost**, restarted to caught up:
  cec is SIGKILLed once it applied N/2 tuples (the kill plan `runtime.after_input`), its `--store-dir`
  deleted, the same command started again: recovery = the longest instance's "recovery time" (EC build +
  load + replay to the crash point). Quix kills itself when it has processed N/2 messages (noting each
  partition's offset then), its `state_dir` deleted and the app restarted: recovery = from the partitions'
  assignment to every partition processing its offset at the crash again (changelog restore +
  reprocessing since the last commit);
- **results checked equal**: every window (key, start) both emitted has the same mean (the values are
  multiples of 1/8, so float sums are exact); a window emitted by only one side is counted (cec closes a
  key's windows at its next tuple, Quix at its partition's stream time: each leaves the last windows of
  the input open). cec's results are from its failure-free and its recovered run, Quix's deduplicated by
  (key, start) (at-least-once) with any disagreeing duplicate counted.

    CEC_TEST_BROKER=apache-kafka flock /tmp/cec-bench.lock nice -n 5 .venv/bin/python benchmarks/bench_window_peers.py \
        [--keys 90000] [--tuples 900000] [--hours 3] [--repeats 1] [--out benchmarks/out/window-peers.json]
"""

from __future__ import annotations

import argparse
import csv
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
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
PARTITIONS = 3
SIZE_MS, SLIDE_MS = 3_600_000, 900_000


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- Quix (its own venv and process: nothing from cec imported here) -------------------------------------------
def quix_worker(args: argparse.Namespace) -> int:
    from quixstreams import Application, message_context

    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        processing_guarantee="at-least-once",
        state_dir=args.state_dir,
        # As bench_quix.py: a SIGKILLed member's session must time out before the restart gets its partitions.
        consumer_extra_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
        loglevel="WARNING",
    )
    source = app.topic(
        args.input,
        value_deserializer="json",
        key_deserializer="str",
        timestamp_extractor=lambda value, headers, timestamp, kind: int(value["ts"]),
    )
    sink = app.topic(args.output, value_serializer="json", key_serializer="str")
    last = {int(p): o for p, o in json.loads(args.last).items()}  # partition -> its last offset
    crash = json.loads(Path(args.crash_file).read_text()) if args.recover else None
    crash = {int(p): o for p, o in crash.items()} if crash else None
    seen: dict[int, int] = {}
    marks: dict[str, float] = {}
    processed = 0
    started = time.perf_counter()

    def observe(value: Any) -> None:
        nonlocal processed
        ctx = message_context()
        now = time.perf_counter()
        marks.setdefault("first", now)
        seen[ctx.partition] = ctx.offset
        processed += 1
        if args.crash_at and processed >= args.crash_at:
            Path(args.crash_file).write_text(json.dumps(seen))
            os.kill(os.getpid(), signal.SIGKILL)
        if (
            crash is not None
            and "recovered" not in marks
            and all(seen.get(p, -1) >= o for p, o in crash.items())
        ):
            marks["recovered"] = now
            app.stop()
        if all(seen.get(p, -1) >= o for p, o in last.items()):
            marks["last"] = now
            app.stop()

    on_assign = app._on_assign

    def assigned(*a: Any, **kw: Any) -> Any:
        marks.setdefault("assigned", time.perf_counter())
        return on_assign(*a, **kw)

    app._on_assign = assigned  # type: ignore[method-assign]
    sdf = app.dataframe(source)
    sdf = sdf.update(observe)
    sdf = sdf.apply(lambda v: v["value"]).hopping_window(SIZE_MS, SLIDE_MS).mean().final()
    sdf.to_topic(sink)
    app.run()
    Path(args.result).write_text(json.dumps({k: v - started for k, v in marks.items()}))
    return 0


def _child_cpu(cmd: list[str], **kw: Any) -> tuple[subprocess.CompletedProcess[str], float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, text=True, capture_output=True, **kw)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return proc, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def quix_run(
    python: Path, bootstrap: str, topic: str, last: dict[int, int], tag: str, work: Path, **mode: Any
) -> tuple[int, dict[str, float], float]:
    result = work / f"{tag}.result.json"
    result.unlink(missing_ok=True)
    cmd = [str(python), str(Path(__file__).resolve()), "_quix", "--bootstrap", bootstrap, "--input", topic,
           "--group", tag, "--output", f"{tag}-out", "--state-dir", str(work / f"{tag}-state"),
           "--result", str(result), "--last", json.dumps(last), "--crash-file", str(work / f"{tag}.crash.json")]  # fmt: skip
    if mode.get("crash_at"):
        cmd += ["--crash-at", str(mode["crash_at"])]
    if mode.get("recover"):
        cmd += ["--recover"]
    proc, cpu = _child_cpu(cmd, cwd=ROOT, timeout=3600)
    if proc.returncode not in (0, -signal.SIGKILL):
        _say(proc.stderr[-3000:])
    return proc.returncode, (json.loads(result.read_text()) if result.exists() else {}), cpu


# -- input and outputs (cec's venv) ---------------------------------------------------------------------------
def produce_input(bootstrap: str, topic: str, keys: int, tuples: int, hours: float) -> dict[int, int]:
    """The rows of bench_windows as JSON keyed by key, 3 partitions; each partition's last offset."""
    from bench_windows import input_rows
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"retention.ms": "-1", "retention.bytes": "-1"}
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1, config=config)]).values():
        future.result()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    for i, (key, value, ts) in enumerate(input_rows(keys, tuples, hours)):
        payload = json.dumps({"key": key, "value": value, "ts": ts}).encode()
        while True:
            try:
                producer.produce(topic, payload, key.encode())
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError(f"could not write the input topic {topic}")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ends-{os.getpid()}"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] - 1
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


def read_topic(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{os.getpid()}-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "enable.partition.eof": True})  # fmt: skip
    out: list[tuple[bytes | None, bytes | None]] = []
    try:
        parts = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        pending = set(parts)
        idle_until = time.monotonic() + 30
        while pending and time.monotonic() < idle_until:
            for msg in consumer.consume(10_000, 0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == err._PARTITION_EOF:
                        pending.discard(msg.partition())
                        continue
                    raise RuntimeError(f"reading {topic}: {err}")
                idle_until = time.monotonic() + 30
                out.append((msg.key(), msg.value()))
        return out
    finally:
        consumer.close()


def quix_results(bootstrap: str, topic: str) -> tuple[dict[tuple[str, int], float], int]:
    """(key, start) -> mean of a Quix output topic, and how many duplicates disagreed."""
    got: dict[tuple[str, int], float] = {}
    disagree = 0
    for key, value in read_topic(bootstrap, topic):
        assert key is not None and value is not None
        row = json.loads(value)
        window = (key.decode(), int(row["start"]))
        if window in got and got[window] != row["value"]:
            disagree += 1
        got[window] = row["value"]
    return got, disagree


def _ms(text: str) -> int:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int(moment.timestamp() * 1000)


def cec_results(path: Path) -> dict[tuple[str, int], float]:
    with path.open(newline="") as f:
        return {(row["key"], _ms(row["start"])): float(row["value"]) for row in csv.DictReader(f)}


def compare(cec: dict[tuple[str, int], float], quix: dict[tuple[str, int], float]) -> dict[str, int]:
    both = cec.keys() & quix.keys()
    return {
        "windows_both": len(both),
        "cec_only": len(cec.keys() - quix.keys()),
        # Quix makes no window that starts before the epoch (the input's first 45 minutes are in 3 such).
        "cec_only_starting_before_epoch": sum(1 for w in cec.keys() - quix.keys() if w[1] < 0),
        "quix_only": len(quix.keys() - cec.keys()),
        "means_differ": sum(1 for w in both if cec[w] != quix[w]),
    }


# -- cec -------------------------------------------------------------------------------------------------------
def cec_env() -> dict[str, str]:
    """`cec run`'s environment: this tree's packages first (a snapshot run from elsewhere measures itself)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def cec_cmd(bootstrap: str, topic: str, out: str, store: Path) -> list[str]:
    return [str(Path(sys.executable).with_name("cec")), "run", "--input-topic", topic, "--bootstrap-servers",
            bootstrap, "--format", "json", "--key", "key", "--value", "value", "--time", "ts",
            "--window-time", "1h", "--slide", "15m", "--agg", "avg", "--output-topic", out,
            "--results", str(store.parent / f"{out}.csv"), "--store-dir", str(store)]  # fmt: skip


def cec_stats(store: Path, out: str) -> list[dict[str, Any]]:
    return [json.loads((store / f".{out}.{p}.stats.json").read_text()) for p in range(PARTITIONS)]


def cec_throughput(bootstrap: str, topic: str, tag: str, work: Path) -> dict[str, Any]:
    from bench_quix import topic_bytes

    store, out = work / f"{tag}-store", f"{tag}-out"
    proc, cpu = _child_cpu(cec_cmd(bootstrap, topic, out, store), cwd=ROOT, env=cec_env())
    if proc.returncode != 0:
        raise RuntimeError(f"cec run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    stats = cec_stats(store, out)
    inputs = sum(s["inputs"] for s in stats)
    seconds = max(s["seconds"] for s in stats)
    records, size = topic_bytes(bootstrap, out)
    return {"tuples_per_s": inputs / seconds, "inputs": inputs, "seconds": seconds, "cpu_seconds": cpu,
            "records_written": records, "bytes_written": size, "results": cec_results(work / f"{out}.csv")}  # fmt: skip


def cec_recovery(bootstrap: str, topic: str, count: int, tag: str, work: Path) -> dict[str, Any]:
    from tests.helpers import child_env

    out = f"{tag}-out"
    first = work / f"{tag}-store-1"
    proc, _ = _child_cpu(cec_cmd(bootstrap, topic, out, first), cwd=ROOT,
                         env=child_env(f"runtime.after_input:{count // 2}"))  # fmt: skip
    if proc.returncode != -signal.SIGKILL:
        raise RuntimeError(f"cec was to be SIGKILLed at {count // 2} inputs, exited {proc.returncode}")
    shutil.rmtree(first)  # the state directory is lost with the process
    second = work / f"{tag}-store-2"
    proc, cpu = _child_cpu(cec_cmd(bootstrap, topic, out, second), cwd=ROOT, env=cec_env())
    if proc.returncode != 0:
        raise RuntimeError(f"cec recovery run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    every = [s["recovery"] for s in cec_stats(second, out)]
    # An instance with nothing durable at the kill starts afresh (no recovery); the others recover.
    recs = [r for r in every if r is not None]
    if not recs:
        raise RuntimeError(f"no instance of {tag} found a log to recover from")
    return {
        "recovery_s": max(r["recovery_seconds"] for r in recs),
        "instances_recovered": len(recs),
        "ec_build_s": max(r["ec_build_seconds"] for r in recs),
        "ec_load_s": max(r["ec_load_seconds"] for r in recs),
        "ec_windows": sum(r["ec_windows"] for r in recs),
        "replayed": sum(r["tuples_replayed"] for r in recs),
        "cpu_seconds_restart": cpu,
        "results": cec_results(second.parent / f"{out}.csv"),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_quix":
        p = argparse.ArgumentParser()
        for name in ("bootstrap", "input", "group", "output", "state-dir", "result", "last", "crash-file"):
            p.add_argument(f"--{name}", required=True)
        p.add_argument("--crash-at", type=int)
        p.add_argument("--recover", action="store_true")
        return quix_worker(p.parse_args(argv[1:]))
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(HERE))
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=90_000)
    parser.add_argument("--tuples", type=int, default=900_000)
    parser.add_argument("--hours", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-recovery", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    import bench_quix

    from tests.brokers import start_broker

    bench_quix.ensure_quix_venv()
    python = bench_quix.QUIX_PYTHON
    broker = start_broker()
    doc: dict[str, Any] = {"broker": broker.kind, "args": vars(args) | {"out": str(args.out)}, "repeats": []}
    _say(f"broker {broker.kind} at {broker.bootstrap}")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-window-peers-") as tmp:
            work = Path(tmp)
            topic = f"hop-in-{os.getpid()}"
            last = produce_input(broker.bootstrap, topic, args.keys, args.tuples, args.hours)
            count = sum(o + 1 for o in last.values())
            _say(f"input {topic}: {count:,} tuples, last offsets {last}")
            for r in range(args.repeats):
                row: dict[str, Any] = {"load_average": {}}
                for system in ["cec", "quix"] if r % 2 == 0 else ["quix", "cec"]:
                    tag = f"{system}-{r}"
                    if system == "cec":
                        row["cec"] = cec_throughput(broker.bootstrap, topic, tag, work)
                    else:
                        rc, marks, cpu = quix_run(python, broker.bootstrap, topic, last, tag, work)
                        if rc != 0 or "last" not in marks:
                            raise RuntimeError(f"quix run {tag} failed (exit {rc}, marks {marks})")
                        topics = [f"{tag}-out"] + [
                            t
                            for t in bench_quix.list_topics(broker.bootstrap)
                            if t.startswith(f"changelog__{tag}--")
                        ]
                        sizes = [bench_quix.topic_bytes(broker.bootstrap, t) for t in topics]
                        results, disagree = quix_results(broker.bootstrap, f"{tag}-out")
                        row["quix"] = {
                            "tuples_per_s": count / (marks["last"] - marks["first"]),
                            "seconds": marks["last"] - marks["first"],
                            "startup_s": marks["first"],
                            "cpu_seconds": cpu,
                            "records_written": sum(s[0] for s in sizes),
                            "bytes_written": sum(s[1] for s in sizes),
                            "bytes_by_topic": dict(zip(topics, sizes, strict=True)),
                            "results": results,
                            "duplicates_disagreeing": disagree,
                        }
                    row["load_average"][system] = os.getloadavg()[0]
                    _say(f"[{r}] {system}: {row[system]['tuples_per_s']:,.0f} tuples/s, "
                         f"{row[system]['cpu_seconds']:.1f} CPU s, load {row['load_average'][system]:.1f}")  # fmt: skip
                    if not args.no_recovery:
                        if system == "cec":
                            row["cec_recovery"] = cec_recovery(
                                broker.bootstrap, topic, count, f"cec-rec-{r}", work
                            )
                            rec_s = row["cec_recovery"]["recovery_s"]
                        else:
                            rtag = f"quix-rec-{r}"
                            rc, _, _ = quix_run(
                                python, broker.bootstrap, topic, last, rtag, work, crash_at=count // 2
                            )
                            if rc != -signal.SIGKILL:
                                raise RuntimeError(f"quix was to be SIGKILLed at {count // 2}, exited {rc}")
                            shutil.rmtree(work / f"{rtag}-state", ignore_errors=True)
                            rc, marks, _ = quix_run(
                                python, broker.bootstrap, topic, last, rtag, work, recover=True
                            )
                            if rc != 0 or "recovered" not in marks:
                                raise RuntimeError(f"quix recovery {rtag} failed (exit {rc}, marks {marks})")
                            results, disagree = quix_results(broker.bootstrap, f"{rtag}-out")
                            rec_s = marks["recovered"] - marks.get("assigned", 0.0)
                            row["quix_recovery"] = {
                                "recovery_s": rec_s,
                                "recovery_with_group_wait_s": marks["recovered"],
                                "results": results,
                                "duplicates_disagreeing": disagree,
                            }
                        _say(f"[{r}] {system} recovery {rec_s:.1f} s")
                # Results: each system's failure-free results against the other's; the recovered ones against
                # their own failure-free run (Quix's recovered run stops at the crash point: its windows so far).
                checks = {"cec vs quix": compare(row["cec"]["results"], row["quix"]["results"])}
                if "cec_recovery" in row:
                    checks["cec recovered vs cec"] = compare(
                        row["cec_recovery"]["results"], row["cec"]["results"]
                    )
                if "quix_recovery" in row:
                    checks["quix recovered vs quix"] = compare(
                        row["quix_recovery"]["results"], row["quix"]["results"]
                    )
                row["checks"] = checks
                _say(f"[{r}] checks {json.dumps(checks)}")
                for part in ("cec", "quix", "cec_recovery", "quix_recovery"):
                    if part in row:
                        row[part]["results"] = len(row[part]["results"])
                doc["repeats"].append(row)
                if args.out is not None:  # every repeat as it ends: a long run cut short keeps its figures
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    args.out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    finally:
        broker.stop()
    rows = doc["repeats"]
    summary: dict[str, Any] = {}
    for system in ("cec", "quix"):
        summary[system] = {
            "tuples_per_s": statistics.median(r[system]["tuples_per_s"] for r in rows),
            "tuples_per_cpu_s": statistics.median(count / r[system]["cpu_seconds"] for r in rows),
            "bytes_per_tuple": statistics.median(r[system]["bytes_written"] / count for r in rows),
        }
        if f"{system}_recovery" in rows[0]:
            summary[system]["recovery_s"] = statistics.median(
                r[f"{system}_recovery"]["recovery_s"] for r in rows
            )
    summary["cec/quix tuples_per_s per repeat"] = [
        r["cec"]["tuples_per_s"] / r["quix"]["tuples_per_s"] for r in rows
    ]
    summary["cec/quix tuples_per_cpu_s per repeat"] = [
        r["quix"]["cpu_seconds"] / r["cec"]["cpu_seconds"] for r in rows
    ]
    doc["summary"] = summary
    text = json.dumps(doc, indent=2, default=str)
    print(json.dumps(summary, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
