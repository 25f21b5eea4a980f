"""The handle of a running attached aggregation (`operators.spark.attach`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cec.config import Checkpointing
from operators.spark.generations import Generation
from operators.spark.planning import AttachRecovery
from operators.spark.sink import CecSink

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

    from queuestore.kafka import KafkaQueueStore

__all__ = ["CecAggregateQuery"]


class CecAggregateQuery:
    """A running CEC aggregation: a StreamingQuery plus the driver-side writers of its output logs."""

    def __init__(
        self, query: StreamingQuery, sink: CecSink, store: KafkaQueueStore, recovery: AttachRecovery
    ):
        self.query = query
        self.recovery = recovery
        self.checkpointing = Checkpointing()  # as given to cec_aggregate (not acted on yet: G-open only)
        self._sink = sink
        self._store = store
        self._closed = False

    @property
    def generation(self) -> Generation:
        return self.recovery.current

    @property
    def isActive(self) -> bool:
        return bool(self.query.isActive)

    @property
    def batches(self) -> int:
        """Micro-batches the sink completed."""
        return self._sink.batches

    def processAllAvailable(self) -> None:
        self.query.processAllAvailable()

    def awaitTermination(self, timeout: int | None = None) -> bool | None:
        """As StreamingQuery.awaitTermination; the output logs are closed once the query has ended."""
        try:
            return (
                self.query.awaitTermination(timeout) if timeout is not None else self.query.awaitTermination()
            )
        finally:
            if not self.query.isActive:
                self.close()

    def stop(self) -> None:
        try:
            self.query.stop()
        finally:
            self.close()

    def exception(self) -> Any:
        return self.query.exception()

    def close(self) -> None:
        """Release the output partitions (flushes what was appended). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._sink.close()
        finally:
            self._store.close()

    def __enter__(self) -> CecAggregateQuery:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.query.isActive:
            self.stop()
        else:
            self.close()
