"""The wire format of the records of a CEC output queue (`cec.model.OutputRecord`): their bytes, checksum
and schema versions.

Wire format: `MAGIC | version | CRC32C(meta + body) | body`. The version selects the body's layout. The
CRC covers the record's metadata (kind, time, window key, seq: what a store keeps beside the value, SQLite
columns or Kafka key/header/frame) as well as the body.

- Version 1 (Avro, fastavro schemaless) repeats the metadata inside the body, so a value decodes on its own.
- Versions 2 and 3 (Avro) carry it only once, beside the value: the body holds `pos`, N, state and
  payload (3: and `marks`), and decoding takes the metadata the store kept (`decode(value, meta)`).
- Version 4 (the newest, "compact") has the same fields as version 3 in a hand-made layout that carries
  nothing the metadata beside it already says (`cec.compact_body`): a flags byte saying which optional
  fields follow (no union or empty-array bytes), `pos[0]` as a difference from the record's time when that
  is shorter (without event time the operator's time is the sum of `pos`: one byte instead of three), and
  a payload whose Avro encoding starts with the window key and seq (an aggregate's result: `key`,
  `window`) stored without that prefix, which decoding puts back from the metadata: every reader gets the
  payload bytes that were written (benchmarks/RESULTS.md, "Bytes per input tuple").

A record's fields come from its body where the body has them, else from the metadata beside it, else
from `OutputRecord`'s defaults: a newer release still loads checkpoints written by an older one.

The record codec lives here; the compact body's layout is `cec.compact_body`, the varint `cec.varint`, the
operators' own Avro `cec.avro_codec` (re-exported here under their old names).
"""

from __future__ import annotations

import dataclasses
import io
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fastavro
import google_crc32c

from cec.avro_codec import AvroCodec
from cec.compact_body import COMPACT_LAYOUT, decode_compact, encode_compact
from cec.exceptions import CodecError
from cec.model import KIND_OF, KIND_VALUE, Kind, OutputRecord
from cec.native import compile_avro, native
from cec.stored import RecordMeta, Row
from cec.varint import read_zigzag, zigzag

__all__ = [
    "COMPACT_LAYOUT",
    "MAGIC",
    "SCHEMAS",
    "AvroCodec",
    "RecordCodec",
    "crc32c",
    "read_zigzag",
    "zigzag",
]

MAGIC = 0xCE
_HEADER = struct.Struct(">BBI")  # magic, version, crc32c
_U32 = struct.Struct(">I")
_crc_value = google_crc32c.value
_crc_extend = google_crc32c.extend


def crc32c(data: bytes) -> int:
    return int(google_crc32c.value(data))


def _meta_bytes(version: int, kind: str, time: int, key: str | None, seq: int) -> bytes:
    # The metadata a store keeps beside the value (SQLite columns; Kafka header, key and frame) is covered
    # by the checksum as well as the body, so that neither can be damaged unnoticed. Separators keep it
    # unambiguous.
    return f"{version}\x1f{kind}\x1f{time}\x1f{'' if key is None else 'k' + key}\x1f{seq}\x1e".encode()


def _checksum(version: int, kind: str, time: int, key: str | None, seq: int, body: bytes | memoryview) -> int:
    return int(_crc_extend(_crc_value(_meta_bytes(version, kind, time, key, seq)), bytes(body)))


_KIND_SYMBOLS = [k.value for k in Kind]
_VERSION_BYTE = tuple(bytes((v,)) for v in range(256))


def _body_schema(*more: dict[str, Any]) -> dict[str, Any]:
    """The Avro body of versions 2 and 3: `pos`, N, state and payload (kind, time, key and seq are kept
    beside the value), then `more` (3: `marks`). Built afresh per version: no two share a field object."""
    return {
        "type": "record",
        "name": "OutputRecordBody",
        "namespace": "cec",
        "fields": [
            {"name": "pos", "type": {"type": "array", "items": "long"}},
            {"name": "n", "type": "long"},
            {"name": "state", "type": ["null", "bytes"], "default": None},
            {"name": "payload", "type": ["null", "bytes"], "default": None},
            *more,
        ],
    }


