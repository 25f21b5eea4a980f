"""A restart's timeline: the recovery time of a report, its metrics and `--recovery-target` cover the whole
restart, not only the part after the log is open (issue 26).

Phases, in order, each from its mark to the next one (the last until `elapsed` is asked):
- `process_start`: from the process's start (the kernel's record of it, where there is one) to the store's
  open: interpreter, imports, command line, spec;
- `store_open`: the store, the input source and the output partition's writer;
- `index`: the stream index opened and brought up to the log (or its rebuild deferred, `queuestore.output`);
- `ec_build`, `ec_load`: the eventual checkpoint read back from the log and decoded (`recovery.manager`);
- `restore`: the loaded windows installed in the operator instance and the input sought to the replay start;
- `replay`: the input replayed up to the crash point (caught up).
Every time is read from `clock` (injected in tests).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["PHASES", "RestartTimeline", "process_started"]

PHASES = ("process_start", "store_open", "index", "ec_build", "ec_load", "restore", "replay")
STARTUP_PHASES = ("process_start", "store_open", "index")


def process_age() -> float | None:
    """Seconds since this process started, from /proc (10 ms resolution); None where there is no /proc."""
    try:
        stat = Path("/proc/self/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        # Field 22 (starttime, in clock ticks after boot); fields are counted after the command's ")".
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def process_started(clock: Callable[[], float] = time.perf_counter) -> float:
    """The process's start on `clock`'s scale (now, where it cannot be known)."""
    age = process_age()
    now = clock()
    return now if age is None else now - age


class RestartTimeline:
    """The marks of one start (module doc). `started`: when the first phase began (default: now)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, started: float | None = None) -> None:
        self.clock = clock
        self.started = clock() if started is None else started
        self._marks: list[tuple[str, float]] = [(PHASES[0], self.started)]

    def mark(self, phase: str) -> None:
        """`phase` begins now (and the one before it ends). A phase marked again goes on from its first
        mark (a writer's open retried after waiting for a lock stays in `store_open`)."""
        if phase not in PHASES:
            raise ValueError(f"unknown restart phase {phase!r}")
        if any(name == phase for name, _ in self._marks):
            return
        self._marks.append((phase, self.clock()))

    def begin_takeover(self) -> None:
        """A standby took over its partition's writer now (`operators.standby`): its restart starts here,
        not at its process's start (it followed the log long before the primary died); what is marked next
        (the index) ends `store_open`."""
        self.started = self.clock()
        self._marks = [("store_open", self.started)]

    def elapsed(self) -> float:
        """From the start to now."""
        return self.clock() - self.started

    def durations(self, now: float | None = None) -> dict[str, float]:
        """Each phase marked so far and how long it took (the last one until `now`, default: the clock's
        now), in order: together they make `now - started`."""
        now = self.clock() if now is None else now
        ends = [at for _, at in self._marks[1:]] + [now]
        return {name: max(0.0, end - at) for (name, at), end in zip(self._marks, ends, strict=True)}

    def startup_seconds(self, now: float | None = None) -> float:
        """The phases before any EC work: process start, store open, index."""
        return sum(v for k, v in self.durations(now).items() if k in STARTUP_PHASES)
