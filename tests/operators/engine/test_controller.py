"""`operators.engine.controller`: one G-check controller for both hosts' ticks. What it says is said once
per instance and in one text whichever tick saw it; it spends at most its credit, oldest window first,
while the policy wants the front one; runs of G-checks where the host writes runs."""

from __future__ import annotations

import logging

import pytest

from cec.policy import TargetPolicy, WindowView
from cec.rates import MeasuredRates
from cec.schedule import CheckpointSchedule
from operators.engine.controller import MEASURE_S, GCheckController


class FakeClock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


class Windows:
    """Candidates: windows with replay sizes u (oldest first); each G-check costs `cost` of the clock."""

    def __init__(self, us: list[int], clock: FakeClock, cost: float, runs: bool = False) -> None:
        self.us, self.clock, self.cost, self.runs = list(us), clock, cost, runs
        self.done: list[int] = []
        self.calls: list[int] = []

    def count(self) -> int:
        return len(self.us)

    def front(self) -> WindowView | None:
        left = self.us[len(self.done) :]
        if not left:
            return None
        gap = left[0] - (left[1] if len(left) > 1 else 0)
        return WindowView(0, left[0], len(self.us), gap, 0)

    def run(self, most: int) -> int:
        left = self.us[len(self.done) :]
        return max(1, sum(1 for u in left[:most] if u > 100)) if self.runs else 1

    def gcheck(self, count: int) -> None:
        self.calls.append(count)
        for _ in range(count):
            self.done.append(self.us[len(self.done)])
            self.clock.now += self.cost

    def poll(self) -> None:
        pass


def _controller(
    clock: FakeClock, policy: TargetPolicy, ci_ms: float = 100.0, **kw: object
) -> GCheckController:
    return GCheckController(
        policy,
        CheckpointSchedule(ci_ms, 100.0, clock=clock),
        MeasuredRates(),
        clock=clock,
        label="op",
        **kw,  # type: ignore[arg-type]
    )


def _counts(n: int) -> tuple[int, int, int, int, int, int, int, int]:
    return (1000, 100, 0, 0, 0, n, 100, 1000)


def test_q_below_n_is_said_once_in_one_text_by_either_tick(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    controller = _controller(clock, TargetPolicy(q_target=10))
    windows = Windows([], clock, 0.0)
    with caplog.at_level(logging.WARNING, logger="operators.engine.controller"):
        controller.start(None, _counts(40))
        for _ in range(3):
            clock.now += MEASURE_S
            controller.look(windows, lambda: _counts(40))  # the local host's tick
            controller.timer(windows, open_windows=40, elapsed=1.0)  # the Spark host's
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "op: Q=10 is below the 40 open windows: an extent holds a footprint of every open window, so q <= Q "
        "cannot hold at any checkpoint budget (Q must be >= N)"
    ]
    assert controller.memory.said == [f"q-below-n: {said[0][4:]}"]
    assert controller.refusal == said[0][4:] and controller.note is None


def test_the_timer_spends_its_allowance_oldest_first_and_carries_the_overshoot() -> None:
    clock = FakeClock()
    controller = _controller(clock, TargetPolicy(u_target=100), ci_ms=5.0)  # 5% of operator time
    windows = Windows([900, 800, 700, 600, 50, 40], clock, cost=0.004)
    done = controller.timer(windows, open_windows=6, elapsed=0.2)  # 10 ms allowed
    assert done == 3 and windows.done == [900, 800, 700]  # 12 ms: the third overshoots by 2 ms
    assert controller.memory.debt == pytest.approx(0.002) and controller.memory.gchecks == 3
    windows = Windows([600, 50], clock, cost=0.004)
    assert controller.timer(windows, open_windows=2, elapsed=0.03) == 0  # 1.5 ms allowed, 2 ms owed


def test_a_look_stops_where_the_policy_is_satisfied_and_writes_runs() -> None:
    clock = FakeClock()
    controller = _controller(clock, TargetPolicy(u_target=100), run_limit=256)
    windows = Windows([900, 800, 700, 50, 40], clock, cost=0.0, runs=True)
    controller.start(None, _counts(5))
    controller.look(windows, lambda: _counts(5))
    assert windows.done == [900, 800, 700] and windows.calls == [3]  # one run of three, then satisfied
    assert controller.schedule.gchecks == 3
