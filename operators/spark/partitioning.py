"""Which state and output partition a key belongs to: Spark's own shuffle hash, computed where it is needed.

A key's output partition among P is pmod(hash(key), P) with Spark's `hash()` (Murmur3_x86_32, seed 42), so
that it is also the key's state partition when the shuffle partitions equal P. The query computes it as a
Spark column (`output_partition`, for the initial state); the data sources compute the same value in
Python for the rows they pack (`spark_hash_string`, `KeyGrouper`), which must agree with Spark bit for
bit (tests/operators/spark/test_partitioning.py checks them against Spark's own `hash()`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from cec.exceptions import BadTupleError
from operators.aggregate import canonical_key

__all__ = [
    "KeyGrouper",
    "output_partition",
    "part_partition_key",
    "partition_groups",
    "partition_key",
    "spark_hash_long",
    "spark_hash_string",
]

_MASK32 = 0xFFFFFFFF
_SEED = 42  # of Spark's hash() and of its HashPartitioning


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK32


def _mix_k1(k: int) -> int:
    return (_rotl32((k * 0xCC9E2D51) & _MASK32, 15) * 0x1B873593) & _MASK32


def _mix_h1(h: int, k: int) -> int:
    return (_rotl32(h ^ k, 13) * 5 + 0xE6546B64) & _MASK32


def _fmix(h: int, length: int) -> int:
    h ^= length
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK32
    h ^= h >> 16
    return h - (1 << 32) if h & 0x80000000 else h


def spark_hash_long(value: int, seed: int = _SEED) -> int:
    """Spark's `hash()` of a LongType value (Murmur3_x86_32.hashLong), as a signed 32-bit int."""
    h = _mix_h1(_mix_h1(seed & _MASK32, _mix_k1(value & _MASK32)), _mix_k1((value >> 32) & _MASK32))
    return _fmix(h, 8)


def spark_hash_string(value: str | None, seed: int = _SEED) -> int:
    """Spark's `hash()` of a StringType value, as a signed 32-bit int: Murmur3_x86_32.hashUnsafeBytes over
    its UTF-8 bytes (little-endian 4-byte words, then each remaining byte on its own, sign-extended: Spark's
    own variant, not the reference murmur3); a null hashes to the seed."""
    if value is None:
        return seed
    data = value.encode("utf-8")
    length = len(data)
    aligned = length - length % 4
    h = seed & _MASK32
    for i in range(0, aligned, 4):
        h = _mix_h1(h, _mix_k1(int.from_bytes(data[i : i + 4], "little")))
    for i in range(aligned, length):
        byte = data[i]
        h = _mix_h1(h, _mix_k1((byte - 256 if byte > 127 else byte) & _MASK32))
    return _fmix(h, length)


def partition_key(value: Mapping[str, Any], fields: Sequence[str], *, as_array: bool) -> str | None:
    """The key several aggregates (`operators.multi_aggregate.MultiAggregate`) are partitioned by: its
    part id without the window start. One field's key as `canonical_key` makes it, or (`as_array`: a
    composite key, or parts keyed by (key, window start) under watermarks) the JSON array of the fields'
    keys, written exactly as `MultiAggregate.key_of` writes its part ids, so that a part id maps back to
    its partition key (`part_partition_key`). None when a field is missing or is not a key: the operator
    refuses that tuple with its own reason wherever it goes."""
    parts: list[str] = []
    for field in fields:
        try:
            part = canonical_key(value.get(field), field)
        except BadTupleError:
            return None
        if part is None:
            return None
        parts.append(part)
    if not as_array:
        return parts[0]
    return json.dumps(parts, ensure_ascii=False, separators=(",", ":"))


def part_partition_key(part_id: Any, *, by_window: bool) -> Any:
    """The Spark column of a part id's `partition_key` (a window of the initial state goes to the state
    partition its key's tuples go to): the part id itself, or under watermarks the JSON array with its
    last element (the window's start, an integer) taken off: `json.dumps(parts)` is the elements'
    texts joined by commas, so dropping the trailing `,<start>` gives exactly `json.dumps(parts[:-1])`."""
    from pyspark.sql import functions as F

    return F.regexp_replace(part_id, r",-?[0-9]+\]$", "]") if by_window else part_id


def output_partition(key: Any, partitions: int) -> Any:
    """The Spark column of a key's output partition among `partitions`: pmod(hash(key), P)."""
    from pyspark.sql import functions as F

    return F.pmod(F.hash(key), F.lit(partitions))


def partition_groups(partitions: int) -> list[int]:
    """For each output partition q, the smallest long g >= 0 with pmod(hash(g), P) == q: grouping by g puts
    partition q's group on Spark's state partition q (shuffle partitions = P), one group per task."""
    groups: dict[int, int] = {}
    g = 0
    while len(groups) < partitions:
        groups.setdefault(spark_hash_long(g) % partitions, g)
        g += 1
    return [groups[q] for q in range(partitions)]


class KeyGrouper:
    """Per key (already in the aggregate's canonical string form): its grouping value in the current
    generation (`partition_groups`) and, across generations, its output partition in each (for C_k)."""

    def __init__(self, partitions: Sequence[int]) -> None:
        self.partitions = list(partitions)  # of every generation, the current one last
        self.groups = partition_groups(self.partitions[-1])

    def __call__(self, key: str | None) -> tuple[int, list[int]]:
        h = spark_hash_string(key)
        qs = [h % p for p in self.partitions]
        return self.groups[qs[-1]], qs
