"""Errors raised by queue stores and the stream index, all under `cec.CecError` (the package's one root)."""

from __future__ import annotations

from cec.exceptions import CecError

__all__ = [
    "BrokerUnavailableError",
    "CommitOutcomeUnknownError",
    "DamagedLogError",
    "IndexError_",
    "LogTrimmedError",
    "PartitionLockedError",
    "QueueStoreError",
    "RecordTooLargeError",
    "StoreClosedError",
    "TopicMismatchError",
    "TornRecordError",
    "UnknownTopicError",
    "WriterFailedError",
    "WriterFencedError",
    "WriterResetError",
]


class QueueStoreError(CecError):
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


class DamagedLogError(QueueStoreError):
    """A stored log is damaged where a reader needs it: a record fails its checksum, or an offset of a
    store whose offsets are dense is missing. The message names the store, topic[partition] and offset."""


class LogTrimmedError(QueueStoreError):
    """A read below a partition's log start: those records were trimmed (every registered consumer had
    acknowledged them and no checkpoint needed them). Never answered with a silent gap."""


class WriterFailedError(QueueStoreError):
    """An append failed; the writer stopped there (fail-stop), so nothing after the failed record is ever
    written and the log stays a gapless prefix. The operator must stop and recover from the log."""


class WriterResetError(WriterFailedError):
    """The writer stopped after a failure of its client that a new client resolves (on Kafka: a producer
    that failed mid-transaction, or a commit whose outcome is unknown). Before raising it fenced its own
    client (on Kafka: a new producer, a new epoch), so nothing of the failed one can land any more and the
    log is final: the owner recovers from the log and goes on (`operators.job.run_job` does, in the same
    process). Where no new client can be made because the broker does not answer, the writer stops with
    `BrokerUnavailableError` instead (a rerun resumes)."""


class CommitOutcomeUnknownError(WriterResetError):
    """A commit failed in a way that leaves its outcome unknown (on Kafka: the EndTxn timed out or its
    connection was lost): the transaction's records may or may not be in the log, which says which now
    that the writer has fenced its own producer."""


class WriterFencedError(QueueStoreError):
    """A newer writer of the partition took over (on Kafka: called `init_transactions()` with the same
    transactional.id); this writer has stopped and must not write anything further."""


class BrokerUnavailableError(QueueStoreError):
    """The broker did not answer in time (down, stalled or unreachable): the operator stops, its log intact
    up to what the broker had confirmed, and a rerun resumes from it. One message form for every site."""

    def __init__(self, bootstrap_servers: str, waiting_for: str, seconds: float) -> None:
        super().__init__(
            f"Kafka at {bootstrap_servers} did not answer for {seconds:g} s ({waiting_for}): is the broker "
            "running and reachable? The output log is intact up to what the broker confirmed: run the same "
            "command again to resume from it"
        )
        self.bootstrap_servers = bootstrap_servers
        self.waiting_for = waiting_for
