"""`cec run --standby` and `--lease-timeout` (either input): the checks of the flags; the standby itself is
`operators.standby`, the lease `queuestore.kafka.lease`."""

from __future__ import annotations

import argparse
from typing import Any

from cec.exceptions import ConfigError
from queuestore.factory import check_lease_timeout

__all__ = ["LEASE_TIMEOUT_HELP", "check_standby_flags", "with_lease"]

LEASE_TIMEOUT_HELP = (
    "hold the output partitions' writer lease on the Kafka cluster, timed out after SECONDS without a "
    "heartbeat: a --standby on another host (another --store-dir) takes over only once the primary's lease "
    "lapsed. Give the primary and its standby the same value; the broker's group.min.session.timeout.ms "
    "(default 6 s) bounds it from below (docs/recovery.md). Without it, only the same host's lock shows a "
    "dead primary: a standby on another host fences a live primary at once"
)


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


def with_lease(args: argparse.Namespace, store_cfg: dict[str, Any]) -> dict[str, Any]:
    """The store spec with --lease-timeout (one line if it is not a positive number or the store is not
    Kafka)."""
    seconds = getattr(args, "lease_timeout", None)
    if seconds is None:
        return store_cfg
    check_lease_timeout(seconds, str(store_cfg.get("type")), "--lease-timeout")
    return {**store_cfg, "lease_timeout_s": seconds}
