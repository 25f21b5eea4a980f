"""Avro's long: the zigzag varint that record bodies (`cec.wire`, `cec.compact_body`) and the Kafka value
frame (`queuestore.kafka.framing`) write their integers in."""

from __future__ import annotations

from cec.exceptions import CodecError

__all__ = ["LONG_MAX", "LONG_MIN", "read_zigzag", "zigzag"]

LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1
_SMALL_LONGS = tuple(bytes((((n << 1) ^ (n >> 63)) & 0xFF,)) for n in range(64))  # 0..63: one byte


def zigzag(n: int) -> bytes:
    """`n` as Avro writes a long (zigzag varint)."""
    if 0 <= n < 64:
        return _SMALL_LONGS[n]
    if not LONG_MIN <= n <= LONG_MAX:
        raise ValueError(f"{n} does not fit in a 64-bit long")
    z = ((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def read_zigzag(data: bytes, at: int) -> tuple[int, int]:
    """The Avro long at `data[at:]` and the index after it; CodecError when malformed."""
    z = shift = 0
    end = len(data)
    while True:
        if at >= end or shift > 63:
            raise CodecError("malformed record body (long)")
        b = data[at]
        at += 1
        z |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
    if z >> 64:
        raise CodecError("malformed record body (long out of range)")
    return (z >> 1) ^ -(z & 1), at
