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
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

from cec import progress as progress_tasks
from cec.cli import demo, inspect, recover, run, state
from cec.cli.common import AlreadyReported, interrupted_line
from cec.exceptions import CecError, RunStoppedError
from operators.worker import REPORTED_ERROR_EXIT
from queuestore.kafka_config import ENV as KAFKA_CONFIG_ENV
from queuestore.kafka_config import quiet_librdkafka, read_properties

__all__ = ["DISTRIBUTION", "build_parser", "main"]

# The commands, in the order `cec --help` lists them: each module adds its own subcommand and flags.
_COMMANDS = (demo, run, inspect, recover, state)

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
    for command in _COMMANDS:
        command.add_parser(sub)
    for subparser in sub.choices.values():
        _global_options(subparser, argparse.SUPPRESS)
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
    """The `cec` command (`argv` None: this process's own arguments, as the installed `cec` calls it)."""
    args = build_parser().parse_args(argv)
    reporter = _setup_output(args)
    try:
        _use_kafka_config(args)
        return int(args.func(args))
    except AlreadyReported:
        return REPORTED_ERROR_EXIT
    except RunStoppedError as exc:
        reporter.stop()
        print(f"cec: {exc}", file=sys.stderr)
        return exc.exit_code
    except CecError as exc:  # the one root: store, recovery and pipeline errors too
        reporter.stop()
        print(f"cec: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the machine's answer to a path or a resource the user gave: one line too
        reporter.stop()
        where = f": {exc.filename}" if exc.filename else ""
        print(f"cec: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        reporter.stop()
        print(f"cec: {interrupted_line(args)}", file=sys.stderr)
        return 130
    finally:
        if argv is None:
            _outcome_reported()
        reporter.stop()
        progress_tasks.set_reporter(None)


def _outcome_reported() -> None:
    """The command's outcome is decided (and said, if it failed): a Ctrl-C from now until the process ends
    (an impatient user's next press, while the interpreter shuts down) changes nothing. Left at Python's
    default it raised KeyboardInterrupt during the shutdown, and the process died of SIGINT after it had
    reported its exit code: measured 1 in 6 runs of the stop-then-Ctrl-C test at load 5. Only for the
    process's own command: a caller of `main(argv)` in its own process keeps its SIGINT."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


if __name__ == "__main__":
    sys.exit(main())
