"""The phase of an operator instance, and its one transition (Kafka Streams' `Task.State`, simplified).

- `RESTORING`: the instance holds the eventual checkpoint it was restored with and replays its input
  below the crash point; the replay contract (`recovery.contract.ReplayContract`) decides each replayed
  tuple's fate. No G-check is made (a window is not consistent until its replay is done), the log is not
  trimmed, and with watermarks no tuple past its partition's crash point is applied yet.
- `RUNNING`: recovery is over (or there was none): every tuple is processed normally.
- `DONE`: the input ended (the end-of-stream record is made) or the log was already complete.

The rule: RESTORING -> RUNNING exactly when every input partition's position has reached its crash
point (`ReplayContract.caught_up`; a tuple at or past a partition's crash point shows it reached it), or
when the input ends before that (a shorter input than the one the log was written from has nothing more
to replay). It is taken in `Lifecycle.advance`, the one place that
decides "recovery is over"; every host (the local loop, the Spark state partition) asks it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import Enum

from operators.exceptions import EngineStateError
from recovery.contract import ReplayContract

__all__ = ["Lifecycle", "Phase"]


class Phase(Enum):
    RESTORING = "restoring"
    RUNNING = "running"
    DONE = "done"


class Lifecycle:
    """The phase and, while RESTORING, the replay contract. `on_running` is told once, at the transition
    (the host's figures: recovery time, the replay's progress bar)."""

    __slots__ = ("contract", "on_running", "phase")

    def __init__(self) -> None:
        self.phase = Phase.RUNNING
        self.contract: ReplayContract | None = None  # set exactly while RESTORING
        self.on_running: Callable[[], None] | None = None

    def restore(self, contract: ReplayContract) -> None:
        """Start RESTORING under `contract` (a fresh instance: nothing was applied yet)."""
        if self.phase is not Phase.RUNNING or self.contract is not None:
            raise EngineStateError(
                f"an instance is restored once, before any input (phase {self.phase.value})"
            )
        self.phase = Phase.RESTORING
        self.contract = contract

    def advance(self, positions: Sequence[int], *, input_ended: bool = False) -> bool:
        """The transition RESTORING -> RUNNING, taken when the rule (module doc) holds at `positions`;
        True if it was taken now."""
        contract = self.contract
        if contract is None or not (input_ended or contract.caught_up(positions)):
            return False
        self.contract = None
        self.phase = Phase.RUNNING
        if self.on_running is not None:
            self.on_running()
        return True

    def finish(self) -> None:
        """RUNNING -> DONE: the input ended (recovery, if any, ended first: `advance(input_ended=True)`)."""
        if self.phase is Phase.RESTORING:
            raise EngineStateError("an instance still restoring cannot be done: advance it first")
        self.phase = Phase.DONE
