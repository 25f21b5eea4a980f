from __future__ import annotations

from pathlib import Path

import pytest

from queuestore.sqlite import SqliteQueueStore


@pytest.fixture
def sqlite_store(tmp_path: Path) -> SqliteQueueStore:
    return SqliteQueueStore(tmp_path / "store")
