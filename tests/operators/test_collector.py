"""`operators.collector`: the collector paused or spaced for the call or run, and left as it was found."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from operators.collector import collector_paused, collector_spaced


@pytest.fixture(autouse=True)
def _collector_restored() -> Iterator[None]:
    enabled, thresholds = gc.isenabled(), gc.get_threshold()
    yield
    gc.set_threshold(*thresholds)
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_paused_over_the_call_and_running_again_after_it_even_when_the_call_raises() -> None:
    gc.enable()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), collector_paused():
        raise ValueError("the call failed")
    assert gc.isenabled()


def test_a_caller_that_turned_the_collector_off_keeps_it_off() -> None:
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_spaced_passes_during_the_run_and_the_callers_thresholds_after() -> None:
    gc.set_threshold(700, 10, 10)
    with collector_spaced():
        young, middle, old = gc.get_threshold()
        assert young >= 100 * 700 and middle >= 10 and old >= 10
    assert gc.get_threshold() == (700, 10, 10)
    gc.set_threshold(5_000, 20, 30)
    with pytest.raises(RuntimeError), collector_spaced():
        raise RuntimeError("the run failed")
    assert gc.get_threshold() == (5_000, 20, 30)
