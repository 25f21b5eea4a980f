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

**Bounds.** A source has, per partition, a *start* (the log-start offset when the run first started:
offsets below it were never part of this run's input) and an *end* (the end of the partition then;
bounded runs stop there, `follow=True` runs until stopped). Both are resolved once, by `resolve_bounds`,
and must be kept with the job's log (`TopicBounds.as_dict`, `KafkaTopicSource.identity`) so a restarted run
reads exactly the same records: passing them back (`start_offsets`, `end_offsets`) pins them.

**Where bounds come from.** The log start is `AdminClient.list_offsets` with `OffsetSpec.earliest()`.
The end is where a read_committed consumer reports `PARTITION_EOF`, read from one offset below the end
that `list_offsets` with `OffsetSpec.latest()` gives under read_committed (the last stable offset): on
Apache Kafka that is one fetch per partition that ends where the listing said (or later, if records came
in between: both are ends the topic really had). A broker whose listing understates the end (Tansu
0.6 answers the last batch's base offset + 1, DESIGN-NOTES section 4) would otherwise cut each
partition's last batch off a bounded run without a word; the fetch reads on to the real end.

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
import gc
import logging
import math
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from pathlib import Path
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Message,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from cec.exceptions import ConfigError
from cec.native import native
from operators.base import InputTuple
from operators.exceptions import RetentionError, TopicDeletedError, TopicSourceError
from operators.formats import FORMATS, ValueDecoder, make_decoder
from operators.sources import InputSource, QueueSource, _partition_subset
from operators.topic_tuples import KEY_FIELD, TIMESTAMP_FIELD, RecordTuples, decode_values
from queuestore.kafka_config import environment_config

__all__ = [
    "KEY_FIELD",
    "TIMESTAMP_FIELD",
    "KafkaTopicSource",
    "TopicBounds",
    "decode_values",
    "open_topic_source",
    "resolve_bounds",
    "topic_partition_count",
]

log = logging.getLogger(__name__)
# The message accessors, called over a whole batch at C speed (`KafkaTopicSource._fast_batch`).
_ACCESSORS = (Message.error, Message.partition, Message.offset, Message.value)
_MSG_ERROR, _MSG_PARTITION, _MSG_OFFSET, _MSG_VALUE = _ACCESSORS
_rdkafka_log = logging.getLogger(__name__ + ".librdkafka")

_TIMEOUT_S = 30.0
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


@dataclass(frozen=True)
class TopicBounds:
    """Per global partition of the topic: where this run's input starts and (bounded runs) ends."""

    starts: tuple[int, ...]
    ends: tuple[int, ...]

    def as_dict(self) -> dict[str, list[int]]:
        return {"start_offsets": list(self.starts), "end_offsets": list(self.ends)}


def _client_config(
    bootstrap_servers: str, config: Mapping[str, Any] | None, client_id: str
) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "client.id": client_id,
        "logger": _rdkafka_log,
        "log.queue": True,
        # A lost answer (a fetch's, a metadata request's) is asked again after this, not after librdkafka's
        # 60 s: the source would otherwise sit idle for a minute (the store's clients do the same).
        "socket.timeout.ms": int(_TIMEOUT_S * 1000 / 3),
    }
    conf.update(environment_config())
    conf.update(config or {})
    return conf


def _consumer_config(
    bootstrap_servers: str, config: Mapping[str, Any] | None, group_id: str | None
) -> dict[str, Any]:
    conf: dict[str, Any] = {
        # Tansu holds every fetch for fetch.wait.max.ms even when data is there; short waits cost nothing
        # on Apache Kafka, which answers as soon as data is available.
        "fetch.wait.max.ms": 10,
        "fetch.queue.backoff.ms": 10,
        "fetch.error.backoff.ms": 100,
        "isolation.level": "read_committed",
    }
    conf.update(_client_config(bootstrap_servers, config, "cec-topic-source"))
    conf.update(
        {
            # The source positions itself (assign at explicit offsets); the group only receives commits.
            "group.id": group_id or f"cec-topic-source-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            # Reading below the log start must be reported, never moved silently to the earliest offset.
            "auto.offset.reset": "error",
            "allow.auto.create.topics": False,
        }
    )
    return conf


def topic_partition_count(bootstrap_servers: str, topic: str, config: Mapping[str, Any] | None = None) -> int:
    admin = AdminClient(_client_config(bootstrap_servers, config, "cec-topic-admin"))
    return _partition_count(admin, bootstrap_servers, topic)


