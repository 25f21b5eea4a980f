"""`cec`: run CEC operators from the command line.

- `cec demo`: the paper's workload (purchases -> filter -> average price per item over count windows),
  the aggregate in its own process, SIGKILLed midway, recovered, and compared with a failure-free run;
- `cec run`: CEC over a user's CSV, optionally SIGKILLed after K rows and recovered;
- `cec inspect`: what an output queue holds and what recovery would rebuild from it (`--list`, `--json`);
- `cec recover --dry-run`: what a recovery would do now, changing nothing;
- `cec state --as-of`: the state of every window open at a past point of a log.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from cec import progress as progress_tasks
from cec.config import POLICIES, Checkpointing
from cec.exceptions import CecError, ConfigError, RunStoppedError
from cec.records import Kind, RecordCodec
from cec.stopping import StopRequest, stopped_error
from cec.validation import check_csv_input, check_output_file, prepare_store_dir, require_spark
from cec.verified import LogVerifier
from operators.aggregate import AGGREGATES, RESULT_SCHEMA
from operators.base import DEAD_LETTER_SCHEMA
from operators.job import JobSpec, aggregate_operator, instance_spec, run_job
from operators.sinks import (
    RESULT_COLUMNS,
    IncrementalOutputs,
    count_kinds,
    iter_payloads,
    result_formats,
    write_outputs,
)
from operators.sources import CsvSource
from operators.worker import REPORTED_ERROR_EXIT
from queuestore.base import PartitionReader
from queuestore.chunks import PART_KIND
from queuestore.exceptions import QueueStoreError
from queuestore.factory import open_store, store_spec
from queuestore.kafka_config import ENV as KAFKA_CONFIG_ENV
from queuestore.kafka_config import quiet_librdkafka, read_properties
from recovery.exceptions import RecoveryError

__all__ = ["main"]

_ALL_KINDS = frozenset(k.value for k in Kind)


# -- helpers ----------------------------------------------------------------------------------------------
def _say(message: str = "") -> None:
    print(message, flush=True)


@contextmanager
def _store_dir(given: str | None, prefix: str):  # type: ignore[no-untyped-def]
    if given:
        yield prepare_store_dir(given)
    else:
        path = Path(tempfile.mkdtemp(prefix=prefix))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)


def _worker(spec: JobSpec, spec_path: Path, crash_after: int | None = None) -> subprocess.Popen[bytes]:
    """Start the job in its own process: the unit that gets killed and recovered (`crash_after`: it
    SIGKILLs itself after that many input tuples, `operators.crash_after`)."""
    spec_path.write_text(spec.to_json())
    extra = [] if crash_after is None else ["--crash-after", str(crash_after)]
    return subprocess.Popen([sys.executable, "-m", "operators.worker", str(spec_path), *extra])


class _AlreadyReported(CecError):
    """A child process already printed the one-line error; the CLI only exits with its code."""


def _wait(proc: subprocess.Popen[bytes], what: str) -> int:
    rc = proc.wait()
    if rc == REPORTED_ERROR_EXIT:
        raise _AlreadyReported(what)
    if rc not in (0, -signal.SIGKILL):
        raise CecError(f"{what} failed with exit code {rc}")
    return rc


def _load_stats(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def _recovery_lines(rec: dict[str, Any] | None) -> list[str]:
    if not rec:
        return ["  recovery:            none (no crash)"]
    return [
        f"  extent at the crash:   {rec['extent_records']:,} records ({rec['ec_windows']:,} open windows in the EC)",
        f"  EC reconstruction:     {rec['ec_build_seconds'] * 1000:.1f} ms "
        f"({rec['records_read'] / max(rec['ec_build_seconds'], 1e-9):,.0f} records/s)",
        f"  EC-load time:          {rec['ec_load_seconds'] * 1000:.1f} ms",
        f"  replay:                from {rec['replay_start']} to crash point {rec['crash_pos']}: "
        f"{rec['tuples_replayed']:,} tuples replayed, {rec['tuples_skipped']:,} skipped",
        f"  damaged footprints:    {rec['corrupt_footprints']}",
        f"  recovery time:         {rec['recovery_seconds'] * 1000:.1f} ms (EC build + load + replay to the crash point)",
    ]


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


def _checkpointing(args: argparse.Namespace) -> Checkpointing:
    """The checkpoint configuration from --Q/--U/--ci-ms/--cp-ms/--recovery-target/--policy/--mtbf.

    A command's default Q and U (`cec demo`: the paper's 20,000 / 100,000) apply only without a recovery
    target: with one, the operator picks them, and a Q or U given beside it bounds what it picks."""
    q, u = args.Q, args.U
    if args.recovery_target is None:
        q = args.default_q if q is None else q
        u = args.default_u if u is None else u
    return Checkpointing(
        q_target=q,
        u_target=u,
        ci_ms=args.ci_ms,
        cp_ms=args.cp_ms,
        recovery_target=args.recovery_target,
        policy=args.policy,
        mtbf=args.mtbf,
    )


def _policy(args: argparse.Namespace) -> dict[str, Any]:
    """The checkpoint-policy field of a JobSpec."""
    return {"checkpointing": _checkpointing(args)}


def _checkpoint_lines(stats: dict[str, Any], checkpointing: Checkpointing) -> list[str]:
    """Report lines on checkpointing: the duty really spent and, with a recovery target, whether the
    recovery met it. From the stats of the operator's last run (after recovery, when it crashed)."""
    if not stats or not checkpointing.checkpoints:
        return []
    lines = [
        f"  checkpoint duty:       {stats.get('checkpoint_duty', 0.0):.1%} of operator time producing G-checks "
        f"(budget {stats.get('checkpoint_budget', 0.0):.1%}; {stats.get('checkpoint_seconds', 0.0) * 1000:,.0f} ms "
        f"in {stats.get('gchecks', 0):,} G-checks after recovery)",
        f"  duty while wanted:     {stats.get('checkpoint_duty_wanted', 0.0):.1%} of the time the policy wanted "
        f"G-checks (budget {stats.get('checkpoint_budget', 0.0):.1%})",
        f"  targets in force:      Q={stats.get('q_target')} U={stats.get('u_target')} "
        f"(max u {stats.get('max_replay', 0):,}, max q {stats.get('max_extent', 0):,}); {stats.get('checkpoint_policy', '')}",
    ]
    rec = stats.get("recovery")
    if checkpointing.recovery_target is not None and rec:
        took = rec["recovery_seconds"]
        verdict = "met" if took <= checkpointing.recovery_target else "MISSED"
        lines.append(
            f"  recovery target:       {checkpointing.recovery_target * 1000:.0f} ms: {verdict} "
            f"(recovery took {took * 1000:.1f} ms)"
        )
    if stats.get("checkpoint_refusal"):
        lines.append(f"  checkpoint warning:    {stats['checkpoint_refusal']}")
    if stats.get("checkpoint_note"):
        lines.append(f"  checkpoint note:       {stats['checkpoint_note']}")
    return lines


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
    filter_spec = JobSpec(
        operator={
            "type": "filter",
            "field": "item_price",
            "op": ">",
            "value": 0,
            "schema": "purchase",
            "time_field": "item_time",
        },
        source={
            "type": "generator",
            "count": args.input,
            "keys": args.keys,
            "seed": args.seed,
            "bad_every": 50,
            "partitions": args.partitions,
        },
        store=store_cfg,
        output_topic=filtered,
        output_partitions=args.partitions,
        batch_size=args.batch,
    )
    agg_spec = JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "avg",
            "window_count": args.window,
            # Event time, not the default (the sum of input offsets): on Kafka the filter's commit markers
            # take offsets where its commits happen to fall, so offsets differ between two runs.
            "time_field": "item_time",
        },
        source={"type": "queue", "topic": filtered, "schema": "purchase"},
        store=store_cfg,
        output_topic=aggregated,
        output_partitions=args.partitions,
        batch_size=args.batch,
        **_policy(args),
        progress=not args.quiet,
        stats_path=str(root / f".{tag}.aggregate.stats.json"),
    )
    return filter_spec, agg_spec


