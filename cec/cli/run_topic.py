"""`cec run --input-topic`: CEC over a user's own Kafka topic (json, avro, registry, csv or cec values).

One operator instance per input partition, each writing its own output partition; the output log lives
on the same cluster (`--bootstrap-servers`), its indexes under `--store-dir`. Without `--follow` the run
is bounded: it stops at the end positions the topic had when the run first started. Those (and the start
positions) are pinned in `STORE_DIR/<output topic>.input.json` and are part of the default output topic
name, so a restart with the same `--store-dir` stops at the same place, and a run over a topic that has
grown since writes a log of its own instead of resuming another input's.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cec.cli.common import (
    check_not_all_dead,
    checkpointing_of,
    concurrently,
    digest,
    load_stats,
    output_lines,
    recovery_lines,
    results_paths,
    results_writer,
    resumed_elsewhere_line,
    say,
    start_worker,
    store_dir,
    wait,
    write_results,
)
from cec.cli.run_operator import check_operator_flags, operator_spec
from cec.cli.standby import check_standby_flags, with_lease
from cec.cli.trimming import trim_settings
from cec.exceptions import ConfigError
from cec.stopping import StopRequest, stopped_error
from cec.target_cost import say_target_cost
from cec.validation import check_topic_input
from operators.aggregate_flags import aggregate_flags
from operators.formats import FORMATS, load_avro_schema
from operators.job import SCHEMAS, JobSpec, instance_spec, run_job
from operators.local_trim import trim_after_consumers
from operators.runtime import RunStats
from operators.sinks import (
    IncrementalOutputs,
)
from operators.specs import OperatorSpec, SourceSpec
from operators.standby import Standby
from operators.topic_source import pin_bounds, topic_partition_count
from queuestore.factory import StoreSpec, open_store, store_spec
from recovery.timeline import process_started

__all__ = ["add_topic_arguments", "cmd_run_topic", "results_topic_of"]

_FOLLOW_REFRESH_S = 1.0


def add_topic_arguments(run: argparse.ArgumentParser) -> None:
    """The `cec run` flags of a Kafka topic input (names are relied on by tests outside the project)."""
    run.add_argument(
        "--input-topic", help="read this Kafka topic instead of a CSV file (needs --bootstrap-servers)"
    )
    run.add_argument("--format", choices=FORMATS, default="json", help="value format of --input-topic")
    run.add_argument(
        "--schema", help="Avro schema (.avsc file) of the avro format, or the payload schema of cec"
    )
    run.add_argument("--schema-registry", help="Schema Registry URL of the registry format")
    run.add_argument("--columns", help="column names of the csv format, comma-separated")
    run.add_argument("--output-topic", help="name of the output log topic (default: derived from the input)")
    run.add_argument(
        "--results-topic",
        help="also publish every result as a plain JSON record (key = window key) to this Kafka topic, in "
        "the output log's transactions: read_committed consumers read each result exactly once "
        "(needs --bootstrap-servers)",
    )
    run.add_argument(
        "--follow",
        action="store_true",
        help="keep reading new records until stopped (default: stop at the end)",
    )


def _source_spec(args: argparse.Namespace) -> dict[str, Any]:
    fmt = args.format
    flags = aggregate_flags(args.key, args.value, args.agg)
    source: dict[str, Any] = {
        "type": "topic",
        "bootstrap_servers": args.bootstrap_servers,
        "topic": args.input_topic,
        "format": fmt,
        "key_field": flags["key"],
        # Several aggregates read their columns under SQL's null rule: none is required of a record.
        "value_field": None if "aggs" in flags else flags["value"],
        "time_field": args.time,
        "follow": bool(args.follow),
    }
    if fmt == "avro":
        if not args.schema:
            raise ConfigError("--format avro needs --schema FILE.avsc")
        source["schema"] = load_avro_schema(args.schema)
    elif fmt == "cec":
        if not args.schema:
            raise ConfigError(
                f"--format cec needs --schema: the queue's payload schema (.avsc or one of {sorted(SCHEMAS)})"
            )
        source["schema"] = args.schema if args.schema in SCHEMAS else load_avro_schema(args.schema)
    elif fmt == "registry":
        if not args.schema_registry:
            raise ConfigError("--format registry needs --schema-registry URL")
        source["schema_registry"] = args.schema_registry
    elif fmt == "csv":
        columns = [c.strip() for c in (args.columns or "").split(",") if c.strip()]
        if not columns:
            raise ConfigError("--format csv needs --columns NAME,NAME,...")
        source["columns"] = columns
    return source


def results_topic_of(args: argparse.Namespace) -> str | None:
    """The JobSpec.results_topic of `--results-topic` (None without it); one line when there is no Kafka
    store."""
    if not getattr(args, "results_topic", None):
        return None
    if not args.bootstrap_servers:
        raise ConfigError(
            "--results-topic needs --bootstrap-servers HOST:PORT: results are published in the Kafka "
            "transactions of the output log"
        )
    return str(args.results_topic)


def _pinned_marker(root: Path, operator: dict[str, Any], source: dict[str, Any]) -> Path:
    """Where a store dir keeps a topic run's output topic and pinned source (`_pinned_source`)."""
    return root / f".topic-run-{digest({'operator': operator, 'source': source})}.json"


