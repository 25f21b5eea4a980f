"""`operators.engine.trimming`: the trim bound (oldest footprint, newest record kept, consumers' acks) and
when a bound taken may be applied (once what was appended with it is durable)."""

from __future__ import annotations

from operators.engine.trimming import TrimSchedule, bound, capped


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
