"""Embedded queue store on SQLite: one database file per partition, WAL journal.

Why SQLite rather than RocksDB for the log itself:
- several processes must read a partition while its single writer appends (the aggregate tails the
  filter's queue, the CLI reads results, recovery reads back the log). SQLite in WAL mode gives every
  reader a consistent snapshot from any process; RocksDB allows one read-write process per database and
  only lagging secondary instances beside it;
- appends are grouped into one transaction per batch (group commit). A transaction is atomic: a process
  killed in the middle of a write leaves a WAL whose torn tail SQLite detects by its frame checksums and
  ignores on the next open, so a reader can never see half a record or half a batch. The cec codec adds a
  CRC32C per record on top, so bytes damaged after the fact are detected too;
- offsets are the INTEGER PRIMARY KEY (the rowid B-tree), so seeking forward or backward is O(log n) and
  sequential reads run at several hundred thousand records per second.

Durability is against process crashes (synchronous=NORMAL: a committed transaction is in the OS page
cache before the commit returns). Set `fsync=True` for durability against power loss.

The store by role: the partition file (`files`), its writer (`writer`), its reader (`reader`) and the
store of topics (`store`).
"""

from __future__ import annotations

from queuestore.sqlite.files import WAY_OUT
from queuestore.sqlite.reader import SqlitePartitionReader
from queuestore.sqlite.store import SqliteQueueStore
from queuestore.sqlite.writer import SqlitePartitionWriter

__all__ = ["WAY_OUT", "SqlitePartitionReader", "SqlitePartitionWriter", "SqliteQueueStore"]
