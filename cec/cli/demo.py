"""`cec demo`: the paper's workload (purchases -> filter -> average price per item over count windows),
the aggregate in its own process (or both stages as long-running Spark tasks), SIGKILLed midway,
recovered, and compared with a failure-free run."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cec.cli.common import (
    checkpoint_lines,
    checkpointing_of,
    load_stats,
    policy_args,
    positive_int,
    recovery_lines,
    say,
    start_worker,
    store_dir,
    wait,
)
from cec.example_data import write_example_data
from cec.exceptions import CecError, ConfigError
from cec.records import Kind, RecordCodec
from cec.validation import require_spark
from cec.verified import LogVerifier
from operators.aggregate import RESULT_SCHEMA
from operators.job import JobSpec, build_operator, instance_spec, purchase_filter, run_job
from operators.sinks import count_kinds, iter_payloads
from operators.specs import AggregateSpec, SourceSpec
from queuestore.base import PartitionReader
from queuestore.chunks import PART_KIND
from queuestore.factory import StoreSpec, open_store, store_spec

__all__ = ["add_parser", "cmd_demo"]

_ALL_KINDS = frozenset(k.value for k in Kind)
WINDOW_KINDS = ("count", "hopping", "session")  # cec demo --windows


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser("demo", help="the paper's workload, killed midway, recovered, verified")
    demo.add_argument(
        "--input", type=positive_int, default=200_000, help="purchases to generate (default 200000)"
    )
    demo.add_argument("--keys", type=positive_int, default=10_000, help="distinct items (default 10000)")
    demo.add_argument("--window", type=positive_int, default=10, help="count window size (default 10)")
    demo.add_argument(
        "--windows",
        choices=WINDOW_KINDS,
        default="count",
        help="count: tumbling count windows of --window purchases (default); hopping: windows of --window x "
        "--keys ms of item_time sliding by a quarter of that; session: sessions of an item's purchases less "
        "than --keys ms apart",
    )
    demo.add_argument("--seed", type=int, default=1)
    demo.add_argument(
        "--crash-at",
        type=int,
        help="kill once the aggregate has consumed this many tuples (default: half the input)",
    )
    demo.add_argument("--batch", type=positive_int, default=512, help="input batch size")
    demo.add_argument(
        "--engine",
        choices=("spark", "local"),
        default="spark",
        help="spark: long-running operator tasks on PySpark in local mode (default); "
        "local: each operator in its own process",
    )
    demo.add_argument(
        "--partitions",
        type=positive_int,
        default=None,
        help="partitions of every stage (default: 2 on spark, 1 on local)",
    )
    demo.add_argument(
        "--task-attempts",
        type=positive_int,
        default=4,
        help="Spark attempts per task, F in local[N,F] (default 4)",
    )
    demo.add_argument("--timeout", type=float, default=600.0)
    demo.add_argument(
        "--make-data",
        metavar="DIR",
        help="only write the README's example inputs (purchases.csv, events.csv, flights.csv, big.csv) into "
        "DIR and exit",
    )
    policy_args(demo, q=20_000, u=100_000)
    demo.set_defaults(func=cmd_demo)


def _wait_until(condition: Callable[[], bool], proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Poll `condition` until true; False if `proc` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.01)
    raise CecError("timed out waiting for the operator to make progress")


class _LogProgress:
    """How far an operator has durably got: the sum of `pos` of the newest record in its log.

    Polled every few milliseconds while waiting for the moment to crash it, so it keeps one store and one
    reader open instead of opening them (on Kafka: a consumer and a scan to EOF) at every poll.
    """

    def __init__(self, store_cfg: dict[str, Any], topic: str) -> None:
        self._store = open_store(store_cfg)
        self._topic = topic
        self._reader: PartitionReader | None = None
        self._codec = RecordCodec()
        self._verifier: LogVerifier | None = None
        self._last = 0

    def __call__(self) -> int:
        if self._reader is None:
            if not self._store.topic_exists(self._topic):
                return 0
            self._reader = self._store.reader(self._topic, 0)
        newest = self._reader.read_backward(self._reader.end_offset(), 1)
        if newest and newest[0].meta.kind != PART_KIND:  # a part's manifest is not written yet: no news
            if self._verifier is None or self._verifier.reader is not self._reader:
                self._verifier = LogVerifier(self._reader, self._codec, decode=_ALL_KINDS)
            self._verifier.seek(newest[0].offset)
            for verified in self._verifier.check(newest):  # checked before it is trusted
                assert verified.record is not None
                self._last = sum(verified.record.pos)
        return self._last

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        self._store.close()


# -- cec demo ---------------------------------------------------------------------------------------------
def _demo_specs(
    args: argparse.Namespace, root: Path, store_cfg: dict[str, Any], tag: str
) -> tuple[JobSpec, JobSpec]:
    filtered, aggregated = f"{tag}.purchases", f"{tag}.avg-price"
    store = StoreSpec.from_dict(store_cfg)
    filter_spec = JobSpec(
        operator=purchase_filter(),
        source=SourceSpec(
            type="generator",
            count=args.input,
            keys=args.keys,
            seed=args.seed,
            bad_every=50,
            partitions=args.partitions,
        ),
        store=store,
        output_topic=filtered,
        output_partitions=args.partitions,
        batch_size=args.batch,
    )
    windows = _windows(args)
    agg_spec = JobSpec(
        operator=AggregateSpec(
            key_field="item_id",
            value_field="item_price",
            agg="avg",
            # Event time, not the default (the sum of input offsets): on Kafka the filter's commit markers
            # take offsets where its commits happen to fall, so offsets differ between two runs.
            time_field="item_time",
            window_count=windows.get("window_count"),
            window_ms=windows.get("window_ms"),
            slide_ms=windows.get("slide_ms"),
            session_gap_ms=windows.get("session_gap_ms"),
        ),
        source=SourceSpec(type="queue", topic=filtered, schema="purchase"),
        store=store,
        output_topic=aggregated,
        output_partitions=args.partitions,
        batch_size=args.batch,
        checkpointing=checkpointing_of(args),
        progress=not args.quiet,
        stats_path=str(root / f".{tag}.aggregate.stats.json"),
    )
    return filter_spec, agg_spec


def _windows(args: argparse.Namespace) -> dict[str, int]:
    """The aggregate's windows for `--windows` (an item's purchases are about --keys ms of item_time apart)."""
    if args.windows == "hopping":
        slide = max(1, args.window * args.keys // 4)
        return {"window_ms": 4 * slide, "slide_ms": slide}
    if args.windows == "session":
        return {"session_gap_ms": args.keys}
    return {"window_count": args.window}


def _describe_windows(args: argparse.Namespace) -> str:
    windows = _windows(args)
    if args.windows == "hopping":
        return f"hopping windows of {windows['window_ms']} ms sliding by {windows['slide_ms']} ms"
    if args.windows == "session":
        return f"sessions with a gap of {windows['session_gap_ms']} ms"
    return f"count windows of {args.window}"


def _run_pipeline_local(
    args: argparse.Namespace,
    root: Path,
    store_cfg: dict[str, Any],
    filter_spec: JobSpec,
    agg_spec: JobSpec,
    crash_at: int,
) -> tuple[int | None, dict[str, Any] | None]:
    """Filter and aggregate in their own processes; the aggregate SIGKILLed from outside and restarted.
    Returns the input position at which it was killed (None: the run ended first) and its stats."""
    stats_path = Path(agg_spec.stats_path or "")
    filter_proc = start_worker(filter_spec, root / "filter.json")
    agg_proc = start_worker(agg_spec, root / "aggregate.json")
    progress = _LogProgress(store_cfg, agg_spec.output_topic)
    killed_at: int | None = None
    try:
        if _wait_until(lambda: progress() >= crash_at, agg_proc, args.timeout):
            agg_proc.send_signal(signal.SIGKILL)
            wait(agg_proc, "aggregate")
            killed_at = progress()
    finally:
        progress.close()
    if killed_at is not None:
        say(
            f"  SIGKILLed the aggregate process (pid {agg_proc.pid}) at input position ~{killed_at:,}; recovering"
        )
        agg_proc = start_worker(agg_spec, root / "aggregate.json")
    wait(agg_proc, "aggregate")
    wait(filter_proc, "filter")
    return killed_at, load_stats(stats_path)


def _run_pipeline_spark(
    args: argparse.Namespace,
    root: Path,
    store_cfg: dict[str, Any],
    filter_spec: JobSpec,
    agg_spec: JobSpec,
    crash_at: int,
) -> tuple[int | None, dict[str, Any] | None]:
    """Both stages as long-running Spark tasks (one chain per partition). Partition 0's Python worker, which
    runs that partition's filter and aggregate, is SIGKILLed midway: Spark relaunches the task and both
    instances recover from their own logs (the cascading case: upstream and downstream die together)."""
    import threading

    from operators.spark.host import SparkOperatorHost, pid_file_name
    from operators.spark.session import local_session

    master = f"local[{args.partitions},{args.task_attempts}]"
    started = time.perf_counter()
    spark = local_session(master, app_name="cec-demo", shuffle_partitions=args.partitions)
    spark.sparkContext.setLogLevel(
        "FATAL"
    )  # the worker we kill makes Spark log a stack trace; it is expected
    say(f"  spark: {master} (session started in {time.perf_counter() - started:.1f} s)")
    pid_dir = root / "pids"
    pid_dir.mkdir(exist_ok=True)
    host = SparkOperatorHost(spark, [filter_spec, agg_spec], pid_dir=pid_dir)
    pid_file = pid_dir / pid_file_name("chain", 1, 0, 0)
    target = crash_at // args.partitions
    killed: list[tuple[int, int]] = []
    done = threading.Event()

    def killer() -> None:
        progress = _LogProgress(store_cfg, agg_spec.output_topic)
        try:
            while not done.is_set():
                if pid_file.exists() and progress() >= target:
                    pid = int(pid_file.read_text())
                    os.kill(pid, signal.SIGKILL)
                    killed.append((pid, progress()))
                    return
                done.wait(0.01)
        finally:
            progress.close()

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        result = host.run()
    finally:
        done.set()
        thread.join()
        spark.stop()
    if killed:
        pid, at = killed[0]
        say(
            f"  SIGKILLed the Python worker of partition 0 (pid {pid}, its filter and aggregate) at input "
            f"position ~{at:,}; Spark relaunched the task and both recovered from their logs"
        )
    report = result.instance(1, 0)
    return (killed[0][1] if killed else None), report.stats


def cmd_demo(args: argparse.Namespace) -> int:
    if args.make_data is not None:
        for path in write_example_data(Path(args.make_data)):
            say(f"wrote {path}")
        return 0
    if args.partitions is None:
        args.partitions = 2 if args.engine == "spark" else 1
    if args.engine == "local" and args.partitions != 1:
        raise ConfigError("--engine local runs one partition; use --engine spark for --partitions > 1")
    if args.engine == "spark":
        require_spark()
    crash_at = args.crash_at if args.crash_at is not None else args.input // 2
    with store_dir(args.store_dir, "cec-demo-") as root:
        store_cfg = store_spec(root, args.bootstrap_servers)
        tag = f"demo-{args.seed}-{os.getpid()}-{int(time.time())}"
        say(
            f"cec demo: {args.input:,} purchases over {args.keys:,} items -> filter(price > 0) -> "
            f"avg(price) per item over {_describe_windows(args)}"
        )
        say(
            f"  engine: {args.engine}, {args.partitions} partition(s); queue store: {store_cfg['type']} "
            f"({store_cfg.get('bootstrap_servers') or root})"
        )
        checkpointing = checkpointing_of(args)
        policy_line = (
            f"  policy: Q={checkpointing.q_target} U={checkpointing.u_target} "
            f"CI={args.ci_ms} ms CP={args.cp_ms} ms"
        )
        if checkpointing.recovery_target is not None:
            policy_line += f" recovery target={checkpointing.recovery_target:g} s"
        if checkpointing.policy != "targets":
            policy_line += f" ({checkpointing.policy})"
        # What the policy buys (README, "Bounded recovery by default").
        if not checkpointing.checkpoints:
            policy_line += " (G-open only: a restart replays from the oldest open window)"
        elif checkpointing.u_target is not None:
            policy_line += (
                f" (a restart replays at most ~{checkpointing.u_target:,} input tuples per instance)"
            )
        say(policy_line)

        # 1. Failure-free reference, in this process, instance by instance.
        ref_filter, ref_agg = _demo_specs(args, root, store_cfg, tag + "-ref")
        ref_agg.progress = False
        started = time.perf_counter()
        for stage in (ref_filter, ref_agg):
            for p in range(args.partitions):
                run_job(instance_spec(stage, p))
        ref_seconds = time.perf_counter() - started

        # 2. The same pipeline, a crash midway, recovery.
        filter_spec, agg_spec = _demo_specs(args, root, store_cfg, tag)
        store = open_store(store_cfg)
        try:  # the pipeline's topics exist before either stage starts, whichever process runs first
            for spec in (filter_spec, agg_spec):
                store.create_topic(spec.output_topic, spec.output_partitions)
        finally:
            store.close()
        run = _run_pipeline_spark if args.engine == "spark" else _run_pipeline_local
        killed_at, agg_stats = run(args, root, store_cfg, filter_spec, agg_spec, crash_at)
        recovery = agg_stats.get("recovery") if agg_stats else None

        # 3. Compare: the results a consumer sees (control tuples dropped) must equal the failure-free run.
        store = open_store(store_cfg)
        try:
            # Hopping and session windows have the several-aggregate form's columns.
            schema = (
                RESULT_SCHEMA if args.windows == "count" else build_operator(agg_spec.operator).result_schema
            )
            got = list(iter_payloads(store, agg_spec.output_topic, schema))
            want = list(iter_payloads(store, ref_agg.output_topic, schema))
            kinds = count_kinds(store, agg_spec.output_topic)
            filtered = count_kinds(store, filter_spec.output_topic).get("R", 0)
        finally:
            store.close()
        say(f"  failure-free run: {len(want):,} results in {ref_seconds:.2f} s")
        # Partitions interleave differently from run to run: with several, each key's sequence must be identical.
        same = got == want if args.partitions == 1 else _by_key(got) == _by_key(want)
        say("")
        say("CEC demo report")
        say(f"  input tuples:          {args.input:,} ({filtered:,} passed the filter)")
        say(f"  results (R):           {kinds.get('R', 0):,} (failure-free run: {len(want):,})")
        say(f"  G-open / G-check:      {kinds.get('GOPEN', 0):,} / {kinds.get('GCHECK', 0):,}")
        # The position the kill line above gave (where the log stood when the process died), not the aim.
        where = " of partition 0" if args.engine == "spark" else ""
        crash_line = (
            "none: the run ended first"
            if killed_at is None
            else f"SIGKILL at input position ~{killed_at:,}{where}"
        )
        say(f"  crash:                 {crash_line}")
        for line in recovery_lines(recovery):
            say(line)
        for line in checkpoint_lines(agg_stats or {}, checkpointing):
            say(line)
        if not same:
            say(f"  first difference: {_first_difference(got, want)}")
        verdict = "PASS: output identical to the failure-free run" if same else "FAIL: outputs differ"
        if args.partitions > 1 and same:
            verdict += " (per key)"
        say(f"  verdict:               {verdict}")
        return 0 if same else 1


def _by_key(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row["key"], []).append(row)
    return out


def _first_difference(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> str:
    g, w = _by_key(got), _by_key(want)
    for key in sorted(set(g) | set(w)):
        if g.get(key) != w.get(key):
            return f"key {key!r}: got {g.get(key)}, want {w.get(key)}"
    return f"{len(got)} results vs {len(want)}"