def _run_pipeline_local(
    args: argparse.Namespace,
    root: Path,
    store_cfg: dict[str, Any],
    filter_spec: JobSpec,
    agg_spec: JobSpec,
    crash_at: int,
) -> tuple[bool, dict[str, Any] | None]:
    """Filter and aggregate in their own processes; the aggregate SIGKILLed from outside and restarted."""
    stats_path = Path(agg_spec.stats_path or "")
    filter_proc = _worker(filter_spec, root / "filter.json")
    agg_proc = _worker(agg_spec, root / "aggregate.json")
    progress = _LogProgress(store_cfg, agg_spec.output_topic)
    try:
        crashed = _wait_until(lambda: progress() >= crash_at, agg_proc, args.timeout)
        if crashed:
            agg_proc.send_signal(signal.SIGKILL)
            _wait(agg_proc, "aggregate")
            killed_at = progress()
    finally:
        progress.close()
    if crashed:
        _say(
            f"  SIGKILLed the aggregate process (pid {agg_proc.pid}) at input position ~{killed_at:,}; recovering"
        )
        agg_proc = _worker(agg_spec, root / "aggregate.json")
    _wait(agg_proc, "aggregate")
    _wait(filter_proc, "filter")
    return crashed, _load_stats(stats_path)


def _run_pipeline_spark(
    args: argparse.Namespace,
    root: Path,
    store_cfg: dict[str, Any],
    filter_spec: JobSpec,
    agg_spec: JobSpec,
    crash_at: int,
) -> tuple[bool, dict[str, Any] | None]:
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
    _say(f"  spark: {master} (session started in {time.perf_counter() - started:.1f} s)")
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
        _say(
            f"  SIGKILLed the Python worker of partition 0 (pid {pid}, its filter and aggregate) at input "
            f"position ~{at:,}; Spark relaunched the task and both recovered from their logs"
        )
    report = result.instance(1, 0)
    return bool(killed), report.stats


