"""cec side by side with Kafka Streams and Quix Streams on one Apache Kafka broker, one input topic.

Workload and input: those of `bench_quix.py` (its input generation is reused): the paper's purchases
(`PurchaseGenerator`, seed 42) as JSON values keyed by item id, one partition, written once per key count
into the broker `tests.brokers` starts (Apache Kafka from the jars of `make kafka-jars`). Every system reads
that topic, each in its own process, interleaved within every repeat (the order rotates):

- **cec** (`cec run --input-topic ... --window-count 10 --agg avg`, bench_quix.py's runner) and
  **cec-time** (the same with `--time item_time --window-time W --allowed-lateness 0`);
- **kstreams**: the Java application in `benchmarks/peers/kafka-streams/` (Kafka Streams of the broker's
  version, `processing.guarantee=exactly_once_v2`): the average price per key over count windows of 10,
  by a Processor over a changelogged key-value store (count and sum per key, the window's 10th tuple emits
  the average and deletes the key); **kstreams-time**: the DSL's
  `groupByKey().windowedBy(TimeWindows.ofSizeAndGrace(W, 0)).emitStrategy(onWindowClose()).aggregate(...)`
  over the same event time (item_time) and window W, final results only;
- **quix-eos** (and **quix-alo** with `--systems`): bench_quix.py's Quix runner,
  `tumbling_count_window(10).mean().final()`, exactly-once (at-least-once).

W defaults to 10 ms x keys: an item gets 10 tuples per time window on average, as per count window.

Figures, per repeat and system:
- **steady throughput** (tuples/s): cec its `RunStats` (input tuples / seconds of its run, consumer start
  included); Quix input tuples / time from the first tuple processed to the last (bench_quix.py's figure);
  Kafka Streams the second half of the input / time from its middle tuple to its last (the JVM's JIT
  warm-up behind it; its whole-run figure, as Quix's, is kept beside it). Start-up and group join are
  excluded for the peers, which favours them;
- **bytes written per input tuple**: every topic a system writes (cec: its output log; Kafka Streams: its
  output topic + changelog topic; Quix: output + changelog) read back to its end with `read_uncommitted`,
  key + value + header bytes summed (bench_quix.py's `topic_bytes`; transaction markers and the brokers'
  batch framing are not counted, for any system);
- **recovery after kill -9 at half the input with the local state lost**: the process SIGKILLs itself when
  it reaches input offset N/2 (cec by `runtime.after_input:N/2` of tests/killpoints; the peers when their first
  node sees offset N/2: Kafka Streams runs `kill -9` on its own JVM), its state directory is deleted and
  it is started again: peers, from the partition's assignment to processing offset N/2 again (changelog
  restore + reprocessing since the last commit; the group rejoin before the assignment is kept apart);
  cec, the restarted run's recovery time (EC build + load + replay to the crash point) with
  `--recovery-target` = a fifth of the fastest peer recovery of the same window kind in the same repeat.

Ratios are cec / system per repeat (cec-time / kstreams-time for the time windows), then their median.

    .venv/bin/python benchmarks/bench_kafka_streams.py                 # 1,000 and 100,000 keys, 3 repeats
    .venv/bin/python benchmarks/bench_kafka_streams.py --quick         # small sizes, one repeat: a smoke run
    .venv/bin/python benchmarks/bench_kafka_streams.py --from-json benchmarks/out/kafka-streams.json   # plot again
Writes benchmarks/out/kafka-streams.json and benchmarks/kafka-streams.png (not with --quick unless asked).
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import bench_quix  # noqa: E402  (the input, the cec and Quix runners, topic_bytes)

__all__ = ["main"]

PEER = HERE / "peers" / "kafka-streams"
# More Kafka Streams settings for every peer run (--kstreams-config), e.g. "commit.interval.ms=1000".
KSTREAMS_CONFIG = ""
PEER_JAR = PEER / "target" / "kstreams-peer.jar"
ALL_SYSTEMS = ("cec", "kstreams", "quix-eos", "quix-alo", "cec-time", "kstreams-time")
DEFAULT_SYSTEMS = ("cec", "kstreams", "quix-eos", "cec-time", "kstreams-time")
# Which cec run each system is compared with (its window kind).
BASELINE = {"kstreams": "cec", "quix-eos": "cec", "quix-alo": "cec", "kstreams-time": "cec-time"}
QUIX = {"quix-eos", "quix-alo"}
KSTREAMS = {"kstreams", "kstreams-time"}


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Progress:
    """Runs done out of the total, their rate and the time left, on stderr."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.started = total, 0, time.perf_counter()
        self.load: list[float] = [os.getloadavg()[0]]

    def step(self, what: str) -> None:
        self.done += 1
        self.load.append(os.getloadavg()[0])
        minutes = (time.perf_counter() - self.started) / 60
        rate = self.done / minutes if minutes > 0 else 0.0
        left = (self.total - self.done) / rate if rate > 0 else float("nan")
        _say(
            f"[{self.done}/{self.total} runs, {minutes:.1f} min, {rate:.2f} runs/min, ~{left:.0f} min left, "
            f"load {self.load[-1]:.1f}] {what}"
        )


