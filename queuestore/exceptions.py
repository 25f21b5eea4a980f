"""Errors raised by queue stores and the stream index."""

from __future__ import annotations

__all__ = [
    "IndexError_",
    "PartitionLockedError",
    "QueueStoreError",
    "RecordTooLargeError",
    "StoreClosedError",
    "TopicMismatchError",
    "TornRecordError",
    "UnknownTopicError",
    "WriterFencedError",
]


class QueueStoreError(Exception):
    """Base class of every error raised by `queuestore`."""


class UnknownTopicError(QueueStoreError):
    """The topic does not exist in the store."""


class TopicMismatchError(QueueStoreError):
    """An existing topic does not fit what the caller asked for (partition count, configs)."""


class PartitionLockedError(QueueStoreError):
    """Another live writer owns the partition: output queues have exactly one writer."""


class RecordTooLargeError(QueueStoreError):
    """A record exceeds the store's `max_record_bytes`; callers must chunk it."""


class StoreClosedError(QueueStoreError):
    """The writer, reader or store was used after `close()`."""


class IndexError_(QueueStoreError):
    """The stream index is unusable (corrupt, or does not belong to this partition)."""


class TornRecordError(QueueStoreError):
    """A value written in parts (larger than a record may be) whose parts are missing or damaged."""


class WriterFencedError(QueueStoreError):
    """A newer writer of the partition took over (on Kafka: called `init_transactions()` with the same
    transactional.id); this writer has stopped and must not write anything further."""
