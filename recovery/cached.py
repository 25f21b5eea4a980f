"""A restart with the EC cache (design S0): the eventual checkpoint the cache holds as of offset X, checked
against the log, then brought to the log's end by reading only the tail [X, end) forward
(`recovery.forward`). Anything that does not check out is a reason (a string) instead of a checkpoint:
the caller reads the log back, as without a cache (DESIGN-NOTES section 2), and writes the cache again.

The checks, all before anything is trusted:
- the snapshot is whole, passes its checksum and is of this partition (`queuestore.ec_cache.ECCache.load`);
- it is not ahead of the log (a log replaced, or trimmed past it);
- every value it holds passes the record's own checksum (a damaged cache byte is found here);
- its newest record is the log's record at that offset (another log of the same name differs there);
- every record of the tail passes its checksum (a damaged one: the log is read back, where the rules for
  damaged records live);
- the windows add up to the crash point's N (`ForwardCheckpoint.checkpoint`).
"""

from __future__ import annotations

from cec.exceptions import CodecError
from cec.records import RecordCodec
from queuestore.base import PartitionReader, RecordMeta, Row, StoredRecord
from queuestore.chunks import PART_KIND, is_manifest, is_part, reassemble
from queuestore.ec_cache import ECCache
from queuestore.exceptions import LogTrimmedError, TornRecordError
from recovery.eventual import EventualCheckpoint, gc_paused
from recovery.forward import ForwardCheckpoint

__all__ = ["apply_tail", "checkpoint_after_tail", "checkpoint_from_cache", "matches_log"]

TAIL_CHUNK = 8192


def _stored(row: Row) -> StoredRecord:
    offset, kind, t, key, seq, value = row
    return StoredRecord(offset, value, RecordMeta(kind, t, key, seq))


def checkpoint_from_cache(
    reader: PartitionReader, cache: ECCache, codec: RecordCodec
) -> tuple[EventualCheckpoint, ForwardCheckpoint] | str:
    """The eventual checkpoint at the log's end from the cache and the tail, with the forward checkpoint it
    came from (the cache goes on from it); or why the cache was not used."""
    with gc_paused():  # a few objects per window, none freed: as the EC build and load (recovery.eventual)
        return _checkpoint_from_cache(reader, cache, codec)


def _checkpoint_from_cache(
    reader: PartitionReader, cache: ECCache, codec: RecordCodec
) -> tuple[EventualCheckpoint, ForwardCheckpoint] | str:
    loaded = cache.load()
    if isinstance(loaded, str):
        return loaded
    parts, last, next_offset = loaded
    end = reader.end_offset()
    if next_offset > end:
        return f"the EC cache is ahead of the log (offset {next_offset:,}, log end {end:,})"
    if next_offset < reader.start_offset():
        return "the EC cache is behind the log's start (trimmed past it)"
    rows = [*parts.values(), *([] if last is None else [last])]
    if rows and codec.failing_rows(rows):
        return "the EC cache holds a damaged value"
    if last is not None and not matches_log(reader, last):
        return f"the EC cache's newest record is not the log's record at offset {last[0]:,}"
    return checkpoint_after_tail(
        reader, ForwardCheckpoint(parts, last, next_offset), codec, end, "the EC cache"
    )


def checkpoint_after_tail(
    reader: PartitionReader, forward: ForwardCheckpoint, codec: RecordCodec, end: int, what: str
) -> tuple[EventualCheckpoint, ForwardCheckpoint] | str:
    """The eventual checkpoint at `end` from `forward` (an EC as of an earlier offset: the EC cache's, or
    what a standby followed) and the log's tail after it; or why not, naming `what` the EC came from."""
    applied = apply_tail(reader, forward, codec, end)
    if isinstance(applied, str):
        return applied
    ec = forward.checkpoint(codec, end)
    if ec is None:
        return f"{what} does not add up to the crash point's open windows"
    ec.records_read = applied
    return ec, forward


def apply_tail(
    reader: PartitionReader, forward: ForwardCheckpoint, codec: RecordCodec, end: int | None = None
) -> int | str:
    """Apply the log's records from `forward.next_offset` to `end` (None: to the end the reader finds as
    it reads, for a log still being written) to `forward`, each checked by checksum first; the records
    read, or why the tail could not be applied (a damaged record, a torn chunked value, records trimmed
    before they were applied: the caller reads the log back instead, where the rules for damaged records
    live). A chunked value's manifest is applied with the whole value its parts make."""
    read = 0
    offset = forward.next_offset
    try:
        while end is None or offset < end:
            stop_before = offset + TAIL_CHUNK if end is None else min(end, offset + TAIL_CHUNK)
            chunk = reader.read_range_rows(offset, stop_before)
            if not chunk:
                break
            read += len(chunk)
            failed = set(codec.failing_rows(chunk))
            for index, row in enumerate(chunk):
                if index in failed:
                    stored = _stored(row)
                    if row[1] == PART_KIND and is_part(stored):
                        forward.apply(row)
                        continue
                    if not is_manifest(stored):
                        return f"a damaged record in the log's tail (offset {row[0]:,})"
                    whole = reassemble(reader, stored)
                    row = (*row[:5], whole)
                    codec.verify(whole, stored.meta)
                forward.apply(row)
            offset = chunk[-1][0] + 1
    except (TornRecordError, CodecError) as exc:  # a torn chunked value, a damaged one: read back instead
        return f"the log's tail could not be applied ({exc})"
    except LogTrimmedError:  # the reader checks the log's start when a read does not begin where asked
        return f"the log was trimmed past what was applied (offset {offset:,})"
    return read


def matches_log(reader: PartitionReader, last: Row | None) -> bool:
    """Whether `last` (the newest record a forward checkpoint applied) is the log's record at its offset
    (another log of the same name, or one replaced since, differs there)."""
    if last is None:
        return True
    at_log = reader.read_range_rows(last[0], last[0] + 1)
    return (
        bool(at_log)
        and at_log[0][:5] == last[:5]
        and (at_log[0][5] == last[5] or is_manifest(_stored(at_log[0])))
    )
