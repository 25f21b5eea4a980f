"""`cec inspect`: what an output queue holds and what recovery would rebuild from it (`--list`, `--json`;
`cec.inspection` does the reading)."""

from __future__ import annotations

import argparse

from cec import inspection
from cec.cli.common import read_store_args, say, say_report
from cec.exceptions import ConfigError

__all__ = ["add_parser", "cmd_inspect"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    inspect = sub.add_parser("inspect", help="what an output queue holds and what recovery would rebuild")
    inspect.add_argument("topic", nargs="?")
    inspect.add_argument("--list", action="store_true", help="the topics in the store, one per line")
    inspect.add_argument("--json", action="store_true", help="one JSON object (see cec/inspection.py)")
    read_store_args(inspect)
    inspect.set_defaults(func=cmd_inspect)


def cmd_inspect(args: argparse.Namespace) -> int:
    if args.list == bool(args.topic):
        raise ConfigError("give a TOPIC to inspect, or --list to list the topics")
    with inspection.existing_store(args.store_dir, args.bootstrap_servers) as store:
        if args.list:
            topics = inspection.list_topics(store)
            if not topics and not args.bootstrap_servers:
                raise ConfigError(inspection.no_embedded_log(args.store_dir))
            for topic, partitions in topics:
                say(f"{topic}\t{partitions} partition(s)")
            return 0
        summaries = inspection.inspect_topic(store, args.topic, shared=bool(args.bootstrap_servers))
    say_report(
        args.json, inspection.topic_json(args.topic, summaries), (s.lines(args.topic) for s in summaries)
    )
    return 0
