"""An exact, order-independent sum of doubles: the accumulator of `sum` and `avg` (operators.multi_aggregate).

Float `+` is not associative: the same values summed in another order can give another double, so a
window over a key whose tuples come from several input partitions would depend on how the partitions
interleave, and a recovery replay would not reproduce the failure-free result bit for bit. Every finite
double is an integer multiple of 2**-1074 (the smallest subnormal), so the sum is kept as that integer,
exactly: integer addition is associative, and the result is rounded once, correctly (Python's int / int
true division rounds correctly), as `math.fsum` rounds the same values. The state carries the integer
(normalised to mantissa and exponent, so a sum of prices takes a few bytes, not 135).
"""

from __future__ import annotations

__all__ = [
    "OVERFLOW",
    "SCALE",
    "exact",
    "pack",
    "rounded",
    "unpack",
]

SCALE = 1074  # 2**-1074 is the smallest positive double: every finite double is n * 2**-SCALE exactly
_ONE = 1 << SCALE
# An exact sum at or beyond this magnitude rounds to infinity (halfway between the largest double and
# 2**1024, ties to even): a value that would take a sum there is refused before it changes anything.
OVERFLOW = ((1 << 1024) - (1 << 970)) << SCALE
# A stored exponent outside this range cannot come from a sum of doubles (a damaged or foreign state).
_MAX_EXP = 1024 + 64


def exact(x: float) -> int:
    """`x` (finite) as an integer multiple of 2**-SCALE."""
    n, d = x.as_integer_ratio()  # d is a power of two, at most 2**SCALE
    return n << (SCALE + 1 - d.bit_length())


def rounded(total: int) -> float:
    """The exact sum `total` rounded once to the nearest double (ties to even). `total` is below OVERFLOW."""
    return total / _ONE


def pack(total: int) -> tuple[bytes, int]:
    """`total` as (mantissa, exponent) with `total` * 2**-SCALE == mantissa * 2**exponent: the mantissa
    odd (or 0), in signed big-endian bytes."""
    if total == 0:
        return b"", 0
    zeros = (total & -total).bit_length() - 1
    mantissa = total >> zeros
    return mantissa.to_bytes((mantissa.bit_length() + 8) // 8, "big", signed=True), zeros - SCALE


def unpack(mantissa: bytes, exponent: int) -> int:
    """`pack`'s inverse. ValueError for an exponent no sum of doubles has."""
    if not mantissa:
        return 0
    if not -SCALE <= exponent <= _MAX_EXP:
        raise ValueError(f"exact sum exponent {exponent} is out of range")
    return int.from_bytes(mantissa, "big", signed=True) << (exponent + SCALE)
