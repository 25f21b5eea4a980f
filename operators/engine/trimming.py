"""How far, and when, an instance's output log may be trimmed (DESIGN-NOTES section 3; Falkirk Wheel's low
watermark): the rule only, the host does the I/O.

- The bound: the lowest offset recovery still needs, the oldest open window's last footprint (found by its
  time: times never decrease along the log), and at least the newest durable record (the crash point),
  capped by what every registered consumer of the log acknowledged (`bound`).
- When: a bound is taken each time `every` more records are durable; it is applied only once everything
  appended when it was taken is durable too (until then a window's newest footprint may not be in the
  log, and a crash would need its older one, which the bound may have passed). Footprints only move
  forward, so a bound stays safe for ever after it was taken (`TrimSchedule`).
- Never while RESTORING (the windows are not consistent yet): the host asks only when RUNNING.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from cec.exceptions import ConfigError

__all__ = ["TrimSchedule", "bound", "capped"]


def bound(durable_end: int, oldest_footprint: int | None) -> int:
    """The lowest offset recovery still needs (module doc): `durable_end` is the offset after the newest
    durable record, `oldest_footprint` the offset of the oldest open window's last footprint (None: no
    window is open)."""
    return durable_end - 1 if oldest_footprint is None else min(durable_end - 1, oldest_footprint)


def capped(low: int, acknowledged: Iterable[int]) -> int:
    """`low` capped by every registered consumer's acknowledged offset: never trim what one still reads."""
    acks = list(acknowledged)
    return min(low, *acks) if acks else low


class TrimSchedule:
    """When bounds are taken and applied (module doc); one per instance and run."""

    def __init__(self, every: int) -> None:
        if every < 1:
            raise ConfigError(f"trim_every must be >= 1, got {every}")
        self.every = every
        self._pending: tuple[int, int] | None = None  # (bound, records appended when it was taken)
        self._looked = 0  # durable end when a bound was last taken

    def ready(self, durable_count: int) -> int | None:
        """The pending bound, once everything appended when it was taken is durable (then it is the host's
        to apply); None otherwise."""
        pending = self._pending
        if pending is None or durable_count < pending[1]:
            return None
        self._pending = None
        return pending[0]

    def take_if_due(self, *, durable_end: int, appended: int, take: Callable[[], int]) -> None:
        """Take the next bound (`take()`: the rule of `bound`, now) when `every` more records are durable
        since the last one was taken: at once after applying one, since waiting for another batch would let
        the durable end run further ahead of the log start. Never while a taken bound waits."""
        if self._pending is None and durable_end - self._looked >= self.every:
            self._looked = durable_end
            self._pending = (take(), appended)

    def at_rest(self) -> None:
        """Everything appended is durable (the end of a run): a pending bound is superseded by the one of
        now, which the host applies itself."""
        self._pending = None
