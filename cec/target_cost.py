"""What a `--recovery-target` will cost, said once at the start of a run (issue 26): a target that needs
more G-check time than the usual budget (CI of every CP), or one that no budget can meet, is said before
any work instead of minutes later in the log, when the runtime has measured its rates again.

The rates are those the previous run of the same job measured (its stats file: `RunStats.rates` and its
open windows), the best measure of this one; a first run has none, and nothing is said at its start (the
runtime says what it finds once it has measured them, `operators.engine.controller`). The plan is the
runtime's own (`cec.policy.RecoveryTimePolicy`), so what is said here is what the run will then do.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from cec.config import Checkpointing
from cec.policy import RecoveryTimePolicy
from cec.rates import MeasuredRates

__all__ = ["rates_of_stats", "say_target_cost", "target_cost_line"]

log = logging.getLogger(__name__)


def rates_of_stats(stats: Mapping[str, Any] | None) -> tuple[MeasuredRates, int] | None:
    """The rates a previous run planned with and its open windows at the end, from its stats (`RunStats.
    as_dict`); None when it measured no input rate (or there are no stats, or they are not of this form)."""
    if not stats or not isinstance(stats.get("rates"), Mapping):
        return None
    raw = dict(stats["rates"])
    names = {f.name for f in fields(MeasuredRates)}
    try:
        values = {k: v for k, v in raw.items() if k in names and k != "measured"}
        rates = MeasuredRates(**values, measured=set(raw.get("measured") or ()))
        open_windows = int(stats.get("open_windows") or 0)
    except (TypeError, ValueError):
        return None
    if rates.input_rate <= 0:
        return None
    return rates, open_windows


def target_cost_line(checkpointing: Checkpointing, rates: MeasuredRates, open_windows: int) -> str | None:
    """One warning line when the recovery target needs more than the usual budget at `rates` with
    `open_windows` windows open (what it will cost), or cannot be met at all; None when it fits."""
    target = checkpointing.recovery_target
    if target is None:
        return None
    policy = RecoveryTimePolicy(
        target, q_cap=checkpointing.q_target, u_cap=checkpointing.u_target, rates=rates
    )
    policy.observe(rates, open_windows)
    measured = (
        f"at the previous run's rates ({rates.input_rate:,.0f} input tuples/s, "
        f"{rates.gcheck_seconds * 1e6:,.0f} us per G-check, {open_windows:,} open windows)"
    )
    problem = policy.problem()
    if problem:
        return f"{problem}; the run goes on with the shortest replay it can hold"
    shortfall = policy.shortfall()
    if shortfall:
        return f"{shortfall} ({measured})"
    usual = checkpointing.duty
    need = rates.gcheck_share(max(open_windows, 1) / policy.u_target)
    if need <= usual or policy.duty is None:
        return None
    return (
        f"--recovery-target {target:g}s needs about {need:.0%} of operator time for G-checks "
        f"{measured} to hold U={policy.u_target:,}, above the usual budget of {usual:.0%} "
        f"(CI={checkpointing.ci_ms:g} ms every CP={checkpointing.cp_ms:g} ms); it will take up to "
        f"{policy.duty:.0%}"
    )


def say_target_cost(checkpointing: Checkpointing, previous_stats: Iterable[Path]) -> str | None:
    """Log `target_cost_line` once (a warning) at the start of a run whose previous run of the same job
    left these stats files (the first that holds measured rates is used); the line, or None."""
    if checkpointing.recovery_target is None:
        return None
    for path in previous_stats:
        try:
            stats = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        found = rates_of_stats(stats if isinstance(stats, Mapping) else None)
        if found is None:
            continue
        line = target_cost_line(checkpointing, *found)
        if line is not None:
            log.warning("%s", line)
        return line
    return None
