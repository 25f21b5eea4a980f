"""The optional C accelerator of recovery's hot loops (`cec/_native.c`), or None.

Every function in it is a fast path for plain inputs that declines anything else, so callers keep the
pure-Python definition as the final word on errors. `CEC_NO_NATIVE=1` turns it off (tests run both ways;
benchmarks measure the Python path beside it).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from types import ModuleType
from typing import Any

__all__ = ["ABI", "compile_avro", "native"]

# The version of the C module's functions and arguments this code calls (`ABI` in _native.c).
ABI = 5


def _load() -> ModuleType | None:
    if os.environ.get("CEC_NO_NATIVE"):
        return None
    try:
        from cec import _native  # type: ignore[attr-defined]
    except ImportError:
        return None
    if getattr(_native, "ABI", None) != ABI:
        # Built from another version of _native.c (e.g. left by an older checkout, not rebuilt): its
        # functions take other arguments. Pure Python until `pip install -e .` / `make setup` rebuilds it.
        warnings.warn(
            "cec._native is stale (built from another _native.c); running without it: reinstall to rebuild",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return _native


native: ModuleType | None = _load()
if native is not None:  # a topic source's decoded records (`_native.topic_batch`) are read-only mappings
    Mapping.register(native.Record)


# Op codes of `_native.decode_avro` programs (the enum in _native.c).
_OP_NULL, _OP_BOOL, _OP_LONG, _OP_FLOAT, _OP_DOUBLE, _OP_BYTES, _OP_STRING, _OP_ENUM, _OP_UNION, _OP_ARRAY = (
    range(10)
)
_PRIMITIVES = {
    "null": _OP_NULL,
    "boolean": _OP_BOOL,
    "int": _OP_LONG,
    "long": _OP_LONG,
    "float": _OP_FLOAT,
    "double": _OP_DOUBLE,
    "bytes": _OP_BYTES,
    "string": _OP_STRING,
}


def _compile_type(schema: Any, enums: dict[str, tuple[Any, ...]], *, arrays: bool) -> tuple[int, Any] | None:
    if isinstance(schema, str):
        code = _PRIMITIVES.get(schema)
        return None if code is None else (code, None)
    if isinstance(schema, list):  # a union of primitives (e.g. ["null", "string"])
        branches = [_compile_type(b, enums, arrays=False) for b in schema]
        if any(b is None or b[0] in (_OP_UNION, _OP_ARRAY) for b in branches):
            return None
        return (_OP_UNION, tuple(branches))
    if not isinstance(schema, dict) or "logicalType" in schema:
        return None  # logical types are converted by fastavro: not a plain decode
    kind = schema.get("type")
    if kind == "enum":
        symbols = schema["symbols"]
        values = enums.get(schema.get("name", ""), tuple(symbols))
        return (_OP_ENUM, tuple(values))
    if kind == "array" and arrays:
        item = _compile_type(schema.get("items"), enums, arrays=False)
        return None if item is None or item[0] == _OP_UNION else (_OP_ARRAY, item)
    if isinstance(kind, str) and kind in _PRIMITIVES and len(schema) == 1:
        return (_PRIMITIVES[kind], None)
    return None


def compile_avro(
    parsed: Any, enums: dict[str, tuple[Any, ...]] | None = None, *, arrays: bool = False
) -> tuple[tuple[int, Any], ...] | None:
    """A `_native.decode_avro` program for a flat record schema (fields of primitives, enums, unions of
    primitives and, with `arrays`, arrays of primitives decoded as tuples); None when the schema is
    anything else or the extension is not there (callers then decode with fastavro). `enums` maps an
    enum's full name to the objects its symbols decode to (default: the symbol strings)."""
    if native is None or not isinstance(parsed, dict) or parsed.get("type") != "record":
        return None
    program = []
    for f in parsed.get("fields", []):
        op = _compile_type(f.get("type"), enums or {}, arrays=arrays)
        if op is None:
            return None
        program.append(op)
    return tuple(program)
