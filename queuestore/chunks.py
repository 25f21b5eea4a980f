"""Values larger than a store's record limit, written all-or-nothing as parts plus a manifest.

A Kafka broker rejects messages above `message.max.bytes`, and a window state can be larger. Such a value
is appended as consecutive records:

    PART 0 | PART 1 | ... | PART n-1 | MANIFEST (the original kind, time, key, seq)

Each part holds a slice of the value; the manifest holds the part count, the total length and a CRC32C of
the whole value. Readers treat the manifest as the record and rebuild its value from the n records right
before it, in order. The write is all-or-nothing because the manifest comes last: a crash in the middle
leaves parts without a manifest, which every reader passes over as they are not records; a manifest whose
parts do not add up to the checksum raises `TornRecordError`, so a partial state is never loaded (recovery
then falls back to an older footprint of the window, as for any damaged footprint).

Parts are consecutive because a partition has exactly one writer and a value's parts are appended in one
go; readers still check each part's index and count rather than assume it.
"""

from __future__ import annotations

import struct

import google_crc32c

from queuestore.base import PartitionReader, RecordMeta, StoredRecord
from queuestore.exceptions import TornRecordError

__all__ = ["PART_KIND", "is_manifest", "is_part", "join", "manifest_parts", "reassemble", "split"]

PART_KIND = "PART"
_PART_MAGIC = 0xCD
_MANIFEST_MAGIC = 0xCF
_PART = struct.Struct(">BII")  # magic, index, count
_MANIFEST = struct.Struct(">BIQI")  # magic, count, total length, crc32c of the whole value


def split(value: bytes, meta: RecordMeta, limit: int) -> list[tuple[bytes, RecordMeta]]:
    """The records that carry `value` in a store whose records hold at most `limit` bytes."""
    if len(value) <= limit:
        return [(value, meta)]
    piece = limit - _PART.size
    if piece <= 0:
        raise ValueError(f"record limit {limit} leaves no room for data")
    count = -(-len(value) // piece)
    part_meta = RecordMeta(PART_KIND, meta.time, meta.key, meta.seq)
    records = [
        (_PART.pack(_PART_MAGIC, i, count) + value[i * piece : (i + 1) * piece], part_meta)
        for i in range(count)
    ]
    records.append(
        (_MANIFEST.pack(_MANIFEST_MAGIC, count, len(value), int(google_crc32c.value(value))), meta)
    )
    return records


def is_manifest(stored: StoredRecord) -> bool:
    value = stored.value
    return (
        type(value) is bytes  # a damaged store may hand back another type (SQLite keeps one per cell)
        and len(value) == _MANIFEST.size
        and value[0] == _MANIFEST_MAGIC
        and stored.meta.kind != PART_KIND
    )


def is_part(stored: StoredRecord) -> bool:
    """Whether a record stored as a part is shaped like one (parts carry no checksum of their own: the
    manifest's covers them; this tells a part from another record whose kind was damaged into PART)."""
    value = stored.value
    if type(value) is not bytes or len(value) < _PART.size:
        return False
    magic, index, count = _PART.unpack_from(value)
    return magic == _PART_MAGIC and index < count


def manifest_parts(manifest: StoredRecord) -> int:
    """How many parts come right before a manifest."""
    return int(_MANIFEST.unpack(manifest.value)[1])


def reassemble(reader: PartitionReader, manifest: StoredRecord) -> bytes:
    """The whole value of a manifest, from the parts right before it; `TornRecordError` if they do not
    add up (missing, out of order, damaged)."""
    count = manifest_parts(manifest)
    if count <= 0 or manifest.offset < count:
        raise TornRecordError(f"offset {manifest.offset}: manifest of {count} parts has no room for them")
    parts = reader.read_backward(manifest.offset, count)  # newest first
    parts.reverse()
    return join(parts, manifest)


def join(parts: list[StoredRecord], manifest: StoredRecord) -> bytes:
    """The whole value of a manifest from its parts, oldest first; `TornRecordError` if they do not add
    up (missing, out of order, damaged)."""
    _, count, total, crc = _MANIFEST.unpack(manifest.value)
    if len(parts) != count:
        raise TornRecordError(f"offset {manifest.offset}: {len(parts)} of {count} parts found")
    pieces: list[bytes] = []
    for expected, part in enumerate(parts):
        value = part.value
        if part.meta.kind != PART_KIND or type(value) is not bytes or len(value) < _PART.size:
            raise TornRecordError(f"offset {part.offset}: expected part {expected} of {manifest.offset}")
        magic, index, part_count = _PART.unpack_from(value)
        if magic != _PART_MAGIC or index != expected or part_count != count:
            raise TornRecordError(f"offset {part.offset}: expected part {expected} of {manifest.offset}")
        pieces.append(value[_PART.size :])
    whole = b"".join(pieces)
    if len(whole) != total or int(google_crc32c.value(whole)) != crc:
        raise TornRecordError(f"offset {manifest.offset}: parts fail the checksum of the whole value")
    return whole
