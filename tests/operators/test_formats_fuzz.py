"""Fuzzing every input format's decoder (operators.formats) with hypothesis, in the normal test run.

Arbitrary bytes, valid records, records cut and joined at arbitrary batch boundaries, and hostile pieces
spliced in (NaN, lone surrogate escapes, a byte order mark, deep nesting, long integers...). For every
format and path the properties are the same:
- the batch decoder gives exactly what decoding each value alone gives (types included: 1, 1.0 and True
  differ, floats bit for bit), and what the format's definition gives;
- nothing raises past the dead-letter path: every answer is a record or a reason.
JSON is checked through `JsonDecoder.decode_many` (orjson value by value, then the definition
`_json_value`) and through the C scanner (`cec._native.topic_batch`), Avro through the flat C decoder
and fastavro, the registry wire format through a registry client, CSV lines through `CsvDecoder` and
CSV files through `CsvSource`.

Examples per test: CEC_FUZZ_EXAMPLES (default 60: seconds in CI). To fuzz longer:
    CEC_FUZZ_EXAMPLES=20000 .venv/bin/python -m pytest -q tests/operators/test_formats_fuzz.py
The C scanner also has a coverage-guided target (tests/cec/fuzz/, benchmarks/fuzz_native.py).
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cec.exceptions import ConfigError
from cec.native import native
from operators.base import InputTuple
from operators.exceptions import DecodeError
from operators.formats import (
    JSON_MAX_DEPTH,
    AvroDecoder,
    CsvDecoder,
    JsonDecoder,
    RegistryDecoder,
    _json_value,
)
from operators.sources import CsvSource
from operators.topic_tuples import _decode_one, decode_values
from tests.cec.fuzz import oracle
from tests.cec.fuzz.oracle import check_avro, check_json, typed

FUZZ = settings(
    max_examples=int(os.environ.get("CEC_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


def one_by_one(decoder: Any, raws: list[bytes]) -> list[Any]:
    """Each value decoded alone, through the decoder's own `decode` (a record, or its DecodeError's reason);
    any other exception fails the test."""
    out: list[Any] = []
    for raw in raws:
        try:
            out.append(decoder.decode(raw))
        except DecodeError as exc:
            out.append(exc.reason)
    return out


def _assert_answers(got: list[Any], raws: list[bytes]) -> None:
    assert len(got) == len(raws)
    for answer in got:
        assert isinstance(answer, (str, Mapping)), answer


@st.composite
def batches(draw: st.DrawFn, docs: st.SearchStrategy[bytes], hostile: list[bytes]) -> list[bytes]:
    """Records from a stream of documents with hostile pieces spliced in, cut at arbitrary places (a
    value cut in two, two values in one record, whole values, empty records)."""
    parts = draw(st.lists(docs, min_size=1, max_size=5))
    stream = bytearray(draw(st.sampled_from([b"", b",", b" ", b"\n", b"}{", b"]["])).join(parts))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(stream)))
        stream[at:at] = draw(st.sampled_from(hostile) | st.binary(max_size=3))
    if draw(st.booleans()):  # a byte changed
        at = draw(st.integers(0, max(0, len(stream) - 1)))
        if stream:
            stream[at] = draw(st.integers(0, 255))
    cuts = sorted(draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    records = [bytes(stream[a:b]) for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    return records + draw(st.lists(docs, max_size=2)) + draw(st.lists(st.binary(max_size=24), max_size=2))


# -- JSON -----------------------------------------------------------------------------------------------
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: beyond 64 bits too
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3),
    max_leaves=10,
)
_NAMES = st.sampled_from(["item", "price", "ts", "ité", "\U0001f34e"]) | st.text(max_size=4)
_OBJECTS = st.dictionaries(_NAMES, _VALUES, max_size=5)
_SEPARATORS = st.sampled_from([(",", ":"), (", ", ": "), (" , ", " : ")])


@st.composite
def json_objects(draw: st.DrawFn) -> tuple[dict[str, Any], bytes]:
    obj = draw(_OBJECTS)
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()), separators=draw(_SEPARATORS))
    return obj, text.encode("utf-8")


_JSON_DOCS = json_objects().map(lambda pair: pair[1]) | _VALUES.map(lambda v: json.dumps(v).encode())
_JSON_HOSTILE = [
    b"NaN",
    b"-Infinity",
    b'"\\ud800"',
    b'"\\udc00\\ud800"',
    b'"\\ud83c\\udf4e"',
    b"\\u",
    b"\xef\xbb\xbf",
    b"\xed\xa0\x80",  # a surrogate encoded in UTF-8
    b"\xff",
    b"\x00",
    b"1234567890123456789012345",
    b"1e400",
    b"-0",
    b'"',
    b"\\",
    b"[" * (JSON_MAX_DEPTH + 1),
    b"]" * (JSON_MAX_DEPTH + 1),
    b'{"a":' * (JSON_MAX_DEPTH - 1) + b"1" + b"}" * (JSON_MAX_DEPTH - 1),
    b'{"a":' * (JSON_MAX_DEPTH + 1) + b"1" + b"}" * (JSON_MAX_DEPTH + 1),
]
_JSON_BATCHES = batches(_JSON_DOCS, _JSON_HOSTILE)
_DECODER = JsonDecoder()


def _json_answers(raws: list[bytes]) -> list[Any]:
    """The JSON answers every path must give: the format's definition, each value alone."""
    return [typed(_json_value(raw)) for raw in raws]


