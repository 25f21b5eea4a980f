"""Shared fixtures: the embedded store, the Kafka broker, and `store_backend` (the same test on both).

The broker is session-scoped and started lazily: only a test that requests `kafka_broker` (directly or
through the "kafka" parameter of `store_backend`) starts one, so SQLite-only runs never pay for it. When
no broker can be started the requesting tests ERROR instead of being skipped: a CI run that silently
skipped every Kafka test would look green while testing nothing (DESIGN-NOTES section 4).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from queuestore.base import QueueStore
from queuestore.sqlite import SqliteQueueStore
from tests.brokers import Broker, start_broker

__all__ = ["BACKENDS", "StoreBackend"]

# Property tests draw the same examples on every run by default ("ci"), so that CI time and verdicts do not
# depend on luck: the example counts in the tests are sized to catch the bugs their docstrings name with
# these seeds. HYPOTHESIS_PROFILE=dev explores new examples each run (and remembers failures locally).
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

BACKENDS = ["sqlite", "kafka"]


@pytest.fixture
def sqlite_store(tmp_path: Path) -> SqliteQueueStore:
    return SqliteQueueStore(tmp_path / "store")


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[Broker]:
    try:
        broker = start_broker()
    except RuntimeError as exc:
        # pytest.fail, not pytest.skip: see the module docstring.
        pytest.fail(f"no Kafka broker could be started for the Kafka tests:\n{exc}", pytrace=False)
    try:
        yield broker
    finally:
        broker.stop()


class StoreBackend:
    """A factory of queue stores that all see the same data (same SQLite root / same broker + state_dir).

    Calling it (`make_store()`) opens a new store instance; opening several is how tests model a restart
    or a second process. `spec` is the JSON-able store spec (`queuestore.factory.open_store`) for child
    processes and `JobSpec.store`. Every store opened is closed at teardown.
    """

    def __init__(self, name: str, root: Path, bootstrap: str | None = None) -> None:
        self.name = name
        self.root = root
        self.bootstrap = bootstrap
        self._opened: list[QueueStore] = []

    @property
    def spec(self) -> dict[str, Any]:
        if self.name == "kafka":
            return {"type": "kafka", "bootstrap_servers": self.bootstrap, "state_dir": str(self.root)}
        return {"type": "sqlite", "root": str(self.root)}

    def __call__(self) -> QueueStore:
        store: QueueStore
        if self.name == "kafka":
            from queuestore.kafka import KafkaQueueStore  # optional backend: only when a test uses it

            assert self.bootstrap is not None
            store = KafkaQueueStore(self.bootstrap, self.root)
        else:
            store = SqliteQueueStore(self.root)
        self._opened.append(store)
        return store

    def topic(self, prefix: str = "t") -> str:
        """A topic name no other test (nor an earlier run against a long-lived broker) has used."""
        return f"{prefix}-{uuid.uuid4().hex[:12]}"

    def close(self) -> None:
        for store in reversed(self._opened):
            store.close()
        self._opened.clear()

    def __repr__(self) -> str:
        return f"StoreBackend({self.name!r}, root={str(self.root)!r})"


@pytest.fixture(params=BACKENDS)
def store_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreBackend]:
    name: str = request.param
    bootstrap: str | None = None
    if name == "kafka":
        # Requested dynamically so that the broker starts only when a Kafka-parametrized test runs.
        bootstrap = request.getfixturevalue("kafka_broker").bootstrap
    backend = StoreBackend(name, tmp_path / f"{name}-store", bootstrap)
    try:
        yield backend
    finally:
        backend.close()
