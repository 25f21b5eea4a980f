"""Results as the tests compare them: `read_results` gives a time window's `start`/`end` as TimestampType
(Python datetimes, naive, in the session's local time); the tests' references are in epoch ms."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any


def epoch_ms(value: Any) -> Any:
    """A datetime as epoch milliseconds (exact: Spark's timestamps are microseconds); anything else as is."""
    if not isinstance(value, datetime):
        return value
    aware = value if value.tzinfo is not None else value.astimezone()  # naive: the local time zone
    delta = aware.astimezone(timezone.utc) - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return delta // _MS


_MS = datetime(1970, 1, 1, 0, 0, 0, 1000) - datetime(1970, 1, 1)
