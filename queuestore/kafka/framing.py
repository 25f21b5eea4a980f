"""Each record's `RecordMeta` on the wire, carried once and compactly (docs/kafka.md):
- header `cec.kind`: the kind's name (R, GOPEN, GCHECK, DEAD, EOS, ...), so that downstream consumers can
  skip control tuples without decoding values, and tools such as kcat show it;
- message key: the window key (UTF-8), or no key;
- value: a small frame (`FRAME_MAGIC`, the kind as one byte, time and seq as zigzag varints) followed by
  the value appended. Record readers take the kind from the header (what consumers see), bulk readers
  (recovery's backward scan) from the frame, because confluent-kafka materialises headers at several
  microseconds per message; either way the record's checksum covers the kind read (cec.records), so a
  damaged header or frame is detected by whichever reader relies on it.
Logs written in the legacy layout (meta packed in the message key plus four headers `cec.kind`,
`cec.time`, `cec.key`, `cec.seq`; `meta_to_key`/`meta_to_headers`) still read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from confluent_kafka import Message

from cec.exceptions import CodecError
from cec.native import native
from cec.records import read_zigzag, zigzag
from queuestore.base import RecordMeta, Row, StoredRecord
from queuestore.exceptions import QueueStoreError

__all__ = [
    "FRAME_KINDS",
    "FRAME_MAGIC",
    "HEADER_KEY",
    "HEADER_KIND",
    "HEADER_SEQ",
    "HEADER_TIME",
    "decode_message",
    "encode_message",
    "meta_from_headers",
    "meta_to_headers",
    "meta_to_key",
]

HEADER_KIND = "cec.kind"
HEADER_TIME = "cec.time"
HEADER_KEY = "cec.key"
HEADER_SEQ = "cec.seq"
# Bytes we add on top of the value and its window key (the kind header, the frame, the record's framing in
# the batch); counted against a store's `max_record_bytes`. It covers kinds of up to _MAX_KIND_BYTES.
_HEADER_OVERHEAD = 96
_MAX_KIND_BYTES = 16


def meta_to_headers(meta: RecordMeta) -> list[tuple[str, str | bytes | None]]:
    """The legacy layout's headers for a record's meta (absent key/seq omitted); still read, still what
    the Spark sink writes beside its own message key."""
    headers: list[tuple[str, str | bytes | None]] = [
        (HEADER_KIND, meta.kind.encode()),
        (HEADER_TIME, b"%d" % meta.time),
    ]
    if meta.key is not None:
        headers.append((HEADER_KEY, meta.key.encode()))
    if meta.seq != -1:
        headers.append((HEADER_SEQ, b"%d" % meta.seq))
    return headers


_NO_META = RecordMeta("", -1, None, -1)
_KEY_SEP = b"\x1f"

# The frame in front of each value: FRAME_MAGIC, a kind code (an index into FRAME_KINDS; 0: the kind
# follows spelled out, one length byte then UTF-8), time and seq as zigzag varints (Avro's long). The magic
# differs from the first byte of every value the legacy layout held (0xCE records, 0xCD parts), so the
# two layouts tell apart by the value alone. Codes are part of the format: append new kinds, never reorder.
FRAME_MAGIC = 0xCF
FRAME_KINDS = ("", "R", "GOPEN", "GCHECK", "DEAD", "EOS", "PART", "META")
_FRAME_CODE = {kind: code for code, kind in enumerate(FRAME_KINDS) if kind}
_FRAME_HEADS = {kind: bytes((FRAME_MAGIC, code)) for kind, code in _FRAME_CODE.items()}
_KIND_HEADERS = {kind: [(HEADER_KIND, kind.encode())] for kind in _FRAME_CODE}


# The frame and the value in one C call and one allocation (the writer's per-record path); None without
# the accelerator or with a build older than it.
_native_frame = getattr(native, "kafka_frame", None)


def encode_message(
    value: bytes, meta: RecordMeta
) -> tuple[bytes | None, bytes, list[tuple[str, str | bytes | None]]]:
    """(message key, message value, headers) of a record: the meta carried once (module docstring)."""
    kind = meta.kind
    head = _FRAME_HEADS.get(kind)
    headers = _KIND_HEADERS.get(kind)
    if head is None or headers is None:
        spelled = kind.encode()
        if len(spelled) > _MAX_KIND_BYTES:
            raise QueueStoreError(f"record kind {kind[:40]!r} is longer than {_MAX_KIND_BYTES} bytes")
        head = bytes((FRAME_MAGIC, 0, len(spelled))) + spelled
        headers = [(HEADER_KIND, spelled)]
    message = None if _native_frame is None else _native_frame(head, meta.time, meta.seq, value)
    if message is None:
        message = head + zigzag(meta.time) + zigzag(meta.seq) + value
    return (None if meta.key is None else meta.key.encode()), message, list(headers)


def _unframe(value: bytes, raw_key: object) -> tuple[RecordMeta, bytes] | None:
    """The meta (kind from the frame) and the value of a message in the framed layout; None when the
    message is in another layout (legacy, or another tool's); a malformed frame or key reads as kind "",
    which no checksum accepts."""
    if len(value) < 4 or value[0] != FRAME_MAGIC:
        return None
    try:
        code = value[1]
        at = 2
        if code == 0:
            size = value[2]
            kind = value[3 : 3 + size].decode()
            at = 3 + size
        else:
            kind = FRAME_KINDS[code]
        t, at = read_zigzag(value, at)
        seq, at = read_zigzag(value, at)
        key = None if raw_key is None else raw_key.decode() if isinstance(raw_key, bytes) else None
        if raw_key is not None and key is None:
            raise ValueError("message key is not bytes")
    except (ValueError, IndexError, CodecError):  # UnicodeDecodeError is a ValueError
        return _NO_META, value
    return RecordMeta(kind, t, key, seq), value[at:]


_Headers = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None] | None


def decode_message(value: bytes | None, raw_key: bytes | None, headers: _Headers) -> tuple[RecordMeta, bytes]:
    """(meta, value) of a stored message, as a record read gives it: the kind is the `cec.kind` header's
    (framed layout), so a damaged header fails the record's checksum instead of misleading a consumer
    that filters by it. Legacy-layout and foreign messages read as before (`meta_from_headers`)."""
    data = value if isinstance(value, bytes) else b""
    framed = _unframe(data, raw_key)
    if framed is None:
        meta = _meta_from_key(raw_key) if isinstance(raw_key, bytes) else None
        return (meta if meta is not None else meta_from_headers(headers)), data
    meta, body = framed
    stated = _header_kind(headers)
    return (meta if stated == meta.kind else meta._replace(kind=stated)), body


def _header_kind(headers: _Headers) -> str:
    """The `cec.kind` header's text ("" when absent or not text: no checksum accepts that kind)."""
    if not headers:
        return ""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    for name, raw in pairs:
        if name == HEADER_KIND:
            if isinstance(raw, bytes):
                try:
                    return raw.decode()
                except UnicodeDecodeError:
                    return ""
            return raw if isinstance(raw, str) else ""
    return ""


def meta_to_key(meta: RecordMeta) -> bytes:
    """The legacy layout's message key, the same meta packed: `kind US time US seq [US key]`.

    What the writer produced before the framed layout (and, as a fallback, what the reading paths still
    understand: confluent-kafka materialises headers at several microseconds per message, so the legacy
    readers took the meta from this key). The window key comes last so it may contain anything,
    separator included.
    """
    head = b"%s\x1f%d\x1f%d" % (meta.kind.encode(), meta.time, meta.seq)
    return head if meta.key is None else head + _KEY_SEP + meta.key.encode()


def _meta_from_key(raw: bytes) -> RecordMeta | None:
    parts = raw.split(_KEY_SEP, 3)
    if len(parts) < 3:
        return None
    try:
        return RecordMeta(
            parts[0].decode(), int(parts[1]), parts[3].decode() if len(parts) == 4 else None, int(parts[2])
        )
    except ValueError:  # not ours: a key written by another tool
        return None


def meta_from_headers(
    headers: Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None] | None,
) -> RecordMeta:
    """Rebuild `RecordMeta` from headers.

    Lenient on purpose: a record produced by a foreign tool (no cec headers) reads as kind "" and time -1
    rather than making the whole partition unreadable; CEC code treats an unknown kind as data it can skip.
    """
    if not headers:
        return _NO_META
    # One C-level dict() instead of a Python loop over the headers: recovery scans call this per record.
    found = headers if isinstance(headers, Mapping) else dict(headers)
    kind, t, key, seq = (
        found.get(HEADER_KIND),
        found.get(HEADER_TIME),
        found.get(HEADER_KEY),
        found.get(HEADER_SEQ),
    )
    return RecordMeta(
        "" if kind is None else (kind if isinstance(kind, str) else kind.decode()),
        -1 if t is None else int(t),
        None if key is None else (key if isinstance(key, str) else key.decode()),
        -1 if seq is None else int(seq),
    )


