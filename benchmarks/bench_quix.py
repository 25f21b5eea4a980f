"""cec side by side with Quix Streams 3.x on one broker: throughput, bytes per tuple, recovery after SIGKILL.

Workload: the paper's aggregate (mean price per item over count windows of 10) over the paper's purchases
(`operators.sources.PurchaseGenerator`, seed 42), written once per key count by a plain confluent-kafka
producer as JSON values keyed by item id into a one-partition topic of the broker `tests.brokers` starts
(Apache Kafka from the jars of `make kafka-jars`; `KAFKA_BOOTSTRAP_SERVERS` if set). Every system reads
that same topic:

- **cec**: the public CLI path, `cec run --input-topic T --format json --key item_id --value item_price
  --window-count 10 --agg avg --output-topic O --store-dir D` (output log on the same broker);
- **Quix ALO / Quix EOS**: a Quix Streams `Application` (RocksDB state + changelog topic, the default), with
  `processing_guarantee="at-least-once"` / `"exactly-once"`, `tumbling_count_window(10).mean().final()`
  over the price, results to an output topic.

Figures, each system in its own process, systems interleaved within every repeat (rotating order):

- **steady throughput** (tuples/s) of a failure-free run: cec: the operator's own `RunStats` (inputs /
  seconds of its run, consumer start included); Quix: input tuples / time from the first message processed
  to the last (its group join and start-up excluded, which favours Quix);
- **bytes written per input tuple**, by reading the topics back and summing key + value + header
  (name + value) sizes: cec: its output log topic; Quix: its output topic + its changelog topic(s);
- **recovery after a SIGKILL at half the input with the state directory lost**: Quix kills itself
  (SIGKILL) when it processes the tuple at offset N/2, its `state_dir` is deleted and the app restarted:
  recovery = from `app.run()` to processing offset N/2 again (changelog restore + reprocessing since the
  last commit). cec: `cec run` SIGKILLed once it applied N/2 input tuples (the kill plan
  `runtime.after_input:N/2` of tests/killpoints, installed from the test side in its process), its `--store-dir` deleted, then the same command with a fresh `--store-dir`:
  recovery = the report's "recovery time" (EC build + load + replay to the crash point). cec runs with
  `--recovery-target` = a fifth of the fastest Quix recovery measured in the same repeat.

    .venv/bin/python benchmarks/bench_quix.py             # 1,000 and 100,000 keys, 3 repeats: ~25-40 min
    .venv/bin/python benchmarks/bench_quix.py --quick     # small sizes, one repeat: ~1 minute (70 s at load 25)
Writes benchmarks/out/quix.json and benchmarks/quix.png (not with --quick unless --plot).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

__all__ = ["main"]

HERE = Path(__file__).resolve().parent
SYSTEMS = ("cec", "quix-alo", "quix-eos")
GUARANTEE = {"quix-alo": "at-least-once", "quix-eos": "exactly-once"}
# Quix Streams 3.28 pins confluent-kafka < 2.13 and cec needs a newer one (Producer.close), so Quix cannot
# share cec's venv: it runs from a venv of its own, made on first use with pip (or --quix-python).
QUIX_REQUIREMENT = "quixstreams==3.28.*"
QUIX_VENV = Path.home() / ".cache" / "cec-bench" / "venv-quix"
QUIX_PYTHON = QUIX_VENV / "bin" / "python"
WINDOW = 10
SEED = 42


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- input ------------------------------------------------------------------------------------------------
def produce_input(bootstrap: str, topic: str, count: int, keys: int) -> None:
    """The paper's purchases as JSON values keyed by item id, one partition, written by a plain producer."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from operators.sources import PurchaseGenerator

    admin = AdminClient({"bootstrap.servers": bootstrap})
    # Quix derives its changelog topics' settings from the input's retention, which Tansu's DescribeConfigs
    # reports only for a topic created with it (DESIGN-NOTES section 4).
    config = {"retention.ms": "-1", "retention.bytes": "-1"}
    for future in admin.create_topics([NewTopic(topic, 1, 1, config=config)]).values():
        future.result()
    gen = PurchaseGenerator(count, keys, seed=SEED)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    for i in range(count):
        row = gen.tuple_at(0, i)
        while True:
            try:
                producer.produce(topic, json.dumps(row).encode(), str(row["item_id"]).encode())
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError(f"could not write the input topic {topic}")


