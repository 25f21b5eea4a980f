"""Errors raised by operators and their input sources."""

from __future__ import annotations

from cec.exceptions import CecError

__all__ = [
    "DeadLetteredInputError",
    "DecodeError",
    "EngineStateError",
    "OutputConflictError",
    "PipelineError",
    "PipelineFailedError",
    "RetentionError",
    "SourceError",
    "StageFailedError",
    "StandbyStoppedError",
    "TopicDeletedError",
    "TopicSourceError",
]


class SourceError(CecError):
    """Base class of the errors of input sources."""


class DecodeError(SourceError):
    """One input record cannot be decoded; `reason` goes to its dead letter and the run goes on."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TopicSourceError(SourceError):
    """A Kafka topic cannot be read as configured (missing topic, unreachable broker or registry)."""


class TopicDeletedError(TopicSourceError):
    """The input topic was deleted (or deleted and created again) while a run read it: the rest of the
    run's input is gone, so its results cannot be completed."""


class RetentionError(TopicSourceError):
    """A replay needs input offsets the broker no longer keeps (below a partition's log start)."""


class OutputConflictError(CecError):
    """An output partition's writer found records in its log that it did not produce (a second writer, or
    a retried micro-batch that differs from its killed attempt): it writes nothing, and the query must be
    restarted, which recovers from the log."""


class DeadLetteredInputError(CecError):
    """A bounded run whose every input tuple was dead-lettered (most often a wrong field name or format):
    its empty answer is refused, with the first reason, rather than returned as a result."""


class EngineStateError(CecError):
    """A host drove the operator engine (`operators.engine`) out of order: a record made outside an applied
    tuple, a second restore, an end while still restoring. A bug in the host, never the input's doing."""


class PipelineError(CecError):
    """Base class of the errors of a pipeline host (`operators.spark.host`)."""


class PipelineFailedError(PipelineError):
    """A stage job still failed after `max_job_attempts` submissions."""


class StageFailedError(PipelineError):
    """One stage of a group run in one task failed, which stopped the others (Spark retries the task)."""


class StandbyStoppedError(CecError):
    """A standby (`operators.standby`) was stopped while its primary still held the partition: it never
    took over, and wrote nothing."""
