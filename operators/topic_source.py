"""A user's own Kafka topic as a cec input: positions are (partition, Kafka offset), so replay is a seek.

`KafkaTopicSource` reads an ordinary topic written by any producer (formats in `operators.formats`; the
`cec` format, a cec queue, goes through `QueueSource` instead, see `open_topic_source`). Each record's
value is decoded into fields; the key, value and time fields the operator uses must be present and not
null. A record that cannot be decoded or lacks one of them becomes an error tuple, which the runtime
dead-letters with its partition, offset and reason; the run goes on. A tuple's value is a read-only
mapping equal to the decoded record: a dict, or (JSON and flat Avro, with the C accelerator) a
`cec._native.Record` that holds the key, value and time fields and loads the rest only if asked.

Two pseudo-fields come from the Kafka record instead of its value: `@timestamp` (the record timestamp in
ms, e.g. as the time field) and `@key` (the message key as UTF-8 text; bytes that are not UTF-8 are
kept exactly, so the key rule makes the record a dead letter).

**Bounds** (where a run starts and ends, kept with the job's log) are `operators.topic_bounds`'s:
`resolve_bounds`, `TopicBounds`, `pin_bounds` (re-exported here).

**Retention.** A seek to offset o of partition j with o below the partition's current log start is a
`RetentionError` ("input retention shorter than the replay needs"), naming topic, partition, offset and
log start, unless o is below the run's pinned start (those offsets were never input: the run starts at
its pinned start). Offsets are never assumed dense: compaction and transaction markers leave gaps.

**Lag.** Delivered positions are committed, for monitoring only, to the consumer group `group_id`
(recovery keeps using the positions in the log), every `commit_interval_s` of the injected `clock` and
when the source closes.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import OffsetSpec

from cec.exceptions import ConfigError
from cec.native import native
from operators.base import InputTuple
from operators.exceptions import RetentionError, TopicDeletedError, TopicSourceError
from operators.formats import FORMATS, ValueDecoder, make_decoder
from operators.sources import InputSource, QueueSource, _partition_subset
from operators.topic_batches import _ACCESSORS as _ACCESSORS  # re-exported: tests and benchmarks read it here
from operators.topic_batches import MessageBatches
from operators.topic_bounds import (
    TIMEOUT_S,
    TopicBounds,
    admin_client,
    consumer_config,
    list_offsets,
    partition_count,
    pin_bounds,
    resolve_bounds,
    topic_partition_count,
)
from operators.topic_tuples import KEY_FIELD, TIMESTAMP_FIELD, RecordTuples, decode_values
from queuestore.kafka.admin import consumer_knowing, topic_id

__all__ = [
    "KEY_FIELD",
    "TIMESTAMP_FIELD",
    "KafkaTopicSource",
    "TopicBounds",
    "decode_values",
    "open_topic_source",
    "pin_bounds",
    "resolve_bounds",
    "topic_partition_count",
]

log = logging.getLogger(__name__)

_POLL_S = 0.05
_CLOSE_COMMIT_S = 5.0  # how long a monitoring commit may wait on the broker
_QUIET_COMMIT_CODES = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError.REQUEST_TIMED_OUT,
    }
)
_ERROR_REASON = "input retention shorter than the replay needs"
_UNKNOWN_CODES = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC}
)


class KafkaTopicSource(MessageBatches, InputSource):
    """An ordinary Kafka topic (json, avro, registry or csv values); see the module docstring."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        fmt: str,
        key_field: str,
        value_field: str | None,
        time_field: str | None = None,
        schema: Any = None,
        registry_url: str | None = None,
        columns: Sequence[str] | None = None,
        partitions: Sequence[int] | None = None,
        start_offsets: Sequence[int] | None = None,
        end_offsets: Sequence[int] | None = None,
        follow: bool = False,
        group_id: str | None = None,
        config: Mapping[str, Any] | None = None,
        registry: Any = None,
        decoder: ValueDecoder | None = None,
        commit_interval_s: float = 1.0,
        idle_check_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if fmt == "cec" or fmt not in FORMATS:
            raise ConfigError(f"KafkaTopicSource reads json, avro, registry or csv values, not {fmt!r}")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.fmt = fmt
        self.key_field, self.value_field, self.time_field = key_field, value_field, time_field
        self.follow = follow
        self.group_id = group_id
        self._config = dict(config or {})
        self._decoder = decoder or make_decoder(
            fmt, schema=schema, registry_url=registry_url, columns=columns, registry=registry
        )
        self._admin = admin_client(bootstrap_servers, config)
        total = partition_count(self._admin, bootstrap_servers, topic)
        self.total_partitions = total
        self.global_partitions = _partition_subset(partitions, total, f"input topic {topic!r}")
        self.partitions = len(self.global_partitions)
        if start_offsets is None or (end_offsets is None and not follow):
            bounds = resolve_bounds(bootstrap_servers, topic, config=config)
            start_offsets = bounds.starts if start_offsets is None else start_offsets
            end_offsets = bounds.ends if end_offsets is None else end_offsets
        for name, given in (("start_offsets", start_offsets), ("end_offsets", end_offsets)):
            if given is not None and len(given) != total:
                raise ConfigError(f"{name} has {len(given)} entries; topic {topic!r} has {total} partitions")
        self._set_bounds(
            TopicBounds(
                tuple(int(o) for o in start_offsets),
                tuple(int(o) for o in end_offsets) if end_offsets is not None else (),
            )
        )
        self._local = {g: i for i, g in enumerate(self.global_partitions)}
        self._local_of = [self._local.get(g, -1) for g in range(total)]  # the same, as a list for C
        self._identity_partitions = list(self.global_partitions) == list(range(len(self.global_partitions)))
        # Its first poll after `seek` does not wait for librdkafka's topic scan (up to ~1 s before a
        # restart's first replayed input).
        self._consumer: Consumer | None = consumer_knowing(
            consumer_config(bootstrap_servers, config, group_id), topic
        )
        self._ended = [False] * self.partitions
        self._limits: list[float] = [math.inf] * self.partitions  # see poll
        # What a record becomes (decode, pseudo-fields, required fields, dead-letter reasons): the rule the
        # attached query's Spark Kafka input shares (operators.topic_tuples).
        self._records = RecordTuples(self._decoder, key_field, value_field, time_field)
        self._getter = self._records.getter
        self._inject_ts, self._inject_key = self._records.inject_ts, self._records.inject_key
        self._required = self._records.required
        # The C batch path (`cec._native.topic_batch`): messages to tuples in one call, records held as
        # `cec._native.Record` mappings (no dict per record). Not when a field comes from the message.
        spec_of = getattr(self._decoder, "native_spec", None)
        self._native_spec = (
            spec_of(self._required)
            if native is not None and spec_of is not None and not (self._inject_ts or self._inject_key)
            else None
        )
        self._clock = clock
        self._commit_interval_s = commit_interval_s
        self._last_commit = clock()
        self._committed: list[int] | None = None
        self._commit_future: Any = None  # the monitoring commit in flight (`_maybe_commit`)
        self._idle_check_s = idle_check_s
        self._last_delivery = clock()  # when a poll last delivered records (or the input was last checked)
        self._topic_id = topic_id(
            self._admin, topic, TIMEOUT_S
        )  # a topic deleted and created again has another

    def describe(self) -> str:
        mode = "follow" if self._ends is None else f"bounded at {list(self._ends)}"
        return f"topic {self.topic} ({self.fmt}) partitions {list(self.global_partitions)}, {mode}"

    def _set_bounds(self, bounds: TopicBounds) -> None:
        self.bounds = bounds
        self._starts = [bounds.starts[g] for g in self.global_partitions]
        self._ends: list[int] | None = (
            None if self.follow or not bounds.ends else [bounds.ends[g] for g in self.global_partitions]
        )
        self._next = list(self._starts)

    # A bounded run's start and end positions are fixed when its log starts and adopted from the log on
    # every restart (recovery.identity), so a restarted run reads exactly what the first one would have.
    pinned_fields = ("start_offsets", "end_offsets")

    def pin(self, recorded: Mapping[str, Any]) -> None:
        starts, ends = recorded.get("start_offsets"), recorded.get("end_offsets")
        if starts is None or ends is None:
            return
        if len(starts) != self.total_partitions or (ends and len(ends) != self.total_partitions):
            raise ConfigError(
                f"the log was started on {len(starts)} partitions of {self.topic!r}; it has {self.total_partitions} now"
            )
        self._set_bounds(TopicBounds(tuple(int(o) for o in starts), tuple(int(o) for o in ends)))

    def identity(self) -> dict[str, Any]:
        """What this input is, to keep with the log: a restarted run must read the same records."""
        return {
            "type": "topic",
            "bootstrap_servers": self.bootstrap_servers,
            "topic": self.topic,
            "format": self.fmt,
            "partitions": self.total_partitions,
            **self.bounds.as_dict(),
            "follow": self.follow,
        }

    def progress_bounds(self) -> tuple[list[int], list[int]] | None:
        return None if self._ends is None else (list(self._starts), list(self._ends))

    def _log_starts(self) -> list[int]:
        try:
            return list_offsets(self._admin, self.topic, list(self.global_partitions), OffsetSpec.earliest())
        except TopicSourceError:
            self._check_input()  # the usual reason: the topic was deleted (said as such)
            raise

    def seek(self, positions: Sequence[int]) -> None:
        consumer = self._live()
        targets = [max(int(p), s) for p, s in zip(positions, self._starts, strict=True)]
        log_starts = self._log_starts()
        for i, (want, low) in enumerate(zip(targets, log_starts, strict=True)):
            if want < low and not (self._ends is not None and want >= self._ends[i]):
                raise self._retention_error(i, want, low)
        self._next = targets
        self._ended = [
            self._ends is not None and t >= e for t, e in zip(targets, self._ends or targets, strict=True)
        ]
        self._limits = [
            -1 if ended else (math.inf if self._ends is None else self._ends[i])
            for i, ended in enumerate(self._ended)
        ]
        consumer.assign(
            [
                TopicPartition(self.topic, g, self._next[i])
                for i, g in enumerate(self.global_partitions)
                if not self._ended[i]
            ]
        )

    def _retention_error(self, local: int, needed: int, log_start: int) -> RetentionError:
        return RetentionError(
            f"{_ERROR_REASON}: topic {self.topic!r} partition {self.global_partitions[local]} needs offset "
            f"{needed}, but its log starts at {log_start}"
        )

    def _live(self) -> Consumer:
        if self._consumer is None:
            raise TopicSourceError(f"the source of topic {self.topic!r} is closed")
        return self._consumer

    def _end_partition(self, local: int) -> None:
        self._ended[local] = True
        self._limits[local] = -1
        self._live().incremental_unassign([TopicPartition(self.topic, self.global_partitions[local])])

    def poll(self, max_records: int) -> list[InputTuple] | None:
        consumer = self._live()
        if all(self._ended):
            self._maybe_commit()
            return None
        first = consumer.poll(_POLL_S)
        out: list[InputTuple] = []
        if first is None:
            if self._clock() - self._last_delivery >= self._idle_check_s:
                self._check_input()
        else:
            self._last_delivery = self._clock()
            msgs = [first, *consumer.consume(max(0, max_records - 1), 0)] if max_records > 1 else [first]
            batch = self._fast_batch(msgs)
            out = self._slow_batch(msgs) if batch is None else batch
            nxt = self._next
            for j, limit in enumerate(self._limits):
                if 0 <= limit <= nxt[j]:
                    self._end_partition(j)
        self._maybe_commit()
        if not out and all(self._ended):
            return None
        return out

    def _check_input(self) -> None:
        """Nothing arrived for `idle_check_s`: a consumer of assigned partitions waits silently forever on a
        topic that was deleted (or deleted and created again, its offsets back at 0), so ask the broker.
        A broker that does not answer is not an error here: the client reconnects, and the store's writer
        reports a broker that stays away.

        Each request waits at most `idle_check_s` (not TIMEOUT_S): the operator's thread is in this call, so
        a broker that died would hold the run's exit for the whole wait (30 s, against the bound of 3 x
        CEC_KAFKA_REQUEST_TIMEOUT in docs/kafka.md); a check that gets no answer is made again later."""
        self._last_delivery = self._clock()
        wait_s = min(TIMEOUT_S, self._idle_check_s)
        try:
            md = self._admin.list_topics(timeout=wait_s)  # all topics: naming one may auto-create it
        except KafkaException as exc:
            log.info("Kafka at %s did not answer a metadata request: %s", self.bootstrap_servers, exc)
            return
        waiting = [j for j, ended in enumerate(self._ended) if not ended]
        tmd = md.topics.get(self.topic)
        if tmd is None or tmd.error is not None or not tmd.partitions:
            j = waiting[0] if waiting else 0
            raise TopicDeletedError(
                f"the input topic {self.topic!r} was deleted while this run read it (partition "
                f"{self.global_partitions[j]} at offset {self._next[j]:,}): the rest of the run's input is "
                "gone; its log is intact but its results cannot be completed"
            )
        now_id = topic_id(self._admin, self.topic, wait_s)
        if self._topic_id is not None and now_id is not None and now_id != self._topic_id:
            raise TopicDeletedError(
                f"the input topic {self.topic!r} was deleted and created again while this run read it (its "
                f"topic id changed from {self._topic_id} to {now_id}): the run's input is gone; its log is "
                "intact but its results cannot be completed"
            )
        for j in waiting:
            tp = TopicPartition(self.topic, self.global_partitions[j])
            try:
                low, _high = self._live().get_watermark_offsets(tp, timeout=wait_s)
            except KafkaException:
                return  # as above: no answer is no evidence
            if low > self._next[j]:
                raise self._retention_error(j, self._next[j], low)

    def _on_error(self, err: KafkaError, msg: Any) -> None:
        code = err.code()
        if code == KafkaError._PARTITION_EOF:
            j = self._local.get(msg.partition())
            offset = msg.offset()
            # Bounded: an EOF at or past the pinned end ends the partition (the pinned end is an EOF
            # offset too). An EOF below it means records there were deleted or are transaction markers.
            ends = self._ends
            if (
                j is not None
                and ends is not None
                and offset is not None
                and offset >= ends[j]
                and not self._ended[j]
            ):
                self._end_partition(j)
            return
        if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            j = self._local.get(msg.partition()) if msg.partition() is not None else None
            if j is not None:
                low = self._log_starts()[j]
                if self._next[j] < low:
                    raise self._retention_error(j, self._next[j], low)
            log.debug("offset out of range on %s (above the end): %s", self.topic, err.str())
            return
        if code in _UNKNOWN_CODES or err.fatal():
            raise TopicSourceError(f"reading topic {self.topic!r} failed: {err.str()}")
        log.debug("transient consumer error on %s: %s", self.topic, err.str())

    def _maybe_commit(self, *, force: bool = False) -> None:
        """Commit the delivered positions to the monitoring group, through the admin client: its requests
        have a timeout, where the consumer's own commits (and its close() after one) wait on a group
        coordinator that does not answer for as long as it does not answer. At most one commit is in flight;
        `force` (closing) waits for it, bounded."""
        if self.group_id is None or self._consumer is None:
            return
        now = self._clock()
        if not force and now - self._last_commit < self._commit_interval_s:
            return
        self._last_commit = now
        pending = self._commit_future
        if pending is not None and not pending.done():
            if not force:
                return  # the broker is slow: the next interval commits newer positions
            self._settle_commit(pending, _CLOSE_COMMIT_S)
        if self._committed == self._next:
            return
        positions = list(self._next)
        offsets = [TopicPartition(self.topic, g, positions[i]) for i, g in enumerate(self.global_partitions)]
        try:
            (future,) = self._admin.alter_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(self.group_id, offsets)], request_timeout=_CLOSE_COMMIT_S
            ).values()
        except KafkaException as exc:
            self._commit_failed(exc)
            return
        self._commit_future = future
        self._committed = positions
        if force:  # closing: the admin client goes away next
            self._settle_commit(future, _CLOSE_COMMIT_S)

    def _settle_commit(self, future: Any, timeout: float) -> None:
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            self._commit_failed(exc)
        except concurrent.futures.TimeoutError:
            log.info(
                "committing positions of %s to group %s: no answer in %gs", self.topic, self.group_id, timeout
            )

    def _commit_failed(self, exc: KafkaException) -> None:
        # Monitoring only: a failed commit must not stop the operator. A deleted topic's commits fail until
        # `_check_input` says why, in one line; a broker that does not answer is the output log's to report.
        error = exc.args[0] if exc.args else None
        quiet = isinstance(error, KafkaError) and error.code() in _QUIET_COMMIT_CODES
        (log.debug if quiet else log.warning)(
            "committing positions of %s to group %s failed: %s", self.topic, self.group_id, exc
        )

    def committed_positions(self) -> list[int] | None:
        """The positions last committed to the monitoring group (None before the first commit)."""
        return None if self._committed is None else list(self._committed)

    def close(self) -> None:
        if self._consumer is None:
            return
        try:
            self._maybe_commit(force=True)
        finally:
            consumer, self._consumer = self._consumer, None
            consumer.close()


