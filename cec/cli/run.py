"""`cec run`: CEC over a user's CSV, optionally SIGKILLed after K rows and recovered; with --input-topic,
over a Kafka topic instead (`run_topic.py`). The parser of `cec run` is here, whichever its input; the
operator's own flags are in `run_operator.py`."""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path
from typing import Any

from cec.cli import run_topic
from cec.cli.common import (
    check_not_all_dead,
    checkpoint_lines,
    checkpointing_of,
    digest,
    load_stats,
    output_lines,
    policy_args,
    port,
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
from cec.cli.run_operator import add_operator_arguments, check_operator_flags, operator_spec
from cec.cli.standby import LEASE_TIMEOUT_HELP, check_standby_flags, with_lease
from cec.cli.trimming import add_trim_argument, trim_settings
from cec.config import DEFAULT_U_TARGET
from cec.exceptions import ConfigError
from cec.stopping import StopRequest, stopped_error
from cec.target_cost import say_target_cost
from cec.validation import check_csv_input
from operators.aggregate_flags import key_columns, value_columns
from operators.exceptions import StandbyStoppedError
from operators.job import JobSpec, run_job
from operators.local_trim import trim_after_consumers
from operators.sinks import IncrementalOutputs
from operators.sources import CsvSource
from operators.specs import OperatorSpec, SourceSpec
from operators.standby import Standby
from queuestore.factory import StoreSpec, open_store, store_spec
from recovery.timeline import process_started

__all__ = ["add_parser", "cmd_run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="CEC aggregate over a CSV file")
    run.add_argument("input", nargs="?", help="input CSV with a header row, processed in file order")
    add_operator_arguments(run)
    run.add_argument(
        "--results",
        required=True,
        help="results CSV: key,window,value,count,start,end, or with several keys or aggregates one column "
        "each (dead letters go beside it, NAME.dead-letters.csv)",
    )
    run.add_argument(
        "--crash-after", type=int, help="SIGKILL the operator process after K input rows, then recover"
    )
    add_trim_argument(run)
    run.add_argument(
        "--progress", action="store_true", help="also the operator's own progress messages on stderr"
    )
    run.add_argument(
        "--metrics-port",
        type=port,
        help="serve Prometheus metrics (cec_*) on this port while the run goes on (instance p: PORT + p)",
    )
    policy_args(run, q=None, u=DEFAULT_U_TARGET)  # bounded recovery by default (cec.config)
    run.add_argument(
        "--standby",
        action="store_true",
        help="run as the standby of the same command running as the primary (same arguments and "
        "--store-dir; on another host its own --store-dir and, both, --lease-timeout): follow its output log, "
        "and when it dies take over exactly where it stopped and go on (docs/recovery.md)",
    )
    run.add_argument("--lease-timeout", type=float, metavar="SECONDS", help=LEASE_TIMEOUT_HELP)
    run.add_argument(
        "--standby-replica",
        choices=("on", "off"),
        default=None,
        help="with --standby: also run the operator on the input while following (default on), so that a "
        "takeover replays nothing; off: follow the log only, at the cost of a replay from the footprints "
        "at the takeover (half the standby's CPU)",
    )
    run.add_argument(
        "--ec-cache",
        choices=("on", "off"),
        default="off",
        help="keep the eventual checkpoint beside the stream index under --store-dir, so that a restart on "
        "the same host reads only the log's tail instead of the extent (default off: measured no faster than "
        "reading the extent back at 100,000 keys, docs/recovery.md; derived data: a damaged or stale cache "
        "is rebuilt from the log)",
    )
    run_topic.add_topic_arguments(run)
    run.set_defaults(func=cmd_run)


_RUN_TOPICS = "cec-run-topics.json"


def _output_topic(
    root: Path, operator: dict[str, Any], input_path: Path, given: str | None = None
) -> tuple[str, bool]:
    """The output topic of `cec run` over `input_path` with `operator`, in the store at `root` (`given`:
    --output-topic), and whether this store dir already knew it (False: a first run from this store dir).

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
    job = digest([operator, str(input_path.resolve())])
    memory = root / _RUN_TOPICS
    try:
        known: dict[str, str] = json.loads(memory.read_text())
    except FileNotFoundError:
        known = {}
    except ValueError:
        raise ConfigError(f"{memory} is damaged; use a new --store-dir") from None
    remembered = known.get(job)
    knew = remembered is not None and given in (None, remembered)
    topic = remembered if knew and remembered is not None else given or f"run-{digest([operator, content])}"
    if not knew:
        known[job] = topic
        tmp = memory.with_name(f".{memory.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, sort_keys=True))
        tmp.replace(memory)
    return topic, knew


def _execute(
    spec: JobSpec,
    root: Path,
    crash_after: int | None,
    stop: StopRequest,
    standby: bool = False,
    replica: bool = True,
) -> dict[str, Any]:
    """Run the job (in this process until its input ends or `stop` is set, or with --crash-after in a worker
    SIGKILLed after K rows and a second one that recovers; with --standby as the standby of a running
    primary, `operators.standby`, with its replica unless `replica` is False); its stats."""
    if standby:
        try:
            standing_by = Standby(stop=stop, replica=replica)
            return run_job(spec, stop=stop, started=process_started(), standby=standing_by).as_dict()
        except StandbyStoppedError:
            return {"completed": False}
    if crash_after is None:
        return run_job(spec, stop=stop, started=process_started()).as_dict()
    rc = wait(start_worker(spec, root / "run.json", crash_after=crash_after), "operator", stop)
    if stop():
        return {"completed": False}
    if rc == -signal.SIGKILL:
        say(f"operator process SIGKILLed after {crash_after:,} input rows; recovering")
    wait(start_worker(spec, root / "run.json"), "operator", stop)
    if stop():
        return {"completed": False}
    return load_stats(Path(spec.stats_path or ""))


def cmd_run(args: argparse.Namespace) -> int:
    if args.input_topic:
        return run_topic.cmd_run_topic(args)
    if not args.input:
        raise ConfigError("give an input CSV file, or --input-topic TOPIC")
    results_topic = run_topic.results_topic_of(args)  # before any work: --results-topic needs a Kafka store
    input_path = Path(args.input)
    if not input_path.is_file():
        raise ConfigError(f"input file not found: {input_path}")
    check_operator_flags(args, "COL")
    if args.crash_after is not None and args.crash_after < 1:
        raise ConfigError("--crash-after needs K >= 1")
    check_standby_flags(args)
    operator = operator_spec(args)
    columns = [*key_columns(operator), *value_columns(operator), *([args.time] if args.time else [])]
    values: list[str | None] = [*value_columns(operator)] or [None]  # count:* alone reads no value column
    for value in values:
        check_csv_input(input_path, columns, value, args.time)
    results_path, dead_path = results_paths(args.results)
    trim_every, trim_pace = trim_settings(args)
    with store_dir(args.store_dir, "cec-run-") as root:
        store_cfg = with_lease(args, store_spec(root, args.bootstrap_servers))
        topic, knew = _output_topic(root, operator, input_path, args.output_topic)
        resumed = (
            None
            if knew
            else resumed_elsewhere_line(
                store_cfg, topic, f"delete topic {topic} or give --output-topic NEW-NAME"
            )
        )
        if resumed is not None:
            say(resumed)
        spec = JobSpec(
            operator=OperatorSpec.from_dict(operator),
            source=SourceSpec(type="csv", path=str(input_path.resolve())),
            store=StoreSpec.from_dict(store_cfg),
            output_topic=topic,
            progress=args.progress,
            checkpointing=checkpointing_of(args),
            stats_path=str(root / f".{topic}.stats.json"),
            results_topic=results_topic,
            metrics_port=args.metrics_port,
            trim_every=trim_every,
            trim_pace=trim_pace,
            ec_cache=args.ec_cache == "on",
        )
        say_target_cost(spec.checkpointing, [Path(spec.stats_path or "")])  # before any work: what it costs
        progress_path = root / f".{topic}.results-writer.json"
        stop = StopRequest()
        if trim_every is not None or IncrementalOutputs.resumable(progress_path):
            if args.standby:
                raise ConfigError("--standby does not take a run that trims its log yet: give --trim-every 0")
            # Trimming: the results are written while the run goes on, by a registered consumer of the
            # log (a run that trimmed before is resumed that way too, its log no longer holds everything),
            # under `.partial` names until the run reached the end of its input.
            store = open_store(store_cfg)
            try:
                store.create_topic(topic, spec.output_partitions)  # to register on it before any trim
                writer = results_writer(
                    store, topic, (results_path, dead_path, progress_path), operator, partial=True
                )
                try:
                    with writer.running(on_error=stop.set), stop.on_signals():
                        run_stats = _execute(spec, root, args.crash_after, stop)
                    if run_stats.get("trim_bound") is not None:  # after the writer's final acknowledgement
                        trim_after_consumers(store, topic, 0, run_stats["trim_bound"])
                    if run_stats.get("completed"):
                        writer.finish()
                finally:
                    writer.close()
            finally:
                store.close()
            if not run_stats.get("completed"):
                raise stopped_error(stop.signum or signal.SIGTERM, args.store_dir, writer.partial_results)
            counts = (writer.n_results, writer.n_dead, dict(writer.counts))
        else:
            with stop.on_signals():
                run_stats = _execute(
                    spec, root, args.crash_after, stop, args.standby, args.standby_replica != "off"
                )
            if not run_stats.get("completed"):
                raise stopped_error(stop.signum or signal.SIGTERM, args.store_dir)
            counts = write_results(store_cfg, topic, results_path, dead_path, operator)
        recovery = run_stats.get("recovery")
    for line in output_lines(results_path, dead_path, counts, "rows", args.results_topic):
        say(line)
    if args.crash_after is not None:
        for line in recovery_lines(recovery):
            say(line)
    for line in checkpoint_lines(run_stats, spec.checkpointing):
        say(line)
    check_not_all_dead(counts[2], dead_path, "rows")
    return 0
