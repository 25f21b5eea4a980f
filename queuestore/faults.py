"""Fault injection for tests: SIGKILL this very process, or fail an I/O, when a named site is hit.

Tests set `CEC_FAULTS="site:n[,site:n...]"` in a child process's environment; the n-th time the code
passes `hit(site)`, the process kills itself with SIGKILL, exactly like `kill -9` from outside, so
nothing (no `finally`, no atexit, no flush) runs. Sites sit where a crash is hardest to get right: between
processing and produce, between produce and durable completion, inside a commit, during recovery.
The n-th pass through `fail(site, make)` raises `make()` instead: an I/O error the code must survive
(e.g. `store.io_error`, a disk error in the k-th batch the SQLite writer commits).
Unset, `hit` and `fail` cost one dict lookup.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

__all__ = ["armed", "fail", "hit", "planned", "reset"]

_counters: dict[str, int] = {}


def _parse(spec: str) -> dict[str, int]:
    plan: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        site, _, count = item.partition(":")
        plan[site] = int(count or 1)
    return plan


_plan = _parse(os.environ.get("CEC_FAULTS", ""))


def reset(spec: str = "") -> None:
    global _plan
    _plan = _parse(spec)
    _counters.clear()


def armed() -> bool:
    """Whether any fault is planned: hot paths skip their `hit` calls when not (the calls would do
    nothing; skipping them changes no count, since nothing is counted without a plan)."""
    return bool(_plan)


def _due(site: str) -> bool:
    if not _plan or site not in _plan:
        return False
    n = _counters.get(site, 0) + 1
    _counters[site] = n
    return n == _plan[site]


def planned(site: str) -> int | None:
    """The n given for `site` in CEC_FAULTS (None when not planned), for a site that decides itself when
    to fire: e.g. one hit in processes that Spark forks anew for each task, where a per-process pass
    counter would restart from zero."""
    return _plan.get(site)


def hit(site: str) -> None:
    if _due(site):
        os.kill(os.getpid(), signal.SIGKILL)


def fail(site: str, make: Callable[[], Exception]) -> None:
    if _due(site):
        raise make()
