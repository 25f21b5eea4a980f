"""Results published to a plain topic in the output log's transactions (`--results-topic`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from cec.exceptions import ConfigError
from cec.records import AvroCodec, Kind, RecordCodec
from queuestore.base import QueueStore, RecordMeta
from queuestore.output import OutputQueue

__all__ = ["RESULTS_TOPIC", "ResultJson", "ResultsTopicOutput"]

# JobSpec.extra key: the topic that receives every result as a plain JSON record (`ResultsTopicOutput`).
RESULTS_TOPIC = "results_topic"


class ResultJson:
    """A result's record in a results topic: key = the window key, value = the result's fields as compact
    JSON (key, window, value, count, start, end for the aggregate). Every host that publishes results
    (`ResultsTopicOutput`, the Spark executors' writers) makes them here."""

    def __init__(self, result_schema: dict[str, Any]) -> None:
        self._results = AvroCodec(result_schema)

    def record(self, meta_key: str | None, payload: bytes) -> tuple[bytes | None, bytes]:
        """(key, value) of the result whose R record has `meta_key` and `payload`."""
        row = self._results.decode(payload)
        body = json.dumps(row, separators=(",", ":")).encode()
        return (None if meta_key is None else meta_key.encode()), body


class ResultsTopicOutput(OutputQueue):
    """An output queue that also publishes every result (R record) as a plain JSON record to
    `results_topic`: key = the window key, value = the result's fields (key, window, value, count, start,
    end for the aggregate). Each one is produced in the Kafka transaction of its R record, so a
    read_committed consumer that knows nothing of cec reads each result exactly once, crashes included:
    a result is in the results topic exactly when its R record is in the log, and recovery never emits an
    R that the log holds. Output partition p publishes to results partition p (the results topic has as
    many partitions as the output log), so per key the results topic is in log order."""

    def __init__(
        self,
        store: QueueStore,
        topic: str,
        partition: int,
        *,
        results_topic: str,
        result_schema: dict[str, Any],
        defer_index_above: int | None = None,
        on_index: Callable[[], None] | None = None,
        ec_cache: bool = False,
        fence_later: bool = False,
    ) -> None:
        super().__init__(
            store,
            topic,
            partition,
            defer_index_above=defer_index_above,
            on_index=on_index,
            ec_cache=ec_cache,
            fence_later=fence_later,
        )
        append_side = getattr(self.writer, "append_side", None)
        if append_side is None:
            self.close()
            raise ConfigError(
                "--results-topic needs the Kafka store (--bootstrap-servers): results are published in the "
                "transaction of the output log"
            )
        try:
            store.create_topic(results_topic, store.partitions(topic))
        except BaseException:
            self.close()
            raise
        self.results_topic = results_topic
        self._append_side = append_side
        self._records = RecordCodec()
        self._side_record = ResultJson(result_schema).record
        self.published = 0

    def append(self, value: bytes, meta: RecordMeta) -> None:
        super().append(value, meta)
        if meta.kind != Kind.R.value:
            return
        record = self._records.decode(value, meta)
        if record.payload is None:
            return
        key, body = self._side_record(meta.key, record.payload)
        # After the last part of a chunked R: in the transaction that completes the result in the log.
        self._append_side(self.results_topic, self.partition, key, body)
        self.published += 1
