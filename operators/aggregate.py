"""Keyed aggregate over tumbling windows: count-based or time-based; count, sum, avg, min, max.

Windows are per key and tumbling. A count window closes on its N-th tuple. A time window of duration D
covers [start, start + D) with start aligned to D; it closes when the next tuple of the same key falls at
or past its end (a per-key trigger: the result then depends only on that key's input order, which is
what makes recovery exact with several input partitions). A tuple older than its key's open window is
late and goes to the dead letters. Windows still open at the end of input emit nothing.

With an allowed lateness L (`allowed_lateness`, ms), a time window also closes when the event-time
watermark (max event time per input partition less L, min over partitions: `recovery.contract`) passes
its end, whether or not its key comes back; a tuple whose window ends at or before the watermark is late
(dead letter, reason "late: ..."). An idle key then no longer holds a window open for ever.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from math import copysign
from operator import attrgetter
from typing import Any

from cec.exceptions import BadTupleError, ConfigError
from cec.records import AvroCodec
from cec.registry import OpenWindow
from cec.timeparse import number_from_text, parse_duration_ms
from operators.base import InputTuple, Operator, OperatorContext
from operators.windows import LONG_MAX, LONG_MIN, CountWindows, TumblingTimeWindows, Windows, windows_for

__all__ = [
    "AGGREGATES",
    "AggState",
    "KeyedAggregate",
    "canonical_key",
    "parse_duration_ms",
    "parse_lateness_ms",
]

AGGREGATES = ("avg", "sum", "count", "min", "max")

RESULT_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "AggregateResult",
    "namespace": "cec.operators",
    "fields": [
        {"name": "key", "type": "string"},
        {"name": "window", "type": "long"},
        {"name": "value", "type": "double"},
        {"name": "count", "type": "long"},
        {"name": "start", "type": "long"},
        {"name": "end", "type": "long"},
    ],
}
STATE_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "AggregateState",
    "namespace": "cec.operators",
    "fields": [
        {"name": "count", "type": "long"},
        {"name": "total", "type": "double"},
        {"name": "lo", "type": "double"},
        {"name": "hi", "type": "double"},
        {"name": "start", "type": "long"},
        {"name": "last", "type": "long"},
    ],
}

# A window's state after its first tuple (every G-open of the paper's aggregate) has count 1 and
# total = lo = hi: its footprint carries the value once, with `start` and `last - start` (0 for a count
# window), behind a tag byte that STATE_SCHEMA's encoding never starts with (its count, >= 1, zigzags to
# an even first byte). 13 bytes instead of 31 at 1,000 keys (benchmarks/RESULTS.md, "Bytes per input tuple").
FIRST_TUPLE_TAG = 0x01
FIRST_TUPLE_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "AggregateFirstTuple",
    "namespace": "cec.operators",
    "fields": [
        {"name": "value", "type": "double"},
        {"name": "start", "type": "long"},
        {"name": "span", "type": "long"},
    ],
}


def parse_lateness_ms(lateness: str | int) -> int:
    """An allowed lateness (`cec run --allowed-lateness`, `cec_aggregate(allowed_lateness=...)`): a duration
    such as "10s", or 0 (no lateness allowed, still event-time watermarks); an int is milliseconds."""
    if isinstance(lateness, int):
        if lateness < 0:
            raise ConfigError(f"allowed lateness must be >= 0, got {lateness}")
        return lateness
    if lateness.strip() in ("0", "0ms", "0s"):
        return 0
    return parse_duration_ms(lateness)


def _same_double(a: float, b: float) -> bool:
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)  # 0.0 and -0.0 differ in the log


_FIRST_TUPLE_HEAD = bytes((FIRST_TUPLE_TAG,))
_STATE_FIELDS = attrgetter("count", "total", "lo", "hi", "start", "last")  # STATE_SCHEMA's order


@dataclass(slots=True)
class AggState:
    count: int
    total: float
    lo: float
    hi: float
    start: int  # time window: aligned start; count window: event time (or offset) of the first tuple
    last: int  # event time (or offset) of the last tuple

    def add(self, x: float, t: int) -> None:
        self.count += 1
        self.total += x
        if x < self.lo:
            self.lo = x
        if x > self.hi:
            self.hi = x
        self.last = t


# Times, window bounds and counts are Avro longs in the log (`operators.windows.LONG_MIN`, `LONG_MAX`).
_EXACT_INT = 1 << 53  # ints up to this convert to a double exactly and cheaply


def _number(value: Any, what: str) -> float:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise BadTupleError(f"missing {what}")
    if isinstance(value, bool):
        raise BadTupleError(f"{what} is not a number: {value!r}")
    try:
        # Text (a CSV field, a JSON string "12.5") only as an ASCII decimal number: not "1_000", " 12 ", "١٢"
        x = number_from_text(value) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        raise BadTupleError(f"{what} is not a number: {value!r:.80}") from None
    except OverflowError:  # an integer beyond any double
        raise BadTupleError(f"{what} is out of range: {value!r:.80}") from None
    if not math.isfinite(x):
        raise BadTupleError(f"{what} is not finite: {value!r:.80}")
    return x


def canonical_key(raw: Any, field: str) -> str | None:
    """A key field's value as the window id's key: THE key rule, the same for every host (the Spark sources
    that pack rows per state partition call this too) and every input format.

    A key is text, compared exactly (no stripping, no case folding):
    - a string is the key as it is; one that is empty or only whitespace is a missing key (None);
    - an integer (JSON, Avro int/long) is its decimal text, so JSON `5` and `"5"` are one key, as they are
      in a CSV file (where every field is text) and in a Spark string column;
    - a boolean is `true` or `false` (JSON's spelling, Spark's cast to string), so `true` and `"true"` are
      one key and `"True"` another;
    - anything else (a floating-point number, bytes, an object or array) is not a key: `BadTupleError`.
      `5.0` would be `5.0` here and `5` in another producer's output: refusing it keeps equal numbers from
      becoming two keys silently.
    Text that cannot be UTF-8 (bytes that were not, kept exactly by the source as lone surrogates, or an
    escaped lone surrogate in JSON) is refused, never replaced: a replacement would merge it with other keys.
    """
    if raw is None:
        return None
    kind = type(raw)
    if kind is str:
        key: str = raw
        if not key or key.isspace():
            return None
    elif kind is bool:
        key = "true" if raw else "false"
    elif isinstance(raw, int):
        try:
            key = str(int(raw))
        except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
            raise BadTupleError(f"key {field!r} is an integer too long to be a key") from None
    else:
        raise BadTupleError(
            f"key {field!r} is {_kind_name(raw)} ({raw!r:.40}): a key is text, an integer or a boolean"
        )
    if not key.isascii():
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            # Bytes that were not UTF-8 (kept exactly by the source as lone surrogates): such a key cannot
            # be written, and replacing its bytes would merge it with other keys.
            data = key.encode("utf-8", "surrogateescape" if _only_escapes(key) else "backslashreplace")
            raise BadTupleError(f"key {field!r} is not valid UTF-8: {data!r:.80}") from None
    return key


def plain_key(raw: Any) -> str | None:
    """`canonical_key` of the common key, plain ASCII text or an int, in fewer steps (the aggregates'
    per-tuple fast paths); None for any other value, which `canonical_key` then decides."""
    if type(raw) is str:
        if not raw or not raw.isascii() or raw.isspace():
            return None  # a missing key, or text whose UTF-8 `canonical_key` checks
        return raw
    if type(raw) is int:
        try:
            return str(raw)
        except ValueError:  # more digits than Python converts: `canonical_key` says why
            return None
    return None


def open_window_of(
    ctx: OperatorContext, key: str, t: int, windows: Windows, *, by_watermark: bool
) -> tuple[OpenWindow | None, bool]:
    """The key's open window, if any, and whether a tuple at time `t` closes it first (its bounds, or the
    watermark when `by_watermark`)."""
    window = ctx.registry.get(key)
    # A host without watermarks (the Spark attach path) has no `watermark`: per-key closing only.
    watermark: int | None = getattr(ctx, "watermark", None) if by_watermark else None
    return window, windows.closes_before(t, None if window is None else window.state.start, watermark)


def _kind_name(raw: Any) -> str:
    if isinstance(raw, float):
        return "a floating-point number"
    if isinstance(raw, (bytes, bytearray)):
        return "bytes"
    if isinstance(raw, Mapping):
        return "an object"
    if isinstance(raw, (list, tuple)):
        return "an array"
    return f"a {type(raw).__name__}"


def _only_escapes(text: str) -> bool:
    """Whether every lone surrogate of `text` is one `surrogateescape` made (U+DC80-U+DCFF: an undecodable
    byte kept by the source), so encoding back gives the input's bytes."""
    return all(not 0xD800 <= ord(c) <= 0xDFFF or 0xDC80 <= ord(c) <= 0xDCFF for c in text)


