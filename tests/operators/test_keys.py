"""The key rule (`operators.aggregate.canonical_key`): what makes two keys one, for every host and format."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cec.exceptions import BadTupleError
from operators.aggregate import KeyedAggregate, canonical_key, plain_key
from operators.base import InputTuple
from tests.operators.test_aggregate_fast_path import RecordingContext


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ("a", "a"),
        (" a", " a"),  # exact: stripping would merge " a" with "a"
        ("a ", "a "),
        ("A", "A"),
        ("ä", "ä"),
        (5, "5"),  # an integer is its decimal text: JSON 5 and "5" are one key, as in a CSV
        ("5", "5"),
        (-12, "-12"),
        (2**70, str(2**70)),
        (True, "true"),  # JSON's spelling: true and "true" are one key ...
        (False, "false"),
    ],
)
def test_a_key_is_its_exact_text(raw: Any, key: str) -> None:
    assert canonical_key(raw, "k") == key


def test_true_and_the_text_True_are_two_keys() -> None:
    assert canonical_key(True, "k") != canonical_key("True", "k")
    assert canonical_key(1, "k") != canonical_key(True, "k")


@pytest.mark.parametrize("raw", [None, "", " ", "\t\n"])
def test_null_and_blank_keys_are_missing(raw: Any) -> None:
    assert canonical_key(raw, "k") is None


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (5.0, "key 'k' is a floating-point number (5.0)"),
        (b"ab", "key 'k' is bytes (b'ab')"),
        ({"a": 1}, "key 'k' is an object"),
        ([1], "key 'k' is an array"),
        ("a\udcff", "key 'k' is not valid UTF-8: b'a\\xff'"),  # a byte the source kept exactly
        ("\ud800", "key 'k' is not valid UTF-8: b'\\\\ud800'"),  # an escaped lone surrogate in JSON
    ],
)
def test_what_is_not_a_key_is_refused_with_a_reason(raw: Any, reason: str) -> None:
    with pytest.raises(BadTupleError) as caught:
        canonical_key(raw, "k")
    assert caught.value.reason.startswith(reason), caught.value.reason


scalars = st.one_of(
    st.text(),
    st.integers(),
    st.booleans(),
    st.floats(allow_nan=False),
    st.binary(max_size=4),
)


@given(scalars, scalars)
def test_two_values_are_one_key_only_if_they_are_equal_text(a: Any, b: Any) -> None:
    def key(raw: Any) -> str | None:
        try:
            return canonical_key(raw, "k")
        except BadTupleError:
            return None

    ka, kb = key(a), key(b)
    if ka is None or kb is None or ka != kb:
        return
    # One key: the same text, or an integer and its decimal text, or a boolean and its JSON spelling.
    texts = {v if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v) for v in (a, b)}
    assert len(texts) == 1


@pytest.mark.parametrize("window", [{"window_count": 10}, {"window_ms": 10, "time_field": "t"}])
def test_the_aggregate_keeps_keys_that_differ_only_in_spaces_or_type_apart(window: dict[str, Any]) -> None:
    """Both per-tuple paths of the aggregate (the count-window fast path and the general one) apply the rule."""
    op = KeyedAggregate(key_field="k", value_field="v", agg="sum", **window)
    ctx = RecordingContext()
    keys: list[Any] = ["a", " a", True, "True", "true", 5, "5"]
    for i, key in enumerate(keys):
        op.process(InputTuple(0, i, {"k": key, "v": 1.0, "t": 0}), ctx)
    windows = {w.key: w.state.count for w in ctx.registry}
    assert windows == {"a": 1, " a": 1, "true": 2, "True": 1, "5": 2}


def _rule(raw: Any) -> str | BadTupleError:
    try:
        return canonical_key(raw, "k") or ""
    except BadTupleError as exc:
        return exc


@given(st.one_of(scalars, st.none(), st.sampled_from(["", " ", "\udcff", 10**5000])))
def test_the_fast_key_path_gives_exactly_the_rule_or_defers_to_it(raw: Any) -> None:
    """`plain_key` (the aggregates' per-tuple fast path) never raises, even for an int with more digits
    than Python converts: it gives the key `canonical_key` gives, or None, and then `canonical_key`
    decides (the key, or the same refusal)."""
    fast = plain_key(raw)
    if fast is not None:
        assert fast == _rule(raw)
