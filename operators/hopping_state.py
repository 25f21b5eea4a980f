"""The state of a hopping-window part (`operators.hopping`): its panes (`PaneRun`), how panes combine into
a window's state, and the part's bytes in the log (`encode_panes` / `decode_panes`: a pane run's tag, then
its panes' `operators.multi_state` encodings).

Kept apart from the operator, which decides which panes a tuple and a window touch: this module only
holds and combines panes and never looks at a key, a watermark or the registry.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from operators.multi_state import VERSION as STATE_VERSION
from operators.multi_state import (
    ColumnState,
    MultiState,
    StateReader,
    decode_state,
    empty_column,
    encode_state,
)

__all__ = [
    "ONE_PANE",
    "VERSION",
    "PaneRun",
    "combine_panes",
    "decode_panes",
    "encode_panes",
    "merge_column",
]

VERSION = 0x03  # multi_state's is 0x02: a pane run's bytes are never read as one window's
ONE_PANE = 0x04  # a run of one pane (every G-open): its `multi_state` bytes after this tag, nothing else


@dataclass(slots=True)
class PaneRun:
    """The state of one part (key, period): its non-empty panes by start, each a `MultiState` whose
    `start` is the pane's start and `last` the latest time of its tuples."""

    panes: list[MultiState]

    @property
    def latest(self) -> int:
        """The latest time of the part's tuples: its last pane's. Panes are disjoint slides of time kept in
        order of start (`decode_panes` refuses any other order) and a pane's `last` is one of its own
        tuples' times, so no earlier pane holds a later one (asked for every part of a key at every tuple)."""
        return self.panes[-1].last


def _varint(out: bytearray, n: int) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def encode_panes(run: PaneRun) -> bytes:
    """Version, pane count, then per pane the length and bytes of its `multi_state` encoding; one pane (a
    G-open's state) as `ONE_PANE` and that pane's `multi_state` bytes without their version byte."""
    if len(run.panes) == 1:
        return bytes((ONE_PANE,)) + encode_state(run.panes[0])[1:]
    out = bytearray((VERSION,))
    _varint(out, len(run.panes))
    for pane in run.panes:
        data = encode_state(pane)
        _varint(out, len(data))
        out += data
    return bytes(out)


def decode_panes(data: bytes, columns: int) -> PaneRun:
    """`encode_panes`'s inverse; ValueError for bytes that are not such a state (never another exception)."""
    if data[:1] == bytes((ONE_PANE,)):
        return PaneRun([decode_state(bytes((STATE_VERSION,)) + data[1:], columns)])
    if data[:1] != bytes((VERSION,)):
        raise ValueError("pane run: unknown version")
    reader = StateReader(data, "pane run")
    count = reader.varint()
    if count < 1:
        raise ValueError("pane run: no pane")
    panes: list[MultiState] = []
    for _ in range(count):
        pane = decode_state(reader.take(reader.varint()), columns)
        if panes and pane.start <= panes[-1].start:
            raise ValueError("pane run: panes out of order")
        panes.append(pane)
    if reader.at != len(data):
        raise ValueError("pane run: trailing bytes")
    return PaneRun(panes)


def merge_column(into: ColumnState, col: ColumnState) -> None:
    if col.n == 0:
        return
    into.n += col.n
    into.total += col.total
    for x in (col.lo, col.hi):  # ColumnState.add's order of -0.0 and 0.0
        if x < into.lo or (x == into.lo and math.copysign(1.0, x) < math.copysign(1.0, into.lo)):
            into.lo = x
        if x > into.hi or (x == into.hi and math.copysign(1.0, x) > math.copysign(1.0, into.hi)):
            into.hi = x


def combine_panes(inside: Sequence[MultiState], start: int) -> MultiState | None:
    """The window starting at `start` that holds the panes `inside`; None if there are none."""
    if not inside:
        return None
    first = inside[0]
    if len(inside) == 1:
        # One pane (most windows of a sparse key): the window is that pane's values from `start`; its
        # columns are shared, not copied (a result only reads them).
        return MultiState(first.count, start, first.last, first.columns)
    # The first pane's columns copied (what merging them into empty columns gives), the others merged.
    combined = MultiState(
        first.count,
        start,
        first.last,
        [ColumnState(c.n, c.total, c.lo, c.hi) if c.n else empty_column() for c in first.columns],
    )
    for pane in inside[1:]:
        combined.count += pane.count
        if pane.last > combined.last:
            combined.last = pane.last
        for into, col in zip(combined.columns, pane.columns, strict=True):
            merge_column(into, col)
    return combined