class KeyedAggregate(Operator):
    name = "aggregate"
    result_schema = RESULT_SCHEMA
    state_schema = STATE_SCHEMA

    def __init__(
        self,
        *,
        key_field: str,
        value_field: str,
        agg: str = "avg",
        window_count: int | None = None,
        window_ms: int | None = None,
        time_field: str | None = None,
        allowed_lateness: int | None = None,
    ) -> None:
        if agg not in AGGREGATES:
            raise ConfigError(f"unknown aggregate {agg!r}; choose one of {', '.join(AGGREGATES)}")
        self.windows: CountWindows | TumblingTimeWindows = windows_for(
            window_count=window_count,
            window_ms=window_ms,
            time_field=time_field,
            allowed_lateness=allowed_lateness,
        )
        self.allowed_lateness = allowed_lateness
        self.key_field = key_field
        self.value_field = value_field
        self.agg = agg
        self.window_count = window_count
        self.window_ms = window_ms
        self.time_field = time_field
        self._state_codec = AvroCodec(STATE_SCHEMA)
        self._first_codec = AvroCodec(FIRST_TUPLE_SCHEMA)
        # A count window over input order (no event time, no watermark): `process` takes a shorter path
        # for the common tuple (a float value, a plain text or integer key); anything else takes the full one.
        self._plain_count = window_count is not None and time_field is None and allowed_lateness is None

    def describe(self) -> str:
        return f"{self.agg}({self.value_field}) by {self.key_field}, {self.windows.describe()}"

    def key_of(self, value: Mapping[str, Any]) -> str | None:
        return canonical_key(value.get(self.key_field), self.key_field)

    def event_time(self, value: Mapping[str, Any]) -> int | None:
        return self.windows.event_time(value)

    def process(self, tup: InputTuple, ctx: OperatorContext) -> None:
        if self._plain_count and self._process_count(tup, ctx):
            return
        self._process(tup, ctx)

    def _process_count(self, tup: InputTuple, ctx: OperatorContext) -> bool:
        """`_process` for a count window over input order when the key is plain ASCII text or an int and
        the value a finite float or an int: the same checks and effects, fewer steps (the per-tuple path of
        throughput). False, with nothing changed, for any other tuple: `_process` then decides."""
        value = tup.value
        assert value is not None
        key = plain_key(value.get(self.key_field))
        if key is None:
            return False
        x = value.get(self.value_field)
        if type(x) is int:
            if not -_EXACT_INT <= x <= _EXACT_INT:
                return False  # _process converts (or refuses) it
            x = float(x)
        elif type(x) is not float or x - x != 0.0:  # not a number, or not finite (inf - inf, nan: nan)
            return False
        t = tup.offset
        window = ctx.registry.get(key)
        if window is None:
            window = ctx.open_window(key, AggState(1, x, x, x, t, t))
            state = window.state
        else:
            state = window.state
            total = state.total + x
            if total - total != 0.0:
                return False  # _process dead-letters it (the sum would overflow)
            state.count += 1
            state.total = total
            if x < state.lo:
                state.lo = x
            if x > state.hi:
                state.hi = x
            state.last = t
        assert self.window_count is not None
        if state.count >= self.window_count:
            ctx.close_window(key, self._result(key, window.seq, state))
        return True

    def _process(self, tup: InputTuple, ctx: OperatorContext) -> None:
        assert tup.value is not None
        key = self.key_of(tup.value)
        if key is None:
            raise BadTupleError(f"missing key {self.key_field!r}")
        x = _number(tup.value.get(self.value_field), f"value {self.value_field!r}")
        # Window bounds must depend on this key's input only (not on how partitions interleave): event time
        # when there is one, else the tuple's offset in its partition.
        t = self.event_time(tup.value) if self.time_field else tup.offset
        assert t is not None
        windows = self.windows
        window, closes = open_window_of(ctx, key, t, windows, by_watermark=windows.closed_by_watermark)
        if window is not None and not closes and not math.isfinite(window.state.total + x):
            raise BadTupleError(f"value {self.value_field!r} {x!r} would overflow its window's sum")
        # Every check is done: from here on the tuple changes state and cannot fail.
        if closes:
            assert window is not None
            ctx.close_window(key, self._result(key, window.seq, window.state))
            window = None
        if window is None:
            window = ctx.open_window(key, AggState(1, x, x, x, windows.start_of(t), t))
        else:
            window.state.add(x, t)
        if windows.is_full(window.state.count):
            ctx.close_window(key, self._result(key, window.seq, window.state))

    def window_end(self, state: AggState) -> int | None:
        return self.windows.watermark_end(state.start)

    def expire(self, key: str, seq: int, state: AggState) -> dict[str, Any]:
        return self._result(key, seq, state)

    def _result(self, key: str, seq: int, state: AggState) -> dict[str, Any]:
        if self.agg == "avg":
            value = state.total / state.count
        elif self.agg == "sum":
            value = state.total
        elif self.agg == "count":
            value = float(state.count)
        elif self.agg == "min":
            value = state.lo
        else:
            value = state.hi
        end = self.windows.end_of(state.start, state.last)
        return {
            "key": key,
            "window": seq,
            "value": value,
            "count": state.count,
            "start": state.start,
            "end": end,
        }

    def encode_state(self, state: AggState) -> bytes:
        # Field order of STATE_SCHEMA is AggState's (as decode_state relies on).
        return self._state_codec.encode_tuple(
            (state.count, state.total, state.lo, state.hi, state.start, state.last)
        )

    def encode_footprint(self, state: AggState) -> bytes:
        total, lo, hi = state.total, state.lo, state.hi
        # One tuple in, and lo, hi that same double: as a rule the very object (AggState(1, x, x, x, ...)).
        if state.count == 1 and (
            (total is lo and total is hi) or (_same_double(total, lo) and _same_double(total, hi))
        ):
            span = state.last - state.start
            if LONG_MIN <= span <= LONG_MAX:
                return _FIRST_TUPLE_HEAD + self._first_codec.encode_tuple((state.total, state.start, span))
        return self.encode_state(state)

    def encode_footprints(self, states: list[AggState]) -> list[bytes]:
        """`encode_footprint` of every state (a run of G-checks): the full forms in one C call, then the
        first-tuple forms of the states that have one in another."""
        rows = list(map(_STATE_FIELDS, states))  # in STATE_SCHEMA's field order
        out = self._state_codec.encode_tuples(rows)
        at: list[int] = []
        firsts: list[tuple[float, int, int]] = []
        for i, (count, total, lo, hi, start, last) in enumerate(rows):
            # encode_footprint's test, inline: one tuple in, and lo, hi that same double (-0.0 is not 0.0)
            if (
                count == 1
                and total == lo == hi
                and copysign(1.0, total) == copysign(1.0, lo) == copysign(1.0, hi)
            ):
                span = last - start
                if LONG_MIN <= span <= LONG_MAX:
                    at.append(i)
                    firsts.append((total, start, span))
        if firsts:
            head = _FIRST_TUPLE_HEAD
            for i, data in zip(at, self._first_codec.encode_tuples(firsts), strict=True):
                out[i] = head + data
        return out

    def decode_state(self, data: bytes) -> AggState:
        if data[:1] == _FIRST_TUPLE_HEAD:
            x, start, span = self._first_codec.decode_tuple(data, 1)
            return AggState(1, x, x, x, start, start + span)
        # Field order of STATE_SCHEMA is AggState's: EC-load decodes one state per open window.
        return AggState(*self._state_codec.decode_tuple(data))

    def decode_states(self, datas: list[bytes]) -> list[AggState]:
        """`decode_state` of each, the full forms in one C call and the first-tuple forms in another (EC-load,
        91,600 states, quiet: 0.085-0.19 s one by one, 0.054-0.08 s so; benchmarks/RESULTS.md)."""
        head = _FIRST_TUPLE_HEAD
        first_form = [data[:1] == head for data in datas]
        if True not in first_form:
            return self._state_codec.decode_slots(datas, AggState)
        firsts = [
            AggState(1, x, x, x, start, start + span)
            for x, start, span in self._first_codec.decode_tuples(
                [d for d, f in zip(datas, first_form, strict=True) if f], 1
            )
        ]
        if False not in first_form:
            return firsts
        fulls = self._state_codec.decode_slots(
            [d for d, f in zip(datas, first_form, strict=True) if not f], AggState
        )
        # Both forms, back in the bodies' order.
        next_first, next_full = iter(firsts).__next__, iter(fulls).__next__
        return [next_first() if f else next_full() for f in first_form]
