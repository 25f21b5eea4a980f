"""`cec recover --dry-run`: what a recovery would do now, changing nothing (`cec.dry_run` plans it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from cec import inspection
from cec.cli.common import read_store_args, say_report
from cec.exceptions import ConfigError

__all__ = ["add_parser", "cmd_recover"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    recover = sub.add_parser("recover", help="--dry-run: what a recovery would do now, changing nothing")
    recover.add_argument("topic")
    recover.add_argument(
        "--dry-run",
        action="store_true",
        help="report the EC windows, extent, replay start per input partition and an estimated time",
    )
    recover.add_argument("--json", action="store_true", help="one JSON object")
    read_store_args(recover)
    recover.set_defaults(func=cmd_recover)


def cmd_recover(args: argparse.Namespace) -> int:
    from cec.dry_run import plan_recovery

    if not args.dry_run:
        raise ConfigError(
            "only --dry-run is supported: a job recovers by itself when it is run again on its log "
            "(e.g. cec run with the same --store-dir)"
        )
    with inspection.existing_store(args.store_dir, args.bootstrap_servers) as store:
        plans = plan_recovery(store, args.topic, Path(args.store_dir) if args.store_dir else None)
    say_report(
        args.json,
        {"topic": args.topic, "partitions": [p.as_json() for p in plans]},
        (plan.lines(args.topic) for plan in plans),
    )
    return 0
