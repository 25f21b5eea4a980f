"""The operator's write path in C (`encode_compact`, `kafka_frame`, `encode_avro` in `cec/_native.c`)
against the pure-Python code it stands in for: the same bytes for every input Python accepts, and the
same error (Python's, after the C function declined) for every input it refuses."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import cec.avro_codec as avro_codec
import cec.compact_body as compact_body
import cec.wire as wire
import queuestore.kafka.framing as kafka
from cec.native import native
from cec.records import AvroCodec, Kind, OutputRecord, RecordCodec
from operators.aggregate import FIRST_TUPLE_SCHEMA, RESULT_SCHEMA, STATE_SCHEMA
from operators.base import DEAD_LETTER_SCHEMA
from queuestore.base import RecordMeta

pytestmark = pytest.mark.skipif(
    native is None or not hasattr(native, "encode_compact"), reason="the C accelerator is not built"
)

_LONGS = [0, 1, -1, 63, 64, -64, -65, 127, 128, 2**31, -(2**40), 2**63 - 1, -(2**63)]
_BEYOND = [2**63, -(2**63) - 1, 2**70]


@contextmanager
def _python_only(module: Any, name: str) -> Iterator[None]:
    saved = getattr(module, name)
    setattr(module, name, None)
    try:
        yield
    finally:
        setattr(module, name, saved)


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as exc:  # the error itself is the outcome compared
        return type(exc)


def _long(rnd: random.Random, beyond: float = 0.0) -> int:
    if rnd.random() < beyond:
        return rnd.choice(_BEYOND)
    return rnd.choice([*_LONGS, rnd.randrange(-(10**9), 10**9)])


def _record(rnd: random.Random) -> OutputRecord:
    key = rnd.choice([None, "", "a", "item-7", "é€", "x" * 300, "\ud800"])
    seq = _long(rnd, 0.02) if key is not None else -1
    payload = rnd.choice([None, b"", bytes(rnd.randrange(256) for _ in range(rnd.randrange(40)))])
    if key is not None and payload is not None and rnd.random() < 0.5:
        prefix = compact_body.payload_prefix(key, seq)  # an aggregate's result starts with (key, seq)
        if prefix is not None:
            payload = prefix + payload
    return OutputRecord(
        rnd.choice(list(Kind)),
        _long(rnd, 0.02),
        tuple(_long(rnd, 0.02) for _ in range(rnd.randrange(4))),
        rnd.randrange(10**6),
        key,
        seq,
        rnd.choice([None, b"", b"st\x00ate", bytes(600)]),
        payload,
        tuple(_long(rnd) for _ in range(rnd.choice([0, 0, 2]))),
    )


def test_compact_records_encode_to_the_python_bytes() -> None:
    codec = RecordCodec()
    rnd = random.Random(7)
    encoded = 0
    for _ in range(20_000):
        rec = _record(rnd)
        with _python_only(wire, "_native_encode"):
            want = _outcome(lambda r=rec: codec.encode(r))
        got = _outcome(lambda r=rec: codec.encode(r))
        fields = _outcome(
            lambda r=rec: codec.encode_fields(
                r.kind, r.time, list(r.pos), r.n, r.key, r.seq, r.state, r.payload, r.marks
            )
        )
        assert got == want and fields == want, rec
        if isinstance(want, bytes) and all(-(2**63) <= v < 2**63 for v in (rec.time, *rec.pos)):
            encoded += 1
            assert codec.decode(want, rec.meta()) == rec
    assert encoded > 15_000  # most inputs are plain: the comparison is mostly of bytes, not of errors


def test_an_older_record_version_is_encoded_in_python() -> None:
    codec = RecordCodec({v: s for v, s in wire.SCHEMAS.items() if v <= 3})
    rec = OutputRecord(Kind.GOPEN, 10, (10,), 1, "k", 0, b"s", None)
    assert codec.encode_fields(rec.kind, rec.time, rec.pos, rec.n, rec.key, rec.seq, rec.state, None) == (
        codec.encode(rec)
    )
    assert codec.decode(codec.encode(rec), rec.meta()) == rec


def test_kafka_frames_match_the_python_frame() -> None:
    rnd = random.Random(3)
    for _ in range(5_000):
        meta = RecordMeta(
            rnd.choice(["R", "GOPEN", "GCHECK", "DEAD", "EOS", "WEIRD"]),
            _long(rnd, 0.05),
            rnd.choice([None, "k", "é"]),
            _long(rnd, 0.05),
        )
        value = bytes(rnd.randrange(256) for _ in range(rnd.randrange(30)))
        with _python_only(kafka, "_native_frame"):
            want = _outcome(lambda v=value, m=meta: kafka.encode_message(v, m))
        assert _outcome(lambda v=value, m=meta: kafka.encode_message(v, m)) == want
        if not isinstance(want, type):
            assert kafka.decode_message(want[1], want[0], want[2]) == (meta, value)


def _field_value(rnd: random.Random, avro_type: Any) -> Any:
    odd = rnd.random() < 0.15
    if isinstance(avro_type, list):  # a union: often None, else a value of one of its branches
        if rnd.random() < 0.3:
            return None
        return _field_value(rnd, rnd.choice([t for t in avro_type if t != "null"] or ["string"]))
    if avro_type == "string":
        return rnd.choice(["", "é€", "\ud800", 5, b"x", None]) if odd else f"item-{rnd.randrange(1000)}"
    if avro_type == "long":
        return rnd.choice([*_BEYOND, True, 1.5, "3", None]) if odd else _long(rnd)
    if avro_type == "boolean":
        return rnd.choice([0, 1, None, "true"]) if odd else rnd.random() < 0.5
    if avro_type == "bytes":
        return (
            rnd.choice(["x", None, bytearray(b"y"), 7])
            if odd
            else bytes(rnd.randrange(256) for _ in range(5))
        )
    assert avro_type in ("double", "float"), avro_type
    return (
        rnd.choice([3, 2**80, float("inf"), float("nan"), -0.0, True, "x"]) if odd else rnd.uniform(-1e6, 1e6)
    )


# Unions: of null and one plain type (encoded in C, either order), and others that C declines (fastavro
# encodes them: the same bytes either way).
UNIONS_SCHEMA = {
    "type": "record",
    "name": "Unions",
    "fields": [
        {"name": "a", "type": ["null", "double"]},
        {"name": "b", "type": ["string", "null"]},
        {"name": "c", "type": ["null", "long"]},
        {"name": "d", "type": ["null", "boolean"]},
        {"name": "e", "type": ["bytes", "null"]},
        {"name": "i", "type": "double"},
    ],
}
DECLINED_UNIONS_SCHEMA = {
    "type": "record",
    "name": "DeclinedUnions",
    "fields": [
        {"name": "a", "type": ["null", "double"]},
        {"name": "f", "type": ["null", "float"]},
        {"name": "g", "type": ["long", "double"]},
        {"name": "h", "type": ["null", "double", "long"]},
    ],
}


def _several_aggregates_result_schema() -> dict[str, Any]:
    from operators.job import aggregate_operator, build_operator

    spec = aggregate_operator(
        "key", None, "avg", window_time="1h", time="ts", slide="15m",
        aggs=[("avg", "x"), ("max", "y"), ("count", "*")],
    )  # fmt: skip
    schema: dict[str, Any] = build_operator(spec).result_schema
    return schema


@pytest.mark.parametrize(
    "schema",
    [
        RESULT_SCHEMA,
        STATE_SCHEMA,
        FIRST_TUPLE_SCHEMA,
        DEAD_LETTER_SCHEMA,
        UNIONS_SCHEMA,
        DECLINED_UNIONS_SCHEMA,
        _several_aggregates_result_schema(),
    ],
)
def test_flat_avro_records_encode_as_fastavro_encodes_them(schema: dict[str, Any]) -> None:
    codec = AvroCodec(schema)
    rnd = random.Random(11)
    in_c = 0
    for _ in range(10_000):
        datum = {f["name"]: _field_value(rnd, f["type"]) for f in schema["fields"]}
        if rnd.random() < 0.02:
            datum.pop(schema["fields"][0]["name"])
        with _python_only(avro_codec, "_native_encode_avro"):
            want = _outcome(lambda d=datum: codec.encode(d))
        assert _outcome(lambda d=datum: codec.encode(d)) == want, datum
        if codec._program is not None and all(name in datum for name in codec.names):
            in_c += (
                avro_codec._native_encode_avro(codec._program, [datum[n] for n in codec.names]) is not None
            )
    # Most records are plain (C encodes them); a schema C cannot encode is all fastavro's.
    assert (in_c == 0) == (schema is DECLINED_UNIONS_SCHEMA), in_c


def test_results_with_nullable_aggregates_are_encoded_in_c() -> None:
    """The several-aggregate results (hopping, session, `--agg` repeated) have nullable columns: C encodes
    them, a None and a number alike, rather than declining every one to fastavro."""
    codec = AvroCodec(_several_aggregates_result_schema())
    row = {"key": "k1", "window": 4, "avg_x": 1.5, "max_y": None, "count": 2, "start": 0, "end": 3_600_000}
    assert set(row) == set(codec.names)
    encoded = avro_codec._native_encode_avro(codec._program, [row[name] for name in codec.names])
    assert encoded is not None
    with _python_only(avro_codec, "_native_encode_avro"):
        assert encoded == codec.encode(row)
    assert codec.decode(encoded) == row
