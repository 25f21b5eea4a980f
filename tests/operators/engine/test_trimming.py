"""`operators.engine.trimming`: the trim bound (oldest footprint, newest record kept, consumers' acks),
when a bound taken may be applied (once what was appended with it is durable), the local host's due points
and the pace a consumer sets."""

from __future__ import annotations

import pytest

from cec.exceptions import ConfigError
from operators.engine.trimming import TrimPace, TrimPoints, TrimSchedule, bound, capped


def test_the_bound_keeps_the_oldest_footprint_and_the_newest_record() -> None:
    assert bound(100, 40) == 40  # the oldest open window's last footprint
    assert bound(100, None) == 99  # no window open: only the crash point (the newest record) is needed
    assert bound(100, 250) == 99  # never past the newest durable record
    assert capped(40, [55, 30]) == 30  # a consumer that acknowledged less holds the log
    assert capped(40, []) == 40


def test_a_bound_waits_until_what_was_appended_with_it_is_durable() -> None:
    schedule = TrimSchedule(10)
    taken: list[int] = []

    def take() -> int:
        taken.append(len(taken))
        return 7 + len(taken)

    schedule.take_if_due(durable_end=5, appended=9, take=take)
    assert taken == []  # fewer than 10 durable records since the last bound
    schedule.take_if_due(durable_end=12, appended=20, take=take)
    assert taken == [0]
    assert schedule.ready(durable_count=19) is None  # 20 were appended when it was taken
    schedule.take_if_due(durable_end=40, appended=50, take=take)
    assert taken == [0]  # never a new bound while one waits
    assert schedule.ready(durable_count=20) == 8
    assert schedule.ready(durable_count=100) is None
    schedule.take_if_due(durable_end=40, appended=50, take=take)
    assert taken == [0, 1]
    schedule.at_rest()  # the end of a run: the host trims to the bound of now instead
    assert schedule.ready(durable_count=10**6) is None


def test_due_points_come_every_n_appended_records_each_used_once() -> None:
    points = TrimPoints(10)
    assert [points.due(a) for a in (3, 9, 10, 10, 19, 23, 33, 34)] == [
        False, False, True, False, False, True, True, False
    ]  # fmt: skip
    with pytest.raises(ConfigError, match="trim_every must be >= 1"):
        TrimPoints(0)


def test_a_pace_waits_for_its_consumer_only() -> None:
    pace = TrimPace("cec-run-results", 100)
    assert pace.caught_up(500, {"cec-run-results": 400, "down": 0})  # another consumer is not waited for
    assert not pace.caught_up(501, {"cec-run-results": 400})
    assert pace.caught_up(501, {"down": 0})  # not registered (forgotten): nothing to wait for
    assert TrimPace.from_dict(pace.to_dict()) == pace and TrimPace.from_dict(None) is None
    for bad in ({"consumer": "x", "lag": 0}, {"consumer": "", "lag": 5}, {"consumer": "x", "lag": 1, "y": 2}):
        with pytest.raises(ConfigError):
            TrimPace.from_dict(bad)
