"""`cec.timeparse`: the one duration parser (CLI, job specs, Checkpointing, cec_aggregate) and event times."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from cec.config import Checkpointing
from cec.exceptions import BadTupleError, CecError, ConfigError
from cec.timeparse import format_time_ms, number_from_text, parse_duration_ms, parse_duration_s, parse_time_ms
from operators.aggregate import KeyedAggregate
from operators.base import InputTuple
from operators.job import aggregate_operator
from tests.operators.test_aggregate_fast_path import RecordingContext


@pytest.mark.parametrize(
    ("given", "ms"),
    [
        ("500ms", 500),
        ("10s", 10_000),
        ("5m", 300_000),
        ("1h", 3_600_000),
        ("1d", 86_400_000),
        ("250", 250),  # a bare number of milliseconds, as before
        ("500 milliseconds", 500),
        ("10 seconds", 10_000),
        ("1 second", 1000),
        ("5 minutes", 300_000),
        ("1 minute", 60_000),
        ("1 hour", 3_600_000),
        ("2 hours", 7_200_000),
        ("1 day", 86_400_000),
        ("interval 1 hour 30 minutes", 5_400_000),  # Spark SQL's interval literal
        ("1.5h", 5_400_000),
        (" 5 MINUTES ", 300_000),
    ],
)
def test_durations_in_both_the_short_and_sparks_forms(given: str, ms: int) -> None:
    assert parse_duration_ms(given) == ms
    assert aggregate_operator("k", "v", "avg", window_time=given, time="t")["window_ms"] == ms


@pytest.mark.parametrize("bad", ["soon", "", "0s", "-1s", "5 fortnights", "5 minutes later", "5m5", "0.5ms"])
def test_bad_durations_are_one_clear_error(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"duration|positive|whole number"):
        parse_duration_ms(bad)


def test_seconds_parser_is_the_same_one_with_seconds_for_bare_numbers() -> None:
    assert parse_duration_s("2 minutes") == 120.0
    assert parse_duration_s("4") == 4.0
    assert Checkpointing(recovery_target="1 hour").recovery_target == 3600.0


def test_spark_attach_reads_durations_with_the_same_parser() -> None:
    # cec_aggregate's window keywords are read by operators.spark.aggregate_form.window_form.
    import operators.spark.aggregate_form as aggregate_form

    assert aggregate_form.parse_duration_ms is parse_duration_ms
    form = aggregate_form.window_form(
        window_count=None, window_time="1 hour", slide="15m", session_gap=None, time="ts", input_format="json"
    )
    assert (form.window_ms, form.slide_ms) == (parse_duration_ms("1 hour"), parse_duration_ms("15m"))


@pytest.mark.parametrize(
    ("given", "ms"),
    [
        (1714564800000, 1714564800000),
        ("1714564800000", 1714564800000),
        ("42", 42),
        ("-42", -42),
        ("1e3", 1000),
        (1000.0, 1000),
        ("2024-05-01T12:00:00Z", 1714564800000),
        ("2024-05-01T12:00:00+00:00", 1714564800000),
        ("2024-05-01T14:00:00+02:00", 1714564800000),
        ("2024-05-01T12:00:00.250Z", 1714564800250),
        ("2024-05-01 12:00:00", 1714564800000),  # no zone: UTC
        ("2024-05-01T12:00:00", 1714564800000),
        ("2024-05-01", 1714521600000),
        ("1969-12-31T23:59:59.999Z", -1),
        (datetime(2024, 5, 1, 12, 0, 0, 250_000), 1714564800250),  # a timestamp column's value: UTC
        (datetime(2024, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2))), 1714564800000),
    ],
)
def test_event_times_as_integers_iso_8601_and_sql_style(given: object, ms: int) -> None:
    assert parse_time_ms(given) == ms


@pytest.mark.parametrize(
    "bad",
    [
        "yesterday",
        "2024-13-01",
        "12:00",
        "nan",
        "inf",
        # leniencies of int() / float() that cec does not share: ASCII decimal text only, no fraction
        " 42 ",
        " 2024-05-01",
        "1_000",
        "\u0661\u0662",  # Arabic-Indic digits
        "1000.5",
        1000.5,
        "",
    ],
)
def test_bad_times_raise_value_error(bad: object) -> None:
    with pytest.raises(ValueError) as caught:
        parse_time_ms(bad)
    assert isinstance(caught.value, CecError)  # under the package's one root too, with its reason


def test_the_aggregate_reads_iso_times_and_dead_letters_what_is_not_a_time() -> None:
    agg = KeyedAggregate(key_field="k", value_field="v", window_ms=60_000, time_field="t")
    assert agg.event_time({"t": "2024-05-01 12:00:00"}) == 1714564800000
    with pytest.raises(BadTupleError, match="neither integer milliseconds nor an ISO-8601 time"):
        agg.event_time({"t": "noon"})


@pytest.mark.parametrize("good", ["12", "-12", "+12", "12.5", ".5", "5.", "1e3", "1E-3", "007"])
def test_numbers_as_text_are_ascii_decimal(good: str) -> None:
    assert number_from_text(good) == float(good)


@pytest.mark.parametrize(
    "bad", ["1_000", " 12 ", "12 ", "\t12", "\u0661\u0662", "\uff11\uff12", "12,5", "0x10", ""]
)
def test_numbers_as_text_refuse_what_only_python_reads(bad: str) -> None:
    with pytest.raises(ValueError):
        number_from_text(bad)


def test_the_aggregate_dead_letters_numbers_and_times_only_python_reads() -> None:
    agg = KeyedAggregate(key_field="k", value_field="v", window_ms=60_000, time_field="t")
    assert agg.event_time({"t": "1000"}) == 1000 and agg.event_time({"t": 1000.0}) == 1000
    for t in ("1_000", " 1000 ", "\u0661\u0660\u0660\u0660", 1000.5, "1000.5"):
        with pytest.raises(BadTupleError, match="neither integer milliseconds nor an ISO-8601 time"):
            agg.event_time({"t": t})
    ctx = RecordingContext()
    for v in ("1_000", " 12 ", "\u0661\u0662"):
        with pytest.raises(BadTupleError, match="is not a number"):
            agg.process(InputTuple(0, 0, {"k": "a", "v": v, "t": 5}, None, None), ctx)
    assert ctx.events == []
    agg.process(InputTuple(0, 1, {"k": "a", "v": "12.5", "t": 5}, None, None), ctx)  # text: a number
    assert [window.state.total for window in ctx.registry] == [12.5]


def test_times_print_as_iso_8601_utc_with_milliseconds() -> None:
    assert format_time_ms(1714564800250) == "2024-05-01T12:00:00.250Z"
    assert format_time_ms(0) == "1970-01-01T00:00:00.000Z"
    assert format_time_ms(10**18) == str(10**18)  # beyond year 9999: the number itself