def cmd_demo(args: argparse.Namespace) -> int:
    if args.engine == "local" and args.partitions != 1:
        raise ConfigError("--engine local runs one partition; use --engine spark for --partitions > 1")
    if args.engine == "spark":
        require_spark()
    crash_at = args.crash_at if args.crash_at is not None else args.input // 2
    with _store_dir(args.store_dir, "cec-demo-") as root:
        store_cfg = store_spec(root, args.bootstrap_servers)
        tag = f"demo-{args.seed}-{os.getpid()}-{int(time.time())}"
        _say(
            f"cec demo: {args.input:,} purchases over {args.keys:,} items -> filter(price > 0) -> "
            f"avg(price) per item over count windows of {args.window}"
        )
        _say(
            f"  engine: {args.engine}, {args.partitions} partition(s); queue store: {store_cfg['type']} "
            f"({store_cfg.get('bootstrap_servers') or root})"
        )
        checkpointing = _checkpointing(args)
        policy_line = (
            f"  policy: Q={checkpointing.q_target} U={checkpointing.u_target} "
            f"CI={args.ci_ms} ms CP={args.cp_ms} ms"
        )
        if checkpointing.recovery_target is not None:
            policy_line += f" recovery target={checkpointing.recovery_target:g} s"
        if checkpointing.policy != "targets":
            policy_line += f" ({checkpointing.policy})"
        _say(policy_line)

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
        crashed, agg_stats = run(args, root, store_cfg, filter_spec, agg_spec, crash_at)
        recovery = agg_stats.get("recovery") if agg_stats else None

        # 3. Compare: the results a consumer sees (control tuples dropped) must equal the failure-free run.
        store = open_store(store_cfg)
        try:
            got = list(iter_payloads(store, agg_spec.output_topic, RESULT_SCHEMA))
            want = list(iter_payloads(store, ref_agg.output_topic, RESULT_SCHEMA))
            kinds = count_kinds(store, agg_spec.output_topic)
            filtered = count_kinds(store, filter_spec.output_topic).get("R", 0)
        finally:
            store.close()
        _say(f"  failure-free run: {len(want):,} results in {ref_seconds:.2f} s")
        # Partitions interleave differently from run to run: with several, each key's sequence must be identical.
        same = got == want if args.partitions == 1 else _by_key(got) == _by_key(want)
        _say("")
        _say("CEC demo report")
        _say(f"  input tuples:          {args.input:,} ({filtered:,} passed the filter)")
        _say(f"  results (R):           {kinds.get('R', 0):,} (failure-free run: {len(want):,})")
        _say(f"  G-open / G-check:      {kinds.get('GOPEN', 0):,} / {kinds.get('GCHECK', 0):,}")
        crash_line = f"SIGKILL at input ~{crash_at:,}" if crashed else "none: the run ended first"
        _say(f"  crash:                 {crash_line}")
        for line in _recovery_lines(recovery):
            _say(line)
        for line in _checkpoint_lines(agg_stats or {}, checkpointing):
            _say(line)
        if not same:
            _say(f"  first difference: {_first_difference(got, want)}")
        verdict = "PASS: output identical to the failure-free run" if same else "FAIL: outputs differ"
        if args.partitions > 1 and same:
            verdict += " (per key)"
        _say(f"  verdict:               {verdict}")
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