class _CecQueueSource(QueueSource):
    """A cec queue on a Kafka cluster, read through `QueueSource` (R payloads; control tuples dropped once
    their checksum passes; EOS ends a partition). It owns the read-only store it reads through."""

    def __init__(
        self, store: Any, topic: str, schema: dict[str, Any], partitions: Sequence[int] | None
    ) -> None:
        self._owned_store = store
        try:
            super().__init__(store, topic, schema, partitions)
        except BaseException:
            store.close()
            raise

    def identity(self) -> dict[str, Any]:
        return {"type": "topic", "topic": self.topic, "format": "cec"}

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._owned_store.close()


def open_topic_source(spec: Mapping[str, Any], schemas: Mapping[str, dict[str, Any]]) -> InputSource:
    """The source of a `{"type": "topic", ...}` spec (see `operators.job.build_source`)."""
    fmt = spec.get("format", "json")
    subset = spec.get("input_partitions")
    if fmt == "cec":
        from queuestore.kafka import KafkaQueueStore

        schema = spec.get("schema")
        if schema is None:
            raise ConfigError("the cec format needs the payload schema of the queue (--schema)")
        payload = schemas[schema] if isinstance(schema, str) and schema in schemas else None
        if payload is None:
            from operators.formats import load_avro_schema

            payload = load_avro_schema(schema)
        state_dir = Path(spec.get("state_dir") or Path(tempfile.gettempdir()) / "cec-topic-readers")
        store = KafkaQueueStore(spec["bootstrap_servers"], state_dir, config=dict(spec.get("config") or {}))
        return _CecQueueSource(store, spec["topic"], payload, subset)
    return KafkaTopicSource(
        spec["bootstrap_servers"],
        spec["topic"],
        fmt=fmt,
        key_field=spec["key_field"],
        value_field=spec["value_field"],
        time_field=spec.get("time_field"),
        schema=spec.get("schema"),
        registry_url=spec.get("schema_registry"),
        columns=spec.get("columns"),
        partitions=subset,
        start_offsets=spec.get("start_offsets"),
        end_offsets=spec.get("end_offsets"),
        follow=bool(spec.get("follow", False)),
        group_id=spec.get("group_id"),
        config=spec.get("config"),
    )
