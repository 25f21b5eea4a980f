"""A state partition's saved state (`operators/spark/state_partition.py`): what `dump` writes, `load` reads back.

The state is pickled without a memo (the pickler's fast mode, for speed at 100,000 keys): every value comes
back equal, an object reached twice comes back as two equal ones, and a state that refers to itself is
refused rather than looped over.
"""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.spark.checkpointing import PartitionControl
from operators.spark.state_partition import PartitionState, Saved, fresh_engine

POS = st.tuples(st.integers(0, 1 << 40), st.integers(0, 1 << 40))
STATE = st.tuples(
    st.integers(1, 10),
    st.floats(allow_nan=False),
    st.floats(allow_nan=False),
    st.floats(allow_nan=False),
    st.integers(-(1 << 62), 1 << 62),
    st.integers(-(1 << 62), 1 << 62),
)
SAVED = st.tuples(
    st.integers(0, 1000),
    st.integers(-1, 1000),
    st.none() | STATE,
    st.integers(-1, 3),
    st.none() | POS,
    st.booleans(),
    st.none() | POS,
    st.integers(-1, 1),
    st.integers(-1, 1 << 40),
    st.integers(0, 1 << 40),
    st.none() | st.integers(-(1 << 62), 1 << 62),
)


def _state(keys: dict[str | None, Saved]) -> PartitionState:
    part = PartitionState(3, (7, 9), fresh_engine(2, [5, 6]), keys, timer=12, stamp_time=44)
    part.control.first_wall = 1000.0
    part.control.out = 17
    return part


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.none() | st.text(max_size=8), SAVED, max_size=30))
def test_a_dumped_state_loads_back_equal(keys: dict[str | None, Saved]) -> None:
    part = _state(keys)
    back = PartitionState.load(part.dump())
    assert back.keys == keys
    assert (back.q, back.timer, back.stamp, back.stamp_time, back.engine) == (3, 12, (7, 9), 44, part.engine)
    assert back.control == part.control
    # What it writes is what the memoized pickle of the same state loads as.
    memoized = pickle.loads(
        pickle.dumps((part.q, part.timer, part.keys, part.control, part.stamp, part.engine, part.stamp_time))
    )
    assert pickle.loads(part.dump()[0])[2] == memoized[2]


def test_an_object_reached_twice_comes_back_as_two_equal_ones() -> None:
    pos = (3, 4)
    keys: dict[str | None, Saved] = {"a": (1, 0, (1, 2.0, 2.0, 2.0, 0, 0), 0, pos, False, pos, 0, 3, 1, 5)}
    back = PartitionState.load(_state(keys).dump()).keys["a"]
    assert back == keys["a"] and back[4] == back[6] == pos


def test_a_state_that_refers_to_itself_is_refused() -> None:
    cyclic: list[object] = []
    cyclic.append(cyclic)
    part = _state({})
    part.engine = ([0, 0], 0, None, [], cyclic, True)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="cyclic"):
        part.dump()


def test_the_checkpoint_controls_survive_a_dump() -> None:
    part = _state({})
    control = PartitionState.load(part.dump()).control
    assert type(control) is PartitionControl
    assert control == part.control and control.first_wall == 1000.0 and control.out == 17
