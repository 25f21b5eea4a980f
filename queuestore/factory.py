"""Open a queue store from a small JSON-able description, so that a job spec can cross processes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from queuestore.base import QueueStore
from queuestore.exceptions import QueueStoreError
from queuestore.sqlite import SqliteQueueStore

__all__ = ["open_store", "store_spec"]


def store_spec(store_dir: str | Path, bootstrap_servers: str | None = None) -> dict[str, Any]:
    """Embedded store under `store_dir`, or Kafka when bootstrap servers are given (indexes under store_dir)."""
    bootstrap = bootstrap_servers or os.environ.get("CEC_BOOTSTRAP_SERVERS") or None
    if bootstrap:
        return {"type": "kafka", "bootstrap_servers": bootstrap, "state_dir": str(store_dir)}
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
