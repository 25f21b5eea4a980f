"""Open a queue store from a small JSON-able description, so that a job spec can cross processes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from queuestore.base import QueueStore
from queuestore.exceptions import QueueStoreError
from queuestore.sqlite import SqliteQueueStore

__all__ = ["REQUEST_TIMEOUT_ENV", "open_store", "store_spec"]


# How long (seconds, default 30) the Kafka store waits on a broker that does not answer before the operator
# stops with one line (`BrokerUnavailableError`); a rerun resumes from the log.
REQUEST_TIMEOUT_ENV = "CEC_KAFKA_REQUEST_TIMEOUT"


def store_spec(store_dir: str | Path, bootstrap_servers: str | None = None) -> dict[str, Any]:
    """Embedded store under `store_dir`, or Kafka when bootstrap servers are given (indexes under store_dir)."""
    bootstrap = bootstrap_servers or os.environ.get("CEC_BOOTSTRAP_SERVERS") or None
    if bootstrap:
        spec: dict[str, Any] = {"type": "kafka", "bootstrap_servers": bootstrap, "state_dir": str(store_dir)}
        timeout = os.environ.get(REQUEST_TIMEOUT_ENV, "").strip()
        if timeout:
            try:
                spec["request_timeout"] = float(timeout)
            except ValueError:
                raise QueueStoreError(f"{REQUEST_TIMEOUT_ENV} must be seconds, got {timeout!r}") from None
            if not spec["request_timeout"] > 0:
                raise QueueStoreError(f"{REQUEST_TIMEOUT_ENV} must be > 0 seconds, got {timeout!r}")
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

        # Optional writer settings: the transactional.id prefix and the commit cadence (see KafkaQueueStore).
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