@FUZZ
@given(raws=_JSON_BATCHES)
def test_json_batches_decode_as_each_value_alone(raws: list[bytes]) -> None:
    want = _json_answers(raws)
    got = _DECODER.decode_many(raws)
    _assert_answers(got, raws)
    assert [typed(g) for g in got] == want
    assert [typed(g) for g in one_by_one(_DECODER, raws)] == want
    assert [typed(g) for g in decode_values(_DECODER, raws)] == want  # the topic source's call
    for i in range(len(raws) + 1):  # every split of the batch in two
        assert [typed(g) for g in _DECODER.decode_many(raws[:i]) + _DECODER.decode_many(raws[i:])] == want


@FUZZ
@given(raws=st.lists(st.binary(max_size=64), max_size=8))
def test_json_arbitrary_bytes_are_values_or_reasons(raws: list[bytes]) -> None:
    got = _DECODER.decode_many(raws)
    _assert_answers(got, raws)
    assert [typed(g) for g in got] == _json_answers(raws)


@FUZZ
@given(pair=json_objects())
def test_json_objects_decode_to_themselves(pair: tuple[dict[str, Any], bytes]) -> None:
    """An independent oracle for the definition: a JSON object written by json.dumps reads back as itself
    (integers exact at any size, floats bit for bit)."""
    obj, raw = pair
    assert typed(_DECODER.decode_many([raw])[0]) == typed(obj)


@pytest.mark.skipif(native is None, reason="the C accelerator is not built")
@FUZZ
@given(raws=_JSON_BATCHES, wanted=st.sampled_from(oracle.WANTED))
def test_json_c_scanner_holds_only_what_the_format_reads_the_same(
    raws: list[bytes], wanted: tuple[str, ...]
) -> None:
    """The C scanner (the topic source's path with the accelerator) holds a record only if the format
    reads it as the same dict, with the wanted fields present, not null and not nested (tests/cec/fuzz/oracle);
    the records it declines are decoded one by one by the caller."""
    check_json(native, raws, wanted)


def test_json_depth_limit_is_the_same_on_every_path_whatever_the_stack() -> None:
    def nested(depth: int) -> bytes:
        return b'{"a": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"

    at_limit, beyond = nested(JSON_MAX_DEPTH), nested(JSON_MAX_DEPTH + 1)
    assert _DECODER.decode_many([at_limit, beyond])[0] == json.loads(at_limit)
    assert _DECODER.decode_many([beyond])[0] == f"not JSON: nested deeper than {JSON_MAX_DEPTH} levels"

    def deep_stack(n: int) -> Any:  # called with most of the recursion limit used: the same answers
        return deep_stack(n - 1) if n else _DECODER.decode_many([at_limit, beyond, nested(1100)])

    assert deep_stack(250) == _DECODER.decode_many([at_limit, beyond, nested(1100)])


# -- Avro (flat: the C decoder and fastavro) --------------------------------------------------------------
FLAT = oracle.FLAT_AVRO
NESTED: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "item", "type": "string"},
        {"name": "lines", "type": {"type": "array", "items": {"type": "map", "values": "long"}}},
        {
            "name": "where",
            "type": ["null", {"type": "record", "name": "At", "fields": [{"name": "x", "type": "int"}]}],
        },
        {"name": "digest", "type": {"type": "fixed", "name": "D", "size": 2}},
        {"name": "names", "type": {"type": "array", "items": "string"}},
    ],
}
_FLAT_RECORDS = st.fixed_dictionaries(
    {
        "item": st.none() | st.text(max_size=6),
        "price": st.none() | st.floats(allow_nan=True),
        "ts": st.integers(-(2**63), 2**63 - 1),
        "tags": st.binary(max_size=6),
        "ok": st.none() | st.booleans(),
        "kind": st.sampled_from(["A", "B"]),
        "ratio": st.floats(width=32),
    }
)
_NESTED_RECORDS = st.fixed_dictionaries(
    {
        "item": st.text(max_size=4),
        "lines": st.lists(
            st.dictionaries(st.text(max_size=3), st.integers(-(2**63), 2**63 - 1), max_size=2), max_size=2
        ),
        "where": st.none() | st.fixed_dictionaries({"x": st.integers(-(2**31), 2**31 - 1)}),
        "digest": st.binary(min_size=2, max_size=2),
        "names": st.lists(st.text(max_size=3), max_size=3),
    }
)


