"""Persistent output queues (embedded SQLite, Kafka) and the RocksDB stream index."""

import logging

from queuestore.base import (
    DurableCallback,
    PartitionReader,
    PartitionWriter,
    QueueStore,
    RecordMeta,
    StoredRecord,
)
from queuestore.index import StreamIndex
from queuestore.output import OutputQueue
from queuestore.sqlite import SqliteQueueStore

# A library logs; the application decides where it goes (no "last resort" output to stderr).
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "DurableCallback",
    "OutputQueue",
    "PartitionReader",
    "PartitionWriter",
    "QueueStore",
    "RecordMeta",
    "SqliteQueueStore",
    "StoredRecord",
    "StreamIndex",
]