# -- cec run ----------------------------------------------------------------------------------------------
_RUN_TOPICS = "cec-run-topics.json"


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _run_topic(root: Path, operator: dict[str, Any], input_path: Path) -> str:
    """The output topic of `cec run` over `input_path` with `operator`, in the store at `root`.

    Named after the operator and the input's *content*, so that different inputs never share a topic
    (on Kafka topics outlive any store dir). A store dir remembers which topic it used for an operator
    over a file path: run again with the same --store-dir after the file was edited, and the job resumes
    that topic's log, whose recorded input identity refuses the new content with a clear error
    (`recovery.identity`), instead of silently starting another log beside it.
    """
    source = CsvSource(input_path)
    try:
        content = source.identity()
    finally:
        source.close()
    job = _digest([operator, str(input_path.resolve())])
    memory = root / _RUN_TOPICS
    try:
        known: dict[str, str] = json.loads(memory.read_text())
    except FileNotFoundError:
        known = {}
    except ValueError:
        raise ConfigError(f"{memory} is damaged; use a new --store-dir") from None
    topic = known.get(job)
    if topic is None:
        topic = f"run-{_digest([operator, content])}"
        known[job] = topic
        tmp = memory.with_name(f".{memory.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, sort_keys=True))
        tmp.replace(memory)
    return topic


def _execute(spec: JobSpec, root: Path, crash_after: int | None, stop: StopRequest) -> dict[str, Any]:
    """Run the job (in this process until its input ends or `stop` is set, or with --crash-after in a worker
    SIGKILLed after K rows and a second one that recovers); its stats."""
    if crash_after is None:
        return run_job(spec, stop=stop).as_dict()
    rc = _wait(_worker(spec, root / "run.json", crash_after=crash_after), "operator")
    if rc == -signal.SIGKILL:
        _say(f"operator process SIGKILLed after {crash_after:,} input rows; recovering")
    if stop():
        return {"completed": False}
    _wait(_worker(spec, root / "run.json"), "operator")
    return _load_stats(Path(spec.stats_path or ""))


def cmd_run(args: argparse.Namespace) -> int:
    if args.input_topic:
        from cec.topic_run import cmd_run_topic

        return cmd_run_topic(args)
    if not args.input:
        raise ConfigError("give an input CSV file, or --input-topic TOPIC")
    from cec.topic_run import results_topic_extra

    extra = results_topic_extra(args)  # before any work: --results-topic needs a Kafka store
    input_path = Path(args.input)
    if not input_path.is_file():
        raise ConfigError(f"input file not found: {input_path}")
    if args.window_time and not args.time:
        raise ConfigError("--window-time needs --time COL")
    if args.allowed_lateness is not None and not args.window_time:
        raise ConfigError("--allowed-lateness needs --window-time (event-time watermarks close time windows)")
    if args.crash_after is not None and args.crash_after < 1:
        raise ConfigError("--crash-after needs K >= 1")
    check_csv_input(input_path, [c for c in (args.key, args.value, args.time) if c], args.value, args.time)
    results_path, dead_path = results_paths(args.results)
    operator = aggregate_operator(
        args.key,
        args.value,
        args.agg,
        window_count=args.window_count,
        window_time=args.window_time,
        time=args.time,
        allowed_lateness=args.allowed_lateness,
    )
    with _store_dir(args.store_dir, "cec-run-") as root:
        store_cfg = store_spec(root, args.bootstrap_servers)
        topic = _run_topic(root, operator, input_path)
        spec = JobSpec(
            operator=operator,
            source={"type": "csv", "path": str(input_path.resolve())},
            store=store_cfg,
            output_topic=topic,
            progress=args.progress,
            **_policy(args),
            stats_path=str(root / f".{topic}.stats.json"),
            extra=extra,
            metrics_port=args.metrics_port,
            trim_every=args.trim_every,
        )
        progress_path = root / f".{topic}.results-writer.json"
        stop = StopRequest()
        if args.trim_every is not None or IncrementalOutputs.resumable(progress_path):
            # Trimming: the results are written while the run goes on, by a registered consumer of the
            # log (a run that trimmed before is resumed that way too, its log no longer holds everything),
            # under `.partial` names until the run reached the end of its input.
            store = open_store(store_cfg)
            try:
                store.create_topic(topic, spec.output_partitions)  # to register on it before any trim
                writer = IncrementalOutputs(
                    store,
                    topic,
                    RESULT_SCHEMA,
                    DEAD_LETTER_SCHEMA,
                    (results_path, RESULT_COLUMNS),
                    dead_path,
                    progress_path,
                    result_formats(operator),
                    partial=True,
                ).open()
                try:
                    with writer.running(), stop.on_signals():
                        run_stats = _execute(spec, root, args.crash_after, stop)
                    if run_stats.get("completed"):
                        writer.finish()
                finally:
                    writer.close()
            finally:
                store.close()
            if not run_stats.get("completed"):
                raise stopped_error(stop.signum or signal.SIGTERM, args.store_dir, writer.partial_results)
            n_results, n_dead, kinds = writer.n_results, writer.n_dead, writer.counts
        else:
            with stop.on_signals():
                run_stats = _execute(spec, root, args.crash_after, stop)
            if not run_stats.get("completed"):
                raise stopped_error(stop.signum or signal.SIGTERM, args.store_dir)
            store = open_store(store_cfg)
            try:
                n_results, n_dead, kinds = write_outputs(
                    store,
                    topic,
                    RESULT_SCHEMA,
                    DEAD_LETTER_SCHEMA,
                    (results_path, RESULT_COLUMNS),
                    dead_path,
                    result_formats(operator),
                )
            finally:
                store.close()
        recovery = run_stats.get("recovery")
    _say(f"results:      {n_results:,} closed windows -> {results_path}")
    _say(f"dead letters: {n_dead:,} rows not processed -> {dead_path}")
    if args.results_topic:
        _say(f"results topic: {args.results_topic} (plain JSON, one record per result, read_committed)")
    _say(f"footprints:   {kinds.get('GOPEN', 0):,} G-open, {kinds.get('GCHECK', 0):,} G-check")
    _say("windows still open at the end of the input are not emitted")
    if args.crash_after is not None:
        for line in _recovery_lines(recovery):
            _say(line)
    for line in _checkpoint_lines(run_stats, spec.checkpointing):
        _say(line)
    check_not_all_dead(kinds, dead_path, "rows")
    return 0


def results_paths(results: str) -> tuple[Path, Path]:
    """The results file and its dead-letter file beside it, both checked writable before any work."""
    results_path = Path(results)
    dead_path = results_path.with_name(results_path.stem + ".dead-letters.csv")
    check_output_file(results_path, "--results")
    check_output_file(dead_path, "dead-letter file")
    return results_path, dead_path


def check_not_all_dead(kinds: Mapping[str, int], dead_path: Path, what: str) -> None:
    """A run in which no tuple was accepted (no window ever opened, every input dead-lettered) is a
    failure, most often a wrong column or format: say so, with the first reason, and exit non-zero."""
    n_dead = kinds.get("DEAD", 0)
    if n_dead == 0 or kinds.get("GOPEN", 0) or kinds.get("R", 0):
        return
    reason = ""
    try:
        with dead_path.open(newline="", encoding="utf-8") as f:
            first = next(csv.DictReader(f), None)
        if first:
            reason = f" (the first: {first['reason']})"
    except (OSError, KeyError, csv.Error):
        pass
    raise ConfigError(f"every one of the {n_dead:,} input {what} was dead-lettered{reason}; see {dead_path}")


# -- cec inspect ------------------------------------------------------------------------------------------
def cmd_inspect(args: argparse.Namespace) -> int:
    from cec import inspection

    if args.list == bool(args.topic):
        raise ConfigError("give a TOPIC to inspect, or --list to list the topics")
    with inspection.existing_store(args.store_dir, args.bootstrap_servers) as store:
        if args.list:
            for topic, partitions in inspection.list_topics(store):
                _say(f"{topic}\t{partitions} partition(s)")
            return 0
        summaries = inspection.inspect_topic(store, args.topic)
    if args.json:
        _say(json.dumps(inspection.topic_json(args.topic, summaries)))
    else:
        for summary in summaries:
            for line in summary.lines(args.topic):
                _say(line)
    return 0


# -- cec recover --dry-run ---------------------------------------------------------------------------------
def cmd_recover(args: argparse.Namespace) -> int:
    from cec import inspection
    from recovery.dry_run import plan_recovery

    if not args.dry_run:
        raise ConfigError(
            "only --dry-run is supported: a job recovers by itself when it is run again on its log "
            "(e.g. cec run with the same --store-dir)"
        )
    with inspection.existing_store(args.store_dir, args.bootstrap_servers) as store:
        plans = plan_recovery(store, args.topic, Path(args.store_dir) if args.store_dir else None)
    if args.json:
        _say(json.dumps({"topic": args.topic, "partitions": [p.as_json() for p in plans]}))
    else:
        for plan in plans:
            for line in plan.lines(args.topic):
                _say(line)
    return 0


# -- cec state --as-of ------------------------------------------------------------------------------------
def cmd_state(args: argparse.Namespace) -> int:
    from cec import inspection
    from recovery.as_of import AsOf, state_as_of

    at = AsOf.parse(args.as_of)
    input_path = Path(args.input) if args.input else None
    with inspection.existing_store(args.store_dir, args.bootstrap_servers) as store:
        windows = state_as_of(store, args.topic, at, input_path=input_path)
    if args.format == "json":
        doc = {"topic": args.topic, "as_of": at.describe(), "windows": [w.as_json() for w in windows]}
        _say(json.dumps(doc))
        return 0
    fields = list(windows[0].state) if windows else []
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(["partition", "key", "window", *fields])
    for w in windows:
        writer.writerow([w.partition, w.key, w.window, *(w.state[f] for f in fields)])
    return 0


# -- argument parsing -------------------------------------------------------------------------------------
def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"must be 1..65535, got {value}")
    return value