def _body(parsed: Any, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, record)
    return buf.getvalue()


_FLAT_PARSED = fastavro.parse_schema(FLAT)
_NESTED_PARSED = fastavro.parse_schema(NESTED)
_AVRO_HOSTILE = [b"\x00", b"\xff" * 10, b"\x01", b"\x7f", b"\xfe\xff\xff\xff\x0f", b"\xed\xa0\x80", b"\xc0"]
_FLAT_C = AvroDecoder(FLAT)
_FLAT_FASTAVRO = AvroDecoder(FLAT)
_FLAT_FASTAVRO._program = None  # the per-value fastavro path (as without the accelerator)
_NESTED_DECODER = AvroDecoder(NESTED)


@FUZZ
@given(raws=batches(_FLAT_RECORDS.map(lambda r: _body(_FLAT_PARSED, r)), _AVRO_HOSTILE))
def test_flat_avro_c_and_fastavro_batches_decode_as_each_value_alone(raws: list[bytes]) -> None:
    want = [typed(g) for g in one_by_one(_FLAT_FASTAVRO, raws)]
    for decoder in (_FLAT_C, _FLAT_FASTAVRO):
        got = decoder.decode_many(raws)
        _assert_answers(got, raws)
        assert [typed(g) for g in got] == want
        assert [typed(g) for g in decode_values(decoder, raws)] == want
    if native is not None:  # the C decoder on its own, and the topic source's C batch path
        check_avro(native, raws)


@FUZZ
@given(raws=batches(_NESTED_RECORDS.map(lambda r: _body(_NESTED_PARSED, r)), _AVRO_HOSTILE))
def test_nested_avro_batches_decode_as_each_value_alone(raws: list[bytes]) -> None:
    got = _NESTED_DECODER.decode_many(raws)
    _assert_answers(got, raws)
    assert [typed(g) for g in got] == [typed(g) for g in one_by_one(_NESTED_DECODER, raws)]


@FUZZ
@given(record=_FLAT_RECORDS)
def test_flat_avro_records_decode_to_themselves(record: dict[str, Any]) -> None:
    """An independent oracle: a record written by fastavro reads back as itself on the C path."""
    in_schema_order = {f["name"]: record[f["name"]] for f in FLAT["fields"]}
    assert typed(_FLAT_C.decode_many([_body(_FLAT_PARSED, record)])[0]) == typed(in_schema_order)


@pytest.mark.parametrize(
    "items",
    ["null", {"type": "fixed", "name": "F", "size": 0}, {"type": "record", "name": "E", "fields": []}],
)
def test_an_avro_array_of_items_that_take_no_bytes_is_refused(items: Any) -> None:
    """A count of 2**62 such items reads without consuming a byte: fastavro would loop (and fill memory) on
    one hostile record, at every restart."""
    schema = {
        "type": "record",
        "name": "R",
        "fields": [{"name": "a", "type": {"type": "array", "items": items}}],
    }
    with pytest.raises(ConfigError, match="an array whose items take no bytes"):
        AvroDecoder(schema)


# -- Registry wire format ----------------------------------------------------------------------------------
class _Schema:
    def __init__(self, text: str, kind: str = "AVRO") -> None:
        self.schema_str, self.schema_type = text, kind


class _Registry:
    """A registry client's `get_schema` over fixed ids (the confluent client's 404 for the others)."""

    schemas = {
        1: _Schema(json.dumps(FLAT)),
        2: _Schema(json.dumps(NESTED)),
        3: _Schema('{"type": "object"}', "JSON"),
        4: _Schema('{"type": "record", "name": "Bad", "fields": [{"name": "a", "type": "nope"}]}'),
        5: _Schema("not json"),
        6: _Schema(
            json.dumps(
                {
                    "type": "record",
                    "name": "Z",
                    "fields": [{"name": "a", "type": {"type": "array", "items": "null"}}],
                }
            )
        ),
    }

    def get_schema(self, schema_id: int) -> _Schema:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        if schema_id not in self.schemas:
            raise SchemaRegistryError(404, 40400, "Schema not found")
        return self.schemas[schema_id]


