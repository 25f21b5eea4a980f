"""Packed input (operators.spark.packing): one row per state partition and chunk, every tuple with its
canonical key and Spark's partition of it, and what the processor unpacks is every tuple in input order."""

from __future__ import annotations

import random

import pytest
from pyspark.sql.types import ArrayType, DoubleType, LongType, StringType

from cec.exceptions import BadTupleError, ConfigError
from operators.spark.packing import Packer, PackSpec, packed_schema, unpack
from operators.spark.partitioning import partition_groups, spark_hash_string


def test_packed_schema_has_the_group_then_arrays_and_optional_columns() -> None:
    schema = packed_schema(DoubleType(), LongType(), errors=True, generations=2)
    assert schema.fieldNames() == ["cec_group", "cec_j", "cec_o", "cec_key", "cec_v", "cec_time", "cec_error",
                                   "cec_qs"]  # fmt: skip
    assert schema["cec_v"].dataType == ArrayType(DoubleType(), True)
    assert schema["cec_qs"].dataType == ArrayType(ArrayType(LongType(), False), False)
    plain = packed_schema(StringType(), None, errors=False, generations=1)
    assert plain.fieldNames() == ["cec_group", "cec_j", "cec_o", "cec_key", "cec_v"]


def test_pack_spec_round_trips_and_rejects_nonsense() -> None:
    spec = PackSpec((2, 3), "item", "price", None)
    assert PackSpec.from_option(spec.to_option()) == spec
    with pytest.raises(ConfigError):
        PackSpec.from_option("{}")
    with pytest.raises(ConfigError):
        PackSpec.from_option('{"partitions": [0]}')


def test_rows_go_to_their_keys_partition_and_unpack_in_input_order() -> None:
    rng = random.Random(7)
    partitions = (3, 2)
    schema = packed_schema(DoubleType(), None, errors=True, generations=2)
    packer = Packer(PackSpec(partitions, "k", "v"), schema)
    packer.remember = 8  # forgets keys as it goes (35 raw keys): hashes them again, same answers
    groups = partition_groups(2)
    raw_keys = [f" k{i} " for i in range(30)] + [7, True, 1, None, "   "]
    tuples = [(rng.randrange(3), o, rng.choice(raw_keys), rng.random()) for o in range(500)]
    chunks = []
    for start in range(0, len(tuples), 61):
        part = tuples[start : start + 61]
        for j in range(3):
            mine = [t for t in part if t[0] == j]
            if mine:
                chunks.append(
                    packer.pack(j, [t[1] for t in mine], [t[2] for t in mine], [t[3] for t in mine])
                )
    frames = [c.to_pandas() for c in chunks[::-1]]
    for frame in frames:
        assert frame["cec_group"].is_unique  # one row per state partition and chunk
    seen = 0
    for q, group in enumerate(groups):
        got = unpack(
            [f[f["cec_group"] == group] for f in frames], ["cec_key", "cec_v", "cec_error", "cec_qs"]
        )

        def canonical(raw: object) -> str | None:  # the key rule: exact text, true/false, integers
            if raw is None or str(raw).strip() == "":
                return None
            return str(raw).lower() if isinstance(raw, bool) else str(raw)

        mine = sorted(
            (t for t in tuples if spark_hash_string(canonical(t[2])) % 2 == q), key=lambda t: (t[0], t[1])
        )
        assert got["cec_j"] == [t[0] for t in mine]
        assert got["cec_o"] == [t[1] for t in mine]
        assert got["cec_key"] == [canonical(t[2]) for t in mine]  # " k1 " is itself, True is "true", 1 is "1"
        assert got["cec_v"] == [t[3] for t in mine]
        assert got["cec_error"] == [None] * len(mine)
        assert [list(qs) for qs in got["cec_qs"]] == [
            [spark_hash_string(canonical(t[2])) % p for p in partitions] for t in mine
        ]
        seen += len(mine)
    assert seen == len(tuples)


def test_a_key_that_is_not_utf8_is_a_dead_letter_where_the_format_has_them() -> None:
    bad = "caf\udce9"  # a lone surrogate: bytes that were not UTF-8
    with_errors = Packer(
        PackSpec((1,), "k", "v"), packed_schema(StringType(), None, errors=True, generations=1)
    )
    frame = with_errors.pack(0, [0, 1], [bad, "ok"], ["1", "2"], None, [None, None]).to_pandas()
    got = unpack([frame], ["cec_key", "cec_error"])
    assert got["cec_key"] == [None, "ok"]
    assert got["cec_error"][0] is not None and "not valid UTF-8" in got["cec_error"][0]
    assert got["cec_error"][1] is None
    without = Packer(PackSpec((1,), "k", "v"), packed_schema(StringType(), None, errors=False, generations=1))
    with pytest.raises(BadTupleError):
        without.pack(0, [0], [bad], ["1"])


def test_no_frames_unpack_to_nothing() -> None:
    assert unpack([], ["cec_key", "cec_v"]) == {"cec_j": [], "cec_o": [], "cec_key": [], "cec_v": []}
