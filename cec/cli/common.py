"""What the commands of `cec` share: the flag groups and types several commands take, the one place the
CLI prints, the store directory of a run, operator worker processes, and the report lines of a recovery
and of checkpointing.

The bottom of the CLI's imports: it imports no command module, so every command module can import it.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from cec.config import POLICIES, Checkpointing
from cec.exceptions import CecError, ConfigError
from cec.stopping import StopRequest
from cec.validation import check_output_file, prepare_store_dir
from operators.aggregate_flags import result_layout
from operators.base import DEAD_LETTER_SCHEMA
from operators.job import JobSpec
from operators.sinks import IncrementalOutputs, result_formats, write_outputs
from operators.worker import REPORTED_ERROR_EXIT
from queuestore.base import QueueStore
from queuestore.factory import open_store
from queuestore.kafka_config import ENV as KAFKA_CONFIG_ENV

__all__ = [
    "AlreadyReported",
    "check_not_all_dead",
    "checkpoint_lines",
    "checkpointing_of",
    "concurrently",
    "digest",
    "interrupted_line",
    "load_stats",
    "output_lines",
    "policy_args",
    "port",
    "positive_int",
    "read_store_args",
    "recovery_lines",
    "results_paths",
    "results_writer",
    "resumed_elsewhere_line",
    "say",
    "say_report",
    "start_worker",
    "store_dir",
    "wait",
    "write_results",
]


# -- printing ---------------------------------------------------------------------------------------------
def say(message: str = "") -> None:
    """A line of a command's report on stdout (the library logs; only the CLI prints)."""
    print(message, flush=True)


def say_report(as_json: bool, doc: object, sections: Iterable[Iterable[str]]) -> None:
    """A read-only command's answer: `doc` as one JSON object with --json, else every section's lines."""
    if as_json:
        say(json.dumps(doc))
        return
    for lines in sections:
        for line in lines:
            say(line)


# -- flag types and groups --------------------------------------------------------------------------------
def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"must be 1..65535, got {value}")
    return value