def topic_bytes(bootstrap: str, topic: str) -> tuple[int, int]:
    """(records, bytes of key + value + headers) of every partition of `topic`, read back to its end."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-bytes-{os.getpid()}-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_uncommitted",  # every record written counts (aborted ones too)
            "fetch.wait.max.ms": 5,
        }
    )
    try:
        md = consumer.list_topics(topic, timeout=10)
        parts = sorted(md.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        pending, records, size = set(parts), 0, 0
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
                records += 1
                size += len(msg.key() or b"") + len(msg.value() or b"")
                for name, value in msg.headers() or ():
                    size += len(name.encode()) + len(value or b"")
        return records, size
    finally:
        consumer.close()


def list_topics(bootstrap: str) -> list[str]:
    from confluent_kafka.admin import AdminClient

    return sorted(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


def ensure_quix_venv() -> None:
    """The Quix venv (see QUIX_REQUIREMENT): created with venv + pip when missing."""
    if QUIX_PYTHON.exists():
        return
    _say(f"creating {QUIX_VENV} with {QUIX_REQUIREMENT} (once, ~1 minute)")
    subprocess.run([sys.executable, "-m", "venv", str(QUIX_VENV)], check=True)
    subprocess.run([str(QUIX_PYTHON), "-m", "pip", "install", "--quiet", QUIX_REQUIREMENT], check=True)


# -- Quix worker (its own process) ------------------------------------------------------------------------
def quix_worker(args: argparse.Namespace) -> int:
    """One Quix Streams application run; writes its timings to `args.result`."""
    from quixstreams import Application, message_context

    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        processing_guarantee=args.guarantee,
        state_dir=args.state_dir,
        # A SIGKILLed member stays in the group until its session times out, and the restarted app waits for
        # that before it gets its partition (45 s by default, measured ~82 s to assignment on Tansu): the
        # smallest session timeout Kafka brokers accept by default, so that recovery measures Quix, not it.
        consumer_extra_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
        loglevel="INFO" if os.environ.get("QDBG") else "WARNING",
    )
    source = app.topic(args.input, value_deserializer="json", key_deserializer="str")
    sink = app.topic(args.output, value_serializer="json", key_serializer="str")
    last = args.count - 1
    marks: dict[str, float] = {}
    started = time.perf_counter()
    started_epoch = time.time()  # the same moment on the wall clock: a parent can time from the spawn

    def observe(value: Any) -> None:
        offset = message_context().offset
        now = time.perf_counter()
        marks.setdefault("first", now)
        if args.crash_at is not None and offset >= args.crash_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if args.recover_until is not None and offset >= args.recover_until and "recovered" not in marks:
            marks["recovered"] = now
            app.stop()
        if offset >= last:
            marks["last"] = now
            app.stop()

    on_assign = app._on_assign

    def assigned(*a: Any, **kw: Any) -> Any:
        # When the group hands the partition over: Quix's own recovery (changelog restore, then
        # reprocessing since the last commit) starts here.
        marks.setdefault("assigned", time.perf_counter())
        return on_assign(*a, **kw)

    app._on_assign = assigned  # type: ignore[method-assign]
    sdf = app.dataframe(source)
    sdf = sdf.update(observe)
    sdf = sdf.apply(lambda v: v["item_price"]).tumbling_count_window(WINDOW).mean().final()
    sdf.to_topic(sink)
    app.run()
    result = {k: v - started for k, v in marks.items()}
    result["started_epoch"] = started_epoch
    Path(args.result).write_text(json.dumps(result))
    return 0


def _quix_run(
    bootstrap: str,
    input_topic: str,
    count: int,
    guarantee: str,
    tag: str,
    state_dir: Path,
    *,
    crash_at: int | None = None,
    recover_until: int | None = None,
    timeout: float = 1800,
) -> tuple[int, dict[str, float]]:
    result = state_dir.parent / f"{tag}.result.json"
    result.unlink(missing_ok=True)
    cmd = [
        str(QUIX_PYTHON),
        str(Path(__file__).resolve()),
        "_quix",
        "--bootstrap", bootstrap,
        "--input", input_topic,
        "--count", str(count),
        "--guarantee", guarantee,
        "--group", tag,
        "--output", f"{tag}-out",
        "--state-dir", str(state_dir),
        "--result", str(result),
    ]  # fmt: skip
    if crash_at is not None:
        cmd += ["--crash-at", str(crash_at)]
    if recover_until is not None:
        cmd += ["--recover-until", str(recover_until)]
    rc = subprocess.run(cmd, timeout=timeout, cwd=ROOT).returncode
    marks = json.loads(result.read_text()) if result.exists() else {}
    return rc, marks


# -- cec (the CLI, its own process) -----------------------------------------------------------------------
# The paper's window: count windows of 10 per key (bench_kafka_streams.py also passes a time window).
COUNT_WINDOW = ("--window-count", str(WINDOW))


def _cec_cmd(
    bootstrap: str,
    input_topic: str,
    out_topic: str,
    store_dir: Path,
    extra: list[str],
    window: Sequence[str] = COUNT_WINDOW,
) -> list[str]:
    return [
        str(Path(sys.executable).with_name("cec")),
        "run",
        "--input-topic", input_topic,
        "--bootstrap-servers", bootstrap,
        "--format", "json",
        "--key", "item_id",
        "--value", "item_price",
        *window,
        "--agg", "avg",
        "--output-topic", out_topic,
        "--results", str(store_dir.parent / f"{out_topic}.results.csv"),
        "--store-dir", str(store_dir),
        *extra,
    ]  # fmt: skip


def _cec_stats(store_dir: Path, out_topic: str) -> dict[str, Any]:
    return json.loads((store_dir / f".{out_topic}.0.stats.json").read_text())


def cec_throughput(
    bootstrap: str, input_topic: str, tag: str, work: Path, window: Sequence[str] = COUNT_WINDOW
) -> dict[str, Any]:
    store_dir = work / f"{tag}-store"
    out_topic = f"{tag}-out"
    proc = subprocess.run(_cec_cmd(bootstrap, input_topic, out_topic, store_dir, [], window), cwd=ROOT,
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"cec run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    stats = _cec_stats(store_dir, out_topic)
    records, size = topic_bytes(bootstrap, out_topic)
    return {
        "tuples_per_s": stats["inputs"] / stats["seconds"],
        "inputs": stats["inputs"],
        "seconds": stats["seconds"],
        "records_written": records,
        "bytes_written": size,
        "topics": [out_topic],
    }


def cec_recovery(
    bootstrap: str,
    input_topic: str,
    count: int,
    tag: str,
    work: Path,
    target_s: float,
    window: Sequence[str] = COUNT_WINDOW,
) -> dict[str, Any]:
    out_topic = f"{tag}-out"
    extra = ["--recovery-target", f"{max(target_s, 0.001) * 1000:.0f}ms"]
    first = work / f"{tag}-store-1"
    # Imported here, not at the top: the Quix worker runs this file in Quix's own venv, which has none of
    # cec's dependencies (tests.helpers imports cec).
    from tests.helpers import child_env  # the kill plan of the recovery phase (tests/killpoints)

    env = child_env(f"runtime.after_input:{count // 2}")
    rc = subprocess.run(_cec_cmd(bootstrap, input_topic, out_topic, first, extra, window), env=env, cwd=ROOT,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode  # fmt: skip
    if rc != -signal.SIGKILL:
        raise RuntimeError(f"cec was to be SIGKILLed at {count // 2} inputs, exited {rc}")
    shutil.rmtree(first)  # the state directory is lost with the process
    second = work / f"{tag}-store-2"
    proc = subprocess.run(_cec_cmd(bootstrap, input_topic, out_topic, second, extra, window), cwd=ROOT,
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"cec recovery run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    stats = _cec_stats(second, out_topic)
    rec = stats["recovery"]
    if rec is None:  # nothing of the first run reached the log (a crash before its first commit)
        raise RuntimeError(
            f"the restarted cec run {tag} found no log to recover from: crash at input too early"
        )
    return {
        "recovery_s": rec["recovery_seconds"],
        "target_s": target_s,
        "ec_build_s": rec["ec_build_seconds"],
        "ec_load_s": rec["ec_load_seconds"],
        "extent": rec["extent_records"],
        "records_read": rec["records_read"],
        "replay_span": rec["replay_span"],
        "crash_pos": rec["crash_pos"],  # the last input position in the log: where its recovery ends
        "catch_up_s": rec["catch_up_seconds"],
        "ec_windows": rec["ec_windows"],
        "replayed": rec["tuples_replayed"],
        "checkpoint_duty": stats.get("checkpoint_duty"),
        "checkpoint_budget": stats.get("checkpoint_budget"),
        "q_target": stats.get("q_target"),
        "u_target": stats.get("u_target"),
    }


def quix_throughput(
    bootstrap: str, input_topic: str, count: int, system: str, tag: str, work: Path
) -> dict[str, Any]:
    rc, marks = _quix_run(bootstrap, input_topic, count, GUARANTEE[system], tag, work / f"{tag}-state")
    if rc != 0 or "last" not in marks:
        raise RuntimeError(f"{system} run {tag} failed (exit {rc}, marks {marks})")
    seconds = marks["last"] - marks["first"]
    topics = [f"{tag}-out"] + [t for t in list_topics(bootstrap) if t.startswith(f"changelog__{tag}--")]
    records = size = 0
    by_topic: dict[str, list[int]] = {}  # topic -> [records, bytes]: output vs changelog
    for topic in topics:
        r, s = topic_bytes(bootstrap, topic)
        records, size = records + r, size + s
        by_topic[topic] = [r, s]
    return {
        "tuples_per_s": count / seconds,
        "seconds": seconds,
        "startup_s": marks["first"],
        "records_written": records,
        "bytes_written": size,
        "topics": topics,
        "by_topic": by_topic,
    }


def quix_recovery(
    bootstrap: str, input_topic: str, count: int, system: str, tag: str, work: Path
) -> dict[str, Any]:
    state = work / f"{tag}-state"
    half = count // 2
    rc, _ = _quix_run(bootstrap, input_topic, count, GUARANTEE[system], tag, state, crash_at=half)
    if rc != -signal.SIGKILL:
        raise RuntimeError(f"{system} was to be SIGKILLed at offset {half}, exited {rc}")
    shutil.rmtree(state, ignore_errors=True)  # the state directory is lost with the process
    rc, marks = _quix_run(bootstrap, input_topic, count, GUARANTEE[system], tag, state, recover_until=half)
    if rc != 0 or "recovered" not in marks:
        raise RuntimeError(f"{system} recovery run {tag} failed (exit {rc}, marks {marks})")
    return {
        "recovery_s": marks["recovered"] - marks.get("assigned", 0.0),  # from the partition's assignment
        "recovery_with_group_wait_s": marks["recovered"],  # from app.run(): the group's rejoin included
    }


# -- the comparison ---------------------------------------------------------------------------------------
def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for keys, block in result["keys"].items():
        count = block["count"]
        tput = {s: [r[s] for r in block["throughput"]] for s in SYSTEMS}
        rec = {s: [r[s] for r in block["recovery"]] for s in SYSTEMS}
        s: dict[str, Any] = {
            "tuples_per_s": {k: _median(v, "tuples_per_s") for k, v in tput.items() if v},
            "bytes_per_tuple": {k: _median(v, "bytes_written") / count for k, v in tput.items() if v},
            "recovery_s": {k: _median(v, "recovery_s") for k, v in rec.items() if v},
        }
        # Ratios per repeat (same moment of the machine), then their median.
        s["throughput_ratio"] = {
            q: statistics.median(r["cec"]["tuples_per_s"] / r[q]["tuples_per_s"] for r in block["throughput"])
            for q in GUARANTEE
            if block["throughput"]
        }
        s["bytes_ratio"] = {
            q: statistics.median(
                r["cec"]["bytes_written"] / r[q]["bytes_written"] for r in block["throughput"]
            )
            for q in GUARANTEE
            if block["throughput"]
        }
        s["recovery_ratio"] = {
            q: statistics.median(r["cec"]["recovery_s"] / r[q]["recovery_s"] for r in block["recovery"])
            for q in GUARANTEE
            if block["recovery"]
        }
        summary[keys] = s
    return summary


def goals(summary: dict[str, Any]) -> list[tuple[str, str, bool]]:
    out: list[tuple[str, str, bool]] = []
    for keys, s in summary.items():
        if "quix-alo" in s["throughput_ratio"]:
            r = s["throughput_ratio"]["quix-alo"]
            out.append((f"throughput >= 3x Quix ALO, {int(keys):,} keys", f"{r:.2f}x", r >= 3.0))
    if "1000" in summary and summary["1000"]["bytes_ratio"]:
        b = summary["1000"]["bytes_ratio"]["quix-alo"]
        out.append(("bytes/tuple <= Quix (ALO) at 1,000 keys", f"{b:.2f}x", b <= 1.0))
        b = summary["1000"]["bytes_ratio"]["quix-eos"]
        out.append(("bytes/tuple <= Quix (EOS) at 1,000 keys", f"{b:.2f}x", b <= 1.0))
    for keys, s in summary.items():
        for q in GUARANTEE:
            if q in s["recovery_ratio"]:
                r = s["recovery_ratio"][q]
                out.append(
                    (f"recovery <= 0.2x Quix {q[5:].upper()}, {int(keys):,} keys", f"{r:.2f}x", r <= 0.2)
                )
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = result["summary"]
    keys = list(summary)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = (
        ("tuples_per_s", "steady throughput (tuples/s)"),
        ("bytes_per_tuple", "bytes written per input tuple"),
        ("recovery_s", "recovery after SIGKILL at half, state lost (s)"),
    )
    width = 0.27
    colors = {"cec": "tab:blue", "quix-alo": "tab:orange", "quix-eos": "tab:red"}
    for ax, (field, title) in zip(axes, panels, strict=True):
        for i, system in enumerate(SYSTEMS):
            ys = [summary[k][field].get(system, 0.0) for k in keys]
            xs = [j + (i - 1) * width for j in range(len(keys))]
            ax.bar(xs, ys, width, label=system, color=colors[system])
        ax.set_xticks(range(len(keys)), [f"{int(k):,} keys" for k in keys])
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    fig.suptitle(
        f"cec vs Quix Streams {result.get('quix_version', '')} on one {result['broker']} broker: "
        "medians of interleaved repeats ("
        + ", ".join(f"{int(k):,} keys: {len(b['throughput'])}" for k, b in result["keys"].items())
        + ")"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def run_keys(
    bootstrap: str,
    keys: int,
    count: int,
    repeats: int,
    work: Path,
    recovery: bool,
    save_partial: bool,
    throughput: bool = True,
) -> dict[str, Any]:
    input_topic = f"bench-purchases-{keys}-{count}-{os.getpid()}"
    produce_input(bootstrap, input_topic, count, keys)
    _say(f"{keys:,} keys: {count:,} purchases in {input_topic}")
    block: dict[str, Any] = {"count": count, "input_topic": input_topic, "throughput": [], "recovery": []}
    for rep in range(repeats):
        order = SYSTEMS[rep % 3 :] + SYSTEMS[: rep % 3]  # interleaved, rotating which system goes first
        row: dict[str, Any] = {}
        for system in order if throughput else ():
            tag = f"b{os.getpid()}-{keys}-{rep}-{system}"
            if system == "cec":
                row[system] = cec_throughput(bootstrap, input_topic, tag, work)
            else:
                row[system] = quix_throughput(bootstrap, input_topic, count, system, tag, work)
            _say(
                f"  [{rep}] {system:<9} {row[system]['tuples_per_s']:>9,.0f} tuples/s  "
                f"{row[system]['bytes_written'] / count:7.1f} bytes/tuple ({row[system]['records_written']:,} records)"
            )
        if row:
            block["throughput"].append(row)
        if not recovery:
            continue
        rec: dict[str, Any] = {}
        for system in ("quix-alo", "quix-eos"):  # cec's target needs Quix's time first
            tag = f"r{os.getpid()}-{keys}-{rep}-{system}"
            rec[system] = quix_recovery(bootstrap, input_topic, count, system, tag, work)
            _say(f"  [{rep}] {system:<9} recovery {rec[system]['recovery_s']:.2f} s")
        target = min(rec[q]["recovery_s"] for q in GUARANTEE) / 5
        tag = f"r{os.getpid()}-{keys}-{rep}-cec"
        rec["cec"] = cec_recovery(bootstrap, input_topic, count, tag, work, target)
        c = rec["cec"]
        _say(
            f"  [{rep}] cec       recovery {c['recovery_s']:.2f} s (target {target:.2f} s; EC build "
            f"{c['ec_build_s'] * 1000:.0f} ms, load {c['ec_load_s'] * 1000:.0f} ms, {c['replayed']:,} replayed, "
            f"duty {c['checkpoint_duty'] or 0:.1%})"
        )
        block["recovery"].append(rec)
        if save_partial:
            # What a run cut short still leaves (a recovery-only run keeps apart from the full run's).
            name = "quix" if throughput else "quix-recovery"
            partial = HERE / "out" / f"{name}.partial-{keys}.json"
            partial.parent.mkdir(exist_ok=True)
            partial.write_text(json.dumps(block, indent=2))
    return block


_PROFILED_CLI = """
import cProfile, sys
import cec.cli.run_topic as topic_run
from cec.cli import main
run_job, out = topic_run.run_job, sys.argv.pop(1)
def profiled(*args, **kwargs):  # the operator runs in a thread of its own: profile it there
    prof = cProfile.Profile()
    try:
        return prof.runcall(run_job, *args, **kwargs)
    finally:
        prof.dump_stats(out)