# Version 1: the first release. Version 2: the metadata only beside the value. Version 3: `marks`
# (per-partition event-time maxima, for watermarks). Version 4: version 3's fields in the compact layout
# (`COMPACT_LAYOUT`: not Avro, see `cec.compact_body`). Never edit a published layout: add version N+1 and
# make it the newest (fields of OutputRecord it lacks come from the metadata beside the value, or from
# OutputRecord's defaults).
SCHEMAS: dict[int, dict[str, Any]] = {
    1: {
        "type": "record",
        "name": "OutputRecord",
        "namespace": "cec",
        "fields": [
            {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": _KIND_SYMBOLS}},
            {"name": "time", "type": "long"},
            {"name": "pos", "type": {"type": "array", "items": "long"}},
            {"name": "n", "type": "long"},
            {"name": "key", "type": ["null", "string"], "default": None},
            {"name": "seq", "type": "long", "default": -1},
            {"name": "state", "type": ["null", "bytes"], "default": None},
            {"name": "payload", "type": ["null", "bytes"], "default": None},
        ],
    },
    2: _body_schema(),
    3: _body_schema({"name": "marks", "type": {"type": "array", "items": "long"}, "default": []}),
}
SCHEMAS[4] = COMPACT_LAYOUT  # the compact body (`cec.compact_body`): no Avro schema


# The fields a store keeps beside every value (RecordMeta), in RecordMeta's order.
_META_FIELDS = ("kind", "time", "key", "seq")
_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(OutputRecord))
# The whole version-4 record in one C call (`_native.encode_compact`), None without the accelerator or
# with a build older than it; it declines (None) anything unusual, which `encode_compact` then encodes.
_native_encode = getattr(native, "encode_compact", None)
_native_encode_gchecks = getattr(native, "encode_gchecks", None)  # a run of G-checks taken at one moment
# OutputRecord's slots by field: the C decoder fills them directly (a frozen dataclass's __init__ costs
# more than the decode itself).
_FIELD_SLOTS = {f.name: getattr(OutputRecord, f.name) for f in dataclasses.fields(OutputRecord)}
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(OutputRecord)}


@dataclass(frozen=True)
class _Layout:
    """How one schema version's body maps onto `OutputRecord`."""

    body: tuple[str, ...]  # the body's fields, in order
    beside: bool  # some of kind/time/key/seq are not in the body: decoding needs the stored metadata
    program: Any  # the C decoder of the body (None: fastavro decodes)
    # Slots for the C decoder: the metadata's four (when beside) then the body's fields; None when they
    # name something that is no field of OutputRecord (fastavro then decodes, defaults fill the rest).
    slots: tuple[Any, ...] | None
    # (slot, default) of the fields of OutputRecord an older layout lacks (versions 1 and 2: `marks`),
    # set after the C decoder filled `slots`.
    missing: tuple[tuple[Any, Any], ...] = ()


def _is_compact(schema: Mapping[str, Any]) -> bool:
    return schema.get("cec.layout") == "compact"


def _layout(parsed: Any) -> _Layout:
    body = tuple(f["name"] for f in parsed.get("fields", ()))
    if _is_compact(parsed):
        return _Layout(body, True, None, tuple(_FIELD_SLOTS[name] for name in (*_META_FIELDS, *body)))
    beside = not set(_META_FIELDS) <= set(body)
    program = compile_avro(parsed, {"cec.Kind": tuple(Kind)}, arrays=True)
    order = (*_META_FIELDS, *body) if beside else body
    if not set(order) <= set(_FIELD_NAMES) or len(set(order)) != len(order):
        return _Layout(body, beside, program, None)
    missing = tuple((_FIELD_SLOTS[name], _DEFAULTS[name]) for name in _FIELD_NAMES if name not in order)
    return _Layout(body, beside, program, tuple(_FIELD_SLOTS[name] for name in order), missing)


def _fill_missing(record: OutputRecord, missing: tuple[tuple[Any, Any], ...]) -> OutputRecord:
    """`record`, made by the C decoder from an older layout, with the fields that layout lacks set to
    their defaults (through the slot descriptors: the dataclass is frozen)."""
    for slot, default in missing:
        slot.__set__(record, default)
    return record