def policy_args(p: argparse.ArgumentParser, q: int | None, u: int | None) -> None:
    """The checkpoint-policy and store flags of the commands that run operators (`checkpointing` reads them)."""
    p.add_argument(
        "--Q",
        type=positive_int,
        default=None,
        help=f"extent size target q (records); default {q} (none with --recovery-target: the operator picks)",
    )
    p.add_argument(
        "--U",
        type=positive_int,
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
    p.add_argument(
        "--gopen-only",
        action="store_true",
        help="write no G-checks (the paper's minimum overhead): a restart replays from the oldest open "
        "window, however old; not with --Q/--U/--recovery-target/--policy cost-benefit",
    )
    _store_args(
        p,
        "where queues and indexes live (default: a temporary directory)",
        "use Kafka for the output queues (also from CEC_BOOTSTRAP_SERVERS)",
    )


def read_store_args(p: argparse.ArgumentParser) -> None:
    """--store-dir/--bootstrap-servers of the commands that only read a store (never create it)."""
    _store_args(
        p,
        "the store's directory (must exist; optional on Kafka)",
        "the queues are on Kafka (also from CEC_BOOTSTRAP_SERVERS)",
    )


def _store_args(p: argparse.ArgumentParser, store_dir_help: str, servers_help: str) -> None:
    """--store-dir, --bootstrap-servers (also from CEC_BOOTSTRAP_SERVERS) and --kafka-config."""
    p.add_argument("--store-dir", help=store_dir_help)
    p.add_argument("--bootstrap-servers", default=os.environ.get("CEC_BOOTSTRAP_SERVERS"), help=servers_help)
    p.add_argument(
        "--kafka-config",
        metavar="FILE",
        help="librdkafka properties (key=value lines: security.protocol, sasl.*, ssl.*, timeouts) for every "
        f"Kafka client of the command (also from {KAFKA_CONFIG_ENV})",
    )


def checkpointing_of(args: argparse.Namespace) -> Checkpointing:
    """The checkpoint configuration from --Q/--U/--ci-ms/--cp-ms/--recovery-target/--policy/--mtbf.

    A command's default Q and U (`cec demo`: the paper's 20,000 / 100,000; `cec run`: U = 100,000, the
    default of `cec.config.Checkpointing.default`) apply only without a recovery target: with one, the
    operator picks them, and a Q or U given beside it bounds what it picks. --gopen-only: no G-checks."""
    if args.gopen_only:
        if args.Q is not None or args.U is not None or args.recovery_target is not None:
            raise ConfigError(
                "--gopen-only writes no G-checks: give it without --Q, --U and --recovery-target"
            )
        if args.policy != "targets":
            raise ConfigError("--gopen-only writes no G-checks: give it without --policy cost-benefit")
        return Checkpointing(ci_ms=args.ci_ms, cp_ms=args.cp_ms)
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


# -- where a run keeps its store, and its workers ---------------------------------------------------------

_A = TypeVar("_A")
_B = TypeVar("_B")


def concurrently(first: Callable[[], _A], second: Callable[[], _B]) -> tuple[_A, _B]:
    """(first(), second()) as if called one after the other, but run at once (`second` on a thread): the
    checks before a run are each a broker round trip or two (~0.05-0.15 s of a restart each). The error is
    the one the sequence would raise: `first`'s if both fail, and `second`'s only once `first` returned."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cec-check") as pool:
        later: Future[_B] = pool.submit(second)
        try:
            a = first()
        except BaseException:
            later.cancel()
            raise
        return a, later.result()


@contextmanager
def store_dir(given: str | None, prefix: str) -> Iterator[Path]:
    """The store directory the user gave (checked), or a temporary one removed afterwards."""
    if given:
        yield prepare_store_dir(given)
    else:
        path = Path(tempfile.mkdtemp(prefix=prefix))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)


def digest(value: Any) -> str:
    """A short, stable name part for a JSON-able value (topic and marker names)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def start_worker(spec: JobSpec, spec_path: Path, crash_after: int | None = None) -> subprocess.Popen[bytes]:
    """Start the job in its own process: the unit that gets killed and recovered (`crash_after`: it
    SIGKILLs itself after that many input tuples, `operators.crash_after`)."""
    spec_path.write_text(spec.to_json())
    extra = [] if crash_after is None else ["--crash-after", str(crash_after)]
    return subprocess.Popen([sys.executable, "-m", "operators.worker", str(spec_path), *extra])


class AlreadyReported(CecError):
    """A child process already printed the one-line error; the CLI only exits with its code."""


# How often a parent waiting on its worker looks at its stop request (a check of a flag, not a deadline).
_STOP_POLL_S = 0.1


def wait(proc: subprocess.Popen[bytes], what: str, stop: StopRequest | None = None) -> int:
    """The worker's exit code: 0, or -SIGKILL (killed on purpose); anything else is an error. `stop`: once
    it is set (a stop signal, or the results writer died) the worker is SIGKILLed instead of awaited: it
    polls no request of this process, and one that paces its trimming on a dead writer would wait for it
    for ever; its log is then what a crash leaves, which the next run recovers. The caller checks `stop`.
    Interrupted (a second Ctrl-C), the worker is SIGKILLed before the interrupt goes on: a crash, the log
    intact."""
    try:
        if stop is not None:
            while proc.poll() is None:
                if stop.wait(_STOP_POLL_S):
                    proc.kill()
                    break
        rc = proc.wait()
    except KeyboardInterrupt:
        proc.kill()
        proc.wait()
        raise
    if stop is not None and stop():
        return rc  # whatever it died of then (Ctrl-C reaches it too): the caller reports the stop
    if rc == REPORTED_ERROR_EXIT:
        raise AlreadyReported(what)
    if rc not in (0, -signal.SIGKILL):
        raise CecError(f"{what} failed with exit code {rc}")
    return rc


def load_stats(path: Path) -> dict[str, Any]:
    """The stats a worker left at its job's `stats_path` (empty if it left none)."""
    return json.loads(path.read_text()) if path.exists() else {}


def resumed_elsewhere_line(store_cfg: dict[str, Any], topic: str, how_afresh: str) -> str | None:
    """On Kafka a new --store-dir does not start a run afresh: its output log is named after the operator
    and the input, and topics outlive store dirs. For a run whose store dir did not know its job, the line
    that says which existing log it resumes and how to start afresh (`how_afresh`); None when the log is
    new or empty, or the store is the embedded one (its logs live in the store dir)."""
    if store_cfg.get("type") != "kafka":
        return None
    from queuestore.kafka import KafkaQueueStore

    store = open_store(store_cfg)
    try:
        if not store.topic_exists(topic):
            return None
        assert isinstance(store, KafkaQueueStore)
        records = store.offset_span(topic)  # its size from the broker: the log is not read
    finally:
        store.close()
    if records <= 0:
        return None
    return (
        f"resuming the output log {topic} on Kafka ({records:,} offsets), which an earlier run of this "
        f"operator over the same input wrote from another store dir (Kafka topics outlive store dirs); to "
        f"start afresh, {how_afresh}"
    )


def interrupted_line(args: argparse.Namespace) -> str:
    """The one line of a command interrupted at once (Ctrl-C outside a stop request, or a second one):
    whether its log survives and how to go on (exit 130)."""
    if args.command != "run":  # the others only read, or (`cec demo`) start afresh every time
        return "interrupted by Ctrl-C"
    if getattr(args, "store_dir", None) or getattr(args, "bootstrap_servers", None):
        where = f" in {args.store_dir}" if getattr(args, "store_dir", None) else " on Kafka"
        return (
            f"interrupted by Ctrl-C: the output log{where} is intact (as after a crash) and no results file "
            "was written; run the same command again to resume from its log"
        )
    return (
        "interrupted by Ctrl-C: no results file was written and the log was in a temporary directory; give "
        "--store-dir DIR to make a run resumable"
    )


# -- report lines -----------------------------------------------------------------------------------------
def recovery_lines(rec: dict[str, Any] | None) -> list[str]:
    if not rec:
        return ["  recovery:            none (no crash)"]
    if rec.get("log_complete"):
        return [
            "  recovery:            none (the output log was complete: an earlier run finished it, nothing replayed)"
        ]
    return [
        f"  extent at the crash:   {rec['extent_records']:,} records ({rec['ec_windows']:,} open windows in the EC)",
        f"  EC reconstruction:     {rec['ec_build_seconds'] * 1000:.1f} ms "
        f"({rec['records_read'] / max(rec['ec_build_seconds'], 1e-9):,.0f} records/s)",
        f"  EC-load time:          {rec['ec_load_seconds'] * 1000:.1f} ms",
        f"  replay:                from {rec['replay_start']} to crash point {rec['crash_pos']}: "
        f"{rec['tuples_replayed']:,} tuples replayed, {rec['tuples_skipped']:,} skipped",
        f"  damaged footprints:    {rec['corrupt_footprints']}",
        f"  recovery time:         {rec['recovery_seconds'] * 1000:.1f} ms (from the restart's start to caught up with the crash point)",
        *restart_phase_lines(rec),
    ]


# How the report names the phases of a restart (`recovery.timeline.PHASES`).
_PHASE_NAMES = {
    "process_start": "process start",
    "store_open": "store open",
    "index": "index",
    "ec_build": "EC build",
    "ec_load": "EC load",
    "restore": "restore",
    "replay": "replay",
}


def restart_phase_lines(rec: dict[str, Any]) -> list[str]:
    """The phases the recovery time is made of (stats of a run before the phases were recorded: none)."""
    phases = rec.get("phases") or {}
    if not phases:
        return []
    parts = ", ".join(
        f"{_PHASE_NAMES.get(name, name)} {seconds * 1000:,.1f} ms" for name, seconds in phases.items()
    )
    return [f"  restart phases:        {parts}"]


def checkpoint_lines(stats: dict[str, Any], checkpointing: Checkpointing) -> list[str]:
    """Report lines on checkpointing: the duty really spent and, with a recovery target, whether the
    recovery met it. From the stats of the operator's last run (after recovery, when it crashed)."""
    if not stats or not checkpointing.checkpoints:
        return []
    rec = stats.get("recovery")
    # The stats are the last run's: after a recovery they count only what it made since.
    since = " after recovery" if rec else ""
    lines = [
        f"  checkpoint duty:       {stats.get('checkpoint_duty', 0.0):.1%} of operator time producing G-checks "
        f"(budget {stats.get('checkpoint_budget', 0.0):.1%}; {stats.get('checkpoint_seconds', 0.0) * 1000:,.0f} ms "
        f"in {stats.get('gchecks', 0):,} G-checks{since})",
        f"  duty while wanted:     {stats.get('checkpoint_duty_wanted', 0.0):.1%} of the time the policy wanted "
        f"G-checks (budget {stats.get('checkpoint_budget', 0.0):.1%})",
        f"  targets in force:      Q={stats.get('q_target')} U={stats.get('u_target')} "
        f"(max u {stats.get('max_replay', 0):,}, max q {stats.get('max_extent', 0):,}); {stats.get('checkpoint_policy', '')}",
    ]
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


# -- the results files of `cec run` -----------------------------------------------------------------------
def results_paths(results: str) -> tuple[Path, Path]:
    """The results file and its dead-letter file beside it, both checked writable before any work."""
    results_path = Path(results)
    dead_path = results_path.with_name(results_path.stem + ".dead-letters.csv")
    check_output_file(results_path, "--results")
    check_output_file(dead_path, "dead-letter file")
    return results_path, dead_path


def write_results(
    store_cfg: Mapping[str, Any], topic: str, results: Path, dead: Path, operator: Mapping[str, Any]
) -> tuple[int, int, dict[str, int]]:
    """The results and dead-letter CSVs of a finished (or following) run, from its whole log: (results,
    dead letters, records of each kind)."""
    store = open_store(store_cfg)
    try:
        schema, columns, formats = result_layout(operator, result_formats(operator))
        n_results, n_dead, counts = write_outputs(
            store, topic, schema, DEAD_LETTER_SCHEMA, (results, columns), dead, formats
        )
    finally:
        store.close()
    return n_results, n_dead, dict(counts)


def results_writer(
    store: QueueStore,
    topic: str,
    paths: tuple[Path, Path, Path],
    operator: Mapping[str, Any],
    *,
    partial: bool,
) -> IncrementalOutputs:
    """The results and dead-letter CSVs written while a trimmed run goes on, by a registered consumer of
    its log (`paths`: results, dead letters, the writer's progress file), opened."""
    results, dead, progress = paths
    schema, columns, formats = result_layout(operator, result_formats(operator))
    return IncrementalOutputs(
        store, topic, schema, DEAD_LETTER_SCHEMA, (results, columns), dead, progress, formats, partial=partial
    ).open()


def output_lines(
    results: Path,
    dead: Path,
    counts: tuple[int, int, Mapping[str, int]],
    what: str,
    results_topic: str | None,
) -> list[str]:
    """The report lines of `cec run` on what it wrote (`counts`: results, dead letters, records of each
    kind; `what` the input's unit: rows, records)."""
    n_results, n_dead, kinds = counts
    lines = [
        f"results:      {n_results:,} closed windows -> {results}",
        f"dead letters: {n_dead:,} {what} not processed -> {dead}",
    ]
    if results_topic:
        lines.append(f"results topic: {results_topic} (plain JSON, one record per result, read_committed)")
    lines.append(f"footprints:   {kinds.get('GOPEN', 0):,} G-open, {kinds.get('GCHECK', 0):,} G-check")
    lines.append("windows still open at the end of the input are not emitted")
    return lines


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
