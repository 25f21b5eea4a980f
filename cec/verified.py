"""Verified reads of a CEC output log: a record's checksum is checked before anyone looks at its kind.

DESIGN-NOTES section 3: consumers drop control tuples by the kind kept beside the value (SQLite column,
Kafka header), but no reader may skip or trust a record before its checksum passes. The kind is stored
metadata like any other: a result whose stored kind is damaged (R -> Q) would vanish, with exit code 0,
from a reader that filters by kind first. So every reader of an output log (results and dead letters,
kind counts, `cec inspect`, queue sources, the Spark data source) reads through `LogVerifier`:

- each record is checked against its CRC32C, which covers the body and the metadata kept beside it
  (`RecordCodec.verify`, or a decode plus a metadata comparison for the kinds the caller decodes anyway);
  a value written in parts is joined first (`queuestore.chunks`) and checked whole;
- a part is passed over once its shape says it is one (the manifest after it is the record; orphans of a
  torn write are never used); a record damaged into the kind PART fails that shape check;
- on a store with dense offsets (`QueueStore.dense_offsets`), an offset missing between two records is
  damage too (a row lost to a damaged page);
- damage raises `DamagedLogError` naming the store, topic[partition] and offset: never skipped, never used.

Recovery's EC scan is the one reader with its own rule: a damaged footprint falls back to an older one
(DESIGN-NOTES section 2), a damaged result is an error; its scan also stops at a missing offset
(`PartitionReader.scan_backward`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from typing import NamedTuple

from cec.exceptions import CodecError
from cec.native import native
from cec.records import OutputRecord, RecordCodec
from queuestore.base import PartitionReader, RecordMeta, Row, StoredRecord
from queuestore.chunks import PART_KIND, is_manifest, is_part, join, manifest_parts, reassemble
from queuestore.exceptions import DamagedLogError, TornRecordError

__all__ = ["LogVerifier", "VerifiedRecord", "verified_records", "whole_record"]


class VerifiedRecord(NamedTuple):
    offset: int
    meta: RecordMeta  # checked: what the store kept beside the record is what was written
    value: bytes  # the whole value (a chunked value's parts joined), checked
    record: OutputRecord | None  # decoded, for the kinds the verifier was asked to decode


class LogVerifier:
    """Checks the records of one partition, fed in log order (possibly batch by batch), and yields the
    intact ones. `decode`: stored kinds to decode as well (checked by the decode itself, so a results
    reader pays for one checksum per result, not two)."""

    def __init__(
        self,
        reader: PartitionReader,
        codec: RecordCodec | None = None,
        *,
        decode: Collection[str] = (),
        passable: Collection[str] = (),
        passed_over: list[int] | None = None,
    ) -> None:
        """`passable`: stored kinds whose damaged records are passed over (their offsets appended to
        `passed_over`) instead of raising: only for a reader that follows recovery's rule (the stream
        index passes over damaged footprints as the EC scan does); any other damage still raises."""
        self.reader = reader
        self.codec = codec or RecordCodec()
        self._decode = frozenset(decode)
        self._passable = frozenset(passable)
        self.passed_over = [] if passed_over is None else passed_over
        self._next: int | None = None  # the offset the next record must have, on a dense store
        self._parts: list[StoredRecord] = []

    def seek(self, offset: int) -> None:
        """The next records fed start at `offset` (on a dense store the first one must be there)."""
        self._next = offset
        self._parts = []

    def damaged(self, offset: int, reason: object) -> DamagedLogError:
        return self.reader.damaged(offset, reason)

    def check(self, records: Iterable[StoredRecord]) -> Iterator[VerifiedRecord]:
        if native is not None and isinstance(records, list) and len(records) > 1:
            plain = self._check_plain(records)
            if plain is not None:
                yield from plain
                return
        # Written flat, with locals: it runs once per record of every read of a log.
        reader, decode = self.reader, self._decode
        verify, decode_record = self.codec.verify, self.codec.decode
        dense = reader.dense_offsets
        for stored in records:
            offset, value, meta = stored
            expected = self._next
            if dense and expected is not None and offset != expected:
                raise reader.missing(expected)
            self._next = offset + 1
            kind = meta.kind
            if kind == PART_KIND:
                if not is_part(stored):
                    raise self.damaged(offset, "stored as a part of a chunked value, but it is not one")
                self._parts.append(stored)
                continue
            try:
                if is_manifest(stored):
                    parts, self._parts = self._parts, []
                    count = manifest_parts(stored)
                    if 0 < count <= len(parts):
                        value = join(parts[-count:], stored)
                    else:  # the read started inside this value's parts: fetch them
                        value = reassemble(reader, stored)
                elif self._parts:
                    self._parts = []  # orphans of a torn write: never used
                record: OutputRecord | None = None
                if kind in decode:
                    # Checks the CRC over the body and the metadata (the store's, or the body's own in
                    # version 1, which must then be what the store kept beside it).
                    record = decode_record(value, meta)
                    if record.meta() != meta:
                        raise CodecError("the metadata kept beside the record does not match it")
                else:
                    verify(value, meta)
            except (CodecError, TornRecordError) as exc:
                if kind in self._passable:
                    self.passed_over.append(offset)
                    continue
                raise self.damaged(offset, exc) from None
            yield VerifiedRecord(offset, meta, value, record)

    def check_rows(self, rows: list[Row]) -> Iterator[tuple[int, str, OutputRecord | None]]:
        """`check` of flat rows (`PartitionReader.read_forward_rows`), yielding (offset, kind, record)
        for each intact record: the plain batch in two C calls without an object per row, anything else
        (a part, a manifest, damage, a gap) through `check`, which raises at the first damaged offset."""
        if native is not None and len(rows) > 1:
            plain = self._plain_rows(rows)
            if plain is not None:
                yield from plain
                return
        for verified in self.check(
            [StoredRecord(r[0], r[5], RecordMeta(r[1], r[2], r[3], r[4])) for r in rows]
        ):
            yield verified.offset, verified.meta.kind, verified.record

    def _plain_rows(self, rows: list[Row]) -> list[tuple[int, str, OutputRecord | None]] | None:
        """`_check_plain` of rows: None unless every row is a plain intact record in place."""
        if self._parts:
            return None
        first = rows[0][0]
        if self.reader.dense_offsets and (
            (self._next is not None and first != self._next) or rows[-1][0] - first != len(rows) - 1
        ):
            return None
        codec = self.codec
        if codec.failing_rows(rows):
            return None
        decode = self._decode
        out: list[tuple[int, str, OutputRecord | None]] = [(row[0], row[1], None) for row in rows]
        wanted = [i for i, row in enumerate(rows) if row[1] in decode] if decode else []
        if wanted:
            try:
                batch = codec.decode_rows([rows[i] for i in wanted], verified=True)
            except CodecError:
                return None
            for i, record in zip(wanted, batch, strict=True):
                row = rows[i]
                if row[5][1] == 1 and record.meta() != RecordMeta(row[1], row[2], row[3], row[4]):
                    return None  # version 1 keeps its metadata in the body too (see _check_plain)
                out[i] = (row[0], row[1], record)
        self._next = rows[-1][0] + 1
        return out

    def _check_plain(self, records: list[StoredRecord]) -> list[VerifiedRecord] | None:
        """`check` of a batch in two C calls (checksums, then decoding the kinds asked for), when every
        record in it is plain: whole values that pass their checksum, in place on a dense store, after no
        pending parts. None otherwise (a part, a manifest, damage, a gap): the record-by-record path then
        handles the batch and raises at the first damage, exactly as without this one (a queue source
        reads every record of its input through here: replay after a crash included)."""
        if self._parts:
            return None
        first = records[0].offset
        if self.reader.dense_offsets and (
            (self._next is not None and first != self._next) or records[-1].offset - first != len(records) - 1
        ):
            return None
        rows: list[Row] = [(r.offset, *r.meta, r.value) for r in records]
        codec = self.codec
        if codec.failing_rows(rows):
            return None  # parts and manifests do not pass as records either
        decode = self._decode
        wanted = [i for i, row in enumerate(rows) if row[1] in decode] if decode else []
        decoded: list[OutputRecord | None] = [None] * len(rows)
        if wanted:
            try:
                batch = codec.decode_rows([rows[i] for i in wanted], verified=True)
            except CodecError:
                return None  # intact but malformed: the record-by-record path names it
            for i, record in zip(wanted, batch, strict=True):
                # Version 1 keeps its metadata in the body too: it must be what the store kept beside it.
                if records[i].value[1] == 1 and record.meta() != records[i].meta:
                    return None
                decoded[i] = record
        self._next = records[-1].offset + 1
        return [
            VerifiedRecord(r.offset, r.meta, r.value, record)
            for r, record in zip(records, decoded, strict=True)
        ]


def verified_records(
    reader: PartitionReader,
    from_offset: int = 0,
    *,
    codec: RecordCodec | None = None,
    decode: Collection[str] = (),
    chunk: int = 4096,
) -> Iterator[VerifiedRecord]:
    """Every intact record of a partition from `from_offset` to its end as it is now, oldest first;
    `DamagedLogError` at the first damaged or missing one."""
    verifier = LogVerifier(reader, codec, decode=decode)
    verifier.seek(from_offset)
    yield from verifier.check(reader.scan_forward(from_offset, chunk))


def whole_record(reader: PartitionReader, stored: StoredRecord, codec: RecordCodec) -> StoredRecord | None:
    """`stored` with its whole value (a manifest's parts joined, `queuestore.chunks`), checked; None if it
    fails its checksum or its parts are missing or damaged (recovery's readers, which pass it over)."""
    if is_manifest(stored):
        try:
            stored = stored._replace(value=reassemble(reader, stored))
        except TornRecordError:
            return None
    try:
        codec.verify(stored.value, stored.meta)
    except CodecError:
        return None
    return stored
