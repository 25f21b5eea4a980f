"""Open a queue store from a small JSON-able description, so that a job spec can cross processes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from queuestore.base import QueueStore
from queuestore.exceptions import QueueStoreError
from queuestore.sqlite import SqliteQueueStore

__all__ = ["COMMIT_INTERVAL_ENV", "COMMIT_RECORDS_ENV", "REQUEST_TIMEOUT_ENV", "open_store", "store_spec"]


# How long (seconds, default 30) the Kafka store waits on a broker that does not answer before the operator
# stops with one line (`BrokerUnavailableError`); a rerun resumes from the log.
REQUEST_TIMEOUT_ENV = "CEC_KAFKA_REQUEST_TIMEOUT"
# The transactional writer's commit cadence: a transaction commits once it is this many seconds old (default
# 0.1) or holds this many records (default 50,000), whichever comes first. Longer transactions write less
# per record; shorter ones make results visible to read_committed readers sooner.
COMMIT_INTERVAL_ENV = "CEC_KAFKA_COMMIT_INTERVAL"
COMMIT_RECORDS_ENV = "CEC_KAFKA_COMMIT_RECORDS"


def _positive_env(name: str, unit: str, kind: type[float] | type[int]) -> float | int | None:
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise QueueStoreError(f"{name} must be {unit}, got {text!r}") from None
    if not value > 0:
        raise QueueStoreError(f"{name} must be > 0 {unit}, got {text!r}")
    return value


def store_spec(store_dir: str | Path, bootstrap_servers: str | None = None) -> dict[str, Any]:
    """Embedded store under `store_dir`, or Kafka when bootstrap servers are given (indexes under store_dir)."""
    bootstrap = bootstrap_servers or os.environ.get("CEC_BOOTSTRAP_SERVERS") or None
    if bootstrap:
        spec: dict[str, Any] = {"type": "kafka", "bootstrap_servers": bootstrap, "state_dir": str(store_dir)}
        for key, name, unit, kind in (
            ("request_timeout", REQUEST_TIMEOUT_ENV, "seconds", float),
            ("commit_interval", COMMIT_INTERVAL_ENV, "seconds", float),
            ("commit_records", COMMIT_RECORDS_ENV, "records", int),
        ):
            value = _positive_env(name, unit, kind)
            if value is not None:
                spec[key] = value
        return spec
    return {"type": "sqlite", "root": str(store_dir)}


def open_store(spec: dict[str, Any]) -> QueueStore:
    kind = spec.get("type")
    if kind == "sqlite":
        sqlite = SqliteQueueStore(
            spec["root"],
            fsync=bool(spec.get("fsync", False)),
            **({"max_outstanding": int(spec["max_outstanding"])} if spec.get("max_outstanding") else {}),
        )
        if spec.get("max_record_bytes"):
            sqlite.max_record_bytes = int(spec["max_record_bytes"])
        return sqlite
    if kind == "kafka":
        from queuestore.kafka import KafkaQueueStore  # optional backend: imported only when used

        # Optional settings: the transactional.id prefix, the commit cadence, the time an operation may go
        # without progress (see KafkaQueueStore).
        writer_settings: dict[str, Any] = {
            name: spec[name]
            for name in (
                "transactional_id_prefix",
                "commit_interval",
                "commit_records",
                "max_outstanding",
                "request_timeout",
            )
            if spec.get(name) is not None
        }
        kafka = KafkaQueueStore(
            spec["bootstrap_servers"],
            Path(spec["state_dir"]),
            config=dict(spec.get("config") or {}),
            **writer_settings,
        )
        if spec.get("max_record_bytes"):  # lower than the broker's limit only (tests of chunked values)
            kafka.max_record_bytes = min(kafka.max_record_bytes, int(spec["max_record_bytes"]))
        return kafka
    raise QueueStoreError(f"unknown store type {kind!r}")
