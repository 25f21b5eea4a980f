"""`gc_paused` (EC build and load) leaves the collector as it found it: enabled again, and what another part
of the process froze still frozen (a Spark Python worker forked from cec's daemon froze its preloaded
modules; an EC load in a task there must not hand them back to every full collection)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from recovery.eventual import gc_paused


@pytest.fixture
def collector() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.unfreeze()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()


def test_a_freeze_made_before_stays(collector: None) -> None:
    kept = [[i] for i in range(1000)]
    gc.freeze()
    before = gc.get_freeze_count()
    assert before > 0
    with gc_paused():
        made = [[i] for i in range(1000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() >= before
    assert kept and made


def test_without_a_freeze_nothing_stays_frozen(collector: None) -> None:
    with gc_paused():
        made = [[i] for i in range(1000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
    assert made
