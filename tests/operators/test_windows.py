"""operators.windows: which window a time falls in, lateness, and when a key's open window closes, at the
boundaries (t exactly at start + size, at the watermark, negative times)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cec.exceptions import BadTupleError, ConfigError
from operators.windows import (
    LONG_MAX,
    LONG_MIN,
    CountWindows,
    TumblingTimeWindows,
    event_time_ms,
    windows_for,
)


def _time(size: int = 10, lateness: int | None = None) -> TumblingTimeWindows:
    windows = windows_for(window_count=None, window_ms=size, time_field="ts", allowed_lateness=lateness)
    assert isinstance(windows, TumblingTimeWindows)
    return windows


@pytest.mark.parametrize(
    ("t", "start"),
    [(0, 0), (9, 0), (10, 10), (11, 10), (19, 10), (-1, -10), (-10, -10), (-11, -20)],
)
def test_time_window_start_is_the_floor_to_the_size(t: int, start: int) -> None:
    assert _time().start_of(t) == start


def test_time_window_closes_at_exactly_its_end_and_not_before() -> None:
    windows = _time()
    assert windows.closes_before(19, 10, None) is False
    assert windows.closes_before(20, 10, None) is True  # [10, 20): 20 is the next window's
    assert windows.closes_before(-11, -20, None) is False
    assert windows.closes_before(-10, -20, None) is True
    assert windows.closes_before(5, None, None) is False  # no open window: nothing closes


def test_tuple_before_its_keys_open_window_is_late_with_the_message_of_the_log() -> None:
    windows = _time()
    assert windows.closes_before(10, 10, None) is False  # at the start: inside
    with pytest.raises(BadTupleError) as err:
        windows.closes_before(9, 10, None)
    assert str(err.value) == "late tuple: time 9 is before its key's open window [10, ...)"


def test_watermark_at_a_windows_end_makes_its_tuples_late() -> None:
    windows = _time(lateness=0)
    assert windows.closes_before(19, None, 19) is False  # window [10, 20) still open at watermark 19
    with pytest.raises(BadTupleError) as err:
        windows.closes_before(19, None, 20)
    assert str(err.value) == "late: window [10, 20) closed at watermark 20"
    with pytest.raises(BadTupleError, match=r"late: window \[-10, 0\) closed at watermark 0"):
        windows.closes_before(-1, None, 0)
    assert windows.closes_before(20, None, 20) is False  # the next window is open


def test_watermark_is_checked_before_the_keys_open_window() -> None:
    # A tuple both late for the watermark and before its key's window: the watermark's message.
    with pytest.raises(BadTupleError, match=r"^late: window"):
        _time(lateness=0).closes_before(5, 10, 10)


def test_without_allowed_lateness_or_without_a_watermark_nothing_is_late_for_the_watermark() -> None:
    assert _time().closes_before(5, None, 1_000) is False  # no lateness: watermarks ignored
    assert _time(lateness=0).closes_before(5, None, None) is False  # a host without watermarks
    assert _time().watermark_end(10) is None
    assert not _time().closed_by_watermark
    assert _time(lateness=5).watermark_end(10) == 20
    assert _time(lateness=5).closed_by_watermark


def test_time_window_result_end_and_index() -> None:
    windows = _time()
    assert windows.end_of(10, 13) == 20
    assert windows.index(-20) == -2
    assert windows.index(30) == 3


def test_count_window_is_full_on_its_nth_tuple_and_never_closes_by_time() -> None:
    windows = windows_for(window_count=3, window_ms=None, time_field=None, allowed_lateness=None)
    assert isinstance(windows, CountWindows)
    assert [windows.is_full(n) for n in (1, 2, 3)] == [False, False, True]
    assert windows.start_of(-7) == -7
    assert windows.end_of(-7, 42) == 42
    assert windows.closes_before(0, 100, 1_000) is False  # a count window's key may go back in time
    assert windows.watermark_end(0) is None
    assert not _time().is_full(10**9)


def test_describe() -> None:
    assert CountWindows(3, None).describe() == "tumbling count=3"
    assert _time().describe() == "tumbling time=10ms"
    assert _time(lateness=5).describe() == "tumbling time=10ms, watermark lateness 5ms"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "give exactly one of a count window or a time window"),
        ({"window_count": 2, "window_ms": 10}, "give exactly one of a count window or a time window"),
        ({"window_count": 0}, "a count window needs at least 1 tuple, got 0"),
        ({"window_ms": 0, "time_field": "ts"}, "a time window needs at least 1 ms, got 0"),
        ({"window_ms": 10}, "a time window needs a time field"),
        ({"window_count": 2, "allowed_lateness": 0}, "an allowed lateness (event-time watermarks) needs a time window"),
        ({"window_ms": 10, "time_field": "ts", "allowed_lateness": -1}, "the allowed lateness must be >= 0 ms, got -1"),
    ],
)  # fmt: skip
def test_bad_window_options_are_one_config_error(options: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "window_count": None,
        "window_ms": None,
        "time_field": None,
        "allowed_lateness": None,
    }
    with pytest.raises(ConfigError) as err:
        windows_for(**{**args, **options})  # type: ignore[arg-type]
    assert str(err.value) == message


def test_event_time_stays_a_window_away_from_the_long_range() -> None:
    windows = _time(size=10)
    assert windows.event_time({"ts": LONG_MIN + 10}) == LONG_MIN + 10
    assert windows.event_time({"ts": LONG_MAX - 10}) == LONG_MAX - 10
    with pytest.raises(BadTupleError, match=r"less the window \(10 ms\)"):
        windows.event_time({"ts": LONG_MAX - 9})
    with pytest.raises(BadTupleError, match=r"^missing time 'ts'$"):
        windows.event_time({})
    assert CountWindows(2, None).event_time({"ts": 5}) is None
    assert CountWindows(2, "ts").event_time({"ts": LONG_MAX}) == LONG_MAX  # no window bound to keep room for
    with pytest.raises(BadTupleError, match=r"beyond the 64-bit range$"):
        event_time_ms(LONG_MAX + 1, "time 'ts'", 0)


# -- the event time asked twice per tuple (the engine, then the operator): the same answer as a fresh parse --


_TIMES = st.one_of(
    st.integers(min_value=-(1 << 64), max_value=1 << 64),
    st.integers(min_value=0, max_value=10**13).map(str),
    st.sampled_from(["", " ", "x", "1.5", "2026-11-27T10:00:00Z", "2026-11-27 10:00:00", "1e3", "nan"]),
    st.none(),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_TIMES, st.booleans()), max_size=30))
def test_event_time_asked_again_answers_as_a_fresh_parse_of_the_same_text(
    asks: list[tuple[object, bool]],
) -> None:
    """Each row's time is asked once or twice (`again`), rows with equal text in other objects among them:
    every answer (a time or the one-line error) is what a window that never saw an earlier row gives."""
    windows = _time(size=1000)
    previous: object = None
    for raw, again in asks:
        # Equal text, another object half the time; the very object of the row before otherwise.
        if isinstance(raw, str) and again and isinstance(previous, str):
            raw = previous
        for _ in range(2 if again else 1):
            fresh = _time(size=1000)
            try:
                want: object = fresh.event_time({"ts": raw})
            except BadTupleError as exc:
                want = ("error", exc.reason)
            try:
                got: object = windows.event_time({"ts": raw})
            except BadTupleError as exc:
                got = ("error", exc.reason)
            assert got == want
        previous = raw
