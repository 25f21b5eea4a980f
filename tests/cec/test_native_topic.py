"""The topic source's C batch path (`cec._native.topic_batch`, `cec._native.Record`) against Python.

`topic_batch` turns a batch of confluent-kafka messages into the source's InputTuples in one call. It
must agree exactly with the per-record decoders: a record it accepts equals what json.loads / fastavro
give, and whatever it is not sure of it declines (None), for the Python path to decode with its reason.
A batch it cannot take whole (an error event, an offset at or past a partition's end, a partition the
source does not read) is refused without changing the source's positions. Messages are built directly
(confluent_kafka.Message), no broker needed.
"""

from __future__ import annotations

import copy
import io
import json
import math
import pickle
import random
from collections.abc import Mapping
from typing import Any

import fastavro
import pytest
from confluent_kafka import KafkaError, Message
from hypothesis import given, settings
from hypothesis import strategies as st

from cec.native import native
from operators.base import InputTuple
from operators.formats import AvroDecoder, JsonDecoder
from operators.topic_source import _ACCESSORS

pytestmark = pytest.mark.skipif(native is None, reason="the C accelerator is not built")

WANTED = ("item", "price")
AVSC: dict[str, Any] = {
    "type": "record",
    "name": "Purchase",
    "fields": [
        {"name": "item", "type": ["null", "string"]},
        {"name": "price", "type": ["null", "double"]},
        {"name": "ts", "type": "long"},
        {"name": "tags", "type": "bytes"},
        {"name": "ok", "type": ["boolean", "null"]},
        {"name": "kind", "type": {"type": "enum", "name": "K", "symbols": ["A", "B"]}},
    ],
}


def _msgs(values: list[Any], partition: int = 0, first: int = 0) -> list[Message]:
    return [Message(topic="t", partition=partition, offset=first + i, value=v) for i, v in enumerate(values)]


def _batch(
    msgs: list[Message],
    spec: tuple[Any, ...],
    *,
    local_of: list[int] | None = None,
    limits: list[Any] | None = None,
    nxt: list[int] | None = None,
) -> Any:
    assert native is not None
    return native.topic_batch(
        msgs,
        _ACCESSORS,
        InputTuple,
        local_of if local_of is not None else [0],
        limits if limits is not None else [math.inf],
        nxt if nxt is not None else [0],
        spec,
    )


