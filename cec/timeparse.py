"""Durations, event times and numbers as users write them: one parser each, shared by the CLI, the job
specs, `cec.config`, the operators and `operators.spark.attach.cec_aggregate`.

- durations: "500ms", "10s", "5m", "1h", "1d", "2.5 s", and Spark's interval forms "500 milliseconds",
  "10 seconds", "5 minutes", "1 hour", "interval 1 hour 30 minutes" (a sum of number-unit pairs);
- event times: integers (milliseconds since the epoch, also as text), ISO-8601 ("2024-05-01T12:00:00Z",
  "2024-05-01T12:00:00.250+02:00", "2024-05-01") and "YYYY-MM-DD HH:MM:SS[.fff]"; a time without a zone
  is UTC. Parsed by `datetime.fromisoformat` (C code), after the integer fast path;
- numbers in data given as text (a CSV field, a JSON string): ASCII decimal only (`number_from_text`).

Data is read as a demanding user (and JSON, Avro, Spark) would: Python's int() / float() also take
"1_000", surrounding whitespace and other scripts' digits ("١٢"); cec does not.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta, timezone
from typing import Any

from cec.exceptions import ConfigError, TimeFormatError

__all__ = [
    "NonFiniteTimeError",
    "format_time_ms",
    "number_from_text",
    "parse_duration_ms",
    "parse_duration_s",
    "parse_time_ms",
]

_UNITS_S: dict[str, float] = {
    "ms": 0.001,
    "msec": 0.001,
    "msecs": 0.001,
    "millisecond": 0.001,
    "milliseconds": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hrs": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
    "w": 604800.0,
    "week": 604800.0,
    "weeks": 604800.0,
}
_PAIR = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)")
_EXAMPLES = "use e.g. 500ms, 10s, 5m, 1h, or Spark's 500 milliseconds, 10 seconds, 5 minutes, 1 hour"


def _duration_seconds(value: str | float | int, what: str, bare_unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(f"{what}: {value!r} is not a duration ({_EXAMPLES})")
    if isinstance(value, (int, float)):
        seconds = float(value) * _UNITS_S[bare_unit]
    else:
        text = value.strip().lower()
        if text.startswith("interval "):  # Spark SQL's literal form
            text = text[len("interval ") :]
        seconds, at, pairs = 0.0, 0, 0
        while at < len(text):
            match = _PAIR.match(text, at)
            unit = match.group(2) if match else None
            if match is None or (unit and unit not in _UNITS_S) or (not unit and pairs):
                raise ConfigError(f"{what}: {value!r} is not a duration ({_EXAMPLES})")
            seconds += float(match.group(1)) * _UNITS_S[unit or bare_unit]
            at, pairs = match.end(), pairs + 1
            if at < len(text) and not text[at].isspace() and not unit:
                raise ConfigError(f"{what}: {value!r} is not a duration ({_EXAMPLES})")
            while at < len(text) and text[at].isspace():
                at += 1
        if pairs == 0:
            raise ConfigError(f"{what}: {value!r} is not a duration ({_EXAMPLES})")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{what} must be positive, got {value!r}")
    return seconds


def parse_duration_s(value: str | float | int, what: str = "duration") -> float:
    """Seconds from "3s", "500ms", "2 minutes", "1.5h" or a number of seconds; positive and finite."""
    return _duration_seconds(value, what, "s")


def parse_duration_ms(value: str | int, what: str = "window duration") -> int:
    """Whole milliseconds from "250ms", "10s", "5 minutes", "1 hour" or a bare number of milliseconds."""
    ms = round(_duration_seconds(value, what, "ms") * 1000, 6)
    if ms < 1 or ms != int(ms):
        raise ConfigError(f"{what} must be a whole number of milliseconds >= 1, got {value!r}")
    return int(ms)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)


def _plain_ascii(text: str) -> bool:
    """Text that int() / float() read as a demanding user would: ASCII, no "_" digit separators, no
    surrounding whitespace."""
    return text.isascii() and "_" not in text and text == text.strip()


def number_from_text(text: str) -> float:
    """A number written as text: float() of an ASCII decimal number (digits, an optional sign, decimal
    point and exponent; "nan" and "inf" read as themselves, for the caller to refuse as not finite).
    ValueError for anything else, "1_000", " 12 " and "١٢" included."""
    x = float(text)
    if not _plain_ascii(text):
        raise TimeFormatError(f"not an ASCII decimal number: {text!r:.80}")
    return x


def parse_time_ms(value: Any) -> int:
    """An event time in integer milliseconds since the epoch, from an integer (or its ASCII decimal text),
    a number with no fraction (1000.0, "1e3"), a datetime (floored to the millisecond), or an ISO-8601 /
    "YYYY-MM-DD HH:MM:SS" text (UTC when it has no zone; floored to the millisecond). Raises ValueError
    (with the reason) for anything else, a number with a fraction (1000.5) included."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, datetime):  # a timestamp column (Spark's TimestampType, pandas): UTC if naive
        moment = value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
        return (moment - _EPOCH) // _MS
    if isinstance(value, str):
        if not value:
            raise TimeFormatError("empty")
        if not _plain_ascii(value):
            raise TimeFormatError(
                "neither integer milliseconds nor an ISO-8601 time (ASCII, no spaces around)"
            )
        try:
            return int(value)
        except ValueError:
            pass
        try:
            x = float(value)  # "1e3": a number of milliseconds
        except ValueError:
            return _iso_ms(value)
        return _whole_ms(x)
    if value is None or isinstance(value, bool):
        raise TimeFormatError("not a time")
    return _whole_ms(float(value))


class NonFiniteTimeError(TimeFormatError):
    """A time given as nan or infinity (a `cec.CecError`, and a ValueError as before)."""


def _whole_ms(x: float) -> int:
    if not math.isfinite(x):
        raise NonFiniteTimeError("not finite")
    if not x.is_integer():
        raise TimeFormatError(f"not a whole number of milliseconds: {x!r}")
    return int(x)


def _iso_ms(text: str) -> int:
    if text.endswith(("Z", "z")):  # fromisoformat takes "Z" only from Python 3.11
        text = text[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise TimeFormatError("neither integer milliseconds nor an ISO-8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return (moment - _EPOCH) // _MS


def format_time_ms(ms: int) -> str:
    """ISO-8601 UTC with milliseconds ("2024-05-01T12:00:00.000Z"); the integer when beyond years 1-9999."""
    try:
        moment = _EPOCH + timedelta(milliseconds=ms)
    except OverflowError:
        return str(ms)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