def _pinned_source(
    root: Path, args: argparse.Namespace, operator: dict[str, Any], source: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """(output topic, source spec with pinned bounds): from the store dir when this job ran there
    before, else resolved now and kept there."""
    marker = _pinned_marker(root, operator, source)
    if marker.exists():
        kept = json.loads(marker.read_text())
        return kept["output_topic"], kept["source"]
    pinned = pin_bounds(source) if source["format"] != "cec" else dict(source)
    if args.follow:  # a following run has no end; its start still defines what its input is
        pinned.pop("end_offsets", None)
    output_topic = args.output_topic or f"cec-run-{digest({'operator': operator, 'source': pinned})}"
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(json.dumps({"output_topic": output_topic, "source": pinned}, sort_keys=True))
    tmp.replace(marker)
    return output_topic, pinned


def cmd_run_topic(args: argparse.Namespace) -> int:
    if args.input:
        raise ConfigError("give either an input CSV file or --input-topic, not both")
    if not args.bootstrap_servers:
        raise ConfigError("--input-topic needs --bootstrap-servers HOST:PORT (or CEC_BOOTSTRAP_SERVERS)")
    check_operator_flags(args, "FIELD (a value field, or @timestamp for the record timestamp)")
    check_standby_flags(args)
    if args.crash_after is not None and args.crash_after < 1:
        raise ConfigError("--crash-after needs K >= 1")
    if args.crash_after is not None and args.follow:
        raise ConfigError("--crash-after needs a bounded run (no --follow)")
    operator = operator_spec(args)
    results_path, dead_path = results_paths(args.results)
    source = _source_spec(args)
    trim_every, trim_pace = trim_settings(args)
    with store_dir(args.store_dir, "cec-run-") as root:
        store_cfg = with_lease(args, store_spec(root, args.bootstrap_servers))
        first_here = not _pinned_marker(root, operator, source).exists()
        partitions, (output_topic, pinned) = concurrently(
            lambda: topic_partition_count(args.bootstrap_servers, args.input_topic),
            lambda: _pinned_source(root, args, operator, source),
        )
        resumed, _ = concurrently(
            lambda: (
                None
                if not first_here
                else resumed_elsewhere_line(
                    store_cfg, output_topic, "give --output-topic NEW-NAME (or delete that topic)"
                )
            ),
            # A wrong field or format is said now, not after the whole run.
            lambda: check_topic_input(pinned),
        )
        if resumed is not None:
            say(resumed)
        template = JobSpec(
            operator=OperatorSpec.from_dict(operator),
            source=SourceSpec.from_dict({**pinned, "group_id": f"cec-{output_topic}"}),
            store=StoreSpec.from_dict(store_cfg),
            output_topic=output_topic,
            output_partitions=partitions,
            progress=args.progress,
            checkpointing=checkpointing_of(args),
            results_topic=results_topic_of(args),
            metrics_port=args.metrics_port,
            trim_every=trim_every,
            trim_pace=trim_pace,
            ec_cache=args.ec_cache == "on",
        )
        store = open_store(store_cfg)
        try:
            store.create_topic(output_topic, partitions)
            if args.results_topic:  # a plain topic; an existing one must have the output's partitions
                store.create_topic(args.results_topic, partitions)
        finally:
            store.close()
        specs = specs_of(template, root, output_topic, partitions)
        say_target_cost(template.checkpointing, [Path(s.stats_path or "") for s in specs])
        progress_path = root / f".{output_topic}.results-writer.json"
        with StopRequest().on_signals() as stop:
            if trim_every is not None or IncrementalOutputs.resumable(progress_path):
                if args.standby:
                    raise ConfigError(
                        "--standby does not take a run that trims its log yet: give --trim-every 0"
                    )
                run, (n_results, n_dead, kinds) = _run_trimmed(
                    args,
                    specs,
                    root,
                    store_cfg,
                    output_topic,
                    (results_path, dead_path, progress_path),
                    operator,
                    stop,
                )
            else:
                run = _execute(
                    args,
                    specs,
                    root,
                    lambda: write_results(store_cfg, output_topic, results_path, dead_path, operator),
                    stop,
                )
                if not run.stopped_early(args.follow):
                    n_results, n_dead, kinds = write_results(
                        store_cfg, output_topic, results_path, dead_path, operator
                    )
        if run.stopped_early(args.follow):
            raise stopped_error(stop.signum or signal.SIGTERM, args.store_dir, run.partial_results)
        recoveries = run.recoveries
    _report(args, partitions, pinned, output_topic, results_path, dead_path, n_results, n_dead, kinds)
    _report_recoveries(args, recoveries)
    check_not_all_dead(kinds, dead_path, "records")
    return 0


def specs_of(template: JobSpec, root: Path, output_topic: str, partitions: int) -> list[JobSpec]:
    specs = [instance_spec(template, p) for p in range(partitions)]
    for p, spec in enumerate(specs):
        spec.stats_path = str(root / f".{output_topic}.{p}.stats.json")
    return specs


@dataclass
class InstancesRun:
    """What the instances of one `cec run --input-topic` did: each one's recovery, whether each reached the
    end of its input, and where a stopped run's results so far are (the trimmed path writes as it goes)."""

    recoveries: list[dict[str, Any] | None]
    completed: list[bool]
    partial_results: str | None = None
    # Each instance's trim bound when it stopped (`RunStats.trim_bound`; None: unknown or no trimming).
    trim_bounds: list[int | None] = field(default_factory=list)

    def stopped_early(self, follow: bool) -> bool:
        """A bounded run that some instance did not finish (a following run has no end to miss)."""
        return not follow and not all(self.completed)


def _execute(
    args: argparse.Namespace,
    specs: list[JobSpec],
    root: Path,
    refresh: Callable[[], object],
    stop: StopRequest,
) -> InstancesRun:
    """Every instance: in this process, or with --crash-after each in a worker SIGKILLed after K records
    and one that recovers (a stop request is then seen between workers); each instance's recovery."""
    if args.crash_after is None:
        return _run_instances(specs, args.follow, refresh, stop, args.standby, args.standby_replica != "off")
    run = InstancesRun([], [False] * len(specs))
    for p, spec in enumerate(specs):
        if stop():
            break
        spec_path = root / f"run-{p}.json"
        rc = wait(start_worker(spec, spec_path, crash_after=args.crash_after), "operator", stop)
        if stop():
            break
        if rc == -signal.SIGKILL:
            say(
                f"partition {p}: operator process SIGKILLed after {args.crash_after:,} input records; recovering"
            )
        wait(start_worker(spec, spec_path), "operator", stop)
        if stop():
            break
        stats = load_stats(Path(spec.stats_path or ""))
        run.recoveries.append(stats.get("recovery"))
        run.completed[p] = bool(stats.get("completed"))
        run.trim_bounds.append(stats.get("trim_bound"))
    return run


def _run_trimmed(
    args: argparse.Namespace,
    specs: list[JobSpec],
    root: Path,
    store_cfg: dict[str, Any],
    output_topic: str,
    paths: tuple[Path, Path, Path],
    operator: dict[str, Any],
    stop: StopRequest,
) -> tuple[InstancesRun, tuple[int, int, dict[str, int]]]:
    """The run with --trim-every (or resuming one that trimmed): the results and dead-letter files are
    written while it goes on by a registered consumer of every output partition (`IncrementalOutputs`),
    so the trimmed log never held a result they lack. A bounded run writes them under `.partial` names
    until every instance reached the end of its input."""
    store = open_store(store_cfg)
    try:
        writer = results_writer(store, output_topic, paths, operator, partial=not args.follow)
        try:
            with writer.running(on_error=stop.set):
                # A following run's results file grows as the writer goes: nothing to rewrite each second.
                run = _execute(args, specs, root, lambda: None, stop)
            for p, low in enumerate(run.trim_bounds):  # after the writer's final acknowledgement
                if low is not None:
                    trim_after_consumers(store, output_topic, p, low)
            if not run.stopped_early(args.follow):
                writer.finish()
            run.partial_results = writer.partial_results
        finally:
            writer.close()
    finally:
        store.close()
    return run, (writer.n_results, writer.n_dead, dict(writer.counts))


def _report(
    args: argparse.Namespace,
    partitions: int,
    pinned: dict[str, Any],
    output_topic: str,
    results_path: Path,
    dead_path: Path,
    n_results: int,
    n_dead: int,
    kinds: dict[str, int],
) -> None:
    bounds = "" if args.follow else f", bounded at {pinned.get('end_offsets')}"
    say(f"input:        topic {args.input_topic} ({args.format}), {partitions} partition(s){bounds}")
    say(f"output log:   {output_topic} ({partitions} partition(s)); lag in consumer group cec-{output_topic}")
    for line in output_lines(
        results_path, dead_path, (n_results, n_dead, kinds), "records", args.results_topic
    ):
        say(line)


def _report_recoveries(args: argparse.Namespace, recoveries: list[dict[str, Any] | None]) -> None:
    for p, rec in enumerate(recoveries):
        if rec or args.crash_after is not None:
            say(f"partition {p}:")
            for line in recovery_lines(rec):
                say(line)


def _run_instances(
    specs: list[JobSpec],
    follow: bool,
    refresh: Callable[[], object],
    stop: StopRequest,
    standby: bool = False,
    replica: bool = True,
) -> InstancesRun:
    """Every partition's instance in this process, side by side (one thread each, so partitions advance
    together as a multi-partition input does), until their input ends or `stop` is set (SIGTERM, Ctrl-C:
    each instance stops at its next batch, its log intact); a following run rewrites the results file from
    the log every second."""
    errors: list[BaseException] = []
    stats: list[RunStats | None] = [None] * len(specs)

    def run(i: int) -> None:
        try:
            stats[i] = run_job(
                specs[i],
                stop=stop,
                started=process_started(),
                standby=Standby(stop=stop, replica=replica) if standby else None,  # `cec run --standby`
            )
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=run, args=(i,), name=f"cec-run-{i}") for i in range(len(specs))]
    try:
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            if stop.wait(_FOLLOW_REFRESH_S if follow else 0.05):
                break
            if follow:
                refresh()
    finally:
        stop.set()  # a bounded run only gets here early on an error or a stop request
        for thread in threads:
            thread.join()
    if errors:
        raise errors[0]
    return InstancesRun(
        [s.recovery.as_dict() if s and s.recovery else None for s in stats],
        [s is not None and s.completed for s in stats],
        trim_bounds=[None if s is None else s.trim_bound for s in stats],
    )
