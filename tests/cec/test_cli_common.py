"""cec.cli.common.concurrently: the checks before a run overlap, and fail as if they ran in order."""

from __future__ import annotations

import threading

import pytest

from cec.cli.common import concurrently
from cec.exceptions import ConfigError

# A bound for a wait that only a broken `concurrently` would reach (then the test fails, it does not hang).
_GUARD_S = 60.0


def test_both_run_at_once_and_the_results_come_in_order() -> None:
    second_started = threading.Event()

    def first() -> str:
        # Returns only once the second call is running: the two overlap, or this fails.
        assert second_started.wait(_GUARD_S), "the second call did not start while the first ran"
        return "first"

    def second() -> int:
        second_started.set()
        return 2

    assert concurrently(first, second) == ("first", 2)


def test_the_first_calls_error_wins_when_both_fail() -> None:
    second_failing = threading.Event()

    def second() -> None:
        second_failing.set()
        raise ConfigError("second")

    def first() -> None:
        assert second_failing.wait(_GUARD_S)  # both fail, the second one first
        raise ConfigError("first")

    with pytest.raises(ConfigError, match=r"^first$"):
        concurrently(first, second)


def test_the_second_calls_error_is_raised_once_the_first_returned() -> None:
    first_done = threading.Event()

    def first() -> str:
        first_done.set()
        return "ok"

    def second() -> None:
        raise ConfigError("second")

    with pytest.raises(ConfigError, match=r"^second$"):
        concurrently(first, second)
    assert first_done.is_set()


def test_the_second_call_has_finished_when_the_first_fails() -> None:
    finished = threading.Event()
    release = threading.Event()

    def second() -> None:
        assert release.wait(_GUARD_S)
        finished.set()

    def first() -> None:
        release.set()
        raise ConfigError("first")

    with pytest.raises(ConfigError, match=r"^first$"):
        concurrently(first, second)
    # Nothing of the checks still runs behind the error the command reports.
    assert finished.is_set()
