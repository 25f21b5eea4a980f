"""Where a run over a user's Kafka topic starts and ends (`operators.topic_source`'s bounds).

A source has, per partition, a *start* (the log-start offset when the run first started: offsets below it
were never part of this run's input) and an *end* (the end of the partition then; bounded runs stop there,
`follow=True` runs until stopped). Both are resolved once, by `resolve_bounds`, and must be kept with the
job's log (`TopicBounds.as_dict`, `KafkaTopicSource.identity`) so a restarted run reads exactly the same
records: passing them back (`start_offsets`, `end_offsets`) pins them.

**Where bounds come from.** The log start is `AdminClient.list_offsets` with `OffsetSpec.earliest()`.
The end is where a read_committed consumer reports `PARTITION_EOF` (`queuestore.kafka.ends`, the one
end-finder), read from one offset below the end that `list_offsets` with `OffsetSpec.latest()` gives under
read_committed (the last stable offset): on Apache Kafka that is one fetch per partition that ends where
the listing said (or later, if records came in between: both are ends the topic really had). A broker
whose listing understates the end (Tansu 0.6 answers the last batch's base offset + 1, DESIGN-NOTES
section 4) would otherwise cut each partition's last batch off a bounded run without a word; the fetch
reads on to the real end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, OffsetSpec

from operators.exceptions import TopicSourceError
from queuestore.kafka import admin as kafka_admin
from queuestore.kafka.config import SOURCE_CONSUMER_TUNING, SOURCE_LOG, ClientSettings
from queuestore.kafka.ends import find_ends

__all__ = ["TopicBounds", "pin_bounds", "resolve_bounds", "topic_partition_count"]

TIMEOUT_S = 30.0


@dataclass(frozen=True)
class TopicBounds:
    """Per global partition of the topic: where this run's input starts and (bounded runs) ends."""

    starts: tuple[int, ...]
    ends: tuple[int, ...]

    def as_dict(self) -> dict[str, list[int]]:
        return {"start_offsets": list(self.starts), "end_offsets": list(self.ends)}


def settings(bootstrap_servers: str, config: Mapping[str, Any] | None) -> ClientSettings:
    """The topic source's clients: the user's settings, librdkafka's lines under the source's logger."""
    return ClientSettings(bootstrap_servers, dict(config or {}), TIMEOUT_S, SOURCE_LOG)


def consumer_config(
    bootstrap_servers: str, config: Mapping[str, Any] | None, group_id: str | None
) -> dict[str, Any]:
    """The source's consumer: it positions itself (assign at explicit offsets); the group, if any, only
    receives commits; reading below the log start is reported, never moved silently."""
    return settings(bootstrap_servers, config).consumer(
        "cec-topic-source", group_id=group_id, tuning=SOURCE_CONSUMER_TUNING, read_committed=False
    )


def admin_client(bootstrap_servers: str, config: Mapping[str, Any] | None) -> AdminClient:
    return AdminClient(settings(bootstrap_servers, config).client("cec-topic-admin"))


def topic_partition_count(bootstrap_servers: str, topic: str, config: Mapping[str, Any] | None = None) -> int:
    return partition_count(admin_client(bootstrap_servers, config), bootstrap_servers, topic)


def partition_count(admin: AdminClient, bootstrap_servers: str, topic: str) -> int:
    try:
        md = admin.list_topics(timeout=TIMEOUT_S)  # all topics: naming one may auto-create it
    except KafkaException as exc:
        raise TopicSourceError(f"cannot reach Kafka at {bootstrap_servers}: {exc}") from None
    tmd = md.topics.get(topic)
    if tmd is None or tmd.error is not None or not tmd.partitions:
        raise TopicSourceError(f"input topic {topic!r} does not exist at {bootstrap_servers}")
    return len(tmd.partitions)


def list_offsets(admin: AdminClient, topic: str, partitions: Sequence[int], spec: OffsetSpec) -> list[int]:
    """`queuestore.kafka.admin.list_offsets`, its failure said as the source's."""
    try:
        return kafka_admin.list_offsets(admin, topic, partitions, spec, TIMEOUT_S)
    except kafka_admin.ListOffsetsError as exc:
        raise TopicSourceError(str(exc)) from None


def resolve_bounds(
    bootstrap_servers: str, topic: str, *, config: Mapping[str, Any] | None = None
) -> TopicBounds:
    """Each partition's log start and end, now (see the module docstring for where they come from)."""
    admin = admin_client(bootstrap_servers, config)
    n = partition_count(admin, bootstrap_servers, topic)
    partitions = list(range(n))
    starts = list_offsets(admin, topic, partitions, OffsetSpec.earliest())
    listed = list_offsets(admin, topic, partitions, OffsetSpec.latest())
    consumer = kafka_admin.consumer_knowing(consumer_config(bootstrap_servers, config, None), topic)
    try:
        found = find_ends(
            consumer,
            topic,
            partitions,
            # One below the listed end, or the log start when the listing says the partition is empty (a
            # broker that understates may say so of a partition that is not).
            [max(starts[p], listed[p] - 1) for p in partitions],
            log_start=lambda p: list_offsets(admin, topic, [p], OffsetSpec.earliest())[0],
            stall_timeout=TIMEOUT_S,
            on_stall=lambda waiting: TopicSourceError(
                f"no end of partition {waiting} of {topic!r} within {TIMEOUT_S}s: the broker does not "
                "answer fetches"
            ),
            on_unknown=lambda p, err: TopicSourceError(f"{topic}[{p}]: {err.str()}"),
        )
    except KafkaException as exc:
        raise TopicSourceError(f"cannot find the end of {topic!r}: {exc}") from None
    finally:
        consumer.close()
    return TopicBounds(tuple(starts), tuple(max(s, e) for s, e in zip(starts, found, strict=True)))


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
