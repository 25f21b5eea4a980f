"""The records an instance's context makes (`operators/engine/context.py`), seen through a recording sink.

A G-open belongs to a window still open once its opening tuple is done: a window the same tuple opened and
closed gets none, one opened after it (the same key again) gets its own, and the G-opens follow the tuple's
other records in the order the windows opened. The sink reads the moment (time, live positions, the tuple's
event time) from the instance as it is handed the records. Both fast and full paths are run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from cec.registry import OpenWindow
from operators.base import InputTuple, Operator, OperatorContext
from operators.engine.instance import OperatorInstance
from operators.engine.records import HeldRecord, Marks, Moment

RESULT_SCHEMA = {"type": "record", "name": "Result", "fields": [{"name": "key", "type": "string"}]}


class Scripted(Operator):
    """Per tuple, the value's "steps": ("open", key), ("close", key) in order; its "time" is its event time."""

    name = "scripted"
    result_schema = RESULT_SCHEMA
    state_schema: dict[str, Any] | None = {"type": "record", "name": "S", "fields": []}

    def key_of(self, value: Mapping[str, Any]) -> str | None:
        return None

    def event_time(self, value: Mapping[str, Any]) -> int | None:
        t = value.get("time")
        return None if t is None else int(t)

    def process(self, tup: InputTuple, ctx: OperatorContext) -> None:
        assert tup.value is not None
        for step, key in tup.value["steps"]:
            if step == "open":
                ctx.open_window(key, {"key": key})
            else:
                ctx.close_window(key, {"key": key})

    def encode_footprint(self, state: Any) -> bytes:
        return state["key"].encode()


class Recording:
    """A `RecordSink` that keeps what it is handed, with the moment it read from the instance."""

    def __init__(self) -> None:
        self.handed: list[
            tuple[tuple[int, int], list[tuple[str, str | None, int]], int, list[int], int | None]
        ] = []

    def tuple_records(self, at: Moment, tup: InputTuple, held: list[HeldRecord], marks: Marks | None) -> None:
        kinds = [(kind.value, key, seq) for kind, key, seq, _state, _payload, _n in held]
        self.handed.append(
            ((tup.partition, tup.offset), kinds, at.time, list(at.positions), at.tuple_event_time)
        )

    def gchecks(
        self, at: Moment, windows: Sequence[OpenWindow], states: list[bytes], marks: tuple[int, ...]
    ) -> None:
        raise AssertionError("no G-check is asked for here")

    def end_of_stream(self, at: Moment, marks: tuple[int, ...]) -> None:
        raise AssertionError("the input does not end here")


def _tuple(o: int, steps: list[tuple[str, str]], time: int | None = None) -> InputTuple:
    value: dict[str, Any] = {"steps": steps}
    if time is not None:
        value["time"] = time
    return InputTuple(0, o, value)


@pytest.mark.parametrize("one_by_one", [False, True], ids=["run", "apply"])
def test_a_window_opened_and_closed_by_its_tuple_has_no_g_open(one_by_one: bool) -> None:
    sink = Recording()
    instance = OperatorInstance(Scripted(), sink, 1)
    tuples = [
        _tuple(0, [("open", "a"), ("close", "a")]),  # opened and closed: an R, no G-open
        _tuple(1, [("open", "b"), ("open", "c"), ("close", "b")]),  # only c is still open
        _tuple(2, [("close", "c"), ("open", "c"), ("open", "a")]),  # c's next window and a's: both open
        _tuple(3, []),  # no records: nothing handed over
    ]
    if one_by_one:
        for tup in tuples:
            instance.apply(tup)
    else:
        instance.apply_run(tuples)
    assert [(at, kinds) for at, kinds, *_ in sink.handed] == [
        ((0, 0), [("R", "a", 0)]),
        ((0, 1), [("R", "b", 0), ("GOPEN", "c", 0)]),
        ((0, 2), [("R", "c", 0), ("GOPEN", "c", 1), ("GOPEN", "a", 1)]),
    ]
    assert instance.stats.gopens == 3 and instance.stats.results == 3 and instance.stats.inputs == 4
    assert instance.out_count == 6
    assert [w.key for w in instance.registry] == ["c", "a"]  # footprint order: the G-opens' order


def test_the_sink_reads_the_moment_of_each_tuple() -> None:
    sink = Recording()
    instance = OperatorInstance(Scripted(), sink, 2)
    instance.apply_run(
        [
            InputTuple(0, 4, {"steps": [("open", "a")]}),  # no event time: logical time is sum(pos) = 5
            InputTuple(1, 9, {"steps": [("open", "b")], "time": 100}),
            InputTuple(0, 5, {"steps": [("open", "c")], "time": 50}),  # time never goes back
        ]
    )
    assert [(t, live, event_time) for _at, _kinds, t, live, event_time in sink.handed] == [
        (5, [5, 0], None),
        (100, [5, 10], 100),
        (100, [6, 10], 50),
    ]
