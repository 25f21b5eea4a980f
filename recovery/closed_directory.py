"""The closed-window directory a recovery needs, read back from the log's end as far as it needs.

A key with no open window in the eventual checkpoint opens its next window with the per-key sequence after
its last R (DESIGN-NOTES section 2: windows are identified by (key, seq)), and that R may lie anywhere in
the log. The stream index keeps this directory, but on a fresh host (state directory lost) the index is
empty, and rebuilding it first reads the whole log: recovery would grow with the log's history, not with
its extent (issue 26). So recovery asks this directory instead:
- the R records the EC build met on its way back ([`scanned_from`, end)) answer first: reading back, the
  first R of a key met is its last;
- a key not among them reads further back, on demand, a chunk at a time, noting every R met, until the key
  is found or the scan reaches the part of the log the stream index already holds (its `next_offset`,
  which its catch-up raises meanwhile) or the log start;
- below that, the index answers.

Only R records matter here, and only intact ones: an R that fails its checksum is damage (`DamagedLogError`,
as the index's rebuild says), never an entry; anything else is left to the index's catch-up to check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from cec.records import RecordCodec
from cec.verified import whole_record
from queuestore.base import PartitionReader, RecordMeta, StoredRecord

__all__ = ["ClosedIndex", "ClosedWindowDirectory"]


class ClosedIndex(Protocol):
    """What the directory asks of the stream index (`queuestore.index.StreamIndex`)."""

    @property
    def next_offset(self) -> int: ...

    def last_closed_seq(self, key: str) -> int | None: ...


class ClosedWindowDirectory:
    """`last_closed_seq(key)` over the log below its end at recovery (module doc). `closed`: the (key,
    seq) of the R records met in [`scanned_from`, end) by the EC build. `open_reader` opens a reader of the
    log for the reads back on demand (opened at the first one, closed by `close`)."""

    CHUNK = 8192

    def __init__(
        self,
        open_reader: Callable[[], PartitionReader],
        index: ClosedIndex,
        *,
        scanned_from: int,
        closed: Iterable[tuple[str, int]] = (),
        codec: RecordCodec | None = None,
    ) -> None:
        self._open_reader = open_reader
        self._reader: PartitionReader | None = None
        self._index = index
        self._codec = codec or RecordCodec()
        self._low = scanned_from  # every R at or above this offset is in `_seqs`
        self._seqs: dict[str, int] = {}
        for key, seq in closed:
            if seq > self._seqs.get(key, -1):
                self._seqs[key] = seq
        self.records_read = 0  # records read back on demand (beyond the EC build's)

    @property
    def low(self) -> int:
        """The lowest offset read: the directory holds every R from there to the log's end at recovery."""
        return self._low

    def last_closed_seq(self, key: str) -> int | None:
        """The window sequence of the last R of `key` in the log, None if it has none."""
        seq = self._seqs.get(key)
        while seq is None and self._low > self._floor():
            self._read_back()
            seq = self._seqs.get(key)
        if seq is not None:
            return seq
        return self._index.last_closed_seq(key)

    def _floor(self) -> int:
        """Where reading back stops: the index holds the log below it, or the log starts there."""
        floor = self._index.next_offset
        if self._reader is not None:
            floor = max(floor, self._reader.start_offset())
        return floor

    def _read_back(self) -> None:
        if self._reader is None:
            self._reader = self._open_reader()
            if self._low <= self._floor():
                return
        reader, codec = self._reader, self._codec
        floor = self._floor()
        rows = reader.read_backward_rows(self._low, min(self.CHUNK, self._low - floor))
        rows = [row for row in rows if row[0] >= floor]
        if not rows:
            self._low = floor
            return
        self.records_read += len(rows)
        results = [row for row in rows if row[1] == "R" and row[3] is not None]
        failed = set(codec.failing_rows(results)) if results else set()
        seqs = self._seqs
        for index, (offset, kind, t, key, seq, value) in enumerate(results):
            if index in failed:
                stored = StoredRecord(offset, value, RecordMeta(kind, t, key, seq))
                if not self._intact(reader, stored):
                    raise reader.damaged(offset, "the result record fails its checksum")
            assert key is not None
            if key not in seqs:  # newest first: the first R of a key met is its last
                seqs[key] = seq
        self._low = rows[-1][0]

    def _intact(self, reader: PartitionReader, stored: StoredRecord) -> bool:
        """A record that failed the batch check: a chunked value's manifest (checked whole) or damage."""
        return whole_record(reader, stored, self._codec) is not None

    def close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()
