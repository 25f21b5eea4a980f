"""The tuple model of a CEC output queue and its wire format.

Every record an operator writes to its output queue is an `OutputRecord`:
- `R`: a result; for a windowed operator also the window's last footprint;
- `GOPEN` / `GCHECK`: window footprints (state after the opening tuple / partial state "as of now");
- `DEAD`: an input tuple the operator could not process (the dead-letter destination lives in the log
  itself, so replay after a crash neither loses nor repeats it);
- `EOS`: the operator reached the end of all its inputs.

Each carries the operator's logical time, `pos` (for every input partition, the next offset it would
read: everything below has been applied), and N, the number of open windows when it was produced.

Wire format: `MAGIC | version | CRC32C(meta + body) | Avro body` (fastavro schemaless). The version
selects the body's schema. The CRC covers the record's metadata (kind, time, window key, seq: what a
store keeps beside the value, SQLite columns or Kafka key/header/frame) as well as the body.

- Version 1 repeats the metadata inside the body, so a value decodes on its own.
- Version 2 (the newest) carries it only once, beside the value: the body holds `pos`, N, state and
  payload, and decoding takes the metadata the store kept (`decode(value, meta)`). With the Kafka
  layout that goes with it, a record of the paper's aggregate is ~40% smaller (benchmarks/RESULTS.md,
  "Bytes per input tuple").

A record's fields come from its body where the body has them, else from the metadata beside it, else
from `OutputRecord`'s defaults: a newer release still loads checkpoints written by an older one.
"""

from __future__ import annotations

import dataclasses
import io
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import fastavro
import google_crc32c

from cec.exceptions import CodecError
from cec.native import compile_avro, native
from queuestore.base import RecordMeta, Row

__all__ = [
    "CONTROL_KINDS",
    "FOOTPRINT_KINDS",
    "AvroCodec",
    "Kind",
    "OutputRecord",
    "RecordCodec",
    "crc32c",
]

MAGIC = 0xCE
_HEADER = struct.Struct(">BBI")  # magic, version, crc32c
_U32 = struct.Struct(">I")
_crc_value = google_crc32c.value
_crc_extend = google_crc32c.extend


class Kind(str, Enum):
    R = "R"
    GOPEN = "GOPEN"
    GCHECK = "GCHECK"
    DEAD = "DEAD"
    EOS = "EOS"


FOOTPRINT_KINDS = frozenset({Kind.GOPEN, Kind.GCHECK})
CONTROL_KINDS = frozenset({Kind.GOPEN, Kind.GCHECK, Kind.DEAD, Kind.EOS})


def crc32c(data: bytes) -> int:
    return int(google_crc32c.value(data))


def _meta_bytes(version: int, kind: str, time: int, key: str | None, seq: int) -> bytes:
    # The metadata a store keeps beside the value (SQLite columns; Kafka header, key and frame) is covered
    # by the checksum as well as the body, so that neither can be damaged unnoticed. Separators keep it
    # unambiguous.
    return f"{version}\x1f{kind}\x1f{time}\x1f{'' if key is None else 'k' + key}\x1f{seq}\x1e".encode()


def _checksum(version: int, kind: str, time: int, key: str | None, seq: int, body: bytes | memoryview) -> int:
    return int(_crc_extend(_crc_value(_meta_bytes(version, kind, time, key, seq)), bytes(body)))


@dataclass(frozen=True, slots=True)
class OutputRecord:
    kind: Kind
    time: int
    pos: tuple[int, ...]
    n: int
    key: str | None = None
    seq: int = -1
    state: bytes | None = None
    payload: bytes | None = None
    # Event-time watermarks (recovery.contract, "watermarks"): for each input partition, the largest event
    # time of the tuples below `pos` (LONG_MIN: none yet); empty when the operator keeps no watermark.
    marks: tuple[int, ...] = ()

    @property
    def window(self) -> tuple[str, int] | None:
        return None if self.key is None else (self.key, self.seq)

    def meta(self) -> RecordMeta:
        return RecordMeta(_KIND_VALUE[self.kind], self.time, self.key, self.seq)


_KIND_SYMBOLS = [k.value for k in Kind]
_KIND_VALUE = {k: k.value for k in Kind}  # Enum.value is a descriptor call: too slow per record
_KIND_OF = {k.value: k for k in Kind}

# Version 1: the first release. Version 2: the metadata only beside the value. Version 3: `marks`
# (per-partition event-time maxima, for watermarks). Never edit a published
# schema: add version N+1 and make it the newest (fields of OutputRecord it lacks come from the metadata
# beside the value, or from OutputRecord's defaults).
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
    2: {
        "type": "record",
        "name": "OutputRecordBody",
        "namespace": "cec",
        "fields": [
            {"name": "pos", "type": {"type": "array", "items": "long"}},
            {"name": "n", "type": "long"},
            {"name": "state", "type": ["null", "bytes"], "default": None},
            {"name": "payload", "type": ["null", "bytes"], "default": None},
        ],
    },
    3: {
        "type": "record",
        "name": "OutputRecordBody",
        "namespace": "cec",
        "fields": [
            {"name": "pos", "type": {"type": "array", "items": "long"}},
            {"name": "n", "type": "long"},
            {"name": "state", "type": ["null", "bytes"], "default": None},
            {"name": "payload", "type": ["null", "bytes"], "default": None},
            {"name": "marks", "type": {"type": "array", "items": "long"}, "default": []},
        ],
    },
}

# The fields a store keeps beside every value (RecordMeta), in RecordMeta's order.
_META_FIELDS = ("kind", "time", "key", "seq")
_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(OutputRecord))
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
    # Slots for the C decoder: the metadata's four (when beside) then the body's fields; None when the
    # body and metadata do not cover OutputRecord exactly (fastavro then decodes, defaults fill the rest).
    slots: tuple[Any, ...] | None


