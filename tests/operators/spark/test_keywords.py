"""Wrong-type keyword values on `cec_aggregate`, `read_results` and `read_dead_letters` are one `ConfigError`
line naming the keyword, what it takes and what it got, raised before anything starts (no session is
touched: `spark` here is a stand-in that fails the test if used); values of the right types reach the
entry point (`operators.spark.keywords`)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from cec import Checkpointing
from cec.exceptions import CecError, ConfigError
from operators.spark.attach import cec_aggregate
from operators.spark.keywords import CEC_AGGREGATE_KEYWORDS, READ_KEYWORDS, check_keywords
from operators.spark.results import read_dead_letters, read_results


class _Untouchable:
    """A `spark` that must never be reached: the refusal comes first."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the session was used ({name}) before the keywords were checked")


_COMMON: dict[str, Any] = {
    "input_topic": "in",
    "bootstrap_servers": "127.0.0.1:1",
    "output_topic": "out",
    "key": "item",
    "value": "price",
    "window_count": 3,
    "state_dir": "/tmp/never",
    "checkpoint_location": "/tmp/never-ckpt",
}


@pytest.mark.parametrize(
    ("change", "line"),
    [
        ({"window_count": "5"}, "cec_aggregate: window_count must be an integer or None, got '5' (str)"),
        ({"available_now": "yes"}, "cec_aggregate: available_now must be True or False, got 'yes' (str)"),
        (
            {"key": 5},
            "cec_aggregate: key must be text (a str) or a non-empty list of field names, got 5 (int)",
        ),
        ({"partitions": True}, "cec_aggregate: partitions must be an integer or None, got True (bool)"),
        ({"partitions": 2.0}, "cec_aggregate: partitions must be an integer or None, got 2.0 (float)"),
        ({"state_dir": 7}, "cec_aggregate: state_dir must be a path (str or pathlib.Path), got 7 (int)"),
        ({"kafka_config": ["acks=all"]}, "cec_aggregate: kafka_config must be a dict with text keys or None"),
        ({"max_records_per_trigger": "1000"}, "cec_aggregate: max_records_per_trigger must be an integer"),
        ({"agg": 3}, "cec_aggregate: agg must be text (a str) or a list of (function, column) pairs, got 3"),
        ({"window_time": 1.5}, "cec_aggregate: window_time must be text (a str) or an integer or None"),
        ({"metrics_port": "8000"}, "cec_aggregate: metrics_port must be an integer or None, got '8000'"),
        ({"checkpointing": "often"}, "cec_aggregate: checkpointing must be a cec.Checkpointing or its dict"),
        ({"output_topic": b"out"}, "cec_aggregate: output_topic must be text (a str), got b'out' (bytes)"),
    ],
)
def test_a_wrong_type_on_cec_aggregate_is_one_line_before_anything_starts(
    change: dict[str, Any], line: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        cec_aggregate(_Untouchable(), **{**_COMMON, **change})  # type: ignore[arg-type]
    message = str(caught.value)
    assert isinstance(caught.value, CecError) and "\n" not in message
    assert message.startswith(line), message


def test_a_long_wrong_value_is_cut_to_keep_the_line_short() -> None:
    with pytest.raises(ConfigError) as caught:
        cec_aggregate(_Untouchable(), **{**_COMMON, "query_name": ["q"] * 500})  # type: ignore[arg-type]
    message = str(caught.value)
    assert "\n" not in message and len(message) < 160 and message.endswith("... (list)"), message


@pytest.mark.parametrize("read", [read_results, read_dead_letters])
def test_a_wrong_type_on_the_readers_is_one_line(read: Any) -> None:
    with pytest.raises(
        ConfigError, match=rf"^{read.__name__}: bootstrap_servers must be text \(a str\), got 9092"
    ):
        read(_Untouchable(), "out", 9092)  # positional, as the README writes them
    with pytest.raises(ConfigError, match=rf"^{read.__name__}: with_meta must be True or False, got 'no'"):
        read(_Untouchable(), "out", "127.0.0.1:1", with_meta="no")
    with pytest.raises(ConfigError, match=rf"^{read.__name__}: output_topic must be text"):
        read(_Untouchable(), output_topic=None, bootstrap_servers="127.0.0.1:1")


def test_values_of_the_right_types_pass_and_the_signatures_stay() -> None:
    good: dict[str, Any] = {
        **_COMMON,
        "key": ["carrier", "origin"],
        "value": None,
        "agg": [("avg", "arr_delay"), ("count", "*")],
        "state_dir": Path("/tmp/never"),
        "window_count": None,
        "window_time": "10s",
        "time": "ts",
        "input_schema": {"type": "record", "name": "F", "fields": []},
        "partitions": 2,
        "available_now": True,
        "kafka_config": {"acks": "all"},
        "checkpointing": Checkpointing(u_target=10),
        "metrics_port": 0,
        "allowed_lateness": 5000,
        "trim_every": 100,
        "transform": lambda df: df,
        "results_topic": None,
    }
    check_keywords("cec_aggregate", CEC_AGGREGATE_KEYWORDS, good)
    check_keywords("cec_aggregate", CEC_AGGREGATE_KEYWORDS, {"checkpointing": {"u_target": 10}})
    check_keywords("read_results", READ_KEYWORDS, {"kafka_config": None, "with_meta": True})
    # The wrapped entry points keep their signatures (help(), IDEs, and the binding above).
    assert "input_topic" in inspect.signature(cec_aggregate).parameters
    assert list(inspect.signature(read_dead_letters).parameters)[:3] == [
        "spark",
        "output_topic",
        "bootstrap_servers",
    ]