def _cec_commit() -> str:
    """The commit of cec that ran ("+dirty" with uncommitted changes to tracked files)."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return "unknown"
    dirty = subprocess.run([*git, "diff", "--quiet", "HEAD"]).returncode != 0
    return head.stdout.strip() + ("+dirty" if dirty else "")


# -- the Kafka Streams peer -------------------------------------------------------------------------------
def ensure_peer_jar() -> None:
    """`mvn -q package` when the jar is missing or older than its sources or pom."""
    sources = [PEER / "pom.xml", *PEER.glob("src/**/*")]
    newest = max(p.stat().st_mtime for p in sources if p.is_file())
    if PEER_JAR.exists() and PEER_JAR.stat().st_mtime >= newest:
        return
    _say(f"building {PEER_JAR.relative_to(ROOT)} with mvn -q package")
    subprocess.run(["mvn", "-q", "-B", "-Dstyle.color=never", "package"], cwd=PEER, check=True)


def _java() -> str:
    home = os.environ.get("JAVA_HOME", "").strip()
    return str(Path(home) / "bin" / "java") if home else "java"


def create_topic(bootstrap: str, topic: str) -> None:
    """An output topic for a peer that does not create its own (the broker does not auto-create)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"retention.ms": "-1", "retention.bytes": "-1"}
    for future in admin.create_topics([NewTopic(topic, 1, 1, config=config)]).values():
        future.result()


def _kstreams_run(
    bootstrap: str,
    input_topic: str,
    count: int,
    mode: str,
    window_ms: int,
    time_base_ms: int,
    tag: str,
    state_dir: Path,
    heap: str,
    *,
    crash_at: int | None = None,
    recover_until: int | None = None,
    timeout: float = 3600,
) -> tuple[int, dict[str, Any], str]:
    result = state_dir.parent / f"{tag}.result.json"
    result.unlink(missing_ok=True)
    cmd = [
        _java(), f"-Xmx{heap}", "-jar", str(PEER_JAR),
        "--bootstrap", bootstrap,
        "--input", input_topic,
        "--output", f"{tag}-out",
        "--application-id", tag,
        "--state-dir", str(state_dir),
        "--count", str(count),
        "--result", str(result),
        "--mode", mode,
        "--window-ms", str(window_ms),
        "--time-base-ms", str(time_base_ms),
    ]  # fmt: skip
    if crash_at is not None:
        cmd += ["--crash-at", str(crash_at)]
    if recover_until is not None:
        cmd += ["--recover-until", str(recover_until)]
    if KSTREAMS_CONFIG:
        cmd += ["--streams-config", KSTREAMS_CONFIG]
    proc = subprocess.run(cmd, timeout=timeout, cwd=ROOT, capture_output=True, text=True)
    marks = json.loads(result.read_text()) if result.exists() else {}
    return proc.returncode, marks, proc.stderr[-3000:]


