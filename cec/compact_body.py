"""The compact record body (version 4 of `cec.wire`): version 3's fields in a hand-made layout that carries
nothing the metadata beside the value already says (see `cec.wire`'s docstring for what it leaves out)."""

from __future__ import annotations

from typing import Any

from cec.exceptions import CodecError
from cec.model import OutputRecord
from cec.varint import LONG_MAX, LONG_MIN, read_zigzag, zigzag

__all__ = ["COMPACT_LAYOUT", "decode_compact", "encode_compact", "payload_prefix"]

# The compact body is no Avro schema: this marks its entry in `cec.wire.SCHEMAS`, and `fields` names what
# it holds (in `encode_compact`'s order) for readers of the table.
COMPACT_LAYOUT: dict[str, Any] = {
    "cec.layout": "compact",
    "fields": [{"name": name} for name in ("pos", "n", "state", "payload", "marks")],
}

# Flags of the compact body: which optional fields follow, and how two of them are shortened.
_F_STATE = 0x01
_F_PAYLOAD = 0x02
_F_MARKS = 0x04
_F_PAYLOAD_KEYED = 0x08  # the payload's leading Avro (key, seq) left out: the metadata has them
_F_POS_FROM_TIME = 0x10  # pos[0] is stored as pos[0] - time
_F_ALL = 0x1F
_SMALL_BYTES = tuple(bytes((i,)) for i in range(256))


def _read_bytes(data: bytes, at: int, what: str) -> tuple[bytes, int]:
    """Length-prefixed bytes at `data[at:]` and the index after them; CodecError naming `what`."""
    size, at = read_zigzag(data, at)
    if size < 0 or size > len(data) - at:
        raise CodecError(f"malformed record body ({what})")
    return data[at : at + size], at + size


def payload_prefix(key: str, seq: int) -> bytes | None:
    """What an Avro record starting with fields (string key, long seq) starts with (an aggregate's result:
    `key`, `window`); None for a key that is not valid text or a seq beyond a long (never left out)."""
    try:
        raw = key.encode()
        return zigzag(len(raw)) + raw + zigzag(seq)
    except (UnicodeEncodeError, ValueError):
        return None


def encode_compact(record: OutputRecord) -> bytes:
    """The version-4 body: `flags | pos | n | [state] | [payload] | [marks]`, every integer an Avro long,
    `pos` and `marks` as a count then the items, state and payload as a length then the bytes; the
    bracketed fields only when their flag is set (module docstring)."""
    flags = 0
    pos = record.pos
    parts = [b"", zigzag(len(pos))]
    if pos:
        first = pos[0]
        rel = first - record.time
        if abs(rel) < abs(first):
            flags |= _F_POS_FROM_TIME
            first = rel
        parts.append(zigzag(first))
        parts.extend(zigzag(p) for p in pos[1:])
    parts.append(zigzag(record.n))
    state = record.state
    if state is not None:
        flags |= _F_STATE
        parts.append(zigzag(len(state)))
        parts.append(state)
    payload = record.payload
    if payload is not None:
        flags |= _F_PAYLOAD
        if record.key is not None:
            prefix = payload_prefix(record.key, record.seq)
            if prefix is not None and payload.startswith(prefix):
                flags |= _F_PAYLOAD_KEYED
                payload = payload[len(prefix) :]
        parts.append(zigzag(len(payload)))
        parts.append(payload)
    marks = record.marks
    if marks:
        flags |= _F_MARKS
        parts.append(zigzag(len(marks)))
        parts.extend(zigzag(m) for m in marks)
    parts[0] = _SMALL_BYTES[flags]
    return b"".join(parts)


def decode_compact(data: bytes, at: int, head: tuple[Any, ...]) -> OutputRecord:
    """The record of a version-4 body at `data[at:]` with its metadata `head` (kind, time, key, seq);
    CodecError when malformed. The pure-Python twin of `_native.decode_compact`."""
    kind, time, key, seq = head
    end = len(data)
    if at >= end:
        raise CodecError("malformed record body (empty)")
    flags = data[at]
    at += 1
    if flags & ~_F_ALL:
        raise CodecError(f"malformed record body (flags 0x{flags:02x})")
    count, at = read_zigzag(data, at)
    if count < 0 or count > end - at:
        raise CodecError("malformed record body (pos)")
    items = []
    for _ in range(count):
        value, at = read_zigzag(data, at)
        items.append(value)
    if flags & _F_POS_FROM_TIME:
        if not items:
            raise CodecError("malformed record body (pos relative to an empty pos)")
        items[0] += time
        if not LONG_MIN <= items[0] <= LONG_MAX:
            raise CodecError("malformed record body (pos out of range)")
    n, at = read_zigzag(data, at)
    state = payload = None
    if flags & _F_STATE:
        state, at = _read_bytes(data, at, "state")
    if flags & _F_PAYLOAD:
        payload, at = _read_bytes(data, at, "payload")
        if flags & _F_PAYLOAD_KEYED:
            prefix = None if key is None else payload_prefix(key, seq)
            if prefix is None:
                raise CodecError("malformed record body (a keyed payload without a usable key)")
            payload = prefix + payload
    elif flags & _F_PAYLOAD_KEYED:
        raise CodecError("malformed record body (a keyed payload without a payload)")
    marks: tuple[int, ...] = ()
    if flags & _F_MARKS:
        count, at = read_zigzag(data, at)
        if count <= 0 or count > end - at:
            raise CodecError("malformed record body (marks)")
        values = []
        for _ in range(count):
            value, at = read_zigzag(data, at)
            values.append(value)
        marks = tuple(values)
    if at != end:
        raise CodecError("trailing bytes after record body")
    return OutputRecord(kind, time, tuple(items), n, key, seq, state, payload, marks)
