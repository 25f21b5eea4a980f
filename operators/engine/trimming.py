"""How far, and when, an instance's output log may be trimmed (DESIGN-NOTES section 3; Falkirk Wheel's low
watermark): the rule only, the host does the I/O.

- The bound: the lowest offset recovery still needs, the oldest open window's last footprint (found by its
  time: times never decrease along the log), and at least the newest durable record (the crash point),
  capped by what every registered consumer of the log acknowledged (`bound`).
- When, on the local host (`TrimPoints`): each time `every` more records were appended, the host makes
  everything appended durable and trims to the bound of then, at once (a window's newest footprint is in
  the log by then: before, a crash would need its older one, which the bound may have passed). A
  registered consumer that must keep up (`TrimPace`: `cec run`'s results writer) is waited for first.
- When, on the attached query (`TrimSchedule`): a bound is taken each time `every` more records are
  durable and applied once everything appended when it was taken is durable too. Footprints only move
  forward, so a bound stays safe for ever after it was taken.
- What must be durable first, wherever the host keeps the closed-window directory (key -> last closed
  seq, which a restart needs for keys without an open window): the directory of every R below the bound
  (`carry_from`): the stream index on the local host and the attached query's driver; the directory
  carried in Kafka when the attached query trims on its executors (`operators.spark.closed_windows`).
- Never while RESTORING (the windows are not consistent yet): the host asks only when RUNNING.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cec.exceptions import ConfigError
from cec.spec_form import check_known

__all__ = ["DEFAULT_TRIM_EVERY", "TrimPace", "TrimPoints", "TrimSchedule", "bound", "capped", "carry_from"]

# The trim interval (records appended between two trims) where trimming is on by default: `cec run`'s
# `--follow` runs and runs with `--results-topic`, and the attached query (`cec_aggregate(trim_every=)`).
DEFAULT_TRIM_EVERY = 10_000


def bound(durable_end: int, oldest_footprint: int | None) -> int:
    """The lowest offset recovery still needs (module doc): `durable_end` is the offset after the newest
    durable record, `oldest_footprint` the offset of the oldest open window's last footprint (None: no
    window is open)."""
    return durable_end - 1 if oldest_footprint is None else min(durable_end - 1, oldest_footprint)


def capped(low: int, acknowledged: Iterable[int]) -> int:
    """`low` capped by every registered consumer's acknowledged offset: never trim what one still reads."""
    acks = list(acknowledged)
    return min(low, *acks) if acks else low


def carry_from(covered: int, low: int) -> tuple[int, int] | None:
    """The stretch of the log [from, to) whose R records must be added to the closed-window directory
    before the log may be trimmed to `low`, when that directory covers the log below `covered`; None
    when it already covers it."""
    return None if low <= covered else (covered, low)


class TrimSchedule:
    """When bounds are taken and applied (module doc); one per instance and run."""

    def __init__(self, every: int, looked: int = 0) -> None:
        """`looked`: the durable end when a bound was last taken (a host whose schedule lives in several
        processes hands it on: the attached query's write tasks)."""
        if every < 1:
            raise ConfigError(f"trim_every must be >= 1, got {every}")
        self.every = every
        self._pending: tuple[int, int] | None = None  # (bound, records appended when it was taken)
        self._looked = looked  # durable end when a bound was last taken

    @property
    def pending(self) -> int | None:
        """The bound taken and not applied yet, if any."""
        return None if self._pending is None else self._pending[0]

    @property
    def looked(self) -> int:
        """The durable end when a bound was last taken."""
        return self._looked

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


class TrimPoints:
    """The due points of the local host's trimming: one each time `every` more records were appended to the
    instance's output log, counted by the operator itself (never by the writer's pace, so a loaded machine
    changes when a trim happens in time, not how many records lie between two)."""

    def __init__(self, every: int, appended: int = 0) -> None:
        if every < 1:
            raise ConfigError(f"trim_every must be >= 1, got {every}")
        self.every = every
        self._last = appended  # records appended at the last due point (or at the start)

    def due(self, appended: int) -> bool:
        """Whether `appended` (records handed to the writer so far) reached the next due point; a due
        point is used once."""
        if appended - self._last < self.every:
            return False
        self._last = appended
        return True


@dataclass(frozen=True)
class TrimPace:
    """Back-pressure from one registered consumer of the log (`cec run`'s results writer): at a due point
    the operator waits until that consumer's acknowledged offset is at most `lag` offsets behind the
    durable end, so its acknowledgements, and with them the trimmed log, cannot fall behind without limit.

    `lag` must exceed what the consumer may leave unacknowledged once it has read everything (for the
    results writer: its commit interval), or the operator would wait for ever."""

    consumer: str
    lag: int

    def __post_init__(self) -> None:
        if not self.consumer:
            raise ConfigError("a trim pace needs the name of a registered consumer")
        if isinstance(self.lag, bool) or not isinstance(self.lag, int) or self.lag < 1:
            raise ConfigError(f"a trim pace's lag must be a whole number >= 1, got {self.lag!r}")

    def caught_up(self, durable_end: int, acknowledged: Mapping[str, int]) -> bool:
        """Whether the operator may trim and go on: the consumer is within `lag` of `durable_end` (the offset
        after the newest durable record), or not registered (it was forgotten: nothing to wait for)."""
        ack = acknowledged.get(self.consumer)
        return ack is None or durable_end - ack <= self.lag

    def to_dict(self) -> dict[str, Any]:
        return {"consumer": self.consumer, "lag": self.lag}

    @classmethod
    def from_dict(cls, data: TrimPace | Mapping[str, Any] | None) -> TrimPace | None:
        if data is None or isinstance(data, TrimPace):
            return data
        check_known(data, ("consumer", "lag"), "trim pace")
        return cls(str(data.get("consumer", "")), data.get("lag", 0))