def _written(bootstrap: str, topics: list[str]) -> dict[str, Any]:
    records = size = 0
    by_topic: dict[str, list[int]] = {}  # topic -> [records, bytes]: output vs changelog
    for topic in topics:
        r, s = bench_quix.topic_bytes(bootstrap, topic)
        records, size = records + r, size + s
        by_topic[topic] = [r, s]
    return {"records_written": records, "bytes_written": size, "topics": topics, "by_topic": by_topic}


def kstreams_throughput(
    bootstrap: str, input_topic: str, count: int, mode: str, window_ms: int, base: int, tag: str, work: Path,
    heap: str,
) -> dict[str, Any]:  # fmt: skip
    create_topic(bootstrap, f"{tag}-out")
    rc, marks, err = _kstreams_run(
        bootstrap, input_topic, count, mode, window_ms, base, tag, work / f"{tag}-state", heap
    )
    if rc != 0 or "last" not in marks:
        raise RuntimeError(f"kstreams run {tag} failed (exit {rc}, marks {marks}): {err}")
    seconds = marks["last"] - marks["first"]
    second_half = count - 1 - count // 2  # tuples processed after the "half" mark
    # Kafka Streams names a store's changelog APPLICATION_ID-STORE-changelog (the peer's stores: PeerApp);
    # matched exactly: a prefix match took the time variant's changelog (tag + "-time-...") for its own.
    store = "time-count-sum" if mode == "time" else "count-sum"
    changelogs = [t for t in bench_quix.list_topics(bootstrap) if t == f"{tag}-{store}-changelog"]
    if len(changelogs) != 1:
        raise RuntimeError(f"kstreams run {tag}: no changelog topic {tag}-{store}-changelog")
    return {
        # The JVM's steady rate: the second half of the input, its JIT warm-up behind it (over the whole run,
        # as Quix is measured, the warm-up weighs on short inputs: kept beside it).
        "tuples_per_s": second_half / (marks["last"] - marks["half"]),
        "tuples_per_s_whole_run": count / seconds,
        "seconds": seconds,
        "startup_s": marks["first"],
        "close_s": marks["closed"] - marks["stopping"],
        "version": marks.get("kafka_streams_version"),
        **_written(bootstrap, [f"{tag}-out", *changelogs]),
    }


def kstreams_recovery(
    bootstrap: str, input_topic: str, count: int, mode: str, window_ms: int, base: int, tag: str, work: Path,
    heap: str,
) -> dict[str, Any]:  # fmt: skip
    state = work / f"{tag}-state"
    half = count // 2
    create_topic(bootstrap, f"{tag}-out")
    rc, _, err = _kstreams_run(
        bootstrap, input_topic, count, mode, window_ms, base, tag, state, heap, crash_at=half
    )
    if rc != -signal.SIGKILL:
        raise RuntimeError(f"kstreams {tag} was to be SIGKILLed at offset {half}, exited {rc}: {err}")
    shutil.rmtree(state, ignore_errors=True)  # the state directory is lost with the process
    rc, m, err = _kstreams_run(
        bootstrap, input_topic, count, mode, window_ms, base, tag, state, heap, recover_until=half
    )
    if rc != 0 or "recovered" not in m or "assigned" not in m:
        raise RuntimeError(f"kstreams recovery run {tag} failed (exit {rc}, marks {m}): {err}")
    restore_start = m.get("restore_start", m["assigned"])
    restore_end = m.get("restore_end", restore_start)
    return {
        "recovery_s": m["recovered"] - m["assigned"],  # from the partition's assignment, as Quix's
        "recovery_with_group_wait_s": m["recovered"] - m["start"],  # from KafkaStreams.start()
        "to_restore_start_s": restore_start - m["assigned"],
        "restore_s": restore_end - restore_start,
        "catch_up_s": m["recovered"] - restore_end,
        "resume_s": m["first"] - restore_end,  # from the restore's end to the first tuple processed again
        "restored_records": m.get("restored_records", 0),
        "reprocessed": half - m["first_offset"],  # input since the last commit before the crash
    }


