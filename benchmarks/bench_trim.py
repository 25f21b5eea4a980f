"""Bounded trimming over a growing input: the records a trimmed log retains stay flat while the input grows.

What `cec run --trim-every N` does, on the local engine: one operator instance per partition (the paper's
aggregate, avg per item over tumbling count windows, on the purchase generator), side by side in threads,
and the results writer (`IncrementalOutputs`, registered consumer `cec-run-results`) writing the results
CSV as the run goes, the operators pacing on it (`TrimPace`, lag N + its commit interval); after the run,
the final trim past the writer's last acknowledgement (`trim_after_consumers`). Each configuration (store
x partitions) runs at the base input and at `--scale` times it, and once more without trimming at the
base input (the throughput baseline, in this same script). Each run's CPU seconds (this process: every
operator thread and the writer; a broker's are not counted) and the load average at its end are reported
beside the wall-clock figures, which a loaded machine distorts.

Reported per run: records produced, the largest number of offsets a partition kept right after any trim
(`RunStats.trims`), the largest bound stated for it (max(what recovery needed, N + C)), what each partition
keeps at the end, and the throughput against the untrimmed run.

    flock /tmp/cec-bench.lock nice -n 5 .venv/bin/python -u benchmarks/bench_trim.py --tuples 1000000 \\
        --scale 10 --partitions 1 3 --plot benchmarks/out/trim-10m.png [--apache-kafka | --bootstrap-servers HOST:PORT]

With `--apache-kafka` (a broker started from its jars, as the tests do) or `--bootstrap-servers` (or
CEC_BOOTSTRAP_SERVERS) the Kafka store runs too (trims are `delete_records`).

`--hosts attached` (or `local attached`) runs the attached query too (Kafka only): `cec_aggregate(...,
trim_every=N)` with Trigger.AvailableNow over an input topic of the same purchases (written first by the
local engine's pass-all filter), P input and output partitions, its write tasks trimming on the executors
(no registered consumer: each trim goes to the extent's start). A sampler thread reads every partition's
log start and end while the query runs (offsets kept against offsets written); CPU seconds are the whole
process tree's (driver, its JVM and Python workers, those that exited included, from /proc), the
broker's excluded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from cec.config import Checkpointing
from operators.aggregate import RESULT_SCHEMA
from operators.base import DEAD_LETTER_SCHEMA
from operators.engine.stats import RunStats
from operators.engine.trimming import TrimPace
from operators.incremental_outputs import COMMIT_EVERY, RESULTS_CONSUMER, IncrementalOutputs
from operators.job import JobSpec, instance_spec, run_job
from operators.local_trim import trim_after_consumers
from operators.sinks import write_outputs
from queuestore.base import QueueStore
from queuestore.factory import open_store, store_spec

RESULT_COLUMNS = ["key", "window", "value", "count", "start", "end"]


@dataclass
class Outcome:
    store: str
    partitions: int
    tuples: int
    trim_every: int | None
    seconds: float
    cpu_seconds: float  # this process's CPU time (every operator thread and the writer; not a broker's)
    load: float  # the 1-minute load average when the run ended
    produced: int  # offsets written over all partitions
    kept_max: int  # most offsets one partition kept right after a trim
    stated_max: int  # the bound stated for that trim: max(what recovery needed, N + C)
    over: int  # trims that kept more than their stated bound
    kept_end: list[int]  # offsets each partition keeps at the end
    trims: int
    waits: int  # due points at which an operator waited for the writer
    samples: list[tuple[int, int]]  # (inputs of partition 0, offsets kept) at each of its trims
    trimmed: int = 0  # the attached query: offsets its write tasks trimmed (`cec_progress`)


def template(
    kind: str, root: Path, bootstrap: str | None, tuples: int, partitions: int, keys: int
) -> JobSpec:
    topic = f"bench-trim-{uuid.uuid4().hex[:8]}"
    return JobSpec(
        operator={"type": "aggregate", "key_field": "item_id", "value_field": "item_price", "agg": "avg",
                  "window_count": 10},
        source={"type": "generator", "count": tuples, "keys": keys, "seed": 1, "partitions": partitions},
        store=store_spec(root, bootstrap if kind == "kafka" else None),
        output_topic=topic,
        output_partitions=partitions,
        checkpointing=Checkpointing(u_target=20_000, ci_ms=30.0, cp_ms=100.0),
    )  # fmt: skip


def run_instances(specs: list[JobSpec]) -> list[RunStats]:
    stats: list[RunStats | None] = [None] * len(specs)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            stats[i] = run_job(specs[i])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(specs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [s for s in stats if s is not None]


def log_extent(store: QueueStore, topic: str, partitions: int) -> tuple[int, list[int]]:
    produced, kept = 0, []
    for p in range(partitions):
        with store.reader(topic, p) as reader:
            start, end = reader.start_offset(), reader.end_offset()
        produced += end
        kept.append(end - start)
    return produced, kept


def one_run(
    kind: str, root: Path, bootstrap: str | None, tuples: int, partitions: int, keys: int, every: int | None
) -> Outcome:
    spec = template(kind, root, bootstrap, tuples, partitions, keys)
    if every is not None:
        spec = replace(spec, trim_every=every, trim_pace=TrimPace(RESULTS_CONSUMER, every + COMMIT_EVERY))
    specs = [instance_spec(spec, p) for p in range(partitions)]
    store = open_store(spec.store)
    try:
        store.create_topic(spec.output_topic, partitions)
        started, cpu_started = time.perf_counter(), time.process_time()
        if every is None:  # as `cec run` without trimming: the job, then the results from the whole log
            stats = run_instances(specs)
            files = (root / "out.csv", RESULT_COLUMNS)
            write_outputs(
                store, spec.output_topic, RESULT_SCHEMA, DEAD_LETTER_SCHEMA, files, root / "dead.csv"
            )
        else:
            writer = IncrementalOutputs(
                store, spec.output_topic, RESULT_SCHEMA, DEAD_LETTER_SCHEMA, (root / "out.csv", RESULT_COLUMNS),
                root / "out.dead-letters.csv", root / "progress.json",
            ).open()  # fmt: skip
            try:
                with writer.running():
                    stats = run_instances(specs)
                for p, s in enumerate(stats):
                    if s.trim_bound is not None:
                        trim_after_consumers(store, spec.output_topic, p, s.trim_bound)
            finally:
                writer.close()
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        produced, kept_end = log_extent(store, spec.output_topic, partitions)
    finally:
        store.close()
    lag = 0 if every is None else every + COMMIT_EVERY
    trims = [t for s in stats for t in s.trims]
    worst = max(trims, key=lambda t: t[1], default=(0, 0, 0))
    over = sum(kept > max(needed, lag) for _, kept, needed in trims)
    return Outcome(
        kind, partitions, tuples, every, seconds, cpu_seconds, os.getloadavg()[0], produced, worst[1], max(worst[2], lag), over, kept_end,
        len(trims), sum(s.trim_waits for s in stats), [(i, k) for i, k, _ in stats[0].trims],
    )  # fmt: skip


# -- the attached query -----------------------------------------------------------------------------------


def tree_cpu_seconds() -> float:
    """CPU seconds of this process and every live descendant (the JVM, Spark's Python workers), from /proc,
    with the children each of them reaped (utime + stime + cutime + cstime): a Python worker that exits
    between two readings still counts, in its reaping parent's figure. A broker started by `--apache-kafka`
    (a child of this process) is left out."""
    ticks = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        times[pid] = sum(int(f) for f in fields[11:15]) / ticks
    total, todo = 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        if _is_broker(pid):  # `--apache-kafka` starts the broker as a child of this process
            continue
        total += times.get(pid, 0.0)
        todo.extend(children.get(pid, []))
    return total


def _is_broker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"\0kafka.Kafka\0" in fh.read()
    except OSError:
        return False


def write_attached_input(root: Path, bootstrap: str, tuples: int, partitions: int, keys: int) -> str:
    """The purchases as CEC R records in a topic of `partitions` partitions (a pass-all filter stage)."""
    topic = f"bench-trim-in-{uuid.uuid4().hex[:8]}"
    spec = JobSpec(
        operator={"type": "filter", "field": "item_price", "op": ">", "value": 0, "schema": "purchase"},
        source={"type": "generator", "count": tuples, "keys": keys, "seed": 1, "partitions": partitions},
        store=store_spec(root / "input", bootstrap),
        output_topic=topic,
        output_partitions=partitions,
        batch_size=1024,
    )  # fmt: skip
    for p in range(partitions):
        assert run_job(instance_spec(spec, p)).completed
    return topic


def attached_run(
    root: Path, bootstrap: str, input_topic: str, tuples: int, partitions: int, every: int | None
) -> Outcome:
    from operators.spark.attach import cec_aggregate
    from operators.spark.session import local_session
    from queuestore.kafka import KafkaQueueStore

    spark = local_session(
        f"local[{max(2, partitions)},3]", app_name="bench-trim", shuffle_partitions=partitions
    )
    output = f"bench-trim-att-{uuid.uuid4().hex[:8]}"
    store = KafkaQueueStore(bootstrap, root / "observer")
    samples: list[tuple[int, int]] = []  # (offsets written to partition 0, offsets it keeps)
    kept_max = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):  # a sampling period of the figure, nothing depends on it
            try:
                kept = []
                for q in range(partitions):
                    with store.reader(output, q) as reader:
                        start, end = reader.start_offset(), reader.end_offset()
                    kept.append(end - start)
                    if q == 0:
                        samples.append((end, end - start))
                kept_max[0] = max(kept_max[0], *kept)
            except Exception:  # the topic is not there yet
                continue

    sampler = threading.Thread(target=sample, daemon=True)
    started, cpu_started = time.perf_counter(), tree_cpu_seconds()
    sampler.start()
    try:
        query = cec_aggregate(
            spark, input_topic=input_topic, bootstrap_servers=bootstrap, output_topic=output, key="item_id",
            value="item_price", agg="avg", window_count=10, state_dir=str(root / "state"),
            checkpoint_location=str(root / "checkpoints"), partitions=partitions, available_now=True,
            max_records_per_trigger=100_000, trim_every=every,
        )  # fmt: skip
        query.awaitTermination()
        seconds, cpu_seconds = time.perf_counter() - started, tree_cpu_seconds() - cpu_started
        assert query.exception() is None, query.exception()
        figures = query.cec_progress
    finally:
        done.set()
        sampler.join()
    try:
        produced, kept_end = log_extent(store, output, partitions)
    finally:
        store.close()
    return Outcome(
        "attached", partitions, tuples, every, seconds, cpu_seconds, os.getloadavg()[0], produced,
        kept_max[0], 0, 0, kept_end, 0, 0, samples, int(figures["trimmed_offsets"]),
    )  # fmt: skip


def measure_attached(args: argparse.Namespace, outcomes: list[Outcome]) -> None:
    print(f"attached query, Apache Kafka, trim every {args.trim_every:,} (kept max: sampled every 0.5 s; "
          "cpu: the driver's process tree)")  # fmt: skip
    for partitions in args.partitions:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            small = args.attached_tuples or args.tuples
            inputs = {n: write_attached_input(root / f"in{n}", args.bootstrap_servers, n, partitions, args.keys)
                      for n in (small, small * args.scale)}  # fmt: skip
            base: Outcome | None = None
            for tuples, every in (
                (small, None),
                (small, args.trim_every),
                (small * args.scale, args.trim_every),
            ):
                o = attached_run(root / f"run-{tuples}-{every}", args.bootstrap_servers, inputs[tuples],
                                 tuples, partitions, every)  # fmt: skip
                base = base or o
                outcomes.append(o)
                report(o, base)
                save(args, outcomes)


def report(o: Outcome, base: Outcome) -> None:
    rate = o.tuples / o.seconds
    ratio = rate / (base.tuples / base.seconds)
    # CPU seconds per tuple of the untrimmed base run over this run's: above 1, this run spent less.
    cpu_ratio = (base.cpu_seconds / base.tuples) / (o.cpu_seconds / o.tuples)
    print(f"{o.store:>8} {o.partitions:>2} {o.tuples:>10,} {'off' if o.trim_every is None else o.trim_every:>6} "
          f"{o.seconds:>7.1f} {o.cpu_seconds:>7.1f} {o.load:>5.1f} {rate:>9,.0f} {ratio:>6.2f} "
          f"{cpu_ratio:>9.2f} {o.produced:>10,} {o.kept_max:>9,} {o.stated_max:>7,} {o.over:>4} "
          f"{o.trims:>6,} {o.waits:>6,}  {o.kept_end}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tuples", type=int, default=200_000, help="the base input (all partitions)")
    parser.add_argument("--scale", type=int, default=10, help="the larger input is this many times the base")
    parser.add_argument("--partitions", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--keys", type=int, default=2_000)
    parser.add_argument("--trim-every", type=int, default=10_000)
    parser.add_argument("--bootstrap-servers", default=os.environ.get("CEC_BOOTSTRAP_SERVERS"))
    parser.add_argument(
        "--apache-kafka",
        action="store_true",
        help="start Apache Kafka from its jars (as the tests do) and use it",
    )
    parser.add_argument("--plot", type=Path, default=None, help="write the plot here (PNG)")
    parser.add_argument("--hosts", nargs="+", choices=["local", "attached"], default=["local"])
    parser.add_argument("--stores", nargs="+", choices=["sqlite", "kafka"], default=["sqlite", "kafka"],
                        help="the local engine's stores (kafka: only with a broker)")  # fmt: skip
    parser.add_argument("--attached-tuples", type=int, default=None,
                        help="the attached query's base input (default: --tuples)")  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="write every run's figures here")
    parser.add_argument("--replot", type=Path, nargs="+", default=None,
                        help="no run: plot the runs of these --json files together (with --plot)")  # fmt: skip
    args = parser.parse_args()
    if args.replot:
        if not args.plot:
            raise SystemExit("--replot needs --plot")
        plot([Outcome(**o) for path in args.replot for o in json.loads(path.read_text())], args.plot)
        return
    broker = None
    if args.apache_kafka:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository's tests package
        from tests.brokers import start_apache_kafka

        broker = start_apache_kafka()
        args.bootstrap_servers = broker.bootstrap
    try:
        measure(args)
    finally:
        if broker is not None:
            broker.stop()


def measure(args: argparse.Namespace) -> None:
    kinds = [k for k in args.stores if k == "sqlite" or args.bootstrap_servers]
    outcomes: list[Outcome] = []
    print(f"aggregate avg, count windows of 10, {args.keys:,} keys, U=20,000, trim every {args.trim_every:,}, "
          f"results writer commit every {COMMIT_EVERY:,} offsets")  # fmt: skip
    header = (f"{'store':>8} {'P':>2} {'tuples':>10} {'trim':>6} {'s':>7} {'cpu s':>7} {'load':>5} {'tuples/s':>9} {'ratio':>6} {'cpu ratio':>9} "
              f"{'produced':>10} {'kept max':>9} {'bound':>7} {'over':>4} {'trims':>6} {'waits':>6}  kept at the end")  # fmt: skip
    print(header)
    for kind in kinds if "local" in args.hosts else []:
        for partitions in args.partitions:
            base: Outcome | None = None
            for tuples, every in ((args.tuples, None), (args.tuples, args.trim_every),
                                  (args.tuples * args.scale, args.trim_every)):  # fmt: skip
                with tempfile.TemporaryDirectory() as tmp:
                    o = one_run(kind, Path(tmp), args.bootstrap_servers, tuples, partitions, args.keys, every)
                base = base or o
                outcomes.append(o)
                report(o, base)
                save(args, outcomes)
    if "attached" in args.hosts:
        if not args.bootstrap_servers:
            raise SystemExit("--hosts attached needs a broker: --apache-kafka or --bootstrap-servers")
        measure_attached(args, outcomes)
    save(args, outcomes)
    if args.plot:
        plot(outcomes, args.plot)


def save(args: argparse.Namespace, outcomes: list[Outcome]) -> None:
    """Every run's figures so far (after each run: a run stopped later keeps those of the runs it did)."""
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=1))