def _policy_args(p: argparse.ArgumentParser, q: int | None, u: int | None) -> None:
    p.add_argument(
        "--Q",
        type=_positive_int,
        default=None,
        help=f"extent size target q (records); default {q} (none with --recovery-target: the operator picks)",
    )
    p.add_argument(
        "--U",
        type=_positive_int,
        default=None,
        help=f"replay size target u (input tuples); default {u} (none with --recovery-target: the operator picks)",
    )
    p.set_defaults(default_q=q, default_u=u)
    p.add_argument(
        "--ci-ms", type=float, default=5.0, help="checkpoint budget: CI ms of operator time (default 5) ..."
    )
    p.add_argument("--cp-ms", type=float, default=100.0, help="... in every CP ms (default 100)")
    p.add_argument(
        "--recovery-target",
        help="recover within this time after a crash, e.g. 3s, 500ms, 2 minutes: the operator picks U, Q "
        "and the checkpoint budget from its measured rates",
    )
    p.add_argument(
        "--policy",
        choices=POLICIES,
        default="targets",
        help="targets: G-check while q > Q or u > U (or to meet --recovery-target); cost-benefit: only when "
        "the recovery time a G-check saves is worth its cost (default targets)",
    )
    p.add_argument(
        "--mtbf",
        default="1h",
        help="mean time between failures the cost-benefit policy plans for, e.g. 10 minutes, 1h (default 1h): "
        "the shorter, the more G-checks are worth their cost",
    )
    p.add_argument("--store-dir", help="where queues and indexes live (default: a temporary directory)")
    p.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("CEC_BOOTSTRAP_SERVERS"),
        help="use Kafka for the output queues (also from CEC_BOOTSTRAP_SERVERS)",
    )
    _kafka_config_arg(p)


