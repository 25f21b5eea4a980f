"""Stateless operators: filter and map. N = 0, no footprints; every output is an R."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cec.exceptions import BadTupleError
from cec.timeparse import parse_time_ms
from operators.base import InputTuple, Operator, OperatorContext

__all__ = ["Filter", "Map"]


class _Stateless(Operator):
    def __init__(self, schema: dict[str, Any], time_field: str | None = None) -> None:
        self.result_schema = schema
        self.time_field = time_field

    def key_of(self, value: Mapping[str, Any]) -> str | None:
        return None

    def event_time(self, value: Mapping[str, Any]) -> int | None:
        if self.time_field is None:
            return None
        raw = value.get(self.time_field)
        try:
            return parse_time_ms(raw)
        except (TypeError, ValueError, OverflowError):
            raise BadTupleError(
                f"time {self.time_field!r} is neither integer milliseconds nor an ISO-8601 time: {raw!r:.80}"
            ) from None


class Filter(_Stateless):
    """Forward tuples for which `predicate` holds. A predicate that raises dead-letters the tuple."""

    name = "filter"

    def __init__(
        self,
        predicate: Callable[[Mapping[str, Any]], bool],
        schema: dict[str, Any],
        *,
        time_field: str | None = None,
        description: str = "filter",
    ) -> None:
        super().__init__(schema, time_field)
        self.predicate = predicate
        self.description = description

    def describe(self) -> str:
        return self.description

    def process(self, tup: InputTuple, ctx: OperatorContext) -> None:
        assert tup.value is not None
        try:
            keep = self.predicate(tup.value)
        except (KeyError, TypeError, ValueError) as exc:
            raise BadTupleError(f"filter predicate failed: {exc!r:.120}") from None
        if keep:
            ctx.emit(tup.value)


class Map(_Stateless):
    """Emit `function(tuple)` for every tuple."""

    name = "map"

    def __init__(
        self,
        function: Callable[[Mapping[str, Any]], Mapping[str, Any]],
        schema: dict[str, Any],
        *,
        time_field: str | None = None,
    ) -> None:
        super().__init__(schema, time_field)
        self.function = function

    def process(self, tup: InputTuple, ctx: OperatorContext) -> None:
        assert tup.value is not None
        try:
            out = self.function(tup.value)
        except (KeyError, TypeError, ValueError) as exc:
            raise BadTupleError(f"map function failed: {exc!r:.120}") from None
        ctx.emit(out)
