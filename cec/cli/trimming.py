"""`cec run --trim-every N`: the flag, its default (on where results stream as the run goes: `--follow`
runs and runs with `--results-topic`), and the pace the operator keeps with the results writer
(docs/long-runs.md, "Trimming")."""

from __future__ import annotations

import argparse

from operators.engine.trimming import DEFAULT_TRIM_EVERY, TrimPace
from operators.incremental_outputs import COMMIT_EVERY, RESULTS_CONSUMER

__all__ = ["DEFAULT_TRIM_EVERY", "add_trim_argument", "trim_settings"]


def _interval(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of records, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0: never trim), got {value}")
    return value


def add_trim_argument(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--trim-every",
        type=_interval,
        metavar="N",
        help=f"trim the output log every N records; 0: never (default: every {DEFAULT_TRIM_EVERY:,} with "
        "--follow or --results-topic, else never): the results and dead-letter CSVs are then written as the "
        "run goes on and acknowledged, so the log keeps only what recovery and the unwritten results still "
        "need (docs/long-runs.md)",
    )


def trim_settings(args: argparse.Namespace) -> tuple[int | None, TrimPace | None]:
    """The run's trim interval (None: never) and the pace of its operators with the results writer: at
    each trim the writer's acknowledgement must be within the interval plus the writer's commit interval
    of the durable end (it always gets there: once it read everything it leaves less than a commit
    interval unacknowledged)."""
    every = args.trim_every
    if every is None and (getattr(args, "follow", False) or getattr(args, "results_topic", None)):
        every = DEFAULT_TRIM_EVERY
    if not every:
        return None, None
    return every, TrimPace(RESULTS_CONSUMER, every + COMMIT_EVERY)