def _partition_count(admin: AdminClient, bootstrap_servers: str, topic: str) -> int:
    try:
        md = admin.list_topics(timeout=_TIMEOUT_S)  # all topics: naming one may auto-create it
    except KafkaException as exc:
        raise TopicSourceError(f"cannot reach Kafka at {bootstrap_servers}: {exc}") from None
    tmd = md.topics.get(topic)
    if tmd is None or tmd.error is not None or not tmd.partitions:
        raise TopicSourceError(f"input topic {topic!r} does not exist at {bootstrap_servers}")
    return len(tmd.partitions)


# Answers to a ListOffsets that asking again cannot change: the topic or partition is not there, or the
# client may not see it. Anything else (a connection lost under the request, no answer, the leaders not
# found because the metadata request before it failed) is asked again until _TIMEOUT_S: found with the
# fault proxy, one cut connection under the request stopped the run, or (no error at all) gave -1001.
_LIST_OFFSETS_FINAL = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError._INVALID_ARG,
    }
)


def _list_offsets(admin: AdminClient, topic: str, partitions: Sequence[int], spec: OffsetSpec) -> list[int]:
    from confluent_kafka import IsolationLevel

    request = {TopicPartition(topic, p): spec for p in partitions}
    deadline = time.monotonic() + _TIMEOUT_S
    while True:
        try:
            futures = admin.list_offsets(
                request,
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=max(1.0, deadline - time.monotonic()),
            )
            offsets = [futures[tp].result().offset for tp in request]
            if min(offsets, default=0) >= 0:
                return offsets
            # Measured (confluent-kafka 2.16, through the fault proxy): when the ListOffsets request is
            # lost (its connection cut, its answer dropped) the result is offset -1001 (OFFSET_INVALID)
            # for every partition, without an error. Never a bound: ask again.
            if time.monotonic() >= deadline:
                raise TopicSourceError(
                    f"cannot list the offsets of {topic!r}: no valid answer within {_TIMEOUT_S:.0f}s "
                    f"(got {offsets})"
                )
            log.debug("listing the offsets of %s gave %s; asking again", topic, offsets)
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            final = err is None or err.code() in _LIST_OFFSETS_FINAL or err.fatal()
            if final or time.monotonic() >= deadline:
                raise TopicSourceError(f"cannot list the offsets of {topic!r}: {exc}") from None
            log.debug("listing the offsets of %s: %s; asking again", topic, exc)
        time.sleep(0.1)  # pacing of a bounded retry while the connection settles


def _topic_id(admin: AdminClient, topic: str) -> str | None:
    """The topic's id (Kafka >= 2.8 gives every topic one; a topic created again under the same name gets
    a new one), or None where the broker does not say."""
    try:
        described = admin.describe_topics(TopicCollection([topic]), request_timeout=_TIMEOUT_S)[
            topic
        ].result()
    except (KafkaException, ValueError):
        return None
    topic_id = str(getattr(described, "topic_id", None) or "")
    return topic_id if topic_id.strip("A") else None  # all zero bits (base64 "AAAA..."): no id


def _confirmed_ends(
    consumer: Consumer, topic: str, listed: Sequence[int], starts: Sequence[int]
) -> list[int]:
    """Each partition's end as the offset where consuming reports PARTITION_EOF, read from one below its
    listed end (see the module docstring), or from its log start when the listing says it is empty (a
    broker that understates may say so of a partition that is not)."""
    ends = list(starts)
    waiting = set(range(len(ends)))
    consumer.assign([TopicPartition(topic, p, max(starts[p], listed[p] - 1)) for p in sorted(waiting)])
    try:
        deadline = time.monotonic() + _TIMEOUT_S
        while waiting and time.monotonic() < deadline:
            msg = consumer.poll(_POLL_S)
            if msg is None:
                continue
            err, p = msg.error(), msg.partition()
            if err is None or p not in waiting:
                continue
            if err.code() == KafkaError._PARTITION_EOF:
                offset = msg.offset()
                assert offset is not None
                ends[p] = max(starts[p], offset)
                waiting.discard(p)
                consumer.incremental_unassign([TopicPartition(topic, p)])
            elif err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                # Out of range: the listing overstated the end, or records were deleted past it since:
                # read on from the log start.
                consumer.incremental_unassign([TopicPartition(topic, p)])
                consumer.incremental_assign([TopicPartition(topic, p, OFFSET_BEGINNING)])
            elif err.code() in _UNKNOWN_CODES:
                raise TopicSourceError(f"{topic}[{p}]: {err.str()}")
    finally:
        consumer.unassign()
    if waiting:
        raise TopicSourceError(
            f"no end of partition {sorted(waiting)} of {topic!r} within {_TIMEOUT_S}s: the broker does not "
            "answer fetches"
        )
    return ends


