"""Operators (aggregate, filter, map), their runtime, input sources and job hosting."""

from operators.aggregate import KeyedAggregate
from operators.base import InputTuple, Operator, OperatorContext
from operators.runtime import OperatorRuntime, RunStats
from operators.stateless import Filter, Map

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
