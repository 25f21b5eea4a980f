"""The kinds of value the Spark entry points take, checked before anything starts: a value of the wrong
type (`window_count="5"`, `available_now="yes"`, `key=5`) is one `ConfigError` line naming the keyword,
what it takes and what it got, instead of a Py4J traceback from inside a query, an executor's
`TypeError`, or (for a truthy string) a setting the user did not mean.

`checked_keywords(name, kinds)` wraps an entry point: each argument given by name or position whose
keyword is in `kinds` is checked; the rest is the entry point's own business (a value of the right type
but out of range is still refused there, with its own message). Only types are checked here, so a
keyword that an entry point validates further keeps its message.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, TypeVar

from cec.exceptions import ConfigError

__all__ = [
    "CEC_AGGREGATE_KEYWORDS",
    "READ_KEYWORDS",
    "Kind",
    "checked_keywords",
]

F = TypeVar("F", bound=Callable[..., Any])

_SHOWN = 60  # characters of a wrong value's repr in the message: one line, whatever was passed


@dataclass(frozen=True)
class Kind:
    """What a keyword takes: `words` for the message, `accepts` the test."""

    words: str
    accepts: Callable[[Any], bool]

    def __or__(self, other: Kind) -> Kind:
        return Kind(f"{self.words} or {other.words}", lambda v: self.accepts(v) or other.accepts(v))


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # True is an int to Python, not to a user


def _is_texts(value: Any) -> bool:
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str | bytes)
        and len(value) > 0
        and all(isinstance(v, str) for v in value)
    )


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def _is_text_mapping(value: Any) -> bool:
    return isinstance(value, Mapping) and all(isinstance(k, str) for k in value)


def _is_checkpointing(value: Any) -> bool:
    from cec.config import Checkpointing

    return isinstance(value, Checkpointing | Mapping)


NONE = Kind("None", lambda v: v is None)
TEXT = Kind("text (a str)", _is_text)
INTEGER = Kind("an integer", _is_int)
BOOLEAN = Kind("True or False", lambda v: isinstance(v, bool))
PATH = Kind("a path (str or pathlib.Path)", lambda v: isinstance(v, str | PurePath))
TEXTS = Kind("a non-empty list of field names", _is_texts)
# Its pairs' shape is the aggregate's to check (`operators.spark.aggregate_form`, with its own message).
PAIRS = Kind("a list of (function, column) pairs", _is_list)
TEXT_MAPPING = Kind("a dict with text keys", _is_text_mapping)
FUNCTION = Kind("a function", callable)
CHECKPOINTING = Kind("a cec.Checkpointing or its dict", _is_checkpointing)

# cec_aggregate's keywords (operators.spark.attach); `transform` and `results_topic` where it has them.
CEC_AGGREGATE_KEYWORDS: Mapping[str, Kind] = {
    "input_topic": TEXT,
    "bootstrap_servers": TEXT,
    "output_topic": TEXT,
    "key": TEXT | TEXTS,
    "value": TEXT | NONE,
    "state_dir": PATH,
    "checkpoint_location": PATH,
    "agg": TEXT | PAIRS,
    "window_count": INTEGER | NONE,
    "window_time": TEXT | INTEGER | NONE,
    "time": TEXT | NONE,
    "input_schema": TEXT | TEXT_MAPPING | TEXTS | NONE,
    "input_format": TEXT,
    "schema_registry_url": TEXT | NONE,
    "partitions": INTEGER | NONE,
    "available_now": BOOLEAN,
    "processing_time": TEXT | NONE,
    "max_records_per_trigger": INTEGER | NONE,
    "kafka_config": TEXT_MAPPING | NONE,
    "query_name": TEXT | NONE,
    "checkpointing": CHECKPOINTING | NONE,
    "metrics_port": INTEGER | NONE,
    "writers": TEXT,
    "allowed_lateness": TEXT | INTEGER | NONE,
    "input_reader": TEXT,
    "trim_every": INTEGER | NONE,
    "transform": FUNCTION | NONE,
    "results_topic": TEXT | NONE,
    "resume_checkpoint": BOOLEAN,
}

# read_results' and read_dead_letters' keywords (operators.spark.results).
READ_KEYWORDS: Mapping[str, Kind] = {
    "output_topic": TEXT,
    "bootstrap_servers": TEXT,
    "kafka_config": TEXT_MAPPING | NONE,
    "with_meta": BOOLEAN,
}


def _shown(value: Any) -> str:
    text = repr(value).replace("\n", " ")
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def check_keywords(name: str, kinds: Mapping[str, Kind], given: Mapping[str, Any]) -> None:
    """Raise one `ConfigError` line for the first value in `given` whose keyword's kind refuses it."""
    for keyword, value in given.items():
        kind = kinds.get(keyword)
        if kind is not None and not kind.accepts(value):
            raise ConfigError(
                f"{name}: {keyword} must be {kind.words}, got {_shown(value)} ({type(value).__name__})"
            )


def checked_keywords(name: str, kinds: Mapping[str, Kind]) -> Callable[[F], F]:
    """Wrap the entry point `name` so that its arguments are checked against `kinds` before it runs
    (module doc). Arguments that do not bind (a missing or unknown keyword) are left to Python's own
    TypeError, raised by the call itself."""

    def wrap(func: F) -> F:
        signature = inspect.signature(func)

        @functools.wraps(func)
        def checked(*args: Any, **kwargs: Any) -> Any:
            try:
                given = signature.bind_partial(*args, **kwargs).arguments
            except TypeError:
                given = kwargs
            check_keywords(name, kinds, given)
            return func(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return wrap
