"""When to produce G-check footprints (paper III.A). A policy never affects correctness, only cost.

Two independent parts:
- a `CheckpointPolicy` says whether the oldest window should be checkpointed now, from the extent size q
  and replay size u: `GOpenOnly` never (minimum overhead, longest recovery), `TargetPolicy` while q > Q or
  u > U (the paper's method);
- a `CheckpointSchedule` says when G-checks may be produced at all: CI milliseconds out of every CP
  (checkpoint slots), so that checkpointing cannot take more than CI/CP of the operator's time.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from dataclasses import dataclass

from cec.exceptions import ConfigError

__all__ = ["CheckpointPolicy", "CheckpointSchedule", "GOpenOnly", "TargetPolicy", "make_policy"]


class CheckpointPolicy(abc.ABC):
    @abc.abstractmethod
    def wants_checkpoint(self, extent_size: int, replay_size: int) -> bool:
        """Should the oldest open window get a G-check now?"""

    @abc.abstractmethod
    def describe(self) -> str: ...


class GOpenOnly(CheckpointPolicy):
    """Only the footprints correctness needs: G-open at window open, R at close."""

    def wants_checkpoint(self, extent_size: int, replay_size: int) -> bool:
        return False

    def describe(self) -> str:
        return "G-open only"


@dataclass(frozen=True)
class TargetPolicy(CheckpointPolicy):
    """Checkpoint the oldest window while q > Q or u > U. A target of None is not checked."""

    q_target: int | None = None
    u_target: int | None = None

    def __post_init__(self) -> None:
        for name, value in (("Q", self.q_target), ("U", self.u_target)):
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be a positive number of tuples, got {value}")

    def wants_checkpoint(self, extent_size: int, replay_size: int) -> bool:
        return (self.q_target is not None and extent_size > self.q_target) or (
            self.u_target is not None and replay_size > self.u_target
        )

    def describe(self) -> str:
        return f"targets Q={self.q_target} U={self.u_target}"


class CheckpointSchedule:
    """Checkpoint slots: G-checks only during the first CI ms of every CP ms period."""

    def __init__(self, ci_ms: float = 5.0, cp_ms: float = 100.0, clock: Callable[[], float] = time.monotonic):
        if ci_ms <= 0 or cp_ms <= 0 or ci_ms > cp_ms:
            raise ConfigError(f"need 0 < CI <= CP, got CI={ci_ms} ms, CP={cp_ms} ms")
        self.ci = ci_ms / 1000.0
        self.cp = cp_ms / 1000.0
        self._clock = clock
        self._origin = clock()

    def slot_remaining(self) -> float:
        """Seconds left in the current checkpoint slot (0 outside a slot)."""
        phase = (self._clock() - self._origin) % self.cp
        return max(0.0, self.ci - phase)

    def in_slot(self) -> bool:
        return self.slot_remaining() > 0.0

    def describe(self) -> str:
        return f"CI={self.ci * 1000:g} ms every CP={self.cp * 1000:g} ms"


def make_policy(q_target: int | None, u_target: int | None) -> CheckpointPolicy:
    if q_target is None and u_target is None:
        return GOpenOnly()
    return TargetPolicy(q_target, u_target)
