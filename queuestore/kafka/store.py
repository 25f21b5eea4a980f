"""`KafkaQueueStore`: topics of a Kafka cluster as CEC output queues (see the package docstring)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, OffsetSpec

from queuestore.base import ATTACHMENT_NAME, QueueStore, RecordMeta
from queuestore.exceptions import QueueStoreError, StoreClosedError, UnknownTopicError
from queuestore.kafka import admin as admin_ops
from queuestore.kafka.admin import ATTACHMENT_TOPIC_PREFIX
from queuestore.kafka.config import ClientSettings, lease_group_id, redact_config, transactional_id
from queuestore.kafka.framing import _HEADER_OVERHEAD, encode_message
from queuestore.kafka.lease import PartitionLease, lease_topic
from queuestore.kafka.reader import KafkaPartitionReader
from queuestore.kafka.writer import KafkaPartitionWriter

__all__ = ["DEFAULT_COMMIT_INTERVAL", "DEFAULT_COMMIT_RECORDS", "DEFAULT_MAX_RECORD_BYTES", "KafkaQueueStore"]

log = logging.getLogger(__name__)

_ATTACHMENT_KIND = "META"
_ACK_PREFIX = "ack-"  # attachments that register a consumer and hold its acknowledged offset

# Below the broker default message.max.bytes (1 MB) with room for headers and batch overhead, so that a
# record accepted by `append` is never rejected by the broker later (which would surface asynchronously).
DEFAULT_MAX_RECORD_BYTES = 900_000
# Commit cadence of the transactional writers: a commit drains the producer's pipeline and costs a round
# trip to the transaction coordinator, so commits are spaced by time and size (benchmarks/RESULTS.md has
# the measured cost against the idempotent producer). The interval is also the latency a read_committed
# consumer sees on top of the produce latency.
DEFAULT_COMMIT_INTERVAL = 0.1
DEFAULT_COMMIT_RECORDS = 50_000


class KafkaQueueStore(QueueStore):
    """Topics of a Kafka cluster (or any Kafka-protocol broker) used as CEC output queues.

    `config` is passed to every client (producer, consumers, admin) and is where security settings go
    (`security.protocol`, `sasl.*`, `ssl.*`); it is never logged and is masked in `repr`. Settings that the
    queue-store contract depends on (idempotence, acks=all, gapless delivery, no auto-commit) are forced
    after `config` is applied, because weakening them would silently break recovery.

    `topic_configs` override the configs `create_topic` sets (`cleanup.policy=delete`, `retention.ms=-1`):
    retention must stay longer than any checkpoint extent, otherwise recovery loses footprints.

    `request_timeout` bounds how long admin calls, positioned reads and transaction commits may go without
    progress, so that an unreachable broker surfaces as an error instead of a hang. `max_outstanding` bounds
    each writer's appended-but-not-completed records, which bounds memory when the broker is slower than the
    operator (a writer commits early when it reaches the bound).

    Writers are transactional (see the `queuestore.kafka` docstring): `transactional_id_prefix` namespaces their
    `transactional.id`s (e.g. per deployment on a shared cluster; every writer of one partition must use
    the same prefix, or they do not fence each other); `commit_interval` (seconds) and `commit_records` set
    the commit cadence; `clock` is what `commit_interval` is measured with (injectable for tests).

    `lease_timeout` (seconds; None: no lease): a writer also holds its partition's cross-host lease
    (`queuestore.kafka.lease`), so that a standby on another host sees the writer die within that long
    instead of taking over at once. Every writer of a partition must give it (the same prefix, too).
    """

    # Transaction markers take offsets (`queuestore.kafka` docstring): a gap between two offsets is not damage.
    dense_offsets: bool = False

    def __init__(
        self,
        bootstrap_servers: str,
        state_dir: Path,
        *,
        config: dict[str, str] | None = None,
        topic_configs: dict[str, str] | None = None,
        request_timeout: float = 30.0,
        max_outstanding: int = 100_000,
        transactional_id_prefix: str = "",
        commit_interval: float = DEFAULT_COMMIT_INTERVAL,
        commit_records: int = DEFAULT_COMMIT_RECORDS,
        clock: Callable[[], float] = time.monotonic,
        lease_timeout: float | None = None,
    ) -> None:
        if lease_timeout is not None and not lease_timeout > 0:
            raise QueueStoreError(f"lease_timeout must be > 0 seconds, got {lease_timeout!r}")
        self.bootstrap_servers = bootstrap_servers
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.max_record_bytes = DEFAULT_MAX_RECORD_BYTES
        # Seconds an admin/metadata/read operation may go without progress before it fails.
        self.request_timeout = request_timeout
        self.max_outstanding = max_outstanding
        self.transactional_id_prefix = transactional_id_prefix
        self.commit_interval = commit_interval
        self.commit_records = max(1, commit_records)
        self.clock = clock
        self.lease_timeout = lease_timeout
        # The writer leases of this store's partitions, kept across refused tries (a standby's: it stays a
        # member of the lease's group, so it is next) until the writer that held one closes.
        self._leases: dict[tuple[str, int], PartitionLease] = {}
        self._config: dict[str, Any] = dict(config or {})
        self._topic_configs: dict[str, str] = {
            "cleanup.policy": "delete",
            "retention.ms": "-1",
            **(topic_configs or {}),
        }
        self._admin: AdminClient | None = None
        self._lock = threading.Lock()
        self._children: list[KafkaPartitionWriter | KafkaPartitionReader] = []
        # The attachments read so far, per companion topic (`read_attachment`, `acknowledged`); its own
        # lock: a reader's close takes `_lock`.
        self._acks: dict[str, _Attachments] = {}
        self._acks_lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(bootstrap_servers={self.bootstrap_servers!r}, "
            f"state_dir={str(self.state_dir)!r}, config={redact_config(self._config)!r})"
        )

    __str__ = __repr__

    # -- client configs (queuestore.kafka.config) ----------------------------------------------------------

    def _settings(self) -> ClientSettings:
        return ClientSettings(self.bootstrap_servers, self._config, self.request_timeout)

    def _base_config(self, client_id: str) -> dict[str, Any]:
        return self._settings().client(client_id)

    def _producer_config(self, topic: str, partition: int) -> dict[str, Any]:
        return self._settings().transactional_producer(
            f"cec-writer-{topic}-{partition}",
            transactional_id(self.transactional_id_prefix, topic, partition),
            max_outstanding=self.max_outstanding,
        )

    def consumer_config(self, purpose: str) -> dict[str, Any]:
        """The settings of the store's own consumers (connection and security, read_committed, partition
        EOF events) for a consumer of another topic of the same cluster, e.g. a results topic."""
        return self._consumer_config(purpose)

    def _consumer_config(self, purpose: str) -> dict[str, Any]:
        return self._settings().consumer(f"cec-{purpose}")

    def _admin_client(self) -> AdminClient:
        self._check_open()
        with self._lock:
            if self._admin is None:
                self._admin = AdminClient(self._base_config("cec-admin"))
            return self._admin

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the Kafka queue store is closed")

    # -- topics -----------------------------------------------------------------------------------------

    def _topic_partitions(self, topic: str) -> int | None:
        return admin_ops.topic_partitions(self._admin_client(), self._where(), topic)

    def _where(self) -> admin_ops.Cluster:
        return admin_ops.Cluster(self.bootstrap_servers, self.request_timeout)

    def value_limit(self, meta: RecordMeta) -> int:
        # The window key travels beside the value (message key), the kind in the header and the frame.
        return self.max_record_bytes - _HEADER_OVERHEAD - len((meta.key or "").encode())

    def create_topic(
        self, topic: str, partitions: int, *, exist_ok: bool = True, configs: Mapping[str, str] | None = None
    ) -> None:
        """`configs` override the store's topic configs for this topic (a companion's compaction)."""
        settings = {**self._topic_configs, **(configs or {})}
        admin_ops.create_topic(
            self._admin_client(), self._where(), topic, partitions, settings, exist_ok=exist_ok
        )

    def topic_exists(self, topic: str) -> bool:
        return self._topic_partitions(topic) is not None

    def topics(self) -> list[str]:
        """Every topic of the cluster but the internal ones (`__consumer_offsets`, ...) and the companions
        that hold attachments (`cec-meta.*`): on a shared cluster that includes topics cec did not write."""
        return admin_ops.topics(self._admin_client(), self._where(), exclude=("_", ATTACHMENT_TOPIC_PREFIX))

    def cluster_id(self) -> str:
        """The cluster's id (the same through any bootstrap address); the bootstrap list if the broker
        reports none."""
        return admin_ops.cluster_id(self._admin_client(), self._where())

    def partitions(self, topic: str) -> int:
        n = self._topic_partitions(topic)
        if n is None:
            raise UnknownTopicError(f"topic {topic!r} does not exist")
        return n

    def offset_span(self, topic: str) -> int:
        """The offsets the topic's partitions hold from their log start to their last stable offset
        (records, transaction markers and aborted records alike), from the broker's offset listing: a size
        in one request per bound, never an end (no record is read: a new reader's `end_offset` reads the log
        from its start, which a fresh host's start paid for its whole history, 1-2 s at ~900k records)."""
        partitions = list(range(self.partitions(topic)))
        admin, timeout = self._admin_client(), self.request_timeout
        starts = admin_ops.list_offsets(admin, topic, partitions, OffsetSpec.earliest(), timeout)
        ends = admin_ops.list_offsets(admin, topic, partitions, OffsetSpec.latest(), timeout)
        return sum(max(0, end - start) for start, end in zip(starts, ends, strict=True))

    def _check_partition(self, topic: str, partition: int) -> None:
        n = self.partitions(topic)
        if not 0 <= partition < n:
            raise UnknownTopicError(
                f"topic {topic!r} has {n} partitions; partition {partition} does not exist"
            )

    # -- writers and readers ----------------------------------------------------------------------------

    def writer(self, topic: str, partition: int, *, fence_later: bool = False) -> KafkaPartitionWriter:
        # Checked first because producing to a missing topic would auto-create it on Tansu.
        self._check_partition(topic, partition)
        w = KafkaPartitionWriter(self, topic, partition, fence_later=fence_later)
        with self._lock:
            self._children.append(w)
        return w

    def _lease(self, topic: str, partition: int) -> PartitionLease | None:
        """The partition's writer lease (joined now or at an earlier try), None without `lease_timeout`."""
        if self.lease_timeout is None:
            return None
        with self._lock:
            lease = self._leases.get((topic, partition))
        if lease is not None:
            return lease
        companion = lease_topic(self.attachment_topic(topic))
        self.create_topic(companion, 1)
        lease = PartitionLease(
            self._settings().lease_consumer(
                f"cec-lease-{topic}-{partition}",
                lease_group_id(self.transactional_id_prefix, topic, partition),
                self.lease_timeout,
            ),
            companion,
            where=f"{topic}[{partition}]",
            timeout_s=self.lease_timeout,
            # An empty group answers after the broker's group.initial.rebalance.delay.ms; a group whose
            # holder died, once its session (the lease) timed out.
            first_answer_s=self.lease_timeout + self.request_timeout,
        )
        with self._lock:
            self._leases[(topic, partition)] = lease
        return lease

    def _release_lease(self, topic: str, partition: int) -> None:
        with self._lock:
            lease = self._leases.pop((topic, partition), None)
        if lease is not None:
            lease.close()

    def reader(self, topic: str, partition: int) -> KafkaPartitionReader:
        self._check_partition(topic, partition)
        r = KafkaPartitionReader(self, topic, partition)
        with self._lock:
            self._children.append(r)
        return r

    # -- attachments ------------------------------------------------------------------------------------

    def attachment_topic(self, topic: str) -> str:
        """The companion topic that holds `topic`'s attachments: in Kafka itself, so that any host with
        any state_dir finds them. One partition; records keyed by (output partition, name), newest wins.
        Written when a log starts (a handful of records per topic) and at each acknowledgement of a
        registered consumer (one per commit of `cec run`'s results writer); it keeps the store's default
        configs (nothing in it is ever deleted), and `read_attachment` and `acknowledged` read it on from
        where the last read ended."""
        return ATTACHMENT_TOPIC_PREFIX + topic

    @staticmethod
    def _attachment_meta(partition: int, name: str) -> RecordMeta:
        if not ATTACHMENT_NAME.match(name):
            raise QueueStoreError(f"invalid attachment name {name!r}")
        return RecordMeta(_ATTACHMENT_KIND, 0, f"{partition}/{name}")

    def read_attachment(self, topic: str, partition: int, name: str) -> bytes | None:
        """The newest value of the attachment, from the companion topic as read on from where this store's
        last read of it ended (`_Attachments`): a long run writes an acknowledgement at every commit of its
        results writer, so a scan from the companion's start at every call would grow with the run."""
        self._attachment_meta(partition, name)  # a bad name is refused before any read
        self._check_partition(topic, partition)
        attachments = self._attachments(self.attachment_topic(topic))
        return None if attachments is None else attachments.value(partition, name)

    def _attachments(self, companion: str) -> _Attachments | None:
        """The companion's attachments as read so far, brought up to its end; None if it does not exist."""
        with self._acks_lock:
            attachments = self._acks.get(companion)
            if attachments is None:
                if self._topic_partitions(companion) is None:
                    return None
                attachments = self._acks[companion] = _Attachments(self.reader(companion, 0))
            attachments.catch_up()
            return attachments

    def write_attachment(self, topic: str, partition: int, name: str, value: bytes) -> None:
        meta = self._attachment_meta(partition, name)
        self._check_partition(topic, partition)
        companion = self.attachment_topic(topic)
        self.create_topic(companion, 1)
        # A producer of its own, not a partition writer: the instances of every output partition write
        # to the one companion partition, and none of them owns it.
        admin_ops.produce_one(
            self._settings().idempotent_producer(f"cec-attach-{topic}-{partition}"),
            self._where(),
            companion,
            encode_message(value, meta),
            f"{name} of {topic}[{partition}] to {companion}",
        )

    # -- trimming (DESIGN-NOTES section 3): cec trims; the broker must not -----------------------------
    def check_retention(self, topic: str) -> None:
        """Refuse an output topic the broker itself may trim (finite retention, compaction): it would
        delete footprints recovery needs, or results no consumer has acknowledged, on its own clock."""
        admin_ops.check_retention(self._admin_client(), self._where(), topic)

    def acknowledge(self, topic: str, partition: int, consumer: str, offset: int) -> None:
        self.write_attachment(topic, partition, _ACK_PREFIX + consumer, str(int(offset)).encode())

    def forget_consumer(self, topic: str, partition: int, consumer: str) -> None:
        self.write_attachment(topic, partition, _ACK_PREFIX + consumer, b"")

    def acknowledged(self, topic: str, partition: int) -> dict[str, int]:
        """From the attachments as read so far (`_Attachments`, one reader of the companion topic kept for
        the store's life, which reads only what was appended since the last call): an operator asks at every
        due point and while it waits for a consumer."""
        self._check_partition(topic, partition)
        attachments = self._attachments(self.attachment_topic(topic))
        return {} if attachments is None else attachments.acknowledged(partition)

    def _forget(self, child: KafkaPartitionWriter | KafkaPartitionReader) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._children.remove(child)

    def close(self) -> None:
        if self._closed:
            return
        with self._acks_lock:
            self._acks.clear()  # their readers are children: closed below
        with self._lock:
            children = list(self._children)
        for child in children:
            try:
                child.close()
            except Exception:  # close the rest even if one fails; the error is not about them
                log.exception("closing %r failed", child)
        with self._lock:
            leases, self._leases = list(self._leases.values()), {}
        for lease in leases:  # a standby's that never got its writer
            lease.close()
        self._closed = True
        self._admin = None


class _Attachments:
    """The newest value of every (output partition, name) in a companion topic, kept up to date by reading
    on from where the last read ended (newest wins; an empty acknowledgement: a forgotten consumer). Derived
    data, checked at every catch-up: a companion that now ends below what was read (deleted and created
    again) is read again from its start."""

    def __init__(self, reader: KafkaPartitionReader) -> None:
        self.reader = reader
        self.next_offset = 0
        self.values: dict[tuple[int, str], bytes] = {}
        self.records_read = 0  # records read from the companion over this cache's life

    def catch_up(self) -> None:
        if self.next_offset and self.reader.end_offset() < self.next_offset:
            log.info("%s ends below what was read of it: reading it again", self.reader.topic)
            self.next_offset, self.values = 0, {}
        for record in self.reader.scan_forward(self.next_offset):
            self.next_offset = record.offset + 1
            self.records_read += 1
            key = record.meta.key
            if record.meta.kind != _ATTACHMENT_KIND or key is None:
                continue
            partition, _, name = key.partition("/")
            if partition.isdigit():
                self.values[(int(partition), name)] = record.value

    def value(self, partition: int, name: str) -> bytes | None:
        return self.values.get((partition, name))

    def acknowledged(self, partition: int) -> dict[str, int]:
        return {
            name[len(_ACK_PREFIX) :]: int(value)
            for (p, name), value in self.values.items()
            if p == partition and name.startswith(_ACK_PREFIX) and value
        }