def _json_spec(wanted: tuple[str, ...] = WANTED) -> tuple[Any, ...]:
    spec = JsonDecoder().native_spec(wanted)
    assert spec is not None
    return spec


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same type, floats bit for bit (NaN, -0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a.hex() == b.hex() if not math.isnan(a) else math.isnan(b)
    return bool(a == b)


def _check_json(raws: list[bytes], wanted: tuple[str, ...] = WANTED) -> list[Any]:
    """topic_batch over `raws`: every record it holds equals json.loads, field by field and as a whole;
    what it declines is left (None). Returns its records."""
    out, declined = _batch(_msgs(raws), _json_spec(wanted))
    assert declined == sum(t is None for t in out)
    for raw, tup in zip(raws, out, strict=True):
        if tup is None:
            continue
        assert type(tup) is InputTuple and tup.error is None and tup.raw is raw
        ref = json.loads(raw)  # must read it: C accepts nothing json.loads refuses
        assert type(ref) is dict
        for name in wanted:
            assert ref[name] is not None and not isinstance(ref[name], (dict, list))
            assert _same(tup.value[name], ref[name]), (raw, name)
            assert _same(tup.value.get(name), ref[name])
        assert tup.value == ref and dict(tup.value) == ref
        assert list(tup.value) == list(ref) and len(tup.value) == len(ref)
    return [t.value if t is not None else None for t in out]


def test_plain_json_records_hold_their_fields_as_json_loads_reads_them() -> None:
    raws = [
        b'{"item": "apple", "price": 1.25, "ts": 3}',
        b'{"item":"b","price":-7}',
        b' \t\r\n{ "price" : 0 , "item" : "x" , "n": null, "z": [1, {"a": [true, false]}], "e": {} } \n',
        b'{"item": "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x8d\x8e", "price": 1e3}',
        b'{"item": "tab\\tnew\\nq\\"s\\\\sl\\/u\\u00e9\\ud83c\\udf4e", "price": 2.5E-3}',
        b'{"item": "k", "price": 123456789012345678901234567890}',
        b'{"item": "k", "price": -0}',
        b'{"item": "k", "price": -0.0}',
        b'{"item": "k", "price": 1e400}',
        b'{"item": "k", "price": 0.1000000000000000055511151231257827}',
        b'{"item": "k", "price": true}',
        b'{"item": "first", "price": 1, "item": "last"}',
        b'{"item": "k", "price": null, "price": 4}',
        b'{"item": "", "price": "12.5"}',
        b'{"item": "k\\u0000nul", "price": 1}',
        b'{"it\\u0065m": "escaped name", "price": 1, "\\ud83c\\udf4e": 2}',
    ]
    values = _check_json(raws)
    assert None not in values
    assert values[11]["item"] == "last"
    assert values[12]["price"] == 4


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'"a string"',
        b"{}",
        b'{"item": "a"}',  # price missing
        b'{"item": "a", "price": null}',
        b'{"item": "a", "price": 1, "price": null}',  # the last one counts: null
        b'{"item": {"n": 1}, "price": 1}',
        b'{"item": ["a"], "price": 1}',
        b'{"item": "a", "price": NaN}',
        b'{"item": "a", "price": Infinity}',
        b'{"item": "a", "price": -Infinity}',
        b'{"item": "a", "price": 01}',
        b'{"item": "a", "price": 1.}',
        b'{"item": "a", "price": .5}',
        b'{"item": "a", "price": +1}',
        b'{"item": "a", "price": 1e}',
        b'{"item": "a", "price": 1}x',
        b'{"item": "a", "price": 1}{}',
        b'{"item": "a", "price": 1,}',
        b'{"item": "a" "price": 1}',
        b'{"item": "a", "price": 1',
        b"{'item': 'a', 'price': 1}",
        b'{"item": "a\x01", "price": 1}',  # control character in a string
        b'{"item": "a\\x", "price": 1}',  # unknown escape
        b'{"item": "a\\u12", "price": 1}',
        b'{"item": "\\ud83c", "price": 1}',  # lone surrogate: json.loads keeps it, UTF-8 cannot
        # a lone surrogate anywhere, a field the scanner skips included: the format refuses the record
        b'{"item": "a", "price": 1, "x": "\\udc00"}',
        b'{"item": "a", "price": 1, "x": ["\\ud800\\u0041"]}',
        b'{"item": "a", "price": 1, "\\ud800": 2}',
        b'{"item": "a", "price": 1, "x": "\\udf4e\\ud83c"}',
        b'{"item": "\xed\xa0\x80", "price": 1}',  # UTF-8-encoded surrogate (json.loads: surrogatepass)
        b'{"item": "\xc0\xaf", "price": 1}',  # overlong
        b'{"item": "\xff", "price": 1}',
        b'\xef\xbb\xbf{"item": "a", "price": 1}',  # BOM
        b'{"item": "a", "price": 1, "deep": ' + b"[" * 100 + b"]" * 100 + b"}",
        b'{"item": "a", "price": 1' + b"0" * 700 + b"}",  # beyond any int_max_str_digits
        b'{"item": "a", "price": 1, "x": tru}',
        b'{"item": "a", "price": 1, "x": nul}',
        b'\x00{"item": "a", "price": 1}',
    ],
)
def test_json_records_it_is_not_sure_of_are_declined(raw: bytes) -> None:
    assert _check_json([raw]) == [None]


def test_tombstones_are_declined_not_the_batch() -> None:
    out, declined = _batch(_msgs([b'{"item": "a", "price": 1}', None]), _json_spec())
    assert declined == 1 and out[1] is None and out[0].value == {"item": "a", "price": 1}


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
_JSON = st.recursive(
    _SCALARS,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
    max_leaves=8,
)
_RECORDS = st.dictionaries(st.sampled_from(["item", "price", "ts", "x", "ité"]), _JSON, max_size=5)


@settings(max_examples=300, deadline=None)
@given(
    records=st.lists(_RECORDS, min_size=1, max_size=8),
    ensure_ascii=st.booleans(),
    spaced=st.booleans(),
    cut=st.integers(min_value=0, max_value=40),
    flip=st.integers(min_value=0, max_value=255),
)
def test_any_json_agrees_with_json_loads(
    records: list[dict[str, Any]], ensure_ascii: bool, spaced: bool, cut: int, flip: int
) -> None:
    separators = (" , ", " : ") if spaced else (",", ":")
    raws = [json.dumps(r, ensure_ascii=ensure_ascii, separators=separators).encode() for r in records]
    damaged = bytearray(raws[0])
    damaged[cut % len(damaged)] = flip
    values = _check_json([*raws, bytes(damaged), raws[0][:cut]])
    for r, v in zip(records, values, strict=False):
        plain = all(isinstance(r.get(w), (str, int, float)) and r.get(w) is not None for w in WANTED)
        assert (v is not None) == plain  # a plain record is always held


