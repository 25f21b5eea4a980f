"""Fault injection on a stored log's bytes, from the test side: flip one byte of a record's stored value in
an embedded (SQLite) store, as a failing disk would. Readers must detect it by checksum."""

from __future__ import annotations

import sqlite3

from queuestore.sqlite import SqliteQueueStore


def corrupt_record(
    store: SqliteQueueStore, topic: str, partition: int, offset: int, flip_at: int = -1
) -> None:
    """Flip the byte at `flip_at` of the value stored at `offset` of `topic`[`partition`]."""
    path = store._partition_path(topic, partition)  # the store's own file layout
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        (value,) = conn.execute("SELECT value FROM log WHERE offset = ?", (offset,)).fetchone()
        damaged = bytearray(value)
        damaged[flip_at] ^= 0xFF
        conn.execute("UPDATE log SET value = ? WHERE offset = ?", (bytes(damaged), offset))
    finally:
        conn.close()
