"""`SpecForm`: the base of cec's typed specs that have a dict form (`operators.specs`: operator and
source; `queuestore.factory.StoreSpec`): frozen dataclasses, validated on construction with one-line
`ConfigError`s, read from and written back to the dict form that job files and logs hold.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, ClassVar

from cec.exceptions import ConfigError

__all__ = [
    "SpecForm",
    "check_count",
    "check_known",
    "check_needs",
    "check_positive",
    "check_text",
    "json_object",
]


def check_known(data: Iterable[Any], known: Iterable[str], kind: str) -> None:
    """Every key of a dict form is a field: an unknown one is a `ConfigError` naming them all, sorted."""
    unknown = sorted(str(k) for k in set(data) - set(known))
    if unknown:
        raise ConfigError(f"unknown {kind} field(s): {', '.join(unknown)}")


def json_object(text: str, what: str) -> dict[str, Any]:
    """The JSON object `text` holds, or one `ConfigError` line saying what (`what`: e.g. "a job spec") is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what}'s JSON must be an object")
    return data


def check_text(value: Any, name: str, *, optional: bool = False) -> None:
    if (value is None and optional) or (isinstance(value, str) and value):
        return
    raise ConfigError(f"{name} must be a non-empty string, got {value!r}")


def check_count(value: Any, name: str, *, least: int = 1) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{name} must be an integer >= {least}, got {value!r}")


def check_positive(value: Any, name: str, unit: str) -> float:
    """`value` as a float, if it is a finite number above 0 (`unit`: what it counts, for the message)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(f"{name} must be a positive number of {unit}, got {value!r}")
    return float(value)


def check_needs(spec: SpecForm, needs: Mapping[str, tuple[str, ...]]) -> None:
    """`spec.type` is one of `needs`, and the spec has every field its type needs (`needs`: type -> fields)."""
    kind = getattr(spec, "type", None)
    needed = needs.get(kind) if isinstance(kind, str) else None
    if needed is None:
        raise ConfigError(f"unknown {spec.kind_name} type {kind!r}")
    missing = [name for name in needed if getattr(spec, name) is None]
    if missing:
        raise ConfigError(f"a {kind} {spec.kind_name} needs {', '.join(missing)}")


def _at_default(spec: Any, f: Field[Any]) -> bool:
    return f.default is not MISSING and bool(getattr(spec, f.name) == f.default)


@dataclass(frozen=True, eq=False)
class SpecForm:
    """A typed spec with a dict form: `to_dict` (exactly the fields a dict gave, when it was read from one),
    and reading it by key like that dict (`spec["root"]`, `spec.get("type")`, `"topic" in spec`).

    Not a `Mapping`: a field may be named like a mapping's method (a generator source's `keys`); `dict(...)`
    of a spec is `spec.to_dict()`."""

    kind_name: ClassVar[str] = "spec"  # in messages: "unknown <kind_name> field(s)"
    # The fields of the dict this spec was read from, in its order (None: built from keyword arguments).
    _given: tuple[str, ...] | None = field(default=None, kw_only=True, repr=False)

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in cls._fields())

    @classmethod
    def _read(cls, data: Mapping[str, Any], **fixed: Any) -> Any:
        """`cls` from a dict form (its fields checked: an unknown one is an error); `fixed`: fields the
        dict form does not spell as keyword arguments of `cls` (an operator's `type`)."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"a {cls.kind_name} spec must be a mapping, got {data!r}")
        check_known(data, {*cls._names(), *fixed}, cls.kind_name)
        given = {k: v for k, v in data.items() if k not in fixed}
        return cls(**given, _given=tuple(data))

    def to_dict(self) -> dict[str, Any]:
        """The fields a dict gave (all of them, in its order, even those at their default), then every
        other field not at its default (set by keyword or by `dataclasses.replace`: never lost)."""
        given = self._given or ()
        names = [
            *given,
            *(f.name for f in self._fields() if f.name not in given and not _at_default(self, f)),
        ]
        return {name: getattr(self, name) for name in names}

    @classmethod
    def _fields(cls) -> tuple[Field[Any], ...]:
        return tuple(f for f in fields(cls) if f.name != "_given")

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_dict().get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self.to_dict()

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (SpecForm, Mapping)):
            return self.to_dict() == (other.to_dict() if isinstance(other, SpecForm) else dict(other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # compared by its dict form, which may hold lists
