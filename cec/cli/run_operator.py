"""The operator of `cec run`, whichever its input (a CSV file, `run.py`; a Kafka topic, `run_topic.py`):
its flags, the checks between them, and the operator spec they make.

The one place an operator flag of `cec run` is added: its definition (`add_operator_arguments`), its
checks (`check_operator_flags`) and what it sets in the spec (`operator_spec`).
"""

from __future__ import annotations

import argparse
from typing import Any

from cec.cli.common import positive_int
from cec.exceptions import ConfigError
from operators.aggregate import AGGREGATES
from operators.aggregate_flags import aggregate_flags
from operators.job import aggregate_operator, build_operator

__all__ = ["add_operator_arguments", "check_operator_flags", "operator_spec"]


def add_operator_arguments(run: argparse.ArgumentParser) -> None:
    """--key, --value, --time (the fields it reads: columns of a CSV, fields of a topic's values), the
    window (--window-count, --window-time or --session-gap; --slide), --allowed-lateness and --agg."""
    run.add_argument(
        "--key",
        required=True,
        help="key column, or several comma-separated (a composite key: carrier,origin)",
    )
    run.add_argument(
        "--value", help="value column (a number); the column of every --agg that names none (default: avg)"
    )
    run.add_argument(
        "--time",
        help="event-time column: integer milliseconds, ISO-8601 or YYYY-MM-DD HH:MM:SS (UTC without a "
        "zone); needed for --window-time and --session-gap",
    )
    group = run.add_mutually_exclusive_group(required=True)
    group.add_argument("--window-count", type=positive_int, help="tumbling window of N tuples per key")
    group.add_argument(
        "--window-time",
        help="time window per key, e.g. 500ms, 10s, 5m, 1h, 5 minutes, 1 hour: tumbling, or hopping with --slide",
    )
    run.add_argument(
        "--slide",
        metavar="D",
        help="hopping windows: a --window-time window starts every D (e.g. --window-time 1h --slide 15m), "
        "as Spark's window(ts, size, slide); D must divide the window",
    )
    group.add_argument(
        "--session-gap",
        metavar="GAP",
        help="session windows per key (needs --time): tuples less than GAP apart share a session "
        "[first, last + GAP), e.g. 30m; the key's next tuple at or past the end closes it, or with "
        "--allowed-lateness the watermark",
    )
    run.add_argument(
        "--allowed-lateness",
        metavar="D",
        help="event-time watermarks: a time window closes once every input partition's largest event time "
        "is D past its end (e.g. 0, 500ms, 10s), whether or not its key comes back; later tuples are "
        "dead letters 'late' (sessions: docs/long-runs.md)",
    )
    run.add_argument(
        "--agg",
        action="append",
        metavar="FUNC[:COLUMN]",
        help=f"aggregate, repeatable: FUNC one of {', '.join(AGGREGATES)} over COLUMN (default --value; "
        "count:* counts rows); default avg. Several: one result column each, FUNC_COLUMN",
    )


def check_operator_flags(args: argparse.Namespace, time_flag: str) -> None:
    """The operator flags that need one another (`time_flag`: how the input names its time field, in the
    message when --window-time comes without one)."""
    if args.window_time and not args.time:
        raise ConfigError(f"--window-time needs --time {time_flag}")
    if args.session_gap is not None and not args.time:
        raise ConfigError(f"--session-gap needs --time {time_flag}")
    if args.slide is not None and not args.window_time:
        raise ConfigError("--slide needs --window-time (hopping windows are time windows)")
    if args.allowed_lateness is not None and not args.window_time and args.session_gap is None:
        raise ConfigError(
            "--allowed-lateness needs --window-time or --session-gap (event-time watermarks close time windows)"
        )


def operator_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The operator spec of the run, checked by building its operator before any work (a duration flag that
    does not parse, a slide larger than the window: one `ConfigError`)."""
    spec = aggregate_operator(
        **aggregate_flags(args.key, args.value, args.agg),
        window_count=args.window_count,
        window_time=args.window_time,
        time=args.time,
        allowed_lateness=args.allowed_lateness,
        slide=args.slide,
        session_gap=args.session_gap,
    )
    build_operator(spec)
    return spec
