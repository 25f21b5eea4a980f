"""Cluster administration for cec's Kafka clients: topics (partition counts, creation, listing), the
retention check of an output topic, offsets and topic ids of an input topic, and the one-record produce of
an attachment. Functions over an `AdminClient` (a store or a source owns it) and the `Cluster` they speak
to, so that each error names the cluster and the bound it waited."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec

from queuestore.exceptions import BrokerUnavailableError, QueueStoreError, TopicMismatchError
from queuestore.kafka.errors import _error_code, _kafka_error, _store_error

__all__ = [
    "ATTACHMENT_TOPIC_PREFIX",
    "Cluster",
    "check_retention",
    "cluster_id",
    "consumer_knowing",
    "create_topic",
    "list_offsets",
    "produce_one",
    "topic_id",
    "topic_partitions",
    "topics",
]

log = logging.getLogger(__name__)

# The longest a new consumer waits for its topic's metadata (`consumer_knowing`): about the wait it saves;
# one round trip on a broker that answers.
METADATA_WARMUP_S = 1.0

# Attachments of topic T (see QueueStore.read_attachment) live in topic ATTACHMENT_TOPIC_PREFIX + T.
ATTACHMENT_TOPIC_PREFIX = "cec-meta."


@dataclass(frozen=True)
class Cluster:
    """The cluster an admin call speaks to (named in errors) and how long a call may wait."""

    bootstrap_servers: str
    request_timeout: float


def _metadata(admin: AdminClient, cluster: Cluster) -> Any:
    """All topics' metadata: listing all rather than naming one, because a metadata request naming a topic
    can auto-create it on brokers with auto.create.topics.enable (Tansu auto-creates on produce too)."""
    try:
        return admin.list_topics(timeout=cluster.request_timeout)
    except KafkaException as exc:
        raise _store_error(
            exc, cluster.bootstrap_servers, "read cluster metadata", cluster.request_timeout
        ) from None


def topic_partitions(admin: AdminClient, cluster: Cluster, topic: str) -> int | None:
    """Partition count from cluster metadata, None when the topic does not exist."""
    tmd = _metadata(admin, cluster).topics.get(topic)
    if tmd is None or tmd.error is not None or not tmd.partitions:
        return None
    return len(tmd.partitions)


def _wait_partitions(admin: AdminClient, cluster: Cluster, topic: str) -> int:
    # Metadata propagates asynchronously after CreateTopics on a multi-broker cluster.
    deadline = time.monotonic() + cluster.request_timeout
    while True:
        n = topic_partitions(admin, cluster, topic)
        if n is not None:
            return n
        if time.monotonic() >= deadline:
            raise QueueStoreError(
                f"topic {topic!r} did not appear in metadata within {cluster.request_timeout}s"
            )
        time.sleep(0.05)  # pacing of a bounded metadata poll, not a wait for correctness


def create_topic(
    admin: AdminClient,
    cluster: Cluster,
    topic: str,
    partitions: int,
    configs: Mapping[str, str],
    *,
    exist_ok: bool = True,
) -> None:
    """Create `topic` with `partitions` and `configs`; an existing one must have that many partitions."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    new = NewTopic(topic, num_partitions=partitions, replication_factor=-1, config=dict(configs))
    future = admin.create_topics([new], request_timeout=cluster.request_timeout)[topic]
    try:
        future.result()
    except KafkaException as exc:
        if _error_code(exc) != KafkaError.TOPIC_ALREADY_EXISTS:
            raise _store_error(
                exc, cluster.bootstrap_servers, f"create topic {topic!r}", cluster.request_timeout
            ) from None
        if not exist_ok:
            raise TopicMismatchError(f"topic {topic!r} already exists") from exc
        existing = _wait_partitions(admin, cluster, topic)
        if existing != partitions:
            raise TopicMismatchError(
                f"topic {topic!r} exists with {existing} partitions, {partitions} requested"
            ) from exc
        return
    existing = _wait_partitions(admin, cluster, topic)
    if existing != partitions:  # someone raced us with another count
        raise TopicMismatchError(f"topic {topic!r} has {existing} partitions, {partitions} requested")


def topics(admin: AdminClient, cluster: Cluster, *, exclude: tuple[str, ...]) -> list[str]:
    """The cluster's topics, sorted, but those whose names start with one of `exclude`."""
    md = _metadata(admin, cluster)
    return sorted(
        name for name, tmd in md.topics.items() if tmd.error is None and not name.startswith(exclude)
    )


def cluster_id(admin: AdminClient, cluster: Cluster) -> str:
    """The cluster's id (the same through any bootstrap address); the bootstrap list if none is reported."""
    return _metadata(admin, cluster).cluster_id or cluster.bootstrap_servers