topic_run.run_job = profiled
sys.exit(main(sys.argv[1:]))
"""


def profile_cec(bootstrap: str, keys: int, count: int, work: Path, top: int = 25) -> None:
    """Where a failure-free `cec run --input-topic` operator spends its time: cProfile of its `run_job`."""
    import pstats

    input_topic = f"bench-profile-{keys}-{count}-{os.getpid()}"
    produce_input(bootstrap, input_topic, count, keys)
    out_topic, store_dir, prof = f"{input_topic}-out", work / "profile-store", work / "cec.prof"
    cmd = _cec_cmd(bootstrap, input_topic, out_topic, store_dir, [])[1:]
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", _PROFILED_CLI, str(prof), *cmd],
        check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wall = time.perf_counter() - started
    stats = _cec_stats(store_dir, out_topic)
    print(
        f"cec run --input-topic, operator under cProfile: {count:,} tuples, {keys:,} keys: CLI process {wall:.2f} s, "
        f"operator {stats['seconds']:.2f} s ({stats['inputs'] / stats['seconds']:,.0f} tuples/s under the profiler)"
    )
    for order in ("tottime", "cumulative"):
        print(f"--- top {top} by {order}")
        pstats.Stats(str(prof)).sort_stats(order).print_stats(top)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "_quix":
        p = argparse.ArgumentParser()
        for name in ("bootstrap", "input", "guarantee", "group", "output", "state-dir", "result"):
            p.add_argument(f"--{name}", required=True)
        p.add_argument("--count", type=int, required=True)
        p.add_argument("--crash-at", type=int)
        p.add_argument("--recover-until", type=int)
        return quix_worker(p.parse_args(argv[1:]))
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat (a smoke run)")
    parser.add_argument("--repeats", type=int, help="interleaved repeats (default 3; 1 with --quick)")
    parser.add_argument("--keys", default="1000,100000", help="key counts, comma-separated")
    parser.add_argument("--input-small", type=int, help="tuples at 1,000 keys or fewer (default 200,000)")
    parser.add_argument(
        "--input-large", type=int, help="tuples above 1,000 keys (default 500,000: the paper's)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="only cProfile a failure-free cec run (first --keys, small input)",
    )
    parser.add_argument(
        "--from-partial",
        metavar="QUIX_VERSION",
        help="summarize the repeats a cut-short run left in benchmarks/out/quix.partial-KEYS.json",
    )
    parser.add_argument("--no-recovery", action="store_true", help="throughput and bytes only")
    parser.add_argument("--no-throughput", action="store_true", help="recovery only")
    parser.add_argument(
        "--quix-python", type=Path, help=f"a Python with {QUIX_REQUIREMENT} (default: {QUIX_VENV})"
    )
    parser.add_argument("--out", type=Path, help="result JSON (default benchmarks/out/quix.json)")
    parser.add_argument("--plot", type=Path, help="plot (default benchmarks/quix.png; none with --quick)")
    args = parser.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    key_counts = [int(k) for k in args.keys.split(",")]
    if args.quick and args.keys == parser.get_default("keys"):
        key_counts = [200]
    small = args.input_small or (4_000 if args.quick else 200_000)
    large = args.input_large or (4_000 if args.quick else 500_000)

    if args.from_partial:  # a run cut short: the repeats it finished (quix.partial-KEYS.json)
        blocks = {k: HERE / "out" / f"quix.partial-{k}.json" for k in key_counts}
        kept = {str(k): json.loads(path.read_text()) for k, path in blocks.items() if path.exists()}
        result = {
            "broker": "tansu",  # the partial runs kept were all made on Tansu
            "quix_version": args.from_partial,
            "repeats": min(len(b["throughput"]) for b in kept.values()),
            "partial": True,
            "keys": kept,
            "seconds": 0.0,
        }
        return finish(result, args)
    global QUIX_PYTHON
    if args.quix_python:
        QUIX_PYTHON = args.quix_python
    else:
        ensure_quix_venv()
    quix_version = subprocess.run(
        [str(QUIX_PYTHON), "-c", "import importlib.metadata as m; print(m.version('quixstreams'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip

    from tests.brokers import start_broker

    broker = start_broker()
    if args.profile:
        try:
            with tempfile.TemporaryDirectory(prefix="bench-quix-profile-") as tmp:
                profile_cec(broker.bootstrap, key_counts[0], small, Path(tmp))
        finally:
            broker.stop()
        return 0
    started = time.perf_counter()
    result: dict[str, Any] = {
        "broker": broker.kind,
        "quix_version": quix_version,
        "repeats": repeats,
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "load_average_start": os.getloadavg(),
        "keys": {},
    }
    try:
        with tempfile.TemporaryDirectory(prefix="bench-quix-") as tmp:
            for keys in key_counts:
                count = small if keys <= 1000 else large
                result["keys"][str(keys)] = run_keys(
                    broker.bootstrap, keys, count, repeats, Path(tmp), not args.no_recovery, not args.quick,
                    not args.no_throughput,
                )  # fmt: skip
    finally:
        broker.stop()
    result["load_average_end"] = os.getloadavg()
    result["seconds"] = time.perf_counter() - started
    return finish(result, args)


def finish(result: dict[str, Any], args: argparse.Namespace) -> int:
    """Summary, goals, ratios printed; JSON and plot written."""
    result["summary"] = summarize(result)
    result["goals"] = [{"goal": g, "measured": m, "met": ok} for g, m, ok in goals(result["summary"])]

    for keys, s in result["summary"].items():
        print(f"{int(keys):,} keys ({result['keys'][keys]['count']:,} tuples), medians:")
        for system in SYSTEMS:
            rec = s["recovery_s"].get(system)
            line = f"  {system:<9}"
            if system in s["tuples_per_s"]:
                line += f" {s['tuples_per_s'][system]:>9,.0f} tuples/s  {s['bytes_per_tuple'][system]:7.1f} bytes/tuple"
            print(line + (f"  recovery {rec:.2f} s" if rec is not None else ""))
        for q in GUARANTEE:
            line = f"  cec / {q}:"
            if q in s["throughput_ratio"]:
                line += f" throughput {s['throughput_ratio'][q]:.2f}x, bytes {s['bytes_ratio'][q]:.2f}x"
            if q in s["recovery_ratio"]:
                line += f", recovery {s['recovery_ratio'][q]:.2f}x"
            print(line)
    print("goals:")
    for g in result["goals"]:
        print(f"  {g['goal']}: {g['measured']} -> {'met' if g['met'] else 'NOT met'}")

    if not args.quick or args.out:
        out = args.out or HERE / "out" / "quix.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
        _say(f"wrote {out}")
    if not args.quick or args.plot:
        plot(result, args.plot or HERE / "quix.png")
    _say(f"done in {result.get('seconds', 0.0):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
