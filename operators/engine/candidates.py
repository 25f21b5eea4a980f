"""An instance's own open windows as the G-check controller's `Candidates` (the local host: the registry
keeps them oldest footprint first, and a G-check moves a window to the young end).

The view of the oldest window: q = records since its footprint (out count now less its out mark), u =
input since (in count less its in mark), and the gaps to the next oldest, which a G-check of it saves.
A run of G-checks is taken at one moment: the i-th window of the run is seen as it would be once the ones
before it were G-checked one at a time (the same records, written in one go).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice

from cec.policy import WindowView
from cec.registry import OpenWindow
from operators.engine.controller import GCheckController
from operators.engine.instance import OperatorInstance

__all__ = ["InstanceWindows"]


class InstanceWindows:
    """`operators.engine.controller.Candidates` over `instance`'s registry, seen by `controller`'s policy;
    `poll()` serves the output's completions between runs."""

    def __init__(
        self, instance: OperatorInstance, controller: GCheckController, poll: Callable[[], object]
    ) -> None:
        self.instance = instance
        self.controller = controller
        self._poll = poll

    def count(self) -> int:
        return len(self.instance.registry)

    def front(self) -> WindowView | None:
        registry = self.instance.registry
        it = iter(registry)
        oldest = next(it, None)
        if oldest is None:
            return None
        after = next(it, None)
        in_count, out_count = self.instance.in_count, self.instance.out_count
        return WindowView(
            out_count - oldest.out_mark,
            in_count - oldest.in_mark,
            registry.n,
            (in_count if after is None else after.in_mark) - oldest.in_mark,
            (out_count if after is None else after.out_mark) - oldest.out_mark,
        )

    def run(self, most: int) -> int:
        return len(self._oldest_wanted(most))

    def gcheck(self, count: int) -> None:
        self.instance.gcheck_run(list(islice(self.instance.registry, count)))

    def poll(self) -> None:
        self._poll()

    def _oldest_wanted(self, most: int) -> list[OpenWindow]:
        """The oldest windows, up to `most`, that one-at-a-time G-checks from now would take in a row: the
        policy sees, for each, the view it would see once the ones before it were G-checked (the oldest
        is wanted already). Pure reads: the registry is not changed."""
        instance = self.instance
        registry = instance.registry
        in_count, out_count, n = instance.in_count, instance.out_count, registry.n
        windows = list(islice(registry, most + 1))  # one more: the one behind the last, for its gap
        policy = self.controller.policy
        thresholds = policy.thresholds()
        if thresholds is not None:  # q > Q or u > U: no view needed
            q_target, u_target = thresholds
            q_on, u_on = q_target is not None, u_target is not None  # a None is not checked
            q_max, u_max = q_target or 0, u_target or 0
            for i in range(1, min(most, len(windows))):
                window = windows[i]
                if not (
                    (q_on and out_count + i - window.out_mark > q_max)
                    or (u_on and in_count - window.in_mark > u_max)
                ):
                    return windows[:i]
            return windows[:most]
        wants_oldest = policy.wants_oldest
        for i in range(1, min(most, len(windows))):
            window = windows[i]
            if i + 1 < len(windows):
                after_in, after_out = windows[i + 1].in_mark, windows[i + 1].out_mark
            elif len(windows) <= most:  # behind the last window comes the first one G-checked in this run
                after_in, after_out = in_count, out_count
            else:  # pragma: no cover - windows holds one more than `most`
                break
            view = WindowView(
                out_count + i - window.out_mark,
                in_count - window.in_mark,
                n,
                after_in - window.in_mark,
                after_out - window.out_mark,
            )
            if not wants_oldest(view):
                return windows[:i]
        return windows[:most]