def _offset(msg: Message) -> int:
    # Typed optional by confluent-kafka's stubs, but always set on fetched messages and EOF events.
    offset = msg.offset()
    if offset is None:
        raise QueueStoreError("consumer event without an offset")
    return offset


def _to_record(msg: Message, offset: int) -> StoredRecord:
    """A record read (see `decode_message`)."""
    meta, value = decode_message(msg.value(), msg.key(), msg.headers())
    return StoredRecord(offset, value, meta)


def _to_row(msg: Message, offset: int) -> Row:
    """The row of a bulk read (recovery's backward scan; `cec._native.message_rows` is its fast path and
    falls back to it for anything but the plain case): the kind from the frame, headers never
    materialised (several microseconds per message in confluent-kafka); legacy-layout messages from
    their meta key, foreign ones from their headers."""
    value = msg.value()
    data = value if isinstance(value, bytes) else b""
    raw_key = msg.key()
    framed = _unframe(data, raw_key)
    if framed is not None:
        meta, data = framed
    else:
        legacy = _meta_from_key(raw_key) if isinstance(raw_key, bytes) else None
        meta = legacy if legacy is not None else meta_from_headers(msg.headers())
    return (offset, meta.kind, meta.time, meta.key, meta.seq, data)


def _message_rows(
    batch: list[Message], i: int, start: int, stop_before: int, out: list[Row]
) -> tuple[int, bool]:
    """Pure-Python twin of `cec._native.message_rows`: rows of `batch[i:]` into `out` until an event
    that is not a record (returns its index), `stop_before` (-1: none) or the end of the batch."""
    for index in range(i, len(batch)):
        msg = batch[index]
        if msg.error() is not None:
            return index, False
        offset = _offset(msg)
        if offset < start:
            continue
        if 0 <= stop_before <= offset:
            return index, True
        out.append(_to_row(msg, offset))
        if offset == stop_before - 1:
            return index + 1, True
    return len(batch), False