@st.composite
def _wire(draw: st.DrawFn) -> bytes:
    schema_id = draw(st.sampled_from([1, 2, 3, 4, 5, 6, 7, 2**31]))
    if schema_id == 1:
        body = _body(_FLAT_PARSED, draw(_FLAT_RECORDS))
    elif schema_id == 2:
        body = _body(_NESTED_PARSED, draw(_NESTED_RECORDS))
    else:
        body = draw(st.binary(max_size=12))
    return bytes([draw(st.sampled_from([0, 0, 0, 1]))]) + schema_id.to_bytes(4, "big") + body


@FUZZ
@given(raws=batches(_wire(), _AVRO_HOSTILE))
def test_registry_wire_values_are_records_or_reasons(raws: list[bytes]) -> None:
    decoder = RegistryDecoder(client=_Registry())
    got = decode_values(decoder, raws)
    _assert_answers(got, raws)
    assert [typed(g) for g in got] == [
        typed(g) for g in one_by_one(RegistryDecoder(client=_Registry()), raws)
    ]


# -- CSV ---------------------------------------------------------------------------------------------------
_FIELDS = st.text(st.characters(exclude_categories=("Cs",)), max_size=6) | st.sampled_from(
    ["", '"', ",", "\r\n", "\ufeff", "\x00"]
)


@st.composite
def csv_lines(draw: st.DrawFn) -> tuple[list[str], bytes]:
    fields = draw(st.lists(_FIELDS, min_size=3, max_size=3))
    buf = io.StringIO()
    # The default line end "\r\n": a field holding "\r" or "\n" is quoted (with another line end, an
    # unquoted "\r" at the end of a line reads as part of the line end).
    csv.writer(buf).writerow(fields)
    if draw(st.booleans()):
        buf.seek(buf.tell() - 2)
        buf.truncate()  # no line end
    return fields, buf.getvalue().encode("utf-8")


_CSV = CsvDecoder(["item", "price", "ts"])
_CSV_HOSTILE = [b'"', b",", b"\n", b"\r", b"\x00", b"\xef\xbb\xbf", b"\xff", b'""', b"a" * (128 * 1024 + 1)]


@FUZZ
@given(raws=batches(csv_lines().map(lambda pair: pair[1]), _CSV_HOSTILE))
def test_csv_lines_are_records_or_reasons(raws: list[bytes]) -> None:
    got = decode_values(_CSV, raws)
    _assert_answers(got, raws)
    assert [typed(g) for g in got] == [typed(g) for g in one_by_one(_CSV, raws)]
    assert [typed(g) for g in got] == [typed(_decode_one(_CSV, raw)) for raw in raws]


@FUZZ
@given(pair=csv_lines(), bom=st.booleans())
def test_csv_lines_written_by_csv_writer_read_back(pair: tuple[list[str], bytes], bom: bool) -> None:
    """An independent oracle: a line csv.writer wrote reads back as its fields; one leading byte order mark
    is not part of the first field."""
    fields, raw = pair
    if bom:
        raw = b"\xef\xbb\xbf" + raw
    elif raw.startswith(b"\xef\xbb\xbf"):
        fields = [fields[0][1:], *fields[1:]]
    got = _decode_one(_CSV, raw)
    assert got == dict(zip(["item", "price", "ts"], fields, strict=True))


@FUZZ
@given(
    body=st.binary(max_size=200) | batches(csv_lines().map(lambda pair: pair[1]), _CSV_HOSTILE).map(b"".join),
    sizes=st.lists(st.integers(1, 7), min_size=1, max_size=4),
)
def test_csv_files_read_the_same_rows_in_any_batch_size(
    body: bytes, sizes: list[int], tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("fuzz-csv") / "in.csv"
    path.write_bytes(b"item,price,ts\n" + body)
    reference = _read_all(path, [1])
    assert reference == _read_all(path, sizes)
    for tup in reference:
        assert (tup.value is None) != (tup.error is None)


def _read_all(path: Path, sizes: list[int]) -> list[InputTuple]:
    source = CsvSource(path)
    out: list[InputTuple] = []
    try:
        i = 0
        while (batch := source.poll(sizes[i % len(sizes)])) is not None:
            out.extend(batch)
            i += 1
    finally:
        source.close()
    return out
