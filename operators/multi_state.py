"""The window state of several aggregates (operators.multi_aggregate) and its bytes in the log.

A footprint is written at every G-open and G-check, so its encoding is on the per-tuple path and in every
byte of the log. The layout (after a version byte) is varints and doubles only:

    count, start (zigzag), last - start (zigzag), then per value column:
      n                      tuples with a value in the column
      n = 1: the value       one double: the sum, min and max are all that value (every G-open)
      n > 1: exponent (zigzag), mantissa length, mantissa (signed big-endian), min, max (doubles)

A G-open of one column is ~20 bytes where fastavro's general record took ~40 and 40 us to write.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from operators import exact_sum

__all__ = ["ColumnState", "MultiState", "StateReader", "decode_state", "empty_column", "encode_state"]

VERSION = 0x02
_DOUBLE = struct.Struct("<d")
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(slots=True)
class ColumnState:
    n: int
    total: int  # exact sum, in units of 2**-1074 (operators.exact_sum)
    lo: float
    hi: float

    def add(self, x: float, scaled: int) -> None:
        self.n += 1
        self.total += scaled
        # -0.0 sorts below 0.0, so that neither result depends on which came first.
        if x < self.lo or (x == self.lo and math.copysign(1.0, x) < math.copysign(1.0, self.lo)):
            self.lo = x
        if x > self.hi or (x == self.hi and math.copysign(1.0, x) > math.copysign(1.0, self.hi)):
            self.hi = x


def empty_column() -> ColumnState:
    return ColumnState(0, 0, math.inf, -math.inf)


@dataclass(slots=True)
class MultiState:
    count: int  # every tuple of the window
    start: int  # time window: aligned start; count window: event time (or offset) of the first tuple
    last: int
    columns: list[ColumnState]  # one per distinct value column, in `MultiAggregate.value_fields` order


def _varint(out: bytearray, n: int) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _zigzag(out: bytearray, n: int) -> None:
    _varint(out, (n << 1) if n >= 0 else ((-n) << 1) - 1)


def encode_state(state: MultiState) -> bytes:
    out = bytearray((VERSION,))
    _varint(out, state.count)
    _zigzag(out, state.start)
    _zigzag(out, state.last - state.start)
    for col in state.columns:
        _varint(out, col.n)
        if col.n == 1:
            out += _DOUBLE.pack(col.lo)
        elif col.n > 1:
            mantissa, exponent = exact_sum.pack(col.total)
            _zigzag(out, exponent)
            _varint(out, len(mantissa))
            out += mantissa
            out += _DOUBLE.pack(col.lo)
            out += _DOUBLE.pack(col.hi)
    return bytes(out)


class StateReader:
    """Reads a state's bytes from after its version byte; `what` names the state in its ValueErrors (the
    window state here, a hopping window's pane run in `operators.hopping_state`)."""

    __slots__ = ("at", "data", "what")

    def __init__(self, data: bytes, what: str = "window state") -> None:
        self.data = data
        self.at = 1
        self.what = what

    def varint(self) -> int:
        data, at, shift, n = self.data, self.at, 0, 0
        while True:
            if at >= len(data) or shift > 70:
                raise ValueError(f"{self.what}: truncated or overlong varint")
            b = data[at]
            at += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                self.at = at
                return n

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) if not n & 1 else -((n + 1) >> 1)

    def take(self, size: int) -> bytes:
        end = self.at + size
        if end > len(self.data):
            raise ValueError(f"{self.what}: truncated")
        chunk = self.data[self.at : end]
        self.at = end
        return chunk

    def double(self) -> float:
        x: float = _DOUBLE.unpack(self.take(8))[0]
        if not math.isfinite(x):
            raise ValueError("window state: a value that is not finite")
        return x


def decode_state(data: bytes, columns: int, *, sum_limit: int = exact_sum.OVERFLOW) -> MultiState:
    """`encode_state`'s inverse for an aggregate of `columns` value columns; ValueError for bytes that
    are not such a state (never another exception). `sum_limit`: an exact sum at or beyond it is refused
    (a window's own sum stays below OVERFLOW; a session's slices folded together may pass it)."""
    if data[:1] != bytes((VERSION,)):
        raise ValueError("window state: unknown version")
    r = StateReader(data)
    count = r.varint()
    start = r.zigzag()
    last = start + r.zigzag()
    if not _LONG_MIN <= start <= _LONG_MAX or not _LONG_MIN <= last <= _LONG_MAX or count > _LONG_MAX:
        raise ValueError("window state: a bound beyond 64 bits")
    cols = []
    for _ in range(columns):
        n = r.varint()
        if n == 0:
            cols.append(empty_column())
        elif n == 1:
            x = r.double()
            cols.append(ColumnState(1, exact_sum.exact(x), x, x))
        else:
            exponent = r.zigzag()
            mantissa = r.take(r.varint())
            total = exact_sum.unpack(mantissa, exponent)
            if abs(total) >= sum_limit:
                raise ValueError("window state: a sum beyond every double")
            cols.append(ColumnState(n, total, r.double(), r.double()))
        if n > count:
            raise ValueError("window state: more values than tuples")
    if r.at != len(data):
        raise ValueError("window state: trailing bytes")
    return MultiState(count, start, last, cols)
