"""Open a queue store from a small JSON-able description (`StoreSpec`, or its dict form), so that a job spec
can cross processes."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from cec.exceptions import ConfigError
from cec.spec_form import SpecForm, check_count, check_needs, check_positive
from queuestore.base import QueueStore
from queuestore.exceptions import QueueStoreError
from queuestore.sqlite import SqliteQueueStore

__all__ = [
    "COMMIT_INTERVAL_ENV",
    "COMMIT_RECORDS_ENV",
    "REQUEST_TIMEOUT_ENV",
    "StoreSpec",
    "check_lease_timeout",
    "open_store",
    "store_spec",
]


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


_STORE_NEEDS: dict[str, tuple[str, ...]] = {
    "sqlite": ("root",),
    "kafka": ("bootstrap_servers", "state_dir"),
}


@dataclass(frozen=True, eq=False)
class StoreSpec(SpecForm):
    """Where a job's output queue lives: the embedded SQLite store under `root`, or Kafka (its local
    indexes under `state_dir`). Which fields a type reads: `queuestore.factory.open_store`."""

    kind_name: ClassVar[str] = "store"
    type: str
    # sqlite
    root: str | None = None
    fsync: bool | None = None
    # kafka
    bootstrap_servers: str | None = None
    state_dir: str | None = None
    config: dict[str, Any] | None = None  # librdkafka settings
    transactional_id_prefix: str | None = None
    commit_interval: float | None = None
    commit_records: int | None = None
    request_timeout: float | None = None
    # The cross-host writer lease, seconds (`queuestore.kafka.lease`; `cec run --lease-timeout`); None: the
    # same-host lock only.
    lease_timeout_s: float | None = None
    # both
    max_outstanding: int | None = None
    max_record_bytes: int | None = None

    @classmethod
    def from_dict(cls, data: StoreSpec | Mapping[str, Any]) -> StoreSpec:
        return data if isinstance(data, StoreSpec) else cls._read(data)

    def __post_init__(self) -> None:
        check_needs(self, _STORE_NEEDS)
        for name in ("commit_records", "max_outstanding", "max_record_bytes"):
            check_count(getattr(self, name), name)
        check_lease_timeout(self.lease_timeout_s, self.type)


def check_lease_timeout(value: Any, store_type: str, name: str = "lease_timeout_s") -> None:
    """A lease timeout (`name`: how the user spelled it) is a positive number of seconds, of a Kafka store."""
    if value is None:
        return
    if store_type != "kafka":
        raise ConfigError(
            f"{name} needs the Kafka store: the lease is a Kafka consumer group (on one host the writer's "
            "lock already shows a dead writer at once)"
        )
    check_positive(value, name, "seconds")


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


def open_store(spec: StoreSpec | Mapping[str, Any]) -> QueueStore:
    spec = StoreSpec.from_dict(spec)  # checked: an unknown type or field is one line
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
        if spec.get("lease_timeout_s") is not None:
            writer_settings["lease_timeout"] = float(spec["lease_timeout_s"])
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