# -- one key count ----------------------------------------------------------------------------------------
def _cec_window(system: str, window_ms: int) -> list[str]:
    if system == "cec-time":
        return ["--time", "item_time", "--window-time", f"{window_ms}ms", "--allowed-lateness", "0"]
    return list(bench_quix.COUNT_WINDOW)


def throughput_run(
    system: str, bootstrap: str, topic: str, count: int, window_ms: int, base: int, tag: str, work: Path,
    heap: str,
) -> dict[str, Any]:  # fmt: skip
    if system.startswith("cec"):
        return bench_quix.cec_throughput(bootstrap, topic, tag, work, _cec_window(system, window_ms))
    if system in KSTREAMS:
        mode = "time" if system == "kstreams-time" else "count"
        return kstreams_throughput(bootstrap, topic, count, mode, window_ms, base, tag, work, heap)
    return bench_quix.quix_throughput(bootstrap, topic, count, system, tag, work)


def recovery_run(
    system: str, bootstrap: str, topic: str, count: int, window_ms: int, base: int, tag: str, work: Path,
    heap: str,
) -> dict[str, Any]:  # fmt: skip
    if system in KSTREAMS:
        mode = "time" if system == "kstreams-time" else "count"
        return kstreams_recovery(bootstrap, topic, count, mode, window_ms, base, tag, work, heap)
    return bench_quix.quix_recovery(bootstrap, topic, count, system, tag, work)


def run_keys(
    bootstrap: str,
    keys: int,
    count: int,
    systems: Sequence[str],
    repeats: int,
    work: Path,
    args: argparse.Namespace,
    progress: Progress,
    partial: Path | None,
) -> dict[str, Any]:
    input_topic = f"bench-purchases-{keys}-{count}-{os.getpid()}"
    bench_quix.produce_input(bootstrap, input_topic, count, keys)
    window_ms = args.window_ms or 10 * keys
    # Event time for Kafka Streams: item_time (ms from 0) on a recent base, a multiple of the window so that
    # windows start where cec's do; 1970 timestamps would be deleted by the changelogs' retention at once.
    base = int(time.time() * 1000) // window_ms * window_ms
    _say(f"{keys:,} keys: {count:,} purchases in {input_topic}; time windows of {window_ms:,} ms")
    block: dict[str, Any] = {
        "count": count,
        "input_topic": input_topic,
        "window_ms": window_ms,
        "throughput": [],
        "recovery": [],
    }
    for rep in range(repeats):
        shift = rep % len(systems)
        order = list(systems[shift:]) + list(systems[:shift])  # interleaved, rotating which goes first
        row: dict[str, Any] = {}
        for system in order if not args.no_throughput else ():
            tag = f"b{os.getpid()}-{keys}-{rep}-{system}"
            row[system] = throughput_run(
                system, bootstrap, input_topic, count, window_ms, base, tag, work, args.heap
            )
            progress.step(
                f"{keys:,} keys [{rep}] {system:<13} {row[system]['tuples_per_s']:>9,.0f} tuples/s  "
                f"{row[system]['bytes_written'] / count:7.1f} bytes/tuple ({row[system]['records_written']:,} records)"
            )
        if row:
            row["load_average"] = os.getloadavg()
            block["throughput"].append(row)
        if not args.no_recovery:
            rec: dict[str, Any] = {}
            peers = [s for s in order if not s.startswith("cec")]
            for system in peers:  # cec's target needs the peers' times first
                tag = f"r{os.getpid()}-{keys}-{rep}-{system}"
                rec[system] = recovery_run(
                    system, bootstrap, input_topic, count, window_ms, base, tag, work, args.heap
                )
                r = rec[system]
                detail = ""
                if system in KSTREAMS:
                    detail = (
                        f" (to restore {r['to_restore_start_s']:.2f} s, restore {r['restore_s']:.2f} s of "
                        f"{r['restored_records']:,} records, catch-up {r['catch_up_s']:.2f} s of {r['reprocessed']:,} tuples)"
                    )
                progress.step(f"{keys:,} keys [{rep}] {system:<13} recovery {r['recovery_s']:.2f} s{detail}")
            for system in (s for s in order if s.startswith("cec")):
                mine = [rec[p]["recovery_s"] for p in peers if BASELINE[p] == system]
                target = args.cec_recovery_target or (min(mine) / 5 if mine else 1.0)
                tag = f"r{os.getpid()}-{keys}-{rep}-{system}"
                rec[system] = bench_quix.cec_recovery(
                    bootstrap, input_topic, count, tag, work, target, _cec_window(system, window_ms)
                )
                c = rec[system]
                # cec's recovery ends at its crash point, the last input position its log holds; the input
                # it had read past that, up to N/2, is processed again after it as live input (the peers'
                # figures include their reprocessing since their last commit): kept apart, with the time
                # it takes at cec's steady rate of the same repeat.
                c["crash_gap"] = count // 2 - sum(c["crash_pos"])
                if system in row:
                    c["to_half_estimate_s"] = c["recovery_s"] + c["crash_gap"] / row[system]["tuples_per_s"]
                progress.step(
                    f"{keys:,} keys [{rep}] {system:<13} recovery {c['recovery_s']:.2f} s (target {target:.2f} s; "
                    f"EC build {c['ec_build_s'] * 1000:.0f} ms, load {c['ec_load_s'] * 1000:.0f} ms, "
                    f"{c['replayed']:,} replayed; crash point {c['crash_gap']:,} tuples before N/2)"
                )
            rec["load_average"] = os.getloadavg()
            block["recovery"].append(rec)
        if partial is not None:  # what a run cut short still leaves
            partial.parent.mkdir(exist_ok=True)
            partial.write_text(json.dumps(block, indent=2))
    return block