def check_retention(admin: AdminClient, cluster: Cluster, topic: str) -> None:
    """Refuse a topic the broker itself may trim (finite retention, compaction): it would delete
    footprints recovery needs, or results no consumer has acknowledged, on its own clock."""
    resource = ConfigResource("topic", topic)
    try:
        futures = admin.describe_configs([resource], request_timeout=cluster.request_timeout)
        configs = next(iter(futures.values())).result(cluster.request_timeout)
    except KafkaException as exc:
        raise _store_error(
            exc, cluster.bootstrap_servers, f"read the configs of topic {topic!r}", cluster.request_timeout
        ) from None
    problems = []
    for name in ("retention.ms", "retention.bytes"):
        entry = configs.get(name)
        if entry is not None and entry.value not in (None, "") and int(entry.value) >= 0:
            problems.append(f"{name}={entry.value}")
    policy = configs.get("cleanup.policy")
    if policy is not None and policy.value and "compact" in policy.value:
        problems.append(f"cleanup.policy={policy.value}")
    if problems:
        raise TopicMismatchError(
            f"topic {topic!r} has {', '.join(problems)}: the broker would delete records recovery or a "
            "registered consumer still needs (cec trims its logs itself); set retention.ms=-1, "
            "retention.bytes=-1 and cleanup.policy=delete on it"
        )


def produce_one(
    config: dict[str, Any],
    cluster: Cluster,
    topic: str,
    message: tuple[bytes | None, bytes, list[tuple[str, str | bytes | None]]],
    what: str,
) -> None:
    """Produce one (key, value, headers) to partition 0 of `topic` with a producer of its own, durably."""
    producer = Producer(config)
    failures: list[KafkaError] = []
    key, value, headers = message
    producer.produce(
        topic,
        value=value,
        key=key,
        headers=headers,
        partition=0,
        on_delivery=lambda err, _msg: failures.append(err) if err is not None else None,
    )
    left = producer.flush(cluster.request_timeout)
    if failures:
        raise QueueStoreError(f"cannot write {what}: {failures[0].str()}")
    if left:
        raise BrokerUnavailableError(cluster.bootstrap_servers, f"writing {what}", cluster.request_timeout)


# Answers to a ListOffsets that asking again cannot change: the topic or partition is not there, or the
# client may not see it. Anything else (a connection lost under the request, no answer, the leaders not
# found because the metadata request before it failed) is asked again until the timeout: found with the
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


class ListOffsetsError(QueueStoreError):
    """ListOffsets gave no valid answer (the message says why); callers say it in their own terms."""


def list_offsets(
    admin: AdminClient, topic: str, partitions: Sequence[int], spec: OffsetSpec, timeout: float
) -> list[int]:
    """The offsets `spec` names (earliest, latest) of `partitions` under read_committed, asked again while
    the answer is one that asking again can change (`ListOffsetsError` after `timeout`)."""
    from confluent_kafka import IsolationLevel

    request = {TopicPartition(topic, p): spec for p in partitions}
    deadline = time.monotonic() + timeout
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
                raise ListOffsetsError(
                    f"cannot list the offsets of {topic!r}: no valid answer within {timeout:.0f}s "
                    f"(got {offsets})"
                )
            log.debug("listing the offsets of %s gave %s; asking again", topic, offsets)
        except KafkaException as exc:
            err = _kafka_error(exc)
            final = err is None or err.code() in _LIST_OFFSETS_FINAL or err.fatal()
            if final or time.monotonic() >= deadline:
                raise ListOffsetsError(f"cannot list the offsets of {topic!r}: {exc}") from None
            log.debug("listing the offsets of %s: %s; asking again", topic, exc)
        time.sleep(0.1)  # pacing of a bounded retry while the connection settles


def topic_id(admin: AdminClient, topic: str, timeout: float) -> str | None:
    """The topic's id (Kafka >= 2.8 gives every topic one; a topic created again under the same name gets
    a new one), or None where the broker does not say."""
    try:
        described = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout)[topic].result()
    except (KafkaException, ValueError):
        return None
    found = str(getattr(described, "topic_id", None) or "")
    return found if found.strip("A") else None  # all zero bits (base64 "AAAA..."): no id


def consumer_knowing(conf: Mapping[str, Any], topic: str, *, timeout: float = METADATA_WARMUP_S) -> Consumer:
    """A new consumer that already knows `topic`'s partition leaders: every consumer cec makes to read a
    topic from given positions (a log reader, an input source, the search for an input's ends).

    librdkafka learns the metadata of a topic first assigned to a new client only at its next topic scan,
    which runs once a second: the first read of a new consumer waited up to ~1 s for it (0.97 s each in the
    attached query's resume check, measured with librdkafka's debug log: assigned at once, "metadata
    information unknown" a second later; up to 0.93 s before a fresh host's first replayed input). One
    metadata request for the topic when the consumer is made fills its cache first. An answer that does
    not come within `timeout` only leaves the wait to librdkafka's scan, as before (a broker that is down is
    found out by the read itself, within its own stall timeout). Naming the topic does not create it: a
    consumer does not ask the broker to (`allow.auto.create.topics` is false for consumers)."""
    consumer = Consumer(dict(conf))
    with contextlib.suppress(KafkaException):
        consumer.list_topics(topic, timeout=timeout)
    return consumer
