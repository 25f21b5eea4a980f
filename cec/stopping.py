"""Stop requests from outside a run: SIGTERM (a supervisor) and SIGINT (Ctrl-C).

The first signal asks the run to stop at its next batch boundary: everything produced so far is durable
and the log is exactly what a crash at that point would leave, so a rerun resumes from it. A second signal
gets the handler that was there before (Python's KeyboardInterrupt, or the default termination), for a run
that does not stop soon enough, e.g. one still recovering.

Whether a stopped run failed is the caller's to decide: a bounded run stopped before the end of its input
has no complete results and says so (`RunStoppedError`, exit 128 + the signal's number); a following run
(`--follow`) has no end, and a stop is how it ends.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from cec.exceptions import RunStoppedError

__all__ = ["STOP_SIGNALS", "StopRequest", "stopped_error"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """A flag that a run polls (`stop()` between batches), set by a stop signal or by the caller."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signum: int | None = None

    def __call__(self) -> bool:
        return self._event.is_set()

    def set(self, signum: int | None = None) -> None:
        if self.signum is None:
            self.signum = signum
        self._event.set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)

    @property
    def by_signal(self) -> bool:
        return self.signum is not None

    @contextmanager
    def on_signals(self) -> Iterator[StopRequest]:
        """Set this request on the first SIGTERM or SIGINT while the body runs (then the previous handlers
        are back at once); outside the main thread, where handlers cannot be installed, nothing changes."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}

        def restore() -> None:
            for s, handler in previous.items():
                signal.signal(s, handler)

        def handler(signum: int, _frame: FrameType | None) -> None:
            restore()
            self.set(signum)

        for s in STOP_SIGNALS:
            signal.signal(s, handler)
        try:
            yield self
        finally:
            restore()


def stopped_error(signum: int, store_dir: str | None, partial: str | None = None) -> RunStoppedError:
    """The one line of a bounded run stopped before the end of its input."""
    name = signal.Signals(signum).name
    kept = (
        "run the same command again to resume from its log"
        if store_dir
        else "its log was in a temporary directory: give --store-dir DIR to make a stopped run resumable"
    )
    written = (
        f"the results so far are in {partial} (incomplete)" if partial else "no results file was written"
    )
    return RunStoppedError(
        f"stopped by {name} before the end of the input: {written}; {kept}", exit_code=128 + signum
    )