# -- summary ----------------------------------------------------------------------------------------------
def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    systems = result["systems"]
    for keys, block in result["keys"].items():
        count = block["count"]
        tput, rec = block["throughput"], block["recovery"]
        s: dict[str, Any] = {"tuples_per_s": {}, "bytes_per_tuple": {}, "recovery_s": {}, "ratios": {}}
        for system in systems:
            if tput:
                s["tuples_per_s"][system] = _stats([r[system]["tuples_per_s"] for r in tput])
                s["bytes_per_tuple"][system] = _stats([r[system]["bytes_written"] / count for r in tput])
            if rec:
                s["recovery_s"][system] = _stats([r[system]["recovery_s"] for r in rec])
        for peer, base in BASELINE.items():
            if peer not in systems or base not in systems:
                continue
            ratios: dict[str, Any] = {}
            if tput:  # per repeat (the same moment of the machine), then the median
                ratios["throughput"] = _stats(
                    [r[base]["tuples_per_s"] / r[peer]["tuples_per_s"] for r in tput]
                )
                ratios["bytes"] = _stats([r[base]["bytes_written"] / r[peer]["bytes_written"] for r in tput])
            if rec:
                ratios["recovery"] = _stats([r[base]["recovery_s"] / r[peer]["recovery_s"] for r in rec])
            s["ratios"][f"{base} / {peer}"] = ratios
        summary[keys] = s
    return summary


def _fmt(st: dict[str, float], spec: str) -> str:
    return f"{st['median']:{spec}} ({st['min']:{spec}}-{st['max']:{spec}})"


