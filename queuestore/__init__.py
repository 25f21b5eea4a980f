"""Persistent output queues (embedded SQLite, Kafka) and the RocksDB stream index."""

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