class RecordCodec:
    """Encodes `OutputRecord`s with the newest schema; decodes any known version.

    `max_bytes` bounds what `decode` accepts, so hostile input cannot make it allocate without limit
    (Avro lengths inside a record are also bounded by the record's own size, which is checked against
    what the reader actually consumed).
    """

    def __init__(self, schemas: Mapping[int, dict[str, Any]] = SCHEMAS, max_bytes: int = 64 << 20) -> None:
        if not schemas:
            raise ValueError("at least one schema version is needed")
        self.version = max(schemas)
        self.max_bytes = max_bytes
        self._parsed = {
            v: dict(s) if _is_compact(s) else fastavro.parse_schema(dict(s)) for v, s in schemas.items()
        }
        self._compact = {v for v, s in schemas.items() if _is_compact(s)}
        self._writer_schema = self._parsed[self.version]
        self._writes_compact = self.version in self._compact
        self._layouts = {v: _layout(p) for v, p in self._parsed.items()}
        self._writes_meta = not self._layouts[self.version].beside
        self._known_versions = bytes(1 if v in self._parsed else 0 for v in range(256))

    def encode(self, record: OutputRecord) -> bytes:
        kind = KIND_VALUE[record.kind]
        # Every record an operator writes (G-checks included): one C call.
        if self._writes_compact and _native_encode is not None:
            value = _native_encode(
                self.version, kind, record.time, record.key, record.seq, record.pos, record.n,
                record.state, record.payload, record.marks,
            )  # fmt: skip
            if value is not None:
                return value
        return self.encode_python(record)

    def encode_python(self, record: OutputRecord) -> bytes:
        """`encode` without the C accelerator (its definition, and what it falls back to)."""
        kind = KIND_VALUE[record.kind]
        if self._writes_compact:
            body = encode_compact(record)
            crc = _checksum(self.version, kind, record.time, record.key, record.seq, body)
            return _HEADER.pack(MAGIC, self.version, crc) + body
        buf = io.BytesIO()
        datum: dict[str, Any] = {"pos": list(record.pos), "n": record.n, "state": record.state}
        datum["payload"] = record.payload
        datum["marks"] = list(record.marks)  # ignored by a writer schema without it (versions 1, 2)
        if self._writes_meta:
            datum.update(kind=kind, time=record.time, key=record.key, seq=record.seq)
        fastavro.schemaless_writer(buf, self._writer_schema, datum)
        body = buf.getvalue()
        crc = _checksum(self.version, kind, record.time, record.key, record.seq, body)
        return _HEADER.pack(MAGIC, self.version, crc) + body

    def encode_fields(
        self,
        kind: Kind,
        time: int,
        pos: tuple[int, ...] | list[int],
        n: int,
        key: str | None,
        seq: int,
        state: bytes | None,
        payload: bytes | None,
        marks: tuple[int, ...] = (),
    ) -> bytes:
        """`encode(OutputRecord(kind, time, pos, n, key, seq, state, payload, marks))` without building
        the record: the operator's write path, once per output record."""
        if self._writes_compact and _native_encode is not None:
            value = _native_encode(
                self.version, KIND_VALUE[kind], time, key, seq, pos, n, state, payload, marks
            )
            if value is not None:
                return value
        return self.encode(OutputRecord(kind, time, tuple(pos), n, key, seq, state, payload, tuple(marks)))

    def encode_run(
        self,
        kind: Kind,
        time: int,
        pos: tuple[int, ...],
        n: int,
        marks: tuple[int, ...],
        keys: list[str],
        seqs: list[int],
        states: list[bytes],
    ) -> list[bytes]:
        """The records of footprints of several windows taken at one moment (the runtime's batched
        G-check), byte for byte `encode_fields(kind, time, pos, n, keys[i], seqs[i], states[i], None,
        marks)` of each, in one C call when the accelerator takes them all."""
        if self._writes_compact and _native_encode_gchecks is not None:
            values: list[bytes] | None = _native_encode_gchecks(
                self.version, KIND_VALUE[kind], time, pos, n, marks, keys, seqs, states
            )
            if values is not None:
                return values
        encode = self.encode_fields
        return [
            encode(kind, time, pos, n, key, seq, state, None, marks)
            for key, seq, state in zip(keys, seqs, states, strict=True)
        ]

    def _header(self, data: bytes) -> tuple[int, int]:
        if not isinstance(data, bytes | bytearray | memoryview):  # a damaged store cell of another type
            raise CodecError(f"a stored value of type {type(data).__name__}, not bytes")
        if len(data) < _HEADER.size + 1:
            raise CodecError(f"record too short ({len(data)} bytes)")
        if len(data) > self.max_bytes:
            raise CodecError(f"record of {len(data)} bytes exceeds the {self.max_bytes}-byte limit")
        magic, version, crc = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise CodecError(f"not a CEC record (magic 0x{magic:02x})")
        if version not in self._parsed:
            raise CodecError(
                f"unknown record schema version {version} (this reader knows {sorted(self._parsed)})"
            )
        return version, crc

    def verify(self, data: bytes, meta: RecordMeta) -> None:
        """Check a stored record and the metadata kept beside it against the checksum, without decoding.

        This is what lets recovery scan the extent at checksum speed and decode only the footprints it
        keeps, while never trusting a damaged record or damaged metadata. (Written flat: it runs once per
        record of every recovery scan.)
        """
        if (
            type(data) is not bytes
            or len(data) <= _HEADER.size
            or len(data) > self.max_bytes
            or data[0] != MAGIC
        ):
            self._header(data)  # raises the precise error
        version = data[1]
        if version not in self._parsed:
            self._header(data)
        try:
            crc = _crc_extend(_crc_value(_meta_bytes(version, *meta)), data[_HEADER.size :])
        except (TypeError, UnicodeEncodeError) as exc:  # metadata of other types: damaged store cells
            raise CodecError(f"malformed metadata beside the record ({exc})") from None
        if crc != _U32.unpack_from(data, 2)[0]:
            raise CodecError("checksum mismatch: torn or corrupt record (or metadata)")

    def failing_rows(self, rows: list[Row]) -> list[int]:
        """Indices of the stored rows `(offset, kind, time, key, seq, value)` whose record fails `verify`
        (checksum over the value and the metadata beside it), in order.

        The C accelerator checks the plain rows of a whole batch at once; whatever it declines (damaged,
        not a CEC record, unusual metadata) is checked again by `verify`, which has the final word.
        """
        if native is not None:
            candidates: list[int] | range = native.verify_rows(
                rows, MAGIC, self._known_versions, self.max_bytes
            )
            if not candidates:
                return []
        else:
            candidates = range(len(rows))
        failed: list[int] = []
        verify = self.verify
        for i in candidates:
            _, kind, time, key, seq, value = rows[i]
            try:
                verify(value, RecordMeta(kind, time, key, seq))
            except CodecError:
                failed.append(i)
        return failed

    def decode_rows(self, rows: list[Row], *, verified: bool = False) -> list[OutputRecord]:
        """`decode` of each row's value with the metadata kept beside it (one call into the C decoder per
        record version present, when it is built): the footprints of the EC at EC-load. Rows written by an
        older release (a log that spans an upgrade) take the C decoder of their own version too."""
        if native is None or not verified:
            return [self.decode(r[5], RecordMeta(r[1], r[2], r[3], r[4]), verified=verified) for r in rows]
        # Most logs hold one version: the first row's is tried on all rows at once, then any others.
        first = rows[0][5] if rows else b""
        primary = first[1] if isinstance(first, bytes) and len(first) > 1 else self.version
        decoded = self._native_rows(rows, primary)
        left = [i for i, r in enumerate(decoded) if r is None]
        if left:
            by_version: dict[int, list[int]] = {}
            for i in left:
                value = rows[i][5]
                if isinstance(value, bytes) and len(value) > 1 and value[1] != primary:
                    by_version.setdefault(value[1], []).append(i)
            for version, indices in by_version.items():
                for i, record in zip(
                    indices, self._native_rows([rows[i] for i in indices], version), strict=True
                ):
                    decoded[i] = record
        out: list[OutputRecord] = []
        for record, row in zip(decoded, rows, strict=True):
            # Declined by the C decoder (unusual or malformed): the Python path has the final word.
            out.append(
                record if record is not None else self.decode(row[5], RecordMeta(*row[1:5]), verified=True)
            )
        return out

    def _native_rows(self, rows: list[Row], version: int) -> list[OutputRecord | None]:
        """The C decoder's records of the version-`version` rows (already verified), None where it
        declines (another version, anything unusual)."""
        assert native is not None
        layout = self._layouts.get(version)
        if layout is None or layout.slots is None:
            return [None] * len(rows)
        decoded: list[OutputRecord | None]
        if version in self._compact:
            decoded = native.decode_compact_rows(
                rows, _HEADER.size, OutputRecord, layout.slots, KIND_OF, version
            )
        elif layout.program is None:
            return [None] * len(rows)
        elif layout.beside:
            decoded = native.decode_avro_rows(
                layout.program, rows, _HEADER.size, OutputRecord, layout.slots, KIND_OF, version
            )
        else:  # version 1: the metadata is in the body (the rows' own is covered by the checksum)
            decoded = native.decode_avro_many(
                layout.program,
                [
                    r[5] if isinstance(r[5], bytes) and r[5][1:2] == _VERSION_BYTE[version] else None
                    for r in rows
                ],
                _HEADER.size,
                OutputRecord,
                layout.slots,
            )
        if layout.missing:
            missing = layout.missing
            decoded = [None if r is None else _fill_missing(r, missing) for r in decoded]
        return decoded

    def decode_many(
        self, values: list[bytes], metas: list[RecordMeta] | None = None, *, verified: bool = False
    ) -> list[OutputRecord]:
        """`decode` of each value (with its metadata: needed from version 2 on)."""
        if metas is None:
            return [self.decode(v, verified=verified) for v in values]
        rows: list[Row] = [(0, m[0], m[1], m[2], m[3], v) for v, m in zip(values, metas, strict=True)]
        return self.decode_rows(rows, verified=verified)

    def decode(self, data: bytes, meta: RecordMeta | None = None, *, verified: bool = False) -> OutputRecord:
        """The record in `data`; `CodecError` if it is malformed or fails its checksum. `meta` is the
        metadata the store kept beside the value (required from version 2 on, which keeps kind, time,
        key and seq only there; checked by the checksum). `verified=True` skips the checksum, for bytes
        that have just passed `verify` (the EC's footprints at EC-load)."""
        version, crc = self._header(data)
        layout = self._layouts[version]
        head: tuple[Any, ...] = ()
        if layout.beside:
            if meta is None:
                raise CodecError(
                    f"a version-{version} record keeps its kind, time, key and seq beside the value: "
                    "decode it with the metadata the store kept"
                )
            kind = KIND_OF.get(meta[0])
            if kind is None:
                raise CodecError(f"unknown record kind {meta[0]!r}")
            head = (kind, meta[1], meta[2], meta[3])
        record: OutputRecord | None = None
        if version in self._compact:
            if native is not None and layout.slots is not None:
                record = native.decode_compact(data, _HEADER.size, head, OutputRecord, layout.slots)
            if record is None:  # no accelerator, or it declined: the Python twin says precisely why
                record = decode_compact(data, _HEADER.size, head)
        elif layout.program is not None and layout.slots is not None and native is not None:
            fields = native.decode_avro(layout.program, data, _HEADER.size)
            if fields is not None:
                record = native.make(OutputRecord, layout.slots, head + fields)
                if layout.missing:
                    record = _fill_missing(record, layout.missing)
            # else: malformed for the fast decoder: fastavro below says precisely why
        if record is None:
            body = memoryview(data)[_HEADER.size :]
            buf = io.BytesIO(body)
            try:
                obj = fastavro.schemaless_reader(buf, self._parsed[version], None)
                if not isinstance(obj, dict) or buf.tell() != len(body):
                    raise CodecError("trailing bytes after record body")
                if head:
                    obj = {**dict(zip(_META_FIELDS, head, strict=True)), **obj}
                values = {name: obj.get(name, _DEFAULTS[name]) for name in _FIELD_NAMES}
                values["kind"] = KIND_OF[values["kind"]]
                values["pos"] = tuple(values["pos"])
                values["marks"] = tuple(values["marks"])
                record = OutputRecord(**values)
            except CodecError:
                raise
            except Exception as exc:  # fastavro raises many types on malformed input
                raise CodecError(f"checksum mismatch or malformed record body: {exc!s:.200}") from None
        if verified:
            return record
        try:
            computed = _checksum(
                version,
                KIND_VALUE[record.kind],
                record.time,
                record.key,
                record.seq,
                memoryview(data)[_HEADER.size :],
            )
        except (TypeError, UnicodeEncodeError) as exc:  # metadata of other types: damaged store cells
            raise CodecError(f"malformed metadata beside the record ({exc})") from None
        if computed != crc:
            raise CodecError("checksum mismatch: torn or corrupt record")
        return record
