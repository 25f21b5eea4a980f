"""What cec's C decoders must agree with, for any bytes: the checks shared by the hypothesis fuzz tests
(tests/operators/test_formats_fuzz.py) and the coverage-guided target (tests/cec/fuzz/native_target.py).

- JSON (`topic_batch` with a json spec): a record the C scanner holds is the record the json format's
  definition (`operators.formats._json_value`) gives for those bytes, types included, and its held fields
  are present, not null and not nested; what it declines, the caller decodes on its own.
- flat Avro (`decode_avro_many`, `topic_batch` with an avro spec): a record the C decoder reads is the
  record fastavro reads from the same bytes, all of them.
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
from pathlib import Path
from typing import Any

import fastavro
from confluent_kafka import Message

from cec.native import compile_avro
from operators.base import InputTuple
from operators.formats import AvroDecoder, JsonDecoder, _json_value
from operators.topic_source import _ACCESSORS

__all__ = [
    "FLAT_AVRO",
    "SEPARATOR",
    "WANTED",
    "check_avro",
    "check_json",
    "load_native",
    "seeds",
    "typed",
    "write_seeds",
]

WANTED = (("item", "price"), ("item",), ("ts", "item", "x"))
SEPARATOR = b"\x1e"  # between the records of one fuzz input
FLAT_AVRO: dict[str, Any] = {
    "type": "record",
    "name": "Purchase",
    "fields": [
        {"name": "item", "type": ["null", "string"]},
        {"name": "price", "type": ["null", "double"]},
        {"name": "ts", "type": "long"},
        {"name": "tags", "type": "bytes"},
        {"name": "ok", "type": ["boolean", "null"]},
        {"name": "kind", "type": {"type": "enum", "name": "K", "symbols": ["A", "B"]}},
        {"name": "ratio", "type": "float"},
    ],
}
_FLAT_PARSED = fastavro.parse_schema(FLAT_AVRO)
_PROGRAM = compile_avro(_FLAT_PARSED)
_AVRO_SPEC = AvroDecoder(FLAT_AVRO).native_spec(["item", "price"])
_JSON_SPECS = {wanted: JsonDecoder().native_spec(wanted) for wanted in WANTED}


def typed(value: Any) -> Any:
    """`value` with every type spelled out: equal only if equal with the same types (1, 1.0 and True
    differ), floats bit for bit (-0.0, NaN); a mapping that is not a dict (a C `Record`) as the dict it
    equals."""
    if type(value) is not dict and hasattr(value, "keys"):
        value = dict(value)
    kind = type(value)
    if kind is dict:
        return ("dict", [(typed(k), typed(v)) for k, v in value.items()])
    if kind is list or kind is tuple:
        return (kind.__name__, [typed(v) for v in value])
    if kind is float:
        return ("float", "nan" if math.isnan(value) else value.hex())
    return (kind.__name__, value)


def load_native(path: str | None) -> Any:
    """The C module: the installed `cec._native`, or a build of it at `path` (an instrumented one)."""
    if not path:
        from cec.native import native

        assert native is not None, "the C accelerator is not built"
        return native
    spec = importlib.util.spec_from_file_location("cec._native", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _messages(raws: list[bytes]) -> list[Message]:
    return [Message(topic="t", partition=0, offset=i, value=raw) for i, raw in enumerate(raws)]


def check_json(native: Any, raws: list[bytes], wanted: tuple[str, ...]) -> None:
    nxt = [0]
    out, declined = native.topic_batch(
        _messages(raws), _ACCESSORS, InputTuple, [0], [math.inf], nxt, _JSON_SPECS[wanted]
    )
    assert declined == sum(t is None for t in out) and nxt == [len(raws)]
    for raw, tup in zip(raws, out, strict=True):
        if tup is None:
            continue
        ref = _json_value(raw)
        assert isinstance(ref, dict), (raw, ref)  # the C scanner holds nothing the format refuses
        assert tup.raw is raw and tup.error is None
        assert typed(tup.value) == typed(ref), raw
        for name in wanted:
            held = tup.value[name]
            assert held is not None and not isinstance(held, (dict, list)), (raw, name)
            assert typed(held) == typed(ref[name]), (raw, name)


def _fastavro(raw: bytes) -> dict[str, Any] | None:
    buf = io.BytesIO(raw)
    try:
        obj = fastavro.schemaless_reader(buf, _FLAT_PARSED, None)
    except Exception:
        return None
    return obj if buf.tell() == len(raw) else None  # type: ignore[return-value]


def check_avro(native: Any, raws: list[bytes]) -> None:
    assert _PROGRAM is not None and _AVRO_SPEC is not None
    names = [f["name"] for f in FLAT_AVRO["fields"]]
    for raw, fields in zip(raws, native.decode_avro_many(_PROGRAM, list(raws), 0), strict=True):
        if fields is not None:
            ref = _fastavro(raw)
            assert ref is not None, raw  # the C decoder reads nothing fastavro refuses
            assert typed(dict(zip(names, fields, strict=True))) == typed(ref), raw
    out, _declined = native.topic_batch(
        _messages(raws), _ACCESSORS, InputTuple, [0], [math.inf], [0], _AVRO_SPEC
    )
    for raw, tup in zip(raws, out, strict=True):
        if tup is not None:
            ref = _fastavro(raw)
            assert ref is not None and ref["item"] is not None and ref["price"] is not None, raw
            assert typed(tup.value) == typed(ref), raw


def seeds() -> list[bytes]:
    """A starting corpus: plain, nested, escaped and hostile JSON records; Avro bodies of FLAT_AVRO."""
    records = [
        {"item": "apple", "price": 1.25, "ts": 3},
        {"item": "caf\u00e9 \U0001f34e", "price": -7, "ts": 10**30, "x": [1, {"a": None}], "e": {}},
        {"item": "k", "price": "12.5", "x": True, "ts": 1e-7},
    ]
    texts = [json.dumps(r, ensure_ascii=a).encode() for r in records for a in (True, False)]
    texts += [b'{"item": "\\ud83c\\udf4e", "price": 1e400}', b'{"item": "a", "price": 1, "x": "\\ud800"}']
    texts += [b'{"item": "a", "price": NaN}', b'\xef\xbb\xbf{"item": "a", "price": 1}', b"[" * 70 + b"]" * 70]
    json_seeds = [bytes([2 * (i % 3)]) + SEPARATOR.join(texts[i : i + 3]) for i in range(len(texts))]
    parsed = _FLAT_PARSED
    bodies = []
    for item, price in (("a", 1.5), (None, None), ("\u20ac", -0.0)):
        buf = io.BytesIO()
        record = {"item": item, "price": price, "ts": -(2**63), "tags": b"\x00\xff", "ok": True, "kind": "B"}
        fastavro.schemaless_writer(buf, parsed, {**record, "ratio": 0.5})
        bodies.append(buf.getvalue())
    return [*json_seeds, b"\x01" + SEPARATOR.join(bodies), b"\x03" + bodies[0] + b"\x00"]


def write_seeds(corpus: Path) -> None:
    corpus.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(seeds()):
        (corpus / f"seed-{i:02d}").write_bytes(seed)
