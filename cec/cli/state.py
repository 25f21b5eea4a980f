"""`cec state TOPIC --as-of AT`: the state of every window open at a past point of a log, as JSON or CSV
(`cec.state_as_of` rebuilds it)."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from cec import inspection
from cec.cli.common import read_store_args, say

__all__ = ["add_parser", "cmd_state"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    read_store_args(state)
    state.set_defaults(func=cmd_state)


def cmd_state(args: argparse.Namespace) -> int:
    from cec.state_as_of import AsOf, state_as_of

    at = AsOf.parse(args.as_of)
    input_path = Path(args.input) if args.input else None
    with inspection.existing_store(args.store_dir, args.bootstrap_servers) as store:
        windows = state_as_of(store, args.topic, at, input_path=input_path)
    if args.format == "json":
        doc = {"topic": args.topic, "as_of": at.describe(), "windows": [w.as_json() for w in windows]}
        say(json.dumps(doc))
        return 0
    fields = list(windows[0].state) if windows else []
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(["partition", "key", "window", *fields])
    for w in windows:
        writer.writerow([w.partition, w.key, w.window, *(w.state[f] for f in fields)])
    return 0
