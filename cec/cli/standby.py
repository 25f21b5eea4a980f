"""`cec run --standby` (either input): the checks of the flag; the standby itself is `operators.standby`."""

from __future__ import annotations

import argparse

from cec.exceptions import ConfigError

__all__ = ["check_standby_flags"]


def check_standby_flags(args: argparse.Namespace) -> None:
    """--standby needs the primary's --store-dir and stands in for no --crash-after run; --standby-replica
    goes with it."""
    if not args.standby:
        if getattr(args, "standby_replica", None) is not None:
            raise ConfigError("--standby-replica goes with --standby")
        return
    if args.crash_after is not None:
        raise ConfigError("--standby stands by a running primary: give it without --crash-after")
    if not args.store_dir:
        raise ConfigError("--standby needs the primary's --store-dir (where it follows the output log)")
