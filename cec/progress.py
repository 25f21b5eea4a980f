"""Progress of long work (a run over a bounded input, an EC scan, a replay), as library code reports it.

Library code asks for a task and updates it; what the user sees is decided by whoever installed the
reporter. The default reports nothing. The CLI installs `RichReporter` on a terminal (a live bar with
the total, the rate and the ETA) and `LogReporter` otherwise (a plain line through `logging` every few
seconds: readable in CI logs and files)::

    with progress.task("replay", total=span, unit="tuples") as t:
        t.update(done)          # cheap: call it per batch

Tasks are safe to update from several threads (one per input partition in `cec run --input-topic`).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

__all__ = [
    "LogReporter",
    "NullReporter",
    "Reporter",
    "RichReporter",
    "Task",
    "active",
    "get_reporter",
    "set_reporter",
    "task",
]

log = logging.getLogger("cec.progress")


class Task:
    """One piece of work: `completed` out of `total` (None: unknown) `unit`s. Subclasses show it."""

    def __init__(self, description: str, total: int | None, unit: str) -> None:
        self.description = description
        self.total = total
        self.unit = unit
        self.completed = 0
        self.closed = False

    def update(self, completed: int, *, total: int | None = None) -> None:
        self.completed = completed
        if total is not None:
            self.total = total

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> Task:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Reporter(Protocol):
    def task(self, description: str, total: int | None = None, unit: str = "records") -> Task: ...

    def stop(self) -> None: ...


class NullReporter:
    """Reports nothing: the default, so that library code never depends on a terminal or the CLI."""

    def task(self, description: str, total: int | None = None, unit: str = "records") -> Task:
        return Task(description, total, unit)

    def stop(self) -> None:
        pass


def _eta(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class _LogTask(Task):
    def __init__(self, reporter: LogReporter, description: str, total: int | None, unit: str) -> None:
        super().__init__(description, total, unit)
        self._reporter = reporter
        self._started = self._last = reporter.clock()
        self._lock = threading.Lock()
        self._said = False

    def line(self, now: float) -> str:
        elapsed = max(now - self._started, 1e-9)
        rate = self.completed / elapsed
        text = f"{self.description}: {self.completed:,}"
        if self.total:
            text += f"/{self.total:,} {self.unit} ({min(self.completed / self.total, 1.0):.0%})"
        else:
            text += f" {self.unit}"
        text += f", {rate:,.0f} {self.unit}/s"
        if self.total and rate > 0 and not self.closed:
            text += f", ETA {_eta(max(self.total - self.completed, 0) / rate)}"
        if self.closed:
            text += f", done in {elapsed:.1f} s"
        return text

    def update(self, completed: int, *, total: int | None = None) -> None:
        super().update(completed, total=total)
        now = self._reporter.clock()
        if now - self._last >= self._reporter.every_s:
            with self._lock:
                if now - self._last < self._reporter.every_s:
                    return
                self._last = now
                self._said = True
            self._reporter.emit(self.line(now))

    def close(self) -> None:
        if not self.closed:
            super().close()
            now = self._reporter.clock()
            if self._said or now - self._started >= self._reporter.every_s:  # quick work stays quiet
                self._reporter.emit(self.line(now))


class LogReporter:
    """A plain line per task every `every_s` seconds and one when it ends, as INFO records of the
    `cec.progress` logger (the CLI's handler prints them on stderr). `clock` is injectable for tests."""

    def __init__(
        self,
        every_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        emit: Callable[[str], None] | None = None,
    ) -> None:
        self.every_s = every_s
        self.clock = clock
        self.emit = emit or log.info

    def task(self, description: str, total: int | None = None, unit: str = "records") -> Task:
        return _LogTask(self, description, total, unit)

    def stop(self) -> None:
        pass


class _RichTask(Task):
    def __init__(self, reporter: RichReporter, description: str, total: int | None, unit: str) -> None:
        super().__init__(description, total, unit)
        self._progress = reporter.progress
        self._id = self._progress.add_task(description, total=total, unit=unit)

    def update(self, completed: int, *, total: int | None = None) -> None:
        super().update(completed, total=total)
        if total is None:
            self._progress.update(self._id, completed=completed)
        else:
            self._progress.update(self._id, completed=completed, total=total)

    def close(self) -> None:
        if not self.closed:
            super().close()
            if self.total is None:  # an unknown total ends where the work ended: show it complete
                self._progress.update(self._id, total=self.completed)
            self._progress.stop_task(self._id)


class RichReporter:
    """A live `rich` progress display on a terminal: per task a bar, done/total, rate, elapsed and ETA."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[unit]}"),
            TaskProgressColumn(),
            _rate_column(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console or Console(stderr=True),
            # Lines printed on stdout pass above the bars when stdout is the same terminal; stdout that is
            # a file or a pipe is left alone (what a command prints there is its output).
            redirect_stdout=sys.stdout.isatty(),
            redirect_stderr=False,
        )
        self._started = False
        self._lock = threading.Lock()

    def task(self, description: str, total: int | None = None, unit: str = "records") -> Task:
        with self._lock:
            if not self._started:  # no live display until there is something to show
                self._started = True
                self.progress.start()
        return _RichTask(self, description, total, unit)

    def stop(self) -> None:
        with self._lock:
            if self._started:
                self._started = False
                self.progress.stop()


def _rate_column() -> Any:
    """A column of units per second, from rich's own moving speed estimate (rich is imported lazily:
    `import cec` stays cheap for library users who never show progress)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            speed = task.finished_speed or task.speed
            return Text("" if speed is None else f"{speed:,.0f}/s")

    return RateColumn()


_reporter: Reporter = NullReporter()


def set_reporter(reporter: Reporter | None) -> Reporter:
    """Install `reporter` (None: the silent default) for every task started from now on; returns the
    previous one."""
    global _reporter
    previous, _reporter = _reporter, reporter or NullReporter()
    return previous


def active() -> bool:
    """Whether anything shows progress (library code may skip work that only feeds the display)."""
    return not isinstance(_reporter, NullReporter)


def get_reporter() -> Reporter:
    return _reporter


def task(description: str, total: int | None = None, unit: str = "records") -> Task:
    """A task on the installed reporter (a silent one by default)."""
    return _reporter.task(description, total, unit)
