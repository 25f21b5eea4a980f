"""Per-key windows of the aggregates: which window a tuple's time falls in, lateness against the event-time
watermark, and when a key's open window closes. Written once for `operators.aggregate.KeyedAggregate` and
`operators.multi_aggregate.MultiAggregate`.

One small class per window kind, each answering the same questions (`Windows`):
- `CountWindows`: tumbling over a key's tuples, closing on the N-th; a window's time is its tuples' times
  (offsets without a time field) and it has no end in time, so no watermark.
- `TumblingTimeWindows`: [start, start + D) with start aligned to D (a floor, also for negative times); the
  key's open window closes when its next tuple is at or past its end, or, with an allowed lateness, when
  the watermark passes its end.
- `HoppingTimeWindows`: Spark's `window(ts, size, slide)`: [start, start + size) with start a multiple of
  the slide; a tuple is in every window that contains its time (`starts_of`). Chosen by `hopping_windows`;
  the operator that keeps them is `operators.hopping`.
Session windows are not a class here: a session's bounds depend on its tuples, not on one tuple's time,
so `operators.sessions` keeps them itself (its module doc says how they close and merge).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from cec.exceptions import BadTupleError, ConfigError
from cec.timeparse import NonFiniteTimeError, parse_time_ms

__all__ = [
    "LONG_MAX",
    "LONG_MIN",
    "CountWindows",
    "HoppingTimeWindows",
    "TumblingTimeWindows",
    "Windows",
    "event_time_ms",
    "hopping_windows",
    "windows_for",
]

# Times, window bounds and counts are Avro longs in the log: anything outside cannot be written. A tuple
# that would put one there is dead-lettered *before* it changes anything, so that no encode error (and no
# crash loop on the same row at every restart) can come after a window changed.
LONG_MIN = -(1 << 63)
LONG_MAX = (1 << 63) - 1


def event_time_ms(value: Any, what: str, margin: int) -> int:
    """An event time in integer ms (`cec.timeparse.parse_time_ms`: integers exactly, also as ASCII text;
    other numbers only without a fraction; ISO-8601 and "YYYY-MM-DD HH:MM:SS", UTC without a zone). Must
    lie within `margin` of the Avro long range (a time window's bounds are `margin` = D away from it)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise BadTupleError(f"missing {what}")
    try:
        t = parse_time_ms(value)
    except NonFiniteTimeError:
        raise BadTupleError(f"{what} is not finite: {value!r:.80}") from None
    except (TypeError, ValueError):
        raise BadTupleError(
            f"{what} is neither integer milliseconds nor an ISO-8601 time: {value!r:.80}"
        ) from None
    except OverflowError:  # an integer beyond any double
        raise BadTupleError(f"{what} is out of range: {value!r:.80}") from None
    if not LONG_MIN + margin <= t <= LONG_MAX - margin:
        bound = "the 64-bit range" if not margin else f"the 64-bit range less the window ({margin} ms)"
        raise BadTupleError(f"{what} is out of range: {value!r:.40} is beyond {bound}")
    return t


class Windows(ABC):
    """The windows of one aggregate: a key's tuples, in that key's input order, fall into a run of windows
    of which at most one is open. `time_field` None: a tuple's time is its offset in its partition."""

    __slots__ = ("_last_time", "allowed_lateness", "time_field")

    def __init__(self, time_field: str | None, allowed_lateness: int | None) -> None:
        self.time_field = time_field
        self.allowed_lateness = allowed_lateness
        # The last text time parsed and its result: the engine asks a tuple's time before the operator
        # does (`OperatorInstance._plain_run`), and parsing text twice was a tenth of a time window's
        # per-tuple cost. Keyed by the very str object (immutable, held here so its id is not reused), so
        # it can only ever answer for the same text; one tuple attribute, so threads sharing the
        # operator never read one's text with another's time.
        self._last_time: tuple[object, int] = (None, 0)

    @abstractmethod
    def describe(self) -> str:
        """The windows as `Operator.describe` names them, e.g. "tumbling count=3"."""

    def event_time(self, value: Mapping[str, Any]) -> int | None:
        """The tuple's event time (ms), None without a time field; BadTupleError for a bad one."""
        if self.time_field is None:
            return None
        raw = value.get(self.time_field)
        last = self._last_time
        if raw is last[0] and raw is not None:
            return last[1]
        t = event_time_ms(raw, f"time {self.time_field!r}", self.margin)
        if type(raw) is str:
            self._last_time = (raw, t)
        return t

    @property
    def margin(self) -> int:
        """How far from the Avro long range an event time must stay (a window's bounds lie that far)."""
        return 0

    @abstractmethod
    def start_of(self, t: int) -> int:
        """The start of the window a tuple at time `t` opens (its key has no open window)."""

    @abstractmethod
    def closes_before(self, t: int, open_start: int | None, watermark: int | None) -> bool:
        """Admit a tuple at time `t` whose key's open window starts at `open_start` (None: no open window)
        under `watermark` (None: the host has none): True when the open window closes before the tuple
        goes into a new one. BadTupleError (a dead letter, nothing changed) for a late tuple."""

    @abstractmethod
    def is_full(self, count: int) -> bool:
        """Whether a window holding `count` tuples closes now (after its latest tuple went in)."""

    @abstractmethod
    def end_of(self, start: int, last: int) -> int:
        """A closed window's `end` in its result: `start` its start, `last` its last tuple's time."""

    @property
    def closed_by_watermark(self) -> bool:
        """Whether the watermark closes these windows (else only a key's own tuples do)."""
        return False

    def watermark_end(self, start: int) -> int | None:
        """Where the watermark closes a window starting at `start` (None: only its key closes it)."""
        return None


class CountWindows(Windows):
    """Tumbling windows of `size` tuples of a key."""

    __slots__ = ("size",)

    def __init__(self, size: int, time_field: str | None) -> None:
        super().__init__(time_field, None)
        self.size = size

    def describe(self) -> str:
        return f"tumbling count={self.size}"

    def start_of(self, t: int) -> int:
        return t

    def closes_before(self, t: int, open_start: int | None, watermark: int | None) -> bool:
        return False

    def is_full(self, count: int) -> bool:
        return count >= self.size

    def end_of(self, start: int, last: int) -> int:
        return last


class _SizedTimeWindows(Windows):
    """Time windows [start, start + size_ms) (tumbling, hopping): never full by count, ended by their size,
    closed by the watermark when there is an allowed lateness."""

    __slots__ = ()
    size_ms: int

    def is_full(self, count: int) -> bool:
        return False

    def end_of(self, start: int, last: int) -> int:
        return start + self.size_ms

    @property
    def closed_by_watermark(self) -> bool:
        return self.allowed_lateness is not None

    def watermark_end(self, start: int) -> int | None:
        if self.allowed_lateness is None:
            return None
        return start + self.size_ms

    @property
    def margin(self) -> int:
        return self.size_ms

    def _with_lateness(self, window: str) -> str:
        """`describe`'s text of the windows, with the watermark's lateness when there is one."""
        if self.allowed_lateness is not None:
            window += f", watermark lateness {self.allowed_lateness}ms"
        return window


class TumblingTimeWindows(_SizedTimeWindows):
    """Tumbling windows [start, start + size_ms) with start a multiple of size_ms."""

    __slots__ = ("size_ms",)

    def __init__(self, size_ms: int, time_field: str, allowed_lateness: int | None) -> None:
        super().__init__(time_field, allowed_lateness)
        self.size_ms = size_ms

    def describe(self) -> str:
        return self._with_lateness(f"tumbling time={self.size_ms}ms")

    def start_of(self, t: int) -> int:
        return t - t % self.size_ms  # Python's % floors: -1 is in [-size, 0)

    def closes_before(self, t: int, open_start: int | None, watermark: int | None) -> bool:
        size = self.size_ms
        if self.allowed_lateness is not None and watermark is not None:
            start = t - t % size
            if start + size <= watermark:
                raise BadTupleError(f"late: window [{start}, {start + size}) closed at watermark {watermark}")
        if open_start is None:
            return False
        if t < open_start:
            raise BadTupleError(f"late tuple: time {t} is before its key's open window [{open_start}, ...)")
        return t >= open_start + size

    def index(self, start: int) -> int:
        """The number of the window starting at `start` (start / size): a window that is a part of its own
        is numbered by where it lies, not per key."""
        return start // self.size_ms


def windows_for(
    *,
    window_count: int | None,
    window_ms: int | None,
    time_field: str | None,
    allowed_lateness: int | None,
) -> CountWindows | TumblingTimeWindows:
    """The windows an aggregate's options describe; ConfigError for options that do not make one."""
    if (window_count is None) == (window_ms is None):
        raise ConfigError("give exactly one of a count window or a time window")
    if window_count is not None and window_count < 1:
        raise ConfigError(f"a count window needs at least 1 tuple, got {window_count}")
    if window_ms is not None and window_ms < 1:
        raise ConfigError(f"a time window needs at least 1 ms, got {window_ms}")
    if window_ms is not None and time_field is None:
        raise ConfigError("a time window needs a time field")
    if allowed_lateness is not None:
        if window_ms is None:
            raise ConfigError("an allowed lateness (event-time watermarks) needs a time window")
        if allowed_lateness < 0:
            raise ConfigError(f"the allowed lateness must be >= 0 ms, got {allowed_lateness}")
    if window_count is not None:
        return CountWindows(window_count, time_field)
    assert window_ms is not None and time_field is not None
    return TumblingTimeWindows(window_ms, time_field, allowed_lateness)


class HoppingTimeWindows(_SizedTimeWindows):
    """Hopping windows [start, start + size_ms) with start a multiple of slide_ms (which divides size_ms):
    k = size / slide windows hold each time. Their state is kept per pane ([p, p + slide), p a multiple of
    the slide) and per period ([e, e + size), e a multiple of the size), `operators.hopping`."""

    __slots__ = ("panes", "size_ms", "slide_ms")

    def __init__(self, size_ms: int, slide_ms: int, time_field: str, allowed_lateness: int | None) -> None:
        super().__init__(time_field, allowed_lateness)
        self.size_ms = size_ms
        self.slide_ms = slide_ms
        self.panes = size_ms // slide_ms  # k: the windows (and panes of a window) per time

    def describe(self) -> str:
        return self._with_lateness(f"hopping time={self.size_ms}ms slide={self.slide_ms}ms")

    def pane_of(self, t: int) -> int:
        """The start of the pane that holds time `t`."""
        return t - t % self.slide_ms

    def period_of(self, t: int) -> int:
        """The start of the size-aligned period that holds time `t` (a window spans at most two)."""
        return t - t % self.size_ms

    def starts_of(self, t: int) -> range:
        """The starts of every window that holds time `t`, the earliest first."""
        pane = self.pane_of(t)
        return range(pane - self.size_ms + self.slide_ms, pane + 1, self.slide_ms)

    def start_of(self, t: int) -> int:
        return self.pane_of(t)

    def closes_before(self, t: int, open_start: int | None, watermark: int | None) -> bool:
        return False  # several windows are open per key: `operators.hopping` closes them


def hopping_windows(
    *, window_ms: int | None, slide_ms: int, time_field: str | None, allowed_lateness: int | None
) -> HoppingTimeWindows:
    """The hopping windows of `--window-time` and `--slide`; ConfigError for options that do not make them."""
    if window_ms is None:
        raise ConfigError("a slide needs a time window (--slide needs --window-time)")
    if window_ms < 1 or slide_ms < 1:
        raise ConfigError(
            f"a hopping window needs a size and a slide of at least 1 ms, got {window_ms}, {slide_ms}"
        )
    if slide_ms > window_ms:
        raise ConfigError(f"the slide ({slide_ms} ms) is larger than the window ({window_ms} ms)")
    if window_ms % slide_ms:
        raise ConfigError(
            f"the slide ({slide_ms} ms) must divide the window ({window_ms} ms): windows are combined from "
            "slide-wide panes"
        )
    if time_field is None:
        raise ConfigError("a time window needs a time field")
    if allowed_lateness is not None and allowed_lateness < 0:
        raise ConfigError(f"the allowed lateness must be >= 0 ms, got {allowed_lateness}")
    return HoppingTimeWindows(window_ms, slide_ms, time_field, allowed_lateness)
