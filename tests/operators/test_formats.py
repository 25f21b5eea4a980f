"""Value decoders of ordinary topics (operators.formats): each format's good and bad records."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path
from typing import Any

import fastavro
import pytest

from cec.exceptions import ConfigError
from operators.exceptions import DecodeError
from operators.formats import AvroDecoder, CsvDecoder, JsonDecoder, RegistryDecoder, load_avro_schema

SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Purchase",
    "fields": [
        {"name": "item", "type": "string"},
        {"name": "price", "type": ["null", "double"], "default": None},
        {"name": "ts", "type": "long"},
    ],
}
OTHER: dict[str, Any] = {"type": "record", "name": "Other", "fields": [{"name": "n", "type": "long"}]}


def avro(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return buf.getvalue()


def test_json_objects_decode_and_anything_else_is_a_reason() -> None:
    dec = JsonDecoder()
    assert dec.decode(b'{"item": "a", "price": 2.5}') == {"item": "a", "price": 2.5}
    for raw, reason in [(b"{oops", "not JSON"), (b"[1, 2]", "not an object"), (b"\xff\xfe", "not JSON")]:
        with pytest.raises(DecodeError, match=reason):
            dec.decode(raw)


def test_avro_from_an_avsc_file_and_wrong_bodies_are_reasons(tmp_path: Path) -> None:
    avsc = tmp_path / "purchase.avsc"
    avsc.write_text(json.dumps(SCHEMA))
    dec = AvroDecoder(str(avsc))
    record = {"item": "a", "price": 1.5, "ts": 7}
    assert dec.decode(avro(SCHEMA, record)) == record
    with pytest.raises(DecodeError, match="not Avro"):
        dec.decode(b"\x02")  # truncated
    with pytest.raises(DecodeError, match="not Avro"):
        dec.decode(avro(SCHEMA, record) + b"\x00\x00")  # another schema's body: bytes left over
    with pytest.raises(ConfigError, match="cannot read Avro schema"):
        AvroDecoder(str(tmp_path / "missing.avsc"))
    assert load_avro_schema(SCHEMA) == SCHEMA


def test_csv_lines_with_named_columns() -> None:
    dec = CsvDecoder(["item", "price", "ts"])
    assert dec.decode(b'a,"1,5",3\n') == {"item": "a", "price": "1,5", "ts": "3"}
    assert dec.decode(b"\xef\xbb\xbfa,1,3") == {"item": "a", "price": "1", "ts": "3"}  # a BOM is not data
    with pytest.raises(DecodeError, match="2 fields, expected 3"):
        dec.decode(b"a,1")


def test_registry_wire_format_through_the_clients_own_test_double() -> None:
    # The confluent-kafka Schema Registry client's own in-memory test double (a mock:// URL), no server.
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient.new_client({"url": "mock://cec-formats-test"})
    serialize = AvroSerializer(client, json.dumps(SCHEMA))
    record = {"item": "a", "price": 2.0, "ts": 5}
    raw = serialize(record, SerializationContext("purchases", MessageField.VALUE))
    assert raw is not None and raw[0] == 0

    calls: list[int] = []

    class Counting:  # the real client, counting fetches: schemas are fetched once per id
        def get_schema(self, schema_id: int) -> Any:
            calls.append(schema_id)
            return client.get_schema(schema_id)

    dec = RegistryDecoder(client=Counting())
    assert dec.decode(raw) == record
    assert dec.decode(raw) == record
    assert len(calls) == 1
    other_id = client.register_schema("other-value", Schema(json.dumps(OTHER), "AVRO"))
    with pytest.raises(DecodeError, match="not Avro"):
        dec.decode(struct.pack(">bI", 0, other_id) + raw[5:])  # a body that is not of schema other_id
    with pytest.raises(DecodeError, match="magic byte 1"):
        dec.decode(b"\x01" + raw[1:])
    with pytest.raises(DecodeError, match="schema id 424242 is not in the registry"):
        dec.decode(struct.pack(">bI", 0, 424242) + raw[5:])
    # A schema that cannot decode anything is each of its records' reason, not a traceback.
    bad_id = client.register_schema(
        "bad-value", Schema('{"type": "record", "name": "B", "fields": 7}', "AVRO")
    )
    with pytest.raises(DecodeError, match=f"invalid Avro schema \\(registry schema id {bad_id}\\)"):
        dec.decode(struct.pack(">bI", 0, bad_id) + raw[5:])


def _one_by_one(dec: Any, raws: list[bytes]) -> list[Any]:
    out: list[Any] = []
    for raw in raws:
        try:
            out.append(dec.decode(raw))
        except DecodeError as exc:
            out.append(exc.reason)
    return out


@pytest.mark.parametrize(
    "raws",
    [
        [b'{"a": 1}', b'{"b": [1, 2]}', b' {"c": "x,y"} '],
        [b'{"a": 1}', b"[1", b"2]"],  # two halves that would join into one array
        [b'{"a": 1}', b"1, 2", b'{"b": 2}'],  # a top-level comma inside one value
        [b'{"a": 1}', b"", b"3"],
        [b'{"a": 1}', b"\xff", b"null"],
        [b'{"a": Infinity}', b'{"b": 2}'],
        [b'{"a": 123456789012345678901234567890}', b'{"b": 2}'],
        # Joined with commas into one array these read as three objects, one per record (issue 21).
        [b'{"k": "a", "v": 1}, {"k": "a", "v": 2}', b'{"k": "a", "v": 3, "s": "', b'"}'],
        [b'{"a": ' + b"[" * 2000 + b"]" * 2000 + b"}", b'{"b": 2}'],  # json.loads: RecursionError
        [b'{"k": "\\ud800"}', b'{"k": "\\ud83c\\udf4e"}', b'\xef\xbb\xbf{"k": 1}'],
    ],
)
def test_json_batches_decode_exactly_as_one_value_at_a_time(raws: list[bytes]) -> None:
    dec = JsonDecoder()
    assert dec.decode_many(raws) == _one_by_one(dec, raws)


def test_json_refuses_what_is_not_one_object_of_text() -> None:
    dec = JsonDecoder()
    assert dec.decode_many(
        [
            b'{"k": "a", "v": 1}, {"k": "a", "v": 2}',
            b'{"v": NaN}',
            b'{"k": "\\ud800"}',
            b'{"a": ' + b"[" * 600 + b"]" * 600 + b"}",
            b'\xef\xbb\xbf{"k": "bom"}',
            b'{"n": 123456789012345678901234567890}',
        ]
    ) == [
        "not JSON: Extra data: line 1 column 19 (char 18)",
        "not JSON: NaN is not a JSON number",
        "not JSON: string '\\ud800' holds a lone surrogate (not text; UTF-8 cannot hold it)",
        "not JSON: nested deeper than 512 levels",
        {"k": "bom"},
        {"n": 123456789012345678901234567890},
    ]


def test_avro_reasons_are_the_same_in_every_run() -> None:
    """A reason goes into the log and the dead-letters file: no object address in it."""
    body = b"\x02a\x02\x00"  # item "a", then a double cut short: fastavro names its buffer object
    assert AvroDecoder(SCHEMA).decode_many([body]) == [
        "not Avro of the given schema: EOFError: cannot read double from <_io.BytesIO object>"
    ]


def test_avro_batches_decode_exactly_as_one_value_at_a_time() -> None:
    dec = AvroDecoder(SCHEMA)
    good = avro(SCHEMA, {"item": "a", "price": None, "ts": 3})
    raws = [good, b"\x02", good + b"\x00", avro(OTHER, {"n": 5}), good]
    assert dec.decode_many(raws) == _one_by_one(dec, raws)
    assert dec.decode_many([good, good]) == [{"item": "a", "price": None, "ts": 3}] * 2


def test_avro_batches_use_the_c_decoder_when_it_is_built() -> None:
    from cec.native import native

    dec = AvroDecoder(SCHEMA)
    assert (dec._program is not None) == (native is not None)
