"""Operators (aggregate, filter, map), their runtime, input sources and job hosting.

The names below are imported when first used (PEP 562), not with the package: a Spark Python worker
that unpickles the attached operator's processor needs `operators.aggregate` and `operators.base`, not
the local runtime and its metrics server, and a fresh worker (and the driver-side process in which Spark
learns a stateful processor's schema at every query start) would otherwise pay for importing them.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from operators.aggregate import KeyedAggregate
    from operators.base import InputTuple, Operator, OperatorContext
    from operators.runtime import OperatorRuntime, RunStats
    from operators.stateless import Filter, Map

_HOMES = {
    "Filter": "operators.stateless",
    "InputTuple": "operators.base",
    "KeyedAggregate": "operators.aggregate",
    "Map": "operators.stateless",
    "Operator": "operators.base",
    "OperatorContext": "operators.base",
    "OperatorRuntime": "operators.runtime",
    "RunStats": "operators.runtime",
}

__all__ = [
    "Filter",
    "InputTuple",
    "KeyedAggregate",
    "Map",
    "Operator",
    "OperatorContext",
    "OperatorRuntime",
    "RunStats",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'operators' has no attribute {name!r}")
    return getattr(import_module(home), name)
