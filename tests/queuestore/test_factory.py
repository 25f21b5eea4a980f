"""The store description a job spec carries: where the Kafka writer's settings come from."""

from __future__ import annotations

from pathlib import Path

import pytest

from cec.exceptions import ConfigError
from queuestore.exceptions import QueueStoreError
from queuestore.factory import (
    COMMIT_INTERVAL_ENV,
    COMMIT_RECORDS_ENV,
    REQUEST_TIMEOUT_ENV,
    StoreSpec,
    open_store,
    store_spec,
)


def test_embedded_store_when_no_bootstrap_servers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CEC_BOOTSTRAP_SERVERS", raising=False)
    assert store_spec(tmp_path) == {"type": "sqlite", "root": str(tmp_path)}


def test_kafka_writer_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(REQUEST_TIMEOUT_ENV, "4.5")
    monkeypatch.setenv(COMMIT_INTERVAL_ENV, "2")
    monkeypatch.setenv(COMMIT_RECORDS_ENV, "200")
    spec = store_spec(tmp_path, "127.0.0.1:9092")
    assert (spec["request_timeout"], spec["commit_interval"], spec["commit_records"]) == (4.5, 2.0, 200)
    assert isinstance(spec["commit_records"], int)


def test_unset_settings_are_left_to_the_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in (REQUEST_TIMEOUT_ENV, COMMIT_INTERVAL_ENV, COMMIT_RECORDS_ENV):
        monkeypatch.setenv(name, " ")
    spec = store_spec(tmp_path, "127.0.0.1:9092")
    assert not {"request_timeout", "commit_interval", "commit_records"} & spec.keys()


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (COMMIT_RECORDS_ENV, "2.5", "must be records, got '2.5'"),
        (COMMIT_RECORDS_ENV, "0", "must be > 0 records"),
        (COMMIT_INTERVAL_ENV, "soon", "must be seconds, got 'soon'"),
        (REQUEST_TIMEOUT_ENV, "-1", "must be > 0 seconds"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, text: str, message: str
) -> None:
    monkeypatch.setenv(name, text)
    with pytest.raises(QueueStoreError, match=name) as raised:
        store_spec(tmp_path, "127.0.0.1:9092")
    assert message in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "sqlite", "root": "r", "lease_timeout_s": 5}, "lease_timeout_s needs the Kafka store"),
        (
            {"type": "kafka", "bootstrap_servers": "b:1", "state_dir": "s", "lease_timeout_s": 0},
            "lease_timeout_s must be a positive number of seconds, got 0",
        ),
        (
            {"type": "kafka", "bootstrap_servers": "b:1", "state_dir": "s", "lease_timeout_s": "5"},
            "lease_timeout_s must be a positive number of seconds, got '5'",
        ),
    ],
)
def test_a_lease_timeout_is_positive_seconds_of_a_kafka_store(spec: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        StoreSpec.from_dict(spec)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_lease_timeout_reaches_the_kafka_store(tmp_path: Path) -> None:
    spec = {
        "type": "kafka",
        "bootstrap_servers": "127.0.0.1:9",
        "state_dir": str(tmp_path),
        "lease_timeout_s": 2,
    }
    store = open_store(spec)  # nothing is asked of the broker until a writer opens
    try:
        assert getattr(store, "lease_timeout", None) == 2.0
    finally:
        store.close()