def report(result: dict[str, Any]) -> None:
    for keys, s in result["summary"].items():
        block = result["keys"][keys]
        print(
            f"{int(keys):,} keys ({block['count']:,} tuples, time windows {block['window_ms']:,} ms), medians (ranges):"
        )
        for system in result["systems"]:
            line = f"  {system:<13}"
            if system in s["tuples_per_s"]:
                line += f" {_fmt(s['tuples_per_s'][system], ',.0f')} tuples/s  "
                line += f"{_fmt(s['bytes_per_tuple'][system], '.1f')} bytes/tuple"
            if system in s["recovery_s"]:
                line += f"  recovery {_fmt(s['recovery_s'][system], '.2f')} s"
            print(line)
        for name, ratios in s["ratios"].items():
            parts = [f"{what} {_fmt(st, '.2f')}x" for what, st in ratios.items()]
            print(f"  {name}: " + ", ".join(parts))
    load = result["load_average"]
    print(f"load average (1 min) during the run: {_fmt(load, '.1f')}")


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, systems = result["summary"], result["systems"]
    keys = list(summary)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    panels = (
        ("tuples_per_s", "steady throughput (tuples/s)"),
        ("bytes_per_tuple", "bytes written per input tuple"),
        ("recovery_s", "recovery after kill -9 at half, state lost (s)"),
    )
    width = 0.8 / len(systems)
    colors = {
        "cec": "tab:blue",
        "kstreams": "tab:green",
        "quix-eos": "tab:red",
        "quix-alo": "tab:orange",
        "cec-time": "lightsteelblue",
        "kstreams-time": "yellowgreen",
    }
    for ax, (field, title) in zip(axes, panels, strict=True):
        for i, system in enumerate(systems):
            stats = [summary[k][field].get(system) for k in keys]
            xs = [j + (i - (len(systems) - 1) / 2) * width for j in range(len(keys))]
            ys = [st["median"] if st else 0.0 for st in stats]
            lo = [st["median"] - st["min"] if st else 0.0 for st in stats]
            hi = [st["max"] - st["median"] if st else 0.0 for st in stats]
            ax.bar(xs, ys, width, label=system, color=colors[system], yerr=[lo, hi], capsize=2)
        ax.set_xticks(range(len(keys)), [f"{int(k):,} keys" for k in keys])
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    load = result["load_average"]
    fig.suptitle(
        f"cec vs Kafka Streams {result.get('kafka_streams_version', '')} (exactly_once_v2) vs Quix Streams "
        f"{result.get('quix_version', '')} on one {result['broker']} broker: medians and ranges of "
        f"{result['repeats']} interleaved repeats; load average {load['min']:.1f}-{load['max']:.1f}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat (a smoke run)")
    parser.add_argument("--repeats", type=int, help="interleaved repeats (default 3; 1 with --quick)")
    parser.add_argument("--keys", default="1000,100000", help="key counts, comma-separated")
    parser.add_argument(
        "--input-small",
        type=int,
        help="tuples at 1,000 keys or fewer (default 500,000: long enough for the JVM's warm-up)",
    )
    parser.add_argument(
        "--input-large", type=int, help="tuples above 1,000 keys (default 500,000: the paper's)"
    )
    parser.add_argument(
        "--systems",
        default=",".join(DEFAULT_SYSTEMS),
        help=f"comma-separated, of {', '.join(ALL_SYSTEMS)} (default: %(default)s)",
    )
    parser.add_argument("--window-ms", type=int, help="the time window (default 10 ms x keys)")
    parser.add_argument("--no-recovery", action="store_true", help="throughput and bytes only")
    parser.add_argument("--no-throughput", action="store_true", help="recovery only")
    parser.add_argument(
        "--cec-recovery-target",
        type=float,
        help="cec's --recovery-target in seconds (default: a fifth of the fastest peer's recovery)",
    )
    parser.add_argument(
        "--kstreams-config",
        default="",
        help="more Kafka Streams settings, name=value,... (default: none; e.g. commit.interval.ms=1000)",
    )
    parser.add_argument("--heap", default="1g", help="the Kafka Streams JVM's -Xmx (default %(default)s)")
    parser.add_argument("--quix-python", type=Path, help="a Python with Quix Streams (bench_quix.py's)")
    parser.add_argument("--out", type=Path, help="result JSON (default benchmarks/out/kafka-streams.json)")
    parser.add_argument(
        "--from-json",
        type=Path,
        help="no run: the summary, the report and the plot again from a result JSON this script wrote",
    )
    parser.add_argument(
        "--plot", type=Path, help="plot (default benchmarks/kafka-streams.png; none with --quick)"
    )
    args = parser.parse_args(argv)
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        saved["summary"] = summarize(saved)
        report(saved)
        plot(saved, args.plot or HERE / "kafka-streams.png")
        return 0
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(ALL_SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {', '.join(unknown)} (known: {', '.join(ALL_SYSTEMS)})")
    for peer in systems:
        if peer in BASELINE and BASELINE[peer] not in systems:
            parser.error(f"{peer} is compared with {BASELINE[peer]}: add it to --systems")
    repeats = args.repeats or (1 if args.quick else 3)
    key_counts = [int(k) for k in args.keys.split(",")]
    if args.quick and args.keys == parser.get_default("keys"):
        key_counts = [200]
    # --quick: 50,000 tuples; with 20,000, cec's crash at half came before its first commit (nothing to recover).
    small = args.input_small or (50_000 if args.quick else 500_000)
    large = args.input_large or (50_000 if args.quick else 500_000)

    global KSTREAMS_CONFIG
    KSTREAMS_CONFIG = args.kstreams_config
    if any(s in KSTREAMS for s in systems):
        ensure_peer_jar()
    quix_version = None
    if any(s in QUIX for s in systems):
        if args.quix_python:
            bench_quix.QUIX_PYTHON = args.quix_python
        else:
            bench_quix.ensure_quix_venv()
        quix_version = subprocess.run(
            [str(bench_quix.QUIX_PYTHON), "-c", "import importlib.metadata as m; print(m.version('quixstreams'))"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip

    from tests.brokers import start_broker

    broker = start_broker()
    _say(f"broker: {broker.describe()}")
    per_repeat = len(systems) * ((0 if args.no_throughput else 1) + (0 if args.no_recovery else 1))
    progress = Progress(len(key_counts) * repeats * per_repeat)
    out = args.out or HERE / "out" / "kafka-streams.json"
    started = time.perf_counter()
    result: dict[str, Any] = {
        "broker": broker.kind,
        "broker_version": broker.version,
        "quix_version": quix_version,
        "cec_commit": _cec_commit(),
        "systems": systems,
        "repeats": repeats,
        "kstreams_config": {
            "processing.guarantee": "exactly_once_v2",
            "commit.interval.ms": "100 (the default under exactly-once)",
            "statestore.cache.max.bytes": "10 MB (the default); caching on for the count and the window store",
            "num.stream.threads": 1,
            "main consumer session.timeout.ms": 6000,
            "jvm": f"-Xmx{args.heap}",
            "more": args.kstreams_config or None,
        },
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "keys": {},
    }
    try:
        with tempfile.TemporaryDirectory(prefix="bench-kstreams-") as tmp:
            for keys in key_counts:
                count = small if keys <= 1000 else large
                partial = None if args.quick else out.with_name(f"{out.stem}.partial-{keys}.json")
                result["keys"][str(keys)] = run_keys(
                    broker.bootstrap, keys, count, systems, repeats, Path(tmp), args, progress, partial
                )
    finally:
        broker.stop()
    result["finished_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    result["seconds"] = time.perf_counter() - started
    result["load_average"] = _stats(progress.load)
    result["load_average_samples"] = progress.load
    versions = [
        r[s]["version"]
        for b in result["keys"].values()
        for r in b["throughput"]
        for s in systems
        if s in KSTREAMS
    ]
    result["kafka_streams_version"] = versions[0] if versions else None
    result["summary"] = summarize(result)
    report(result)
    if not args.quick or args.out:
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
        _say(f"wrote {out}")
    if not args.quick or args.plot:
        plot(result, args.plot or HERE / "kafka-streams.png")
    _say(f"done in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
