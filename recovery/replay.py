"""Where replay starts and which replayed tuples each window takes (DESIGN-NOTES section 2).

- start on input partition j: min over EC windows of pos_w[j]; t_c[j] when the EC is empty;
- a replayed tuple (j, o) with key k: if k has a window in the EC, apply it only if o >= pos_w[j];
  otherwise skip it if o < t_c[j] (it belonged to a window that closed, whose R is in the log, or it was
  already dead-lettered); otherwise process it normally.
Recovery stops being special on partition j once o >= t_c[j]: from there every tuple is admitted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from recovery.exceptions import RecoveryError

__all__ = ["ReplayPlan"]


@dataclass(frozen=True)
class ReplayPlan:
    start: tuple[int, ...]
    crash_pos: tuple[int, ...]
    window_pos: Mapping[str, tuple[int, ...]]

    @classmethod
    def fresh(cls, partitions: int) -> ReplayPlan:
        zeros = (0,) * partitions
        return cls(zeros, zeros, {})

    @classmethod
    def build(
        cls, crash_pos: Sequence[int] | None, window_pos: Mapping[str, Sequence[int]], partitions: int
    ) -> ReplayPlan:
        if crash_pos is None:
            return cls.fresh(partitions)
        if len(crash_pos) != partitions:
            raise RecoveryError(
                f"the log was written reading {len(crash_pos)} input partitions, the input now has {partitions}"
            )
        start = list(crash_pos)
        for pos in window_pos.values():
            for j, o in enumerate(pos):
                if o < start[j]:
                    start[j] = o
        return cls(tuple(start), tuple(crash_pos), {k: tuple(v) for k, v in window_pos.items()})

    def admit(self, partition: int, offset: int, key: str | None) -> bool:
        if offset >= self.crash_pos[partition]:
            return True
        if key is not None:
            pos = self.window_pos.get(key)
            if pos is not None:
                return offset >= pos[partition]
        return False

    def caught_up(self, positions: Sequence[int]) -> bool:
        return all(p >= c for p, c in zip(positions, self.crash_pos, strict=True))

    @property
    def replay_span(self) -> int:
        """Input tuples (by offset) between the replay start and the crash point, over all partitions."""
        return sum(c - s for s, c in zip(self.start, self.crash_pos, strict=True))