def plot(outcomes: list[Outcome], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    attached = [o for o in outcomes if o.store == "attached"]
    local = [o for o in outcomes if o.store != "attached"]
    panels = [p for p in (local, attached) if p]
    fig, axes = plt.subplots(1, len(panels), figsize=(8 * len(panels), 4.5), squeeze=False)
    for ax, group in zip(axes[0], panels, strict=True):
        biggest = max(o.tuples for o in group)
        for o in group:
            if o.trim_every is None or o.tuples != biggest:
                continue
            if o.store == "attached":  # offsets written to partition 0, sampled while the query ran
                ax.plot([w for w, _ in o.samples], [k for _, k in o.samples],
                        label=f"attached, {o.partitions} partition(s): kept (p0)")  # fmt: skip
            else:  # partition 0's inputs, scaled to the whole input
                xs = [i * o.partitions for i, _ in o.samples]
                ax.plot(
                    xs, [k for _, k in o.samples], label=f"{o.store}, {o.partitions} partition(s): kept (p0)"
                )
        untrimmed = next((o for o in group if o.trim_every is None), None)
        if untrimmed is not None and untrimmed.store != "attached":
            ax.plot([0, biggest], [0, untrimmed.produced / untrimmed.partitions * biggest / untrimmed.tuples],
                    ":", color="grey", label=f"untrimmed log per partition ({untrimmed.store}, "
                    f"{untrimmed.partitions}p, extrapolated)")  # fmt: skip
            ax.set_xlabel("input tuples")
            ax.set_title("local engine: retained log at every trim, cec run's results writer pacing")
        else:
            written = max((w for o in group for w, _ in o.samples), default=0)
            ax.plot([0, written], [0, written], ":", color="grey", label="untrimmed (kept = written)")
            ax.set_xlabel("offsets written to partition 0")
            ax.set_title(f"attached query ({biggest:,} tuples): retained log, trimmed on the executors")
        ax.set_ylabel("output log offsets kept per partition")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