def test_avro_records_equal_fastavro_and_hold_every_field() -> None:
    decoder = AvroDecoder(AVSC)
    spec = decoder.native_spec(["item", "price"])
    assert spec is not None
    parsed = fastavro.parse_schema(AVSC)

    def body(rec: dict[str, Any]) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, rec)
        return buf.getvalue()

    good = {"item": "a€", "price": 2.5, "ts": -(2**63), "tags": b"\x00\xff", "ok": True, "kind": "B"}
    raws = [
        body(good),
        body({**good, "price": None}),  # required field null: declined
        body(good) + b"\x00",  # bytes left over: declined
        body(good)[:-1],  # truncated: declined
        body({**good, "ts": 2**63 - 1, "tags": b"", "ok": None}),
    ]
    out, declined = _batch(_msgs(raws), spec)
    assert declined == 3 and [t is None for t in out] == [False, True, True, True, False]
    for i in (0, 4):
        ref = fastavro.schemaless_reader(io.BytesIO(raws[i]), parsed, None)
        value = out[i].value
        assert (
            value == ref and {k: value[k] for k in value} == ref and list(value.items()) == list(ref.items())
        )
        assert value == decoder.decode_many([raws[i]])[0]
        assert len(value) == 6 and "ts" in value and "nope" not in value
    # a wanted field the schema lacks: no C path (every record is decoded one by one for its reason)
    assert decoder.native_spec(["item", "missing"]) is None
    # a schema the C decoder does not take (an array): no C path either
    assert (
        AvroDecoder(
            {**AVSC, "fields": [*AVSC["fields"], {"name": "a", "type": {"type": "array", "items": "int"}}]}
        ).native_spec(["item"])
        is None
    )


def test_batch_refused_whole_without_changing_positions() -> None:
    spec = _json_spec()
    raw = b'{"item": "a", "price": 1}'
    error = Message(topic="t", partition=0, offset=2, error=KafkaError(KafkaError._PARTITION_EOF))
    cases = {
        "error event": ([*_msgs([raw, raw]), error], [0], [math.inf]),
        "at the end": (_msgs([raw, raw, raw]), [0], [2]),
        "ended": (_msgs([raw]), [0], [-1]),
        "partition not read": (_msgs([raw], partition=1), [0, -1], [math.inf]),
        "partition unknown": (_msgs([raw], partition=5), [0], [math.inf]),
        "offsets not rising": (_msgs([raw]) + _msgs([raw]), [0], [math.inf]),
    }
    for name, (msgs, local_of, limits) in cases.items():
        nxt = [0] * len(limits)
        assert _batch(msgs, spec, local_of=local_of, limits=limits, nxt=nxt) is None, name
        assert nxt == [0] * len(limits), name


def test_batch_positions_and_local_partitions() -> None:
    spec = _json_spec()
    raw = b'{"item": "a", "price": 1}'
    # the source reads global partitions 2 and 0 as local 0 and 1
    msgs = (
        _msgs([raw, raw], partition=2, first=10) + _msgs([raw], partition=0, first=4) + _msgs([b"x"], 2, 12)
    )
    nxt = [10, 4]
    out, declined = _batch(msgs, spec, local_of=[1, -1, 0], limits=[13, math.inf], nxt=nxt)
    assert nxt == [13, 5] and declined == 1
    assert [(t.partition, t.offset) for t in out[:3]] == [(0, 10), (0, 11), (1, 4)] and out[3] is None


def test_record_is_a_read_only_mapping_equal_to_its_dict() -> None:
    raw = b'{"ts": 7, "item": "a", "price": 1.5, "extra": [1, 2]}'
    (tup,), _ = _batch(_msgs([raw]), _json_spec())
    value = tup.value
    ref = json.loads(raw)
    assert isinstance(value, Mapping) and not isinstance(value, dict)
    assert value["extra"] == [1, 2] and value.get("ts") == 7 and value.get("nope", 3) == 3
    with pytest.raises(KeyError):
        value["nope"]
    assert "extra" in value and "nope" not in value
    assert list(value.keys()) == list(ref) and list(value.items()) == list(ref.items())
    assert list(value.values()) == list(ref.values()) and repr(value) == repr(ref)
    assert value == ref and ref == value and (value != ref) is False and value != {**ref, "ts": 8}
    assert pickle.loads(pickle.dumps(value)) == ref and copy.deepcopy(value) == ref
    with pytest.raises(TypeError):
        hash(value)
    with pytest.raises(TypeError):
        value["item"] = "b"  # type: ignore[index]
    assert json.dumps(dict(value)) == json.dumps(ref)


def test_short_decimal_floats_are_read_as_float_reads_them() -> None:
    """Floats of up to 15 significant digits take a fast path (one exact multiplication or division):
    bit for bit what float() gives, at the edges of that path and past them."""
    rng = random.Random(11)
    texts = [
        "0.0",
        "-0.0",
        "0e0",
        "1e22",
        "1e23",
        "1e-22",
        "1e-23",
        "123456789012345.0",
        "1234567890123456.0",
        "9007199254740993.0",
    ]
    texts += ["0.1", "0.3", "2.2250738585072014e-308", "1.7976931348623157e308", "5e-324", "1e400"]
    for _ in range(3000):
        digits = str(rng.randrange(1, 10 ** rng.randrange(1, 18)))
        cut = rng.randrange(0, len(digits) + 1)
        text = (digits[:cut] or "0") + "." + (digits[cut:] or "0")
        if rng.random() < 0.5:
            text += rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.randrange(0, 40))
        texts.append(("-" if rng.random() < 0.3 else "") + text)
    raws = [b'{"item": "k", "price": %s}' % t.encode() for t in texts]
    values = _check_json(raws)
    for text, value in zip(texts, values, strict=True):
        assert value is not None and _same(value["price"], float(text)), text