def _layout(parsed: Any) -> _Layout:
    body = tuple(f["name"] for f in parsed.get("fields", ()))
    beside = not set(_META_FIELDS) <= set(body)
    program = compile_avro(parsed, {"cec.Kind": tuple(Kind)}, arrays=True)
    order = (*_META_FIELDS, *body) if beside else body
    slots = None
    if sorted(order) == sorted(_FIELD_NAMES) and len(set(order)) == len(order):
        slots = tuple(_FIELD_SLOTS[name] for name in order)
    return _Layout(body, beside, program, slots)


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
        self._parsed = {v: fastavro.parse_schema(dict(s)) for v, s in schemas.items()}
        self._writer_schema = self._parsed[self.version]
        self._layouts = {v: _layout(p) for v, p in self._parsed.items()}
        self._writes_meta = not self._layouts[self.version].beside
        self._known_versions = bytes(1 if v in self._parsed else 0 for v in range(256))

    def encode(self, record: OutputRecord) -> bytes:
        buf = io.BytesIO()
        kind = _KIND_VALUE[record.kind]
        datum: dict[str, Any] = {"pos": list(record.pos), "n": record.n, "state": record.state}
        datum["payload"] = record.payload
        datum["marks"] = list(record.marks)  # ignored by a writer schema without it (versions 1, 2)
        if self._writes_meta:
            datum.update(kind=kind, time=record.time, key=record.key, seq=record.seq)
        fastavro.schemaless_writer(buf, self._writer_schema, datum)
        body = buf.getvalue()
        crc = _checksum(self.version, kind, record.time, record.key, record.seq, body)
        return _HEADER.pack(MAGIC, self.version, crc) + body

    def _header(self, data: bytes) -> tuple[int, int]:
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
        if len(data) <= _HEADER.size or len(data) > self.max_bytes or data[0] != MAGIC:
            self._header(data)  # raises the precise error
        version = data[1]
        if version not in self._parsed:
            self._header(data)
        if (
            _crc_extend(_crc_value(_meta_bytes(version, *meta)), data[_HEADER.size :])
            != _U32.unpack_from(data, 2)[0]
        ):
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
        """`decode` of each row's value with the metadata kept beside it (one call into the C decoder for
        the whole list, when it is built): the footprints of the EC at EC-load."""
        if native is None:
            return [self.decode(r[5], RecordMeta(r[1], r[2], r[3], r[4]), verified=verified) for r in rows]
        out: list[OutputRecord] = []
        if verified:
            version = self.version
            layout = self._layouts[version]
            if layout.program is not None and layout.slots is not None and layout.beside:
                fast: list[OutputRecord | None] = native.decode_avro_rows(
                    layout.program, rows, _HEADER.size, OutputRecord, layout.slots, _KIND_OF, version
                )
                for r, row in zip(fast, rows, strict=True):
                    out.append(
                        r if r is not None else self.decode(row[5], RecordMeta(*row[1:5]), verified=True)
                    )
                return out
        return [self.decode(r[5], RecordMeta(r[1], r[2], r[3], r[4]), verified=verified) for r in rows]

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
            kind = _KIND_OF.get(meta[0])
            if kind is None:
                raise CodecError(f"unknown record kind {meta[0]!r}")
            head = (kind, meta[1], meta[2], meta[3])
        record: OutputRecord | None = None
        if layout.program is not None and layout.slots is not None and native is not None:
            fields = native.decode_avro(layout.program, data, _HEADER.size)
            if fields is not None:
                record = native.make(OutputRecord, layout.slots, head + fields)
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
                values["kind"] = _KIND_OF[values["kind"]]
                values["pos"] = tuple(values["pos"])
                values["marks"] = tuple(values["marks"])
                record = OutputRecord(**values)
            except CodecError:
                raise
            except Exception as exc:  # fastavro raises many types on malformed input
                raise CodecError(f"checksum mismatch or malformed record body: {exc!s:.200}") from None
        if not verified and (
            _checksum(
                version,
                _KIND_VALUE[record.kind],
                record.time,
                record.key,
                record.seq,
                memoryview(data)[_HEADER.size :],
            )
            != crc
        ):
            raise CodecError("checksum mismatch: torn or corrupt record")
        return record


class AvroCodec:
    """Schemaless Avro for operator-defined payloads and window states (the schema is the operator's)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = fastavro.parse_schema(schema)
        fields = self.schema.get("fields", ()) if isinstance(self.schema, dict) else ()
        self._names = tuple(f["name"] for f in fields)
        self._program = compile_avro(self.schema)  # None: fastavro decodes

    def encode(self, datum: Mapping[str, Any]) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, self.schema, dict(datum))
        return buf.getvalue()

    def decode_tuple(self, data: bytes) -> tuple[Any, ...]:
        """The record's field values in schema order (EC-load decodes every window state: no dict)."""
        if self._program is not None and native is not None:
            fields = native.decode_avro(self._program, data, 0)
            if fields is not None:
                return tuple(fields)
        obj = self.decode(data)
        return tuple(obj[name] for name in self._names)

    def decode(self, data: bytes) -> dict[str, Any]:
        if self._program is not None and native is not None:
            fields = native.decode_avro(self._program, data, 0)
            if fields is not None:
                return dict(zip(self._names, fields, strict=True))
        try:
            obj = fastavro.schemaless_reader(io.BytesIO(data), self.schema, None)
        except Exception as exc:
            raise CodecError(f"malformed payload: {exc!s:.200}") from None
        assert isinstance(obj, dict)
        return obj
