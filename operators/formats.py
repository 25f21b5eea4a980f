"""Value formats of ordinary Kafka topics: bytes -> a record (a dict of fields).

A decoder raises `DecodeError` with a reason for a value it cannot read; the topic source turns that into
a dead letter with the record's partition and offset, and the run goes on. Problems that are not the
record's fault (a schema registry that cannot be reached) raise `TopicSourceError` instead: dead-lettering
every record because a server is down would lose the input.

- `json`: one JSON object per record: RFC 8259 text in UTF-8 (a leading byte order mark is ignored), as
  `json.loads` reads it, except that `NaN` / `Infinity`, strings holding a lone surrogate escape
  (`"\\ud800"`: not text, UTF-8 cannot hold it) and nesting deeper than `JSON_MAX_DEPTH` levels are refused;
  integers are exact at any size Python reads;
- `avro`: a schemaless Avro body (no container header), schema given as a dict or an `.avsc` file path;
- `registry`: the Confluent wire format (magic byte 0, 4-byte big-endian schema id, Avro body), schemas
  fetched by id through confluent-kafka's Schema Registry client and cached;
- `csv`: one CSV line per record (UTF-8; a leading byte order mark ignored), column names given.

The `cec` format (a cec queue) is not a value decoder: its records carry cec's envelope, checksums and
control tuples, which `operators.sources.QueueSource` already reads.
"""

from __future__ import annotations

import csv
import io
import json
import re
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import fastavro

from cec.exceptions import ConfigError
from cec.native import compile_avro, native
from operators.exceptions import DecodeError, TopicSourceError

# Every digit read as "0": a run of 19 zeros in the result is an integer of 19+ digits (C-speed translate
# and substring search over a whole batch).
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * 19
_fast_loads: Any
try:  # per value about 4x faster than json.loads (benchmarks/bench_decoders.py)
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - a dependency; without it every value takes the json path
    _fast_loads = None

# Deeper JSON is refused (a dead letter), on every path: json.loads recurses once per level and would fail
# with RecursionError at a depth that depends on the caller's stack; orjson stops at 1,024 levels.
JSON_MAX_DEPTH = 512
_UTF8_BOM = b"\xef\xbb\xbf"
# Strings, and brackets outside them (a string's closing quote optional: an unterminated one runs to the end).
_JSON_NESTING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)
__all__ = [
    "FORMATS",
    "JSON_MAX_DEPTH",
    "AvroDecoder",
    "CsvDecoder",
    "JsonDecoder",
    "RegistryDecoder",
    "ValueDecoder",
    "load_avro_schema",
    "make_decoder",
]

FORMATS = ("json", "avro", "registry", "csv", "cec")

_WIRE_HEADER = struct.Struct(">bI")  # Confluent wire format: magic byte 0, schema id


class ValueDecoder(Protocol):
    def decode(self, raw: bytes) -> Mapping[str, Any]:
        """The record in `raw`; `DecodeError` with a reason if it cannot be read."""
        ...


