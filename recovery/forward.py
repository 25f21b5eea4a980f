"""The eventual checkpoint kept forward, record by record (design S0, `designs/standby.md`): what the EC
cache holds (`queuestore.ec_cache`) and what a restart with that cache completes by reading only the
log's tail.

Invariant: after the records at offsets [0, X) were applied in order, `checkpoint()` is the eventual
checkpoint `recovery.eventual.EventualCheckpointBuilder` reads back from a log that ends at X. The rules,
forward (DESIGN-NOTES section 2):
- a footprint (G-open, G-check) of a key replaces the key's entry: the newest footprint of a window is
  its latest, and a key has one window at a time in the EC;
- an R of (key, seq) removes the key's entry when that entry is of window seq (the window closed; its
  older footprints are not in the EC); an R of another window of the key leaves the entry;
- the newest record (any kind but a part of a chunked value, which is no record) is the crash point: its
  pos, N, logical time and marks; EOS means the operator had finished;
- the EC holds N windows, N read from the crash point's record. Entries that do not add up to N mean this
  log is not one the forward rules describe (e.g. a record that was never applied): `checkpoint` then
  answers None and recovery reads the log back instead, never trusting the cache blindly.
Records are applied as their writer made them (whole values: a chunked value's manifest comes with the
whole value it stands for), and checked by checksum when loaded (`queuestore.ec_cache`).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator
from itertools import repeat

from cec.exceptions import CodecError
from cec.native import native
from cec.records import FOOTPRINT_KINDS, Kind, RecordCodec
from queuestore.base import RecordMeta, Row
from queuestore.chunks import PART_KIND
from recovery.eventual import ECFootprint, EventualCheckpoint

_OFFSET = operator.itemgetter(0)
_FOOTPRINT_SLOTS = tuple(
    getattr(ECFootprint, name) for name in ("offset", "key", "_row", "_codec", "_record")
)


def _footprints(keys: Iterable[str], rows: Iterable[Row], codec: RecordCodec) -> Iterator[ECFootprint]:
    """ECFootprint(row[0], key, row, codec) of each, built by the C accelerator when there: a Python
    __init__ per window was most of what turning the EC cache into a checkpoint cost (as
    recovery.manager's `_loaded`)."""
    if native is None:
        return map(ECFootprint, map(_OFFSET, rows), keys, rows, repeat(codec))
    slots = zip(map(_OFFSET, rows), keys, rows, repeat(codec), repeat(None))
    footprints: Iterator[ECFootprint] = map(native.make, repeat(ECFootprint), repeat(_FOOTPRINT_SLOTS), slots)
    return footprints


__all__ = ["ForwardCheckpoint"]

_FOOTPRINT_CODES = frozenset(k.value for k in FOOTPRINT_KINDS)


class ForwardCheckpoint:
    """`parts`: key -> the row (offset, kind, time, key, seq, value) of its window's latest footprint;
    `last`: the row of the newest record; `next_offset`: every record below it was applied."""

    __slots__ = ("last", "next_offset", "parts")

    def __init__(
        self, parts: dict[str, Row] | None = None, last: Row | None = None, next_offset: int = 0
    ) -> None:
        self.parts: dict[str, Row] = {} if parts is None else parts
        self.last = last
        self.next_offset = next_offset

    def apply(self, row: Row) -> None:
        """The record `row` (whole value), the next one of the log."""
        offset, kind, _, key, seq, _ = row
        self.next_offset = offset + 1
        if kind == PART_KIND:
            return  # a part of a chunked value: its manifest brings the whole value
        self.last = row
        if key is None:
            return
        if kind == "R":
            entry = self.parts.get(key)
            if entry is not None and entry[4] == seq:
                del self.parts[key]
        elif kind in _FOOTPRINT_CODES:
            self.parts[key] = row

    def windows(self, codec: RecordCodec) -> dict[str, ECFootprint]:
        """key -> the footprint of its window's latest footprint (its record decoded when loaded)."""
        return dict(zip(self.parts, _footprints(self.parts, self.parts.values(), codec), strict=True))

    def oldest_offset(self, windows: dict[str, ECFootprint], end_offset: int) -> int:
        """The extent's start: the offset of the oldest footprint (`end_offset` if none); `windows` are the
        checkpoint's (`windows`), which a subclass may keep in the log's order."""
        return min(map(_OFFSET, self.parts.values()), default=end_offset)

    def checkpoint(self, codec: RecordCodec, end_offset: int) -> EventualCheckpoint | None:
        """The eventual checkpoint at `end_offset` (the log's end: this has applied every record below it),
        or None where the entries do not add up to the crash point's N (module doc). Values are trusted:
        the caller checked them."""
        last = self.last
        if last is None:
            return (
                None
                if self.parts
                else EventualCheckpoint({}, None, 0, 0, end_offset, end_offset, 0, 0, False)
            )
        _, kind, t, key, seq, value = last
        try:
            newest = codec.decode(value, RecordMeta(kind, t, key, seq), verified=True)
        except CodecError:
            return None
        if newest.n != len(self.parts):
            return None
        windows = self.windows(codec)
        return EventualCheckpoint(
            windows=windows,
            crash_pos=newest.pos,
            n=newest.n,
            time=newest.time,
            end_offset=end_offset,
            extent_start=self.oldest_offset(windows, end_offset),
            records_read=0,
            corrupt_skipped=0,
            complete=newest.kind is Kind.EOS,
            marks=newest.marks,
            scanned_from=end_offset,
        )
