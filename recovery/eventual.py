"""Eventual-checkpoint (EC) reconstruction: read the output log back from its end (paper II.B).

Rules (DESIGN-NOTES section 2):
- the crash point t_c is the `pos` of the newest record that passes its checksum; N and the logical time
  come from the same record. Newer records that fail their checksum must all be footprints by their kind:
  between two records only tuples that change no window membership can have been processed, so resuming
  from the older t_c re-derives exactly the same state. Any other damaged record there is a hard error;
- reading back, a window whose R is met before any footprint is closed: its older footprints are
  skipped; the first footprint met of a window not closed is its latest; stop after N windows;
- a footprint that fails its checksum is not a footprint: keep reading back to an older one of the same
  window (a G-check falls back to an older G-check or to the G-open: longer replay, same result).
The extent is what this scan reads: from the log end back to the oldest footprint in the EC.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from cec.native import native
from cec.records import FOOTPRINT_KINDS, Kind, OutputRecord, RecordCodec
from cec.verified import whole_record
from queuestore.base import PartitionReader, RecordMeta, Row, StoredRecord
from queuestore.chunks import PART_KIND, is_part
from recovery.exceptions import RecoveryError

__all__ = [
    "ECFootprint",
    "EventualCheckpoint",
    "EventualCheckpointBuilder",
    "footprint_records",
    "gc_paused",
]

_FOOTPRINT_CODES = frozenset(k.value for k in FOOTPRINT_KINDS)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic GC off for a bulk step that allocates a few objects per record and frees none (EC
    build and load): it would otherwise scan the growing heap again and again for nothing (measured: it
    doubled the scan's CPU time at 92k windows). Nothing allocated there forms reference cycles."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            # Everything allocated meanwhile counts as young: re-enabled as is, the next allocation would
            # start a full collection over all of it (measured: ~0.8 s at 92k windows). Promote it to the
            # oldest generation instead (freeze + unfreeze), where it waits for the next full collection
            # like any long-lived data; garbage cycles made meanwhile are collected then too. Where
            # something was frozen already (a Spark Python worker forked from cec's daemon, which froze what
            # it preloaded: operators.spark.daemon), unfreezing would hand that back to every full collection
            # too: the new objects stay frozen beside it instead (refcounting still frees them).
            frozen_before = gc.get_freeze_count()
            gc.freeze()
            if not frozen_before:
                gc.unfreeze()
            gc.enable()


class ECFootprint:
    """The latest footprint of one window in the EC. Reconstruction only identifies it (by checksum and
    the metadata beside it); its body, state included, is decoded when the EC is loaded."""

    __slots__ = ("_codec", "_record", "_row", "key", "offset")

    def __init__(
        self, offset: int, key: str, row: Row, codec: RecordCodec, record: OutputRecord | None = None
    ) -> None:
        self.offset = offset
        self.key = key
        self._row = row  # (offset, kind, time, key, seq, value): the value and the metadata kept beside it
        self._codec = codec
        self._record = record

    @property
    def row(self) -> Row:
        """The footprint as stored (offset, kind, time, key, seq, whole value): what the EC cache keeps."""
        return self._row

    @property
    def decoded(self) -> bool:
        """Whether its record is decoded already (a standby decodes as it follows)."""
        return self._record is not None

    @property
    def record(self) -> OutputRecord:
        if self._record is None:
            # The builder keeps only values that passed their checksum: no need to compute it again.
            _, kind, t, key, seq, value = self._row
            self._record = self._codec.decode(value, RecordMeta(kind, t, key, seq), verified=True)
        return self._record


def footprint_records(footprints: list[ECFootprint], codec: RecordCodec) -> list[OutputRecord]:
    """The decoded record of each footprint (what `ECFootprint.record` gives), decoded in one batch."""
    pending = [fp for fp in footprints if fp._record is None]
    for fp, record in zip(
        pending, codec.decode_rows([fp._row for fp in pending], verified=True), strict=True
    ):
        fp._record = record
    return [fp.record for fp in footprints]


@dataclass
class EventualCheckpoint:
    windows: dict[str, ECFootprint]  # key -> latest footprint of its window open at t_c
    crash_pos: tuple[int, ...] | None  # None: the log is empty, nothing ever happened
    n: int
    time: int
    end_offset: int
    extent_start: int  # offset of the oldest footprint (== end_offset when the EC is empty)
    records_read: int
    corrupt_skipped: int
    complete: bool  # the log ends with EOS: the operator had finished
    build_seconds: float = 0.0
    fallbacks: list[int] = field(default_factory=list)  # offsets of damaged footprints passed over
    marks: tuple[int, ...] = ()  # the crash record's event-time maxima per input partition (watermarks)
    # The windows whose R the scan met, and the lowest offset it read: the closed-window directory of the
    # log from there to its end (`recovery.closed_directory`), without reading the log again.
    closed: set[tuple[str, int]] = field(default_factory=set)
    scanned_from: int = 0
    crash_row: Row | None = None  # the crash point's record as stored (whole value): what the EC cache keeps

    @property
    def extent_size(self) -> int:
        return self.end_offset - self.extent_start


class EventualCheckpointBuilder:
    def __init__(
        self,
        reader: PartitionReader,
        codec: RecordCodec | None = None,
        *,
        chunk: int = 8192,
        progress: Callable[[int, int, int], None] | None = None,
    ) -> None:
        self.reader = reader
        self.codec = codec or RecordCodec()
        self.chunk = chunk
        self.progress = progress  # (records read, windows found, N)

    def _whole(self, stored: StoredRecord) -> StoredRecord | None:
        """The record with its whole value (a manifest's parts joined, see queuestore.chunks), or None if
        it fails its checksum or its parts are missing or damaged."""
        return whole_record(self.reader, stored, self.codec)

    def _damaged(self, stored: StoredRecord, corrupt: list[int], where: str) -> None:
        # Only a damaged footprint can be passed over: its window falls back to an older footprint. The
        # kind of a damaged record is itself unverified, so this is the best that can be known.
        if stored.meta.kind not in _FOOTPRINT_CODES:
            raise RecoveryError(
                f"{self.reader.where(stored.offset)} is damaged (a record of kind {stored.meta.kind!r} "
                f"{where}, not a footprint recovery could fall back past); {self.reader.way_out}"
            )
        corrupt.append(stored.offset)

    def build(self) -> EventualCheckpoint:
        with gc_paused():
            return self._build()

    def _build(self) -> EventualCheckpoint:
        started = time.perf_counter()
        end = self.reader.end_offset()
        chunks = _Chunks(self.reader, self.codec, end)
        records_read = 0
        corrupt: list[int] = []
        codec = self.codec

        # 1. The crash point: the newest intact record.
        newest: OutputRecord | None = None
        newest_offset = -1
        crash_row: Row | None = None
        while newest is None and chunks.next(self.chunk):
            rows, failed = chunks.rows, chunks.failed
            for index in range(chunks.at, len(rows)):
                records_read += 1
                offset, kind, t, key, seq, value = rows[index]
                stored = StoredRecord(offset, value, RecordMeta(kind, t, key, seq))
                if kind == PART_KIND and is_part(stored):
                    continue  # a part of a chunked value, not a record (or the orphan of a torn write)
                whole = self._whole(stored) if index in failed else stored
                if whole is not None:
                    newest, newest_offset = codec.decode(whole.value, whole.meta, verified=True), offset
                    crash_row = (offset, *whole.meta, whole.value)
                    chunks.at = index + 1
                    break
                self._damaged(stored, corrupt, "at the end of the log, so the crash point is unknown")
            else:
                chunks.at = len(rows)
        if newest is None:
            if corrupt:
                raise RecoveryError(
                    f"{self.reader.log_name}: no intact record in the log; {self.reader.way_out}"
                )
            return EventualCheckpoint(
                {}, None, 0, 0, end, end, records_read, 0, False, time.perf_counter() - started,
                scanned_from=chunks.upper,
            )  # fmt: skip

        assert crash_row is not None
        n = newest.n
        windows: dict[str, ECFootprint] = {}
        closed: set[tuple[str, int]] = set()
        extent_start = end
        if newest.key is not None:
            if newest.kind is Kind.R:
                closed.add((newest.key, newest.seq))
            elif newest.kind in FOOTPRINT_KINDS:
                windows[newest.key] = ECFootprint(newest_offset, newest.key, crash_row, codec, newest)
                extent_start = newest_offset

        # 2. Read back until N windows are found. Each chunk's checksums are checked at once (C when
        #    built); a record that failed goes through `_whole` (chunked values, damage). Only the
        #    footprints that enter the EC are decoded, at EC-load. A chunk is the number of windows
        #    still missing (each needs a record of its own, so the extent holds at least that many more)
        #    plus one ordinary chunk of slack: a long extent takes one or two reads instead of a read
        #    per 8,192 records plus a last short one (each read is a round trip on Kafka: ~20-80 ms).
        while len(windows) < n and chunks.next(n - len(windows) + self.chunk):
            rows, failed = chunks.rows, chunks.failed
            first = chunks.at
            while True:
                at, status, oldest = _scan(rows, chunks.at, failed, windows, closed, n, codec)
                if oldest is not None:
                    extent_start = oldest
                chunks.at = at
                if status != _SCAN_FAILED:
                    break
                # A row that failed its checksum: a chunked value to reassemble, or damage.
                offset, kind, t, key, seq, value = rows[at]
                stored = StoredRecord(offset, value, RecordMeta(kind, t, key, seq))
                whole = self._whole(stored)
                chunks.at = at + 1
                if whole is None:
                    self._damaged(stored, corrupt, "inside the extent")
                elif _classify((offset, kind, t, key, seq, whole.value), windows, closed, codec):
                    extent_start = offset
                    if len(windows) >= n:
                        break
            records_read += chunks.at - first
            if self.progress:
                self.progress(records_read, len(windows), n)
        if len(windows) < n:
            raise RecoveryError(
                f"{self.reader.log_name}: found {len(windows)} of N={n} open windows before the start of "
                f"the log (truncated by retention, or a G-open is damaged); {self.reader.way_out}"
            )
        if self.progress:
            self.progress(records_read, len(windows), n)
        return EventualCheckpoint(
            windows=windows,
            crash_pos=newest.pos,
            n=n,
            time=newest.time,
            end_offset=end,
            extent_start=extent_start,
            records_read=records_read,
            corrupt_skipped=len(corrupt),
            complete=newest.kind is Kind.EOS,
            build_seconds=time.perf_counter() - started,
            fallbacks=corrupt,
            marks=newest.marks,
            closed=closed,
            scanned_from=min(extent_start, newest_offset),
            crash_row=crash_row,
        )


_SCAN_END, _SCAN_FULL, _SCAN_FAILED = 0, 1, 2


def _classify(
    row: Row,
    windows: dict[str, ECFootprint],
    closed: set[tuple[str, int]],
    codec: RecordCodec,
) -> bool:
    """One intact record met reading back (DESIGN-NOTES section 2): an R closes its window; the first
    footprint met of a window not closed is its latest and enters the EC (returns True)."""
    offset, kind, _, key, seq, _ = row
    if key is None:
        return False
    if kind == "R":
        closed.add((key, seq))
    elif kind in _FOOTPRINT_CODES and key not in windows and (key, seq) not in closed:
        windows[key] = ECFootprint(offset, key, row, codec)
        return True
    return False


def _scan_rows(
    rows: list[Row],
    at: int,
    failed: set[int],
    windows: dict[str, ECFootprint],
    closed: set[tuple[str, int]],
    n: int,
    codec: RecordCodec,
) -> tuple[int, int, int | None]:
    """Classify `rows[at:]` (newest first) until the end (`_SCAN_END`), N windows (`_SCAN_FULL`, at the
    row after the last one used) or a row that failed its checksum (`_SCAN_FAILED`, at that row, for the
    caller to handle, as is a record whose kind says PART but which is not shaped like a part); also
    returns the offset of the oldest footprint taken, if any. Parts of chunked values are passed over.
    `_native.ec_scan` does exactly this in C."""
    oldest: int | None = None
    for index in range(at, len(rows)):
        offset, kind, t, key, seq, value = rows[index]
        if kind == PART_KIND:
            if is_part(StoredRecord(offset, value, RecordMeta(kind, t, key, seq))):
                continue
            return index, _SCAN_FAILED, oldest  # damaged into a "part": the caller's checks decide
        if failed and index in failed:
            return index, _SCAN_FAILED, oldest
        if _classify(rows[index], windows, closed, codec):
            oldest = offset
            if len(windows) >= n:
                return index + 1, _SCAN_FULL, oldest
    return len(rows), _SCAN_END, oldest


def _native_scan(
    rows: list[Row],
    at: int,
    failed: set[int],
    windows: dict[str, ECFootprint],
    closed: set[tuple[str, int]],
    n: int,
    codec: RecordCodec,
) -> tuple[int, int, int | None]:
    assert native is not None
    result: tuple[int, int, int | None] = native.ec_scan(
        rows, at, failed, windows, closed, n, _FOOTPRINT_CODES, ECFootprint, _FOOTPRINT_SLOTS, codec
    )
    return result


# ECFootprint's slots in the order `_native.ec_scan` fills them: offset, key, row, codec, record.
_FOOTPRINT_SLOTS = tuple(vars(ECFootprint)[name] for name in ("offset", "key", "_row", "_codec", "_record"))
_scan = _scan_rows if native is None else _native_scan


class _Chunks:
    """The log read back in chunks of rows, each with the indices of the rows that failed their checksum
    (`RecordCodec.failing_rows`); `at` is the next row of the current chunk to look at."""

    # Bounds one read (memory, and how often progress is reported) however many windows are missing.
    MAX_CHUNK = 131_072

    def __init__(self, reader: PartitionReader, codec: RecordCodec, end: int) -> None:
        self.reader = reader
        self.codec = codec
        self.upper = end
        self.rows: list[Row] = []
        self.failed: set[int] = set()
        self.at = 0
        self.first = True

    def next(self, size: int) -> bool:
        """Make sure rows remain in the current chunk, reading the next one if needed; False at the
        start of the log."""
        if self.at < len(self.rows):
            return True
        if self.upper <= 0:
            return False
        reader = self.reader
        rows = reader.read_backward_rows(self.upper, min(size, self.MAX_CHUNK))
        dense = reader.dense_offsets
        if not rows:
            if dense and not self.first:
                raise reader.missing(self.upper - 1)
            return False
        # As `PartitionReader.scan_backward`: the newest row is the top of the log; below it, a dense log
        # (SQLite) has every offset, and a missing one is damage.
        top = rows[0][0] if self.first else self.upper - 1
        if dense and (rows[0][0] != top or top - rows[-1][0] != len(rows) - 1):
            expected = top
            for row in rows:
                if row[0] != expected:
                    raise reader.missing(expected)
                expected -= 1
        self.first = False
        self.rows, self.at = rows, 0
        self.upper = rows[-1][0]
        self.failed = set(self.codec.failing_rows(rows))
        return True