def _kafka_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kafka-config",
        metavar="FILE",
        help="librdkafka properties (key=value lines: security.protocol, sasl.*, ssl.*, timeouts) for every "
        f"Kafka client of the command (also from {KAFKA_CONFIG_ENV})",
    )


def _read_store_args(p: argparse.ArgumentParser) -> None:
    """--store-dir/--bootstrap-servers of the commands that only read a store (never create it)."""
    p.add_argument("--store-dir", help="the store's directory (must exist; optional on Kafka)")
    p.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("CEC_BOOTSTRAP_SERVERS"),
        help="the queues are on Kafka (also from CEC_BOOTSTRAP_SERVERS)",
    )
    _kafka_config_arg(p)


# The name on PyPI (`cec` there is an unrelated project); the import package and the command are `cec`.
DISTRIBUTION = "cec-stream"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # running from a source tree that was never installed
        from cec import __version__

        return f"{__version__} (not installed)"


class _Parser(argparse.ArgumentParser):
    """A usage mistake is one line (`cec run: error: ...`) and exit code 2, like every other mistake.

    No abbreviated flags: `--input in.csv` would silently mean `--input-topic in.csv`, and every flag
    added later could change what an abbreviation in someone's script means."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


_LOG_LEVELS = ("debug", "info", "warning", "error")


def _global_options(p: argparse.ArgumentParser, default: Any) -> None:
    """--log-level and --quiet, accepted before or after the subcommand (`default` SUPPRESS on the
    subcommands, so that one given before the subcommand is not reset by the subcommand's default)."""
    p.add_argument(
        "--log-level",
        choices=_LOG_LEVELS,
        default=default if default is argparse.SUPPRESS else "warning",
        help="messages of the library on stderr from this level (default warning)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        default=default if default is argparse.SUPPRESS else False,
        help="no progress display and only errors on stderr",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cec", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    _global_options(parser, None)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="the paper's workload, killed midway, recovered, verified")
    demo.add_argument(
        "--input", type=_positive_int, default=200_000, help="purchases to generate (default 200000)"
    )
    demo.add_argument("--keys", type=_positive_int, default=10_000, help="distinct items (default 10000)")
    demo.add_argument("--window", type=_positive_int, default=10, help="count window size (default 10)")
    demo.add_argument("--seed", type=int, default=1)
    demo.add_argument(
        "--crash-at",
        type=int,
        help="kill once the aggregate has consumed this many tuples (default: half the input)",
    )
    demo.add_argument("--batch", type=_positive_int, default=512, help="input batch size")
    demo.add_argument(
        "--engine",
        choices=("spark", "local"),
        default="spark",
        help="spark: long-running operator tasks on PySpark in local mode (default); "
        "local: each operator in its own process",
    )
    demo.add_argument(
        "--partitions",
        type=_positive_int,
        default=None,
        help="partitions of every stage (default: 2 on spark, 1 on local)",
    )
    demo.add_argument(
        "--task-attempts",
        type=_positive_int,
        default=4,
        help="Spark attempts per task, F in local[N,F] (default 4)",
    )
    demo.add_argument("--timeout", type=float, default=600.0)
    _policy_args(demo, q=20_000, u=100_000)
    demo.set_defaults(func=cmd_demo)

    run = sub.add_parser("run", help="CEC aggregate over a CSV file")
    run.add_argument("input", nargs="?", help="input CSV with a header row, processed in file order")
    run.add_argument("--key", required=True, help="key column")
    run.add_argument("--value", required=True, help="value column (a number)")
    run.add_argument(
        "--time",
        help="event-time column: integer milliseconds, ISO-8601 or YYYY-MM-DD HH:MM:SS (UTC without a "
        "zone); needed for --window-time",
    )
    group = run.add_mutually_exclusive_group(required=True)
    group.add_argument("--window-count", type=_positive_int, help="tumbling window of N tuples per key")
    group.add_argument(
        "--window-time", help="tumbling time window per key, e.g. 500ms, 10s, 5m, 1h, 5 minutes, 1 hour"
    )
    run.add_argument(
        "--allowed-lateness",
        metavar="D",
        help="event-time watermarks: a time window closes once every input partition's largest event time "
        "is D past its end (e.g. 0, 500ms, 10s), whether or not its key comes back; later tuples are "
        "dead letters 'late'",
    )
    run.add_argument("--agg", choices=AGGREGATES, default="avg")
    run.add_argument(
        "--results",
        required=True,
        help="results CSV: key,window,value,count,start,end (dead letters go beside it, NAME.dead-letters.csv)",
    )
    run.add_argument(
        "--crash-after", type=int, help="SIGKILL the operator process after K input rows, then recover"
    )
    run.add_argument(
        "--trim-every",
        type=_positive_int,
        metavar="N",
        help="trim the output log every N records (default: never): the results and dead-letter CSVs are "
        "then written as the run goes on and acknowledged, so the log keeps only what recovery and the "
        "unwritten results still need (docs/long-runs.md)",
    )
    run.add_argument(
        "--progress", action="store_true", help="also the operator's own progress messages on stderr"
    )
    run.add_argument(
        "--metrics-port",
        type=_port,
        help="serve Prometheus metrics (cec_*) on this port while the run goes on (instance p: PORT + p)",
    )
    _policy_args(run, q=None, u=None)
    from cec.topic_run import add_topic_arguments

    add_topic_arguments(run)
    run.set_defaults(func=cmd_run)

    inspect = sub.add_parser("inspect", help="what an output queue holds and what recovery would rebuild")
    inspect.add_argument("topic", nargs="?")
    inspect.add_argument("--list", action="store_true", help="the topics in the store, one per line")
    inspect.add_argument("--json", action="store_true", help="one JSON object (see cec/inspection.py)")
    _read_store_args(inspect)
    inspect.set_defaults(func=cmd_inspect)

    recover = sub.add_parser("recover", help="--dry-run: what a recovery would do now, changing nothing")
    recover.add_argument("topic")
    recover.add_argument(
        "--dry-run",
        action="store_true",
        help="report the EC windows, extent, replay start per input partition and an estimated time",
    )
    recover.add_argument("--json", action="store_true", help="one JSON object")
    _read_store_args(recover)
    recover.set_defaults(func=cmd_recover)

    state = sub.add_parser("state", help="the state of every window open at a past point of a log")
    state.add_argument("topic")
    state.add_argument(
        "--as-of",
        required=True,
        metavar="AT",
        help="a logical time (ms, or ISO-8601 read as UTC) or pos:OFFSETS, an input position vector "
        "(pos:K = after the first K tuples of a one-partition input); see recovery/as_of.py",
    )
    state.add_argument(
        "--input",
        help="the CSV file the log was built from (checked against the log); other inputs (generators, "
        "cec queues, Kafka topics) are read again from what the log recorded",
    )
    state.add_argument("--format", choices=("json", "csv"), default="json")
    _read_store_args(state)
    state.set_defaults(func=cmd_state)
    for command in sub.choices.values():
        _global_options(command, argparse.SUPPRESS)
    return parser


def _setup_output(args: argparse.Namespace) -> progress_tasks.Reporter:
    """Logging on stderr at --log-level (errors only with --quiet) and the progress display: a live
    bar on a terminal, a plain line every few seconds otherwise, none with --quiet. Worker processes
    inherit the level through CEC_LOG_LEVEL."""
    level = logging.ERROR if args.quiet else getattr(logging, args.log_level.upper())
    if getattr(args, "progress", False):
        level = min(level, logging.INFO)
    os.environ["CEC_LOG_LEVEL"] = logging.getLevelName(level)
    reporter: progress_tasks.Reporter = progress_tasks.NullReporter()
    if not args.quiet and sys.stderr.isatty():
        from rich.logging import RichHandler

        live = progress_tasks.RichReporter()
        reporter = live
        # Log lines go through the live display's console, so they print above the bars, not into them.
        handler: logging.Handler = RichHandler(
            console=live.progress.console, show_path=False, show_time=False
        )
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        if not args.quiet:
            reporter = progress_tasks.LogReporter()
            logging.getLogger("cec.progress").setLevel(logging.INFO)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    quiet_librdkafka(level)
    progress_tasks.set_reporter(reporter)
    return reporter


def _use_kafka_config(args: argparse.Namespace) -> None:
    """--kafka-config: checked now (a mistake in the file is one line before anything runs), then named in
    the environment, where every Kafka client of this process and of its workers reads it
    (`queuestore.kafka_config`): never in a job spec or a log, since it may hold credentials."""
    path = getattr(args, "kafka_config", None)
    if not path:
        return
    read_properties(path)
    os.environ[KAFKA_CONFIG_ENV] = str(Path(path).resolve())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "command", None) == "demo" and args.partitions is None:
        args.partitions = 2 if args.engine == "spark" else 1
    reporter = _setup_output(args)
    try:
        _use_kafka_config(args)
        return int(args.func(args))
    except _AlreadyReported:
        return REPORTED_ERROR_EXIT
    except RunStoppedError as exc:
        reporter.stop()
        print(f"cec: {exc}", file=sys.stderr)
        return exc.exit_code
    except (CecError, QueueStoreError, RecoveryError) as exc:
        reporter.stop()
        print(f"cec: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the machine's answer to a path or a resource the user gave: one line too
        reporter.stop()
        where = f": {exc.filename}" if exc.filename else ""
        print(f"cec: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        reporter.stop()
        progress_tasks.set_reporter(None)


if __name__ == "__main__":
    sys.exit(main())
