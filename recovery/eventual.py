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

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cec.exceptions import CodecError
from cec.records import FOOTPRINT_KINDS, Kind, OutputRecord, RecordCodec
from queuestore.base import PartitionReader, StoredRecord
from queuestore.chunks import PART_KIND, is_manifest, is_part, reassemble
from queuestore.exceptions import TornRecordError
from recovery.exceptions import RecoveryError

__all__ = ["ECFootprint", "EventualCheckpoint", "EventualCheckpointBuilder"]

_FOOTPRINT_CODES = frozenset(k.value for k in FOOTPRINT_KINDS)


class ECFootprint:
    """The latest footprint of one window in the EC. Reconstruction only identifies it (by checksum and
    the metadata beside it); its body, state included, is decoded when the EC is loaded."""

    __slots__ = ("_codec", "_record", "_value", "key", "offset")

    def __init__(
        self, offset: int, key: str, value: bytes, codec: RecordCodec, record: OutputRecord | None = None
    ) -> None:
        self.offset = offset
        self.key = key
        self._value = value
        self._codec = codec
        self._record = record

    @property
    def record(self) -> OutputRecord:
        if self._record is None:
            self._record = self._codec.decode(self._value)
        return self._record


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
        if is_manifest(stored):
            try:
                stored = stored._replace(value=reassemble(self.reader, stored))
            except TornRecordError:
                return None
        try:
            self.codec.verify(stored.value, stored.meta)
        except CodecError:
            return None
        return stored

    def _damaged(self, stored: StoredRecord, corrupt: list[int], where: str) -> None:
        # Only a damaged footprint can be passed over: its window falls back to an older footprint. The
        # kind of a damaged record is itself unverified, so this is the best that can be known.
        if stored.meta.kind not in _FOOTPRINT_CODES:
            raise RecoveryError(
                f"{self.reader.topic}[{self.reader.partition}] offset {stored.offset}: a damaged record "
                f"(kind {stored.meta.kind!r}) {where}; the output log itself is damaged"
            )
        corrupt.append(stored.offset)

    def build(self) -> EventualCheckpoint:
        started = time.perf_counter()
        end = self.reader.end_offset()
        scan = self.reader.scan_backward(end, self.chunk)
        records_read = 0
        corrupt: list[int] = []

        # 1. The crash point: the newest intact record.
        newest: OutputRecord | None = None
        newest_offset = -1
        for stored in scan:
            records_read += 1
            if stored.meta.kind == PART_KIND and is_part(stored):
                continue  # a part of a chunked value, not a record (or the orphan of a torn write)
            whole = self._whole(stored)
            if whole is not None:
                newest, newest_offset = self.codec.decode(whole.value), stored.offset
                break
            self._damaged(stored, corrupt, "at the end of the log, so the crash point is unknown")
        if newest is None:
            if corrupt:
                raise RecoveryError(
                    f"{self.reader.topic}[{self.reader.partition}]: no intact record in the log"
                )
            return EventualCheckpoint(
                {}, None, 0, 0, end, end, records_read, 0, False, time.perf_counter() - started
            )

        n = newest.n
        windows: dict[str, ECFootprint] = {}
        closed: set[tuple[str, int]] = set()
        extent_start = end
        if newest.key is not None:
            if newest.kind is Kind.R:
                closed.add((newest.key, newest.seq))
            elif newest.kind in FOOTPRINT_KINDS:
                windows[newest.key] = ECFootprint(newest_offset, newest.key, b"", self.codec, newest)
                extent_start = newest_offset

        # 2. Read back until N windows are found. Records are checked by checksum (cheap); only the
        #    footprints that enter the EC are decoded.
        if len(windows) < n:
            for stored in scan:
                records_read += 1
                meta = stored.meta
                if meta.kind == PART_KIND and is_part(stored):  # else: damaged into a "part"
                    continue
                whole = self._whole(stored)
                if whole is None:
                    self._damaged(stored, corrupt, "inside the extent")
                    continue
                if meta.key is not None:
                    wid = (meta.key, meta.seq)
                    if meta.kind == "R":
                        closed.add(wid)
                    elif meta.kind in _FOOTPRINT_CODES and meta.key not in windows and wid not in closed:
                        windows[meta.key] = ECFootprint(stored.offset, meta.key, whole.value, self.codec)
                        extent_start = stored.offset
                        if len(windows) >= n:
                            break
                if self.progress and records_read % 65536 == 0:
                    self.progress(records_read, len(windows), n)
        if len(windows) < n:
            raise RecoveryError(
                f"{self.reader.topic}[{self.reader.partition}]: found {len(windows)} of N={n} open windows "
                "before the start of the log (truncated by retention, or a G-open is damaged)"
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
        )
