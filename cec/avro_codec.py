"""Schemaless Avro for operator-defined payloads and window states (`AvroCodec`), with the C accelerator's
encoders and decoders where they apply."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any, TypeVar, cast

import fastavro

from cec.exceptions import CodecError
from cec.native import compile_avro, native

_T = TypeVar("_T")

__all__ = ["AvroCodec"]

_native_encode_avro = getattr(native, "encode_avro", None)  # one C call per flat record of primitives


class AvroCodec:
    """Schemaless Avro for operator-defined payloads and window states (the schema is the operator's)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = fastavro.parse_schema(schema)
        fields = self.schema.get("fields", ()) if isinstance(self.schema, dict) else ()
        self._names = tuple(f["name"] for f in fields)
        self._program = compile_avro(self.schema)  # None: fastavro decodes

    @property
    def names(self) -> tuple[str, ...]:
        """The record's field names, in schema order (what `decode_tuple` gives values for)."""
        return self._names

    def encode(self, datum: Mapping[str, Any]) -> bytes:
        if self._program is not None and _native_encode_avro is not None:
            try:
                values = [datum[name] for name in self._names]
            except KeyError:  # a field left to its default: fastavro fills it in
                values = None
            if values is not None:
                encoded = _native_encode_avro(self._program, values)
                if encoded is not None:
                    return encoded
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, self.schema, dict(datum))
        return buf.getvalue()

    def encode_tuple(self, values: tuple[Any, ...]) -> bytes:
        """`encode` of the record whose fields, in schema order, are `values` (a window state at every
        G-check: one C call for a flat record of primitives, else fastavro)."""
        if self._program is not None and _native_encode_avro is not None:
            data: bytes | None = _native_encode_avro(self._program, values)
            if data is not None:
                return data
        return self.encode(dict(zip(self._names, values, strict=True)))

    def encode_tuples(self, rows: list[tuple[Any, ...]]) -> list[bytes]:
        """`[encode_tuple(r) for r in rows]`, in one C call when every row is plain (a run of window
        states: the batched G-check)."""
        each = getattr(native, "encode_avro_each", None) if self._program is not None else None
        if each is not None:
            data: list[bytes] | None = each(self._program, rows)
            if data is not None:
                return data
        encode = self.encode_tuple
        return [encode(row) for row in rows]

    def decode_tuple(self, data: bytes, start: int = 0) -> tuple[Any, ...]:
        """The field values, in schema order, of the record at `data[start:]` (EC-load decodes every window
        state: no dict)."""
        if self._program is not None and native is not None:
            fields = native.decode_avro(self._program, data, start)
            if fields is not None:
                return tuple(fields)
        obj = self.decode(data[start:] if start else data)
        return tuple(obj[name] for name in self._names)

    def decode_tuples(self, datas: list[bytes], start: int = 0) -> list[tuple[Any, ...]]:
        """`[decode_tuple(d, start) for d in datas]`, in one C call when every body is plain (a source's
        batch of results, EC-load's window states); a body the C path declines is decoded alone, which
        names what is wrong with it."""
        if self._program is not None and native is not None:
            fields = native.decode_avro_many(self._program, datas, start)
            if None not in fields:
                return [tuple(f) for f in fields]
            return [
                tuple(f) if f is not None else self.decode_tuple(d, start)
                for f, d in zip(fields, datas, strict=True)
            ]
        return [self.decode_tuple(d, start) for d in datas]

    def decode_slots(self, datas: list[bytes], cls: type[_T]) -> list[_T]:
        """`[cls(*decode_tuple(d)) for d in datas]` for a slots class whose fields are the schema's, in its
        order (EC-load's window states): built in C without `cls.__init__` when every body is plain; a body
        the C path declines is decoded alone, which names what is wrong with it."""
        if self._program is not None and native is not None:
            descrs = tuple(getattr(cls, name) for name in self._names)
            objs = native.decode_avro_many(self._program, datas, 0, cls, descrs)
            if None not in objs:
                return cast("list[_T]", objs)
            return [
                obj if obj is not None else cls(*self.decode_tuple(d))
                for obj, d in zip(objs, datas, strict=True)
            ]
        return [cls(*self.decode_tuple(d)) for d in datas]

    def decode(self, data: bytes) -> dict[str, Any]:
        if self._program is not None and native is not None:
            fields = native.decode_avro(self._program, data, 0)
            if fields is not None:
                return dict(zip(self._names, fields, strict=True))
        try:
            obj = fastavro.schemaless_reader(io.BytesIO(data), self.schema, None)
        except Exception as exc:
            raise CodecError(f"malformed payload: {exc!s:.200}") from None
        assert isinstance(obj, dict)
        return obj
