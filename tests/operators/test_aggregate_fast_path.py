"""The aggregate's short path for count windows (`KeyedAggregate._process_count`) against its full path:
the same windows, results, states and dead letters for plain tuples and for every odd one it leaves to
the full path (keys that are not plain text or ints, values that are not finite numbers, sums that would
overflow)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from cec.exceptions import BadTupleError
from cec.registry import OpenWindow, WindowRegistry
from operators.aggregate import AGGREGATES, KeyedAggregate
from operators.base import InputTuple


class RecordingContext:
    """What an operator sees of the runtime, recording every window it opens and closes."""

    def __init__(self) -> None:
        self.registry = WindowRegistry()
        self.time = 0
        self.events: list[tuple[Any, ...]] = []
        self._seq: dict[str, int] = {}

    def open_window(self, key: str, state: Any) -> OpenWindow:
        seq = self._seq.get(key, 0)
        self._seq[key] = seq + 1
        window = OpenWindow(key, seq, state, 0, 0, 0, 0)
        self.registry.open(window)
        self.events.append(("open", key, seq, repr(state)))
        return window

    def close_window(self, key: str, result: Mapping[str, Any]) -> None:
        window = self.registry.close(key)
        self.events.append(("close", key, window.seq, sorted(result.items())))

    def emit(self, result: Mapping[str, Any]) -> None:
        raise AssertionError("an aggregate emits results of windows only")


def _values(rnd: random.Random) -> dict[str, Any]:
    key: Any = rnd.choice([rnd.randrange(40), f"k{rnd.randrange(40)}", f" k{rnd.randrange(5)} "])
    if rnd.random() < 0.05:
        key = rnd.choice([None, "", "   ", True, 3.5, "é", "\u3000k1", 2**80])
    value: Any = rnd.choice([rnd.randrange(-1000, 1000), rnd.uniform(-1e3, 1e3)])
    if rnd.random() < 0.05:
        value = rnd.choice([None, "12.5", "x", True, float("inf"), float("nan"), 2**60, 2**1100, 1.7e308])
    out = {"item": key, "price": value}
    if rnd.random() < 0.02:
        del out["item"]
    return out


def _run(agg: str, plain: bool, tuples: list[InputTuple]) -> list[tuple[Any, ...]]:
    operator = KeyedAggregate(key_field="item", value_field="price", agg=agg, window_count=5)
    assert operator._plain_count
    operator._plain_count = plain
    ctx = RecordingContext()
    for tup in tuples:
        try:
            operator.process(tup, ctx)
        except BadTupleError as exc:
            ctx.events.append(("dead", tup.offset, exc.reason))
    ctx.events.extend(("still open", w.key, w.seq, repr(w.state)) for w in ctx.registry)
    return ctx.events


def test_the_short_path_gives_exactly_what_the_full_path_gives() -> None:
    rnd = random.Random(5)
    tuples = [InputTuple(0, i, _values(rnd)) for i in range(20_000)]
    for agg in AGGREGATES:
        short, full = _run(agg, True, tuples), _run(agg, False, tuples)
        assert short == full
        kinds = {event[0] for event in short}
        assert kinds == {"open", "close", "dead", "still open"}  # every branch was taken


def test_time_windows_do_not_take_the_short_path() -> None:
    operator = KeyedAggregate(key_field="k", value_field="v", window_ms=10, time_field="t")
    assert not operator._plain_count
    operator = KeyedAggregate(key_field="k", value_field="v", window_count=3, time_field="t")
    assert not operator._plain_count  # a count window over event time: times are parsed per tuple
