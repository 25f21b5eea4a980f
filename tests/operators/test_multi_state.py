"""The window state of several aggregates in the log (operators.multi_state): every state round-trips,
and any bytes decode to a state or raise ValueError, never anything else."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from operators import exact_sum
from operators.multi_state import ColumnState, MultiState, decode_state, empty_column, encode_state

LONG = st.integers(-(1 << 63), (1 << 63) - 1)
FINITE = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def columns(draw: st.DrawFn) -> ColumnState:
    xs = draw(st.lists(FINITE.filter(lambda x: abs(x) < 1e300), max_size=6))
    if not xs:
        return empty_column()
    col = ColumnState(1, exact_sum.exact(xs[0]), xs[0], xs[0])
    for x in xs[1:]:
        col.add(x, exact_sum.exact(x))
    return col


@st.composite
def states(draw: st.DrawFn) -> MultiState:
    cols = draw(st.lists(columns(), max_size=4))
    count = max([c.n for c in cols], default=0) + draw(st.integers(0, 3))
    start = draw(LONG)
    last = draw(st.integers(max(-(1 << 63), start - 1000), min((1 << 63) - 1, start + 10**6)))
    return MultiState(count, start, last, cols)


def _same(a: MultiState, b: MultiState) -> bool:
    def col(c: ColumnState) -> tuple[object, ...]:
        return (c.n, c.total, math.copysign(1.0, c.lo), c.lo, math.copysign(1.0, c.hi), c.hi)

    return (a.count, a.start, a.last, [col(c) for c in a.columns]) == (
        b.count, b.start, b.last, [col(c) for c in b.columns],
    )  # fmt: skip


@given(states())
def test_every_state_round_trips_bit_for_bit(state: MultiState) -> None:
    assert _same(decode_state(encode_state(state), len(state.columns)), state)


@given(st.binary(max_size=80), st.integers(0, 4))
def test_any_bytes_are_a_state_or_a_value_error(data: bytes, columns_: int) -> None:
    try:
        state = decode_state(data, columns_)
    except ValueError:
        return
    assert len(state.columns) == columns_
    assert _same(decode_state(encode_state(state), columns_), state)  # a real state, which round-trips


@given(states(), st.data())
def test_a_truncated_or_extended_state_is_refused(state: MultiState, data: st.DataObject) -> None:
    encoded = encode_state(state)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    for damaged in (encoded[:cut], encoded + b"\x00"):
        try:
            decode_state(damaged, len(state.columns))
        except ValueError:
            continue
        raise AssertionError(f"{damaged!r} decoded")