def load_avro_schema(schema: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """An Avro schema as a dict: given as one, or as the path of an `.avsc` file (JSON)."""
    if isinstance(schema, Mapping):
        return dict(schema)
    path = Path(schema)
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read Avro schema {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"Avro schema {path} is not JSON: {exc}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"Avro schema {path} must be a record schema (a JSON object)")
    return loaded


def _parse_avro(schema: Mapping[str, Any], where: str) -> Any:
    try:
        parsed = fastavro.parse_schema(dict(schema))
    except Exception as exc:  # fastavro raises several types (SchemaParseException, KeyError, ...)
        raise ConfigError(f"invalid Avro schema ({where}): {exc}") from None
    if _has_array_of_nothing(parsed):
        # Such items are read without consuming a byte: one record claiming 2**62 of them would keep
        # fastavro looping (and filling memory), at every restart.
        raise ConfigError(
            f"Avro schema ({where}) has an array whose items take no bytes (null, an empty record, a "
            "fixed of size 0): not supported"
        )
    return parsed


def _has_array_of_nothing(parsed: Any) -> bool:
    """Whether a parsed schema holds an array of items that take no bytes when encoded."""
    named: dict[str, Any] = {}
    found = False

    def empty(t: Any, seen: frozenset[str]) -> bool:
        if isinstance(t, str):
            if t == "null":
                return True
            if t in named and t not in seen:
                return empty(named[t], seen | {t})
            return False  # a primitive that takes bytes, or a recursive reference
        if not isinstance(t, dict):
            return False  # a union: its branch index takes a byte
        kind = t.get("type")
        if kind == "fixed":
            return t.get("size") == 0
        if kind in ("record", "error"):
            return all(empty(f.get("type"), seen) for f in t.get("fields", []))
        if kind in ("array", "map", "enum"):
            return False  # a block count or an index takes a byte
        return empty(kind, seen)  # {"type": "null"}, a logical type over a primitive

    def walk(t: Any) -> None:
        nonlocal found
        if isinstance(t, list):
            for branch in t:
                walk(branch)
        elif isinstance(t, dict):
            if isinstance(t.get("name"), str) and t.get("type") in ("record", "error", "enum", "fixed"):
                named[t["name"]] = t
            kind = t.get("type")
            if kind in ("record", "error"):
                for f in t.get("fields", []):
                    walk(f.get("type"))
            elif kind == "array":
                walk(t.get("items"))
                found = found or empty(t.get("items"), frozenset())
            elif kind == "map":
                walk(t.get("values"))
            elif isinstance(kind, (dict, list)):
                walk(kind)

    walk(parsed)
    return found


def _read_avro(parsed: Any, body: bytes | memoryview) -> Mapping[str, Any]:
    buf = io.BytesIO(body)
    try:
        obj = fastavro.schemaless_reader(buf, parsed, None)
    except Exception as exc:  # EOFError, UnicodeDecodeError, ValueError, IndexError...: "not this schema"
        raise DecodeError(f"not Avro of the given schema: {_message(exc)}") from None
    # A body written with another schema often decodes "successfully" into garbage; bytes left over are
    # the one cheap sign of it that schemaless Avro offers.
    if buf.tell() != len(body):
        raise DecodeError(f"not Avro of the given schema: {len(body) - buf.tell()} bytes left over")
    if not isinstance(obj, Mapping):
        raise DecodeError("Avro value is not a record")
    return obj


# An object's address in a message ("<_io.BytesIO object at 0x7f...>"): a reason must not change from
# one run to the next (a rerun writes byte-identical dead letters).
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _message(exc: BaseException) -> str:
    """An exception as one line of a dead letter's reason: its type and message, addresses dropped."""
    return f"{type(exc).__name__}: {_ADDRESS.sub('', str(exc))!s:.120}"


def _not_an_object(obj: Any) -> str:
    return f"JSON value is a {type(obj).__name__}, not an object"


def _layout(names: tuple[str, ...], loader: Any) -> tuple[tuple[str, ...], dict[str, int], Any]:
    """A `cec._native.Record` layout: the held fields, their positions, what loads the whole record."""
    return (names, {name: i for i, name in enumerate(names)}, loader)


def _json_nesting(text: str) -> int:
    """The deepest nesting of arrays and objects in `text` (exact for JSON; never less than json.loads
    recurses before it stops, for any text)."""
    if text.count("[") + text.count("{") <= JSON_MAX_DEPTH:
        return 0  # not deeper than the limit, whatever it is
    depth = deepest = 0
    for match in _JSON_NESTING.finditer(text):
        token = match[0]
        if token == "[" or token == "{":
            depth += 1
            if depth > deepest:
                deepest = depth
        elif token == "]" or token == "}":
            depth -= 1
    return deepest


def _lone_surrogate(obj: Any) -> str | None:
    """The first string (key or value, at any depth) in a decoded JSON value that holds a lone surrogate."""
    todo = [obj]
    while todo:
        item = todo.pop()
        if type(item) is str:
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return item
        elif type(item) is dict:
            todo.extend(item)
            todo.extend(item.values())
        elif type(item) is list:
            todo.extend(item)
    return None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _json_value(raw: bytes) -> Mapping[str, Any] | str:
    """The json format's definition (module docstring): the record in `raw`, or the reason it is not one.
    Every path decodes a record to exactly what this gives."""
    body = raw[len(_UTF8_BOM) :] if raw[:3] == _UTF8_BOM else raw
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not JSON: not UTF-8 ({exc.reason} at byte {exc.start + len(raw) - len(body)})"
    if _json_nesting(text) > JSON_MAX_DEPTH:
        return f"not JSON: nested deeper than {JSON_MAX_DEPTH} levels"
    try:
        obj = json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:  # JSONDecodeError; an integer longer than Python reads (int_max_str_digits)
        return f"not JSON: {exc!s:.120}"
    except RecursionError:  # not within the depth limit: only if the caller's stack is nearly full
        return f"not JSON: nested deeper than {JSON_MAX_DEPTH} levels"
    if type(obj) is not dict:
        return _not_an_object(obj)
    if "\\u" in text:  # only an escape can make a lone surrogate (the text itself is valid UTF-8)
        bad = _lone_surrogate(obj)
        if bad is not None:
            return f"not JSON: string {bad!r:.60} holds a lone surrogate (not text; UTF-8 cannot hold it)"
    return obj


class JsonDecoder:
    def native_spec(self, wanted: Sequence[str]) -> tuple[Any, ...] | None:
        """What `cec._native.topic_batch` decodes this format with, holding the `wanted` fields (each must
        be present, not null, and a string, number or boolean: anything else is declined and decoded by
        `decode`); the rest of a record is loaded by json.loads when asked for (the C scanner accepts only
        records that json.loads reads exactly as `decode` does). None without the C accelerator."""
        if native is None or not wanted or len(set(wanted)) > 8:
            return None
        return ("json", _layout(tuple(dict.fromkeys(wanted)), json.loads))

    def decode(self, raw: bytes) -> Mapping[str, Any]:
        got = self.decode_many([raw])[0]
        if isinstance(got, str):
            raise DecodeError(got)
        return got

    def decode_many(self, raws: Sequence[bytes]) -> list[Mapping[str, Any] | str]:
        """Each value decoded, or the reason it is not a JSON object: exactly `_json_value` of each.

        orjson decodes each value on its own (as fast per value as one call over the batch joined into an
        array, and no value can change how another one reads). It is stricter than `_json_value` (no BOM,
        no number beyond a double) and reads integers beyond 64 bits as floats, so only a dict it returns
        is taken, and only from a value with no run of 19 digits and no more brackets than the depth
        limit; every other value is decided by `_json_value`. Both checks are made over the whole batch
        first (nearly always they clear it)."""
        loads = _fast_loads
        if loads is None:
            return [_json_value(raw) for raw in raws]
        out: list[Mapping[str, Any] | str | None] = []
        append = out.append
        for raw in raws:
            try:
                obj = loads(raw)
            except ValueError:  # orjson.JSONDecodeError
                obj = None
            append(obj if type(obj) is dict else None)
        if raws:
            if _LONG_RUN in b"\n".join(raws).translate(_DIGITS_AS_ZERO):
                for i, raw in enumerate(raws):
                    if _LONG_RUN in raw.translate(_DIGITS_AS_ZERO):
                        out[i] = None
            if max(map(len, raws)) > JSON_MAX_DEPTH:
                for i, raw in enumerate(raws):
                    if len(raw) > JSON_MAX_DEPTH and raw.count(b"[") + raw.count(b"{") > JSON_MAX_DEPTH:
                        out[i] = None
        if None in out:
            return [_json_value(raw) if obj is None else obj for obj, raw in zip(out, raws, strict=True)]
        return out  # type: ignore[return-value]  # no None left


class AvroDecoder:
    """Schemaless Avro bodies, all written with one schema."""

    def __init__(self, schema: str | Path | Mapping[str, Any]) -> None:
        self.schema = load_avro_schema(schema)
        self._parsed = _parse_avro(self.schema, "avro format")
        # A flat record of primitives (the common case) decodes in C (`cec.native`), about 50x faster than
        # fastavro per record; anything else, or a body the C decoder declines, goes through fastavro.
        self._program = compile_avro(self._parsed)
        self._as_dict = _dict_maker([f["name"] for f in self._parsed["fields"]]) if self._program else None

    def native_spec(self, wanted: Sequence[str]) -> tuple[Any, ...] | None:
        """What `cec._native.topic_batch` decodes this format with: every field held (the record is
        flat), the `wanted` ones required not null; None where `decode_many` has no C path, or a wanted
        field is not in the schema (every record then lacks it: decoded one by one for the reason)."""
        if self._program is None or native is None:
            return None
        names = tuple(f["name"] for f in self._parsed["fields"])
        wanted = list(dict.fromkeys(wanted))
        if not wanted or len(wanted) > 8 or any(w not in names for w in wanted):
            return None
        return ("avro", _layout(names, None), self._program, tuple(names.index(w) for w in wanted))

    def decode(self, raw: bytes) -> Mapping[str, Any]:
        return _read_avro(self._parsed, raw)

    def decode_many(self, raws: Sequence[bytes]) -> list[Mapping[str, Any] | str]:
        """Each value decoded, or the reason it cannot be (the per-value loop without per-call overhead)."""
        if self._program is not None and self._as_dict is not None and native is not None:
            values = raws if type(raws) is list else list(raws)
            fields = native.decode_avro_many(self._program, values, 0)
            if None not in fields:
                return list(map(self._as_dict, fields))
            # Some body was declined (malformed, or trailing bytes): fastavro decides, value by value.
            return [
                self._as_dict(t) if t is not None else self._decode_slow(r)
                for t, r in zip(fields, values, strict=True)
            ]
        parsed, reader, new_buffer = self._parsed, fastavro.schemaless_reader, io.BytesIO
        out: list[Mapping[str, Any] | str] = []
        append = out.append
        for raw in raws:
            buf = new_buffer(raw)
            try:
                obj = reader(buf, parsed, None)
            except Exception:  # the reason is worked out on the slow path below
                obj = None
            if type(obj) is dict and buf.tell() == len(raw):
                append(obj)
                continue
            append(self._decode_slow(raw))
        return out

    def _decode_slow(self, raw: bytes | None) -> Mapping[str, Any] | str:
        if raw is None:
            return "null value (tombstone)"
        try:
            return _read_avro(self._parsed, raw)
        except DecodeError as exc:
            return exc.reason


def _dict_maker(names: Sequence[str]) -> Any:
    """A function from a tuple of field values to the record's dict, as a dict display (several times
    faster than dict(zip(names, values))). The names are embedded as string literals (repr), never as code."""
    items = ", ".join(f"{name!r}: t[{i}]" for i, name in enumerate(names))
    return eval(f"lambda t: {{{items}}}", {"__builtins__": {}})


class RegistryDecoder:
    """Confluent wire format; each record names its writer schema by id, fetched once and cached.

    `client` is a `confluent_kafka.schema_registry.SchemaRegistryClient` (or anything with its
    `get_schema(schema_id)`); `url` builds one. Cached ids never change meaning (registry ids are
    immutable), so the cache needs no expiry.
    """

    def __init__(self, url: str | None = None, *, client: Any = None) -> None:
        if client is None:
            if not url:
                raise ConfigError("the registry format needs a schema registry URL (--schema-registry)")
            client = registry_client(url)
        self._client = client
        self.url = url
        self._schemas: dict[int, Any] = {}
        self._unusable: dict[int, str] = {}  # ids whose schema cannot decode anything: the reason

    def _schema(self, schema_id: int) -> Any:
        parsed = self._schemas.get(schema_id)
        if parsed is not None:
            return parsed
        reason = self._unusable.get(schema_id)
        if reason is not None:
            raise DecodeError(reason)
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            schema = self._client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise DecodeError(f"schema id {schema_id} is not in the registry") from None
            raise TopicSourceError(f"schema registry {self.url}: {exc}") from None
        except Exception as exc:  # transport errors: the registry is down, not the record bad
            raise TopicSourceError(f"schema registry {self.url} unreachable: {exc}") from None
        if (schema.schema_type or "AVRO") != "AVRO":
            raise DecodeError(f"schema id {schema_id} is {schema.schema_type}, not Avro")
        try:
            parsed = _parse_avro(json.loads(schema.schema_str), f"registry schema id {schema_id}")
        except (ValueError, TypeError, ConfigError) as exc:  # the schema, not the registry: the record's
            reason = str(exc) if isinstance(exc, ConfigError) else f"schema id {schema_id} is not JSON: {exc}"
            self._unusable[schema_id] = reason
            raise DecodeError(reason) from None
        self._schemas[schema_id] = parsed
        return parsed

    def decode(self, raw: bytes) -> Mapping[str, Any]:
        if len(raw) < _WIRE_HEADER.size:
            raise DecodeError(f"not Confluent wire format: {len(raw)} bytes")
        magic, schema_id = _WIRE_HEADER.unpack_from(raw)
        if magic != 0:
            raise DecodeError(f"not Confluent wire format: magic byte {magic}")
        return _read_avro(self._schema(schema_id), memoryview(raw)[_WIRE_HEADER.size :])


def registry_client(url: str) -> Any:
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
    except ImportError as exc:
        raise ConfigError(
            f"the registry format needs confluent-kafka's schema registry extras ({exc.name} missing): "
            "pip install 'confluent-kafka[schemaregistry]'"
        ) from None
    # new_client: a `mock://` URL gives the client's own in-memory test double.
    return SchemaRegistryClient.new_client({"url": url})


class CsvDecoder:
    """One CSV line per record, fields named by `columns` (a header is not part of a topic)."""

    def __init__(self, columns: Sequence[str], delimiter: str = ",") -> None:
        if not columns:
            raise ConfigError("the csv format needs the column names")
        if len(set(columns)) != len(columns):
            raise ConfigError(f"csv columns repeat: {list(columns)}")
        self.columns = list(columns)
        self.delimiter = delimiter

    def decode(self, raw: bytes) -> Mapping[str, Any]:
        try:
            text = raw.decode("utf-8").removeprefix("\ufeff")  # a leading byte order mark, as in a CSV file
            rows = list(csv.reader([text.rstrip("\r\n")], delimiter=self.delimiter, strict=True))
        except (UnicodeDecodeError, csv.Error) as exc:
            raise DecodeError(f"not a CSV line: {exc!s:.120}") from None
        row = rows[0] if rows else []
        if len(row) != len(self.columns):
            raise DecodeError(f"CSV line has {len(row)} fields, expected {len(self.columns)}")
        return dict(zip(self.columns, row, strict=True))


def make_decoder(
    fmt: str,
    *,
    schema: str | Path | Mapping[str, Any] | None = None,
    registry_url: str | None = None,
    columns: Sequence[str] | None = None,
    registry: Any = None,
) -> ValueDecoder:
    if fmt == "json":
        return JsonDecoder()
    if fmt == "avro":
        if schema is None:
            raise ConfigError("the avro format needs a schema (--schema FILE.avsc)")
        return AvroDecoder(schema)
    if fmt == "registry":
        return RegistryDecoder(registry_url, client=registry)
    if fmt == "csv":
        return CsvDecoder(list(columns or []))
    raise ConfigError(f"unknown value format {fmt!r} (one of {', '.join(FORMATS)})")