def resolve_bounds(
    bootstrap_servers: str, topic: str, *, config: Mapping[str, Any] | None = None
) -> TopicBounds:
    """Each partition's log start and end, now (see the module docstring for where they come from)."""
    admin = AdminClient(_client_config(bootstrap_servers, config, "cec-topic-admin"))
    n = _partition_count(admin, bootstrap_servers, topic)
    partitions = list(range(n))
    starts = _list_offsets(admin, topic, partitions, OffsetSpec.earliest())
    listed = _list_offsets(admin, topic, partitions, OffsetSpec.latest())
    consumer = Consumer(_consumer_config(bootstrap_servers, config, None))
    try:
        ends = _confirmed_ends(consumer, topic, listed, starts)
    except KafkaException as exc:
        raise TopicSourceError(f"cannot find the end of {topic!r}: {exc}") from None
    finally:
        consumer.close()
    return TopicBounds(tuple(starts), tuple(ends))


class KafkaTopicSource(InputSource):
    """An ordinary Kafka topic (json, avro, registry or csv values); see the module docstring."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        fmt: str,
        key_field: str,
        value_field: str,
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
        self._admin = AdminClient(_client_config(bootstrap_servers, config, "cec-topic-admin"))
        total = _partition_count(self._admin, bootstrap_servers, topic)
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
        self._consumer: Consumer | None = Consumer(_consumer_config(bootstrap_servers, config, group_id))
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
        self._topic_id = _topic_id(self._admin, topic)  # a topic deleted and created again has another

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
            return _list_offsets(self._admin, self.topic, list(self.global_partitions), OffsetSpec.earliest())
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

    def _fast_batch(self, msgs: list[Message]) -> list[InputTuple] | None:
        """The batch's tuples when it is plain (the common case): no error event, every record below its
        partition's end, no value absent, every value decoded with the fields the operator needs. Every
        per-record step runs in C (`map` over the message accessors, one batch decode, `map` building
        the tuples); None, having changed nothing, when the batch needs the per-record path. With the C
        accelerator, all of it is one call (`_native_batch`)."""
        if self._native_spec is not None:
            return self._native_batch(msgs)
        if self._inject_ts or self._inject_key:
            return None
        # Truthiness, not `== None`: KafkaError's comparison with None leaks a TypeError (confluent-kafka).
        if any(map(_MSG_ERROR, msgs)):
            return None
        parts: list[int] = list(map(_MSG_PARTITION, msgs))  # type: ignore[arg-type]
        offsets: list[int] = list(map(_MSG_OFFSET, msgs))  # type: ignore[arg-type]
        local_of, limits = self._local, self._limits
        last = dict(zip(parts, offsets, strict=True))  # offsets grow within a partition: its last offset
        try:
            if any(offset >= limits[local_of[p]] for p, offset in last.items()):
                return None  # past an end, or prefetched after a partition ended: per record
        except KeyError:
            return None
        raws = list(map(_MSG_VALUE, msgs))
        if getattr(self._decoder, "decode_many", None) is None or None in raws:
            return None
        # A batch allocates a dict and a tuple per record, none of them cyclic: the cyclic collector's
        # passes over them halved the input rate (measured: benchmarks/bench_topic_source.py), so it is
        # paused for the batch (process-wide; left as it was if someone else turned it off).
        collecting = gc.isenabled()
        if collecting:
            gc.disable()
        try:
            return self._fast_tuples(msgs, parts, offsets, last, raws, decode_values(self._decoder, raws))
        finally:
            if collecting:
                gc.enable()

    def _native_batch(self, msgs: list[Message]) -> list[InputTuple] | None:
        """`_fast_batch` in one C call (`cec._native.topic_batch`): the same checks, the same tuples, the
        records as mappings that hold the fields the operator reads. A record it declines (tombstone,
        malformed, a field missing, null or nested...) is decoded here on its own, which gives its value
        or its reason exactly as the per-record path."""
        assert native is not None
        collecting = gc.isenabled()  # see _fast_batch
        if collecting:
            gc.disable()
        try:
            got = native.topic_batch(
                msgs, _ACCESSORS, InputTuple, self._local_of, self._limits, self._next, self._native_spec
            )
            if got is None:
                return None
            out, declined = got
            if declined:
                redo = [i for i, t in enumerate(out) if t is None]
                again = [msgs[i] for i in redo]
                fixed = self._tuples(
                    [self._local[m.partition()] for m in again],  # type: ignore[index]
                    [m.offset() for m in again],  # type: ignore[misc]
                    [m.value() for m in again],
                    [],
                )
                for i, tup in zip(redo, fixed, strict=True):
                    out[i] = tup
            return out
        finally:
            if collecting:
                gc.enable()

    def _fast_tuples(
        self,
        msgs: list[Message],
        parts: list[int],
        offsets: list[int],
        last: dict[int, int],
        raws: list[Any],
        decoded: list[Any],
    ) -> list[InputTuple]:
        n, local_of = len(msgs), self._local
        try:
            got = list(map(self._getter, decoded))  # a reason (str) or a record missing a field raises
        except (KeyError, TypeError):
            got = None
        if got is None or (None in got if len(self._required) == 1 else None in chain.from_iterable(got)):
            return self._tuples([local_of[p] for p in parts], offsets, raws, [], decoded=decoded)
        nxt = self._next
        for p, offset in last.items():
            nxt[local_of[p]] = offset + 1
        js = parts if self._identity_partitions else list(map(local_of.__getitem__, parts))
        return list(
            map(
                tuple.__new__,
                repeat(InputTuple, n),
                zip(js, offsets, decoded, repeat(None, n), raws, strict=True),
            )
        )

    def _slow_batch(self, msgs: list[Message]) -> list[InputTuple]:
        """Record by record: error events, ends inside the batch, absent values, injected fields."""
        # `limits[j]` is the pinned end (or no limit), -1 once partition j ended.
        limits, nxt, local_of = self._limits, self._next, self._local
        keep_msgs = self._inject_ts or self._inject_key
        js: list[int] = []
        offsets: list[int] = []
        raws: list[bytes | None] = []
        kept: list[Any] = []
        for msg in msgs:
            if msg.error() is not None:
                self._on_error(msg.error(), msg)  # type: ignore[arg-type]
                continue
            j = local_of[msg.partition()]  # type: ignore[index]
            offset: int = msg.offset()  # type: ignore[assignment]
            if offset >= limits[j]:
                if limits[j] >= 0:
                    self._end_partition(j)
                continue  # past the end, or prefetched before the partition ended
            nxt[j] = offset + 1
            js.append(j)
            offsets.append(offset)
            raws.append(msg.value())
            if keep_msgs:
                kept.append(msg)
        return self._tuples(js, offsets, raws, kept) if raws else []

    def _tuples(
        self,
        js: list[int],
        offsets: list[int],
        raws: list[Any],
        msgs: list[Any],
        *,
        decoded: list[Any] | None = None,
    ) -> list[InputTuple]:
        """Decode a batch (one call for the whole batch where the decoder can: `decode_many`) and check
        the fields the operator needs (`RecordTuples`)."""
        if decoded is not None:  # `_fast_batch` decoded them, and advanced no position
            nxt = self._next
            for j, offset in dict(zip(js, offsets, strict=True)).items():
                nxt[j] = offset + 1
        timestamps = [m.timestamp()[1] for m in msgs] if msgs else None
        keys = [m.key() for m in msgs] if msgs else None
        return self._records.tuples(js, offsets, raws, timestamps=timestamps, keys=keys, decoded=decoded)

    def _check_input(self) -> None:
        """Nothing arrived for `idle_check_s`: a consumer of assigned partitions waits silently forever on a
        topic that was deleted (or deleted and created again, its offsets back at 0), so ask the broker.
        A broker that does not answer is not an error here: the client reconnects, and the store's writer
        reports a broker that stays away."""
        self._last_delivery = self._clock()
        try:
            md = self._admin.list_topics(timeout=_TIMEOUT_S)  # all topics: naming one may auto-create it
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
        topic_id = _topic_id(self._admin, self.topic)
        if self._topic_id is not None and topic_id is not None and topic_id != self._topic_id:
            raise TopicDeletedError(
                f"the input topic {self.topic!r} was deleted and created again while this run read it (its "
                f"topic id changed from {self._topic_id} to {topic_id}): the run's input is gone; its log is "
                "intact but its results cannot be completed"
            )
        for j in waiting:
            tp = TopicPartition(self.topic, self.global_partitions[j])
            try:
                low, _high = self._live().get_watermark_offsets(tp, timeout=_TIMEOUT_S)
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


def pin_bounds(spec: Mapping[str, Any]) -> dict[str, Any]:
    """`spec` with its start and end offsets resolved now, unless it already has them: call once when a
    job first starts and keep the result (with the log), so every restart reads the same records."""
    out = dict(spec)
    if out.get("format", "json") == "cec" or ("start_offsets" in out and "end_offsets" in out):
        return out
    bounds = resolve_bounds(out["bootstrap_servers"], out["topic"], config=out.get("config"))
    out.setdefault("start_offsets", list(bounds.starts))
    out.setdefault("end_offsets", list(bounds.ends))
    return out
