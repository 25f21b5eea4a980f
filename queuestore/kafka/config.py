"""Client configs: the one builder of every Kafka client cec makes (the queue store's producers, readers and
admin client, the topic source's consumer and admin client, the Spark sink's producer), and the properties
file that the environment names.

`CEC_KAFKA_CONFIG` names a file of librdkafka properties for every Kafka client cec makes in this process
and its worker processes (what `cec ... --kafka-config FILE` sets): security settings
(`security.protocol`, `sasl.*`, `ssl.*`), timeouts, anything librdkafka accepts. The file is read where
clients are made, never copied into job specs, logs or topics: it may hold credentials. Its format is
Kafka's client properties file (what Kafka's own tools take with `--command-config`): one `key=value` (or
`key: value`) a line; blank lines and lines starting with `#` or `!` are comments. Settings given in code
(`KafkaQueueStore(config=...)`) win over the file's, and the settings the store's guarantees depend on are
forced over both.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka

from cec.exceptions import ConfigError

__all__ = [
    "ENV",
    "LIBRDKAFKA_LOGGERS",
    "SOURCE_CONSUMER_TUNING",
    "STORE_CONSUMER_TUNING",
    "ClientSettings",
    "environment_config",
    "lease_group_id",
    "quiet_librdkafka",
    "read_properties",
    "redact_config",
    "transactional_id",
]

ENV = "CEC_KAFKA_CONFIG"

# The loggers librdkafka's own lines go to (every client cec makes logs through one of them). The names
# are the ones the store and the topic source have always logged under, whatever module builds the client.
LIBRDKAFKA_LOGGERS = ("queuestore.kafka.librdkafka", "operators.topic_source.librdkafka")
STORE_LOG = logging.getLogger(LIBRDKAFKA_LOGGERS[0])
SOURCE_LOG = logging.getLogger(LIBRDKAFKA_LOGGERS[1])

_cache: dict[tuple[str, int], dict[str, str]] = {}

# Whether this librdkafka knows `metadata.recovery.strategy` (KIP-899, librdkafka 2.10; confluent-kafka 2.4+
# is accepted, and an unknown property is an error there).
_REBOOTSTRAPS = confluent_kafka.libversion()[1] >= 0x020A0000

_SENSITIVE_PREFIXES = ("sasl.", "ssl.")
_SENSITIVE_WORDS = ("password", "secret", "token", "credential", "jaas", "key")
_REDACTED = "***"

# Defaults of the queue store's readers (a user's config may override them).
STORE_CONSUMER_TUNING: Mapping[str, Any] = {
    # Tansu holds every fetch for the full fetch.wait.max.ms, even when data is available, so every
    # positioned read costs about two waits; keep it short.
    "fetch.wait.max.ms": 10,
    # Positioned reads stop consuming mid-stream and re-assign, which leaves the prefetch queue over
    # its thresholds; librdkafka then pauses fetching for fetch.queue.backoff.ms (1 s by default),
    # which made about one backward chunk in three take a second.
    "fetch.queue.backoff.ms": 10,
    "fetch.error.backoff.ms": 100,
    "check.crcs": True,
    # As for writers: a reader's first fetch waited up to ~50 ms for a connection made on demand.
    "enable.sparse.connections": False,
}
# Defaults of the topic source's consumer: Tansu holds every fetch for fetch.wait.max.ms even when data is
# there; short waits cost nothing on Apache Kafka, which answers as soon as data is available. Its
# isolation level is a default a user may change (the store's readers force read_committed).
SOURCE_CONSUMER_TUNING: Mapping[str, Any] = {
    "fetch.wait.max.ms": 10,
    "fetch.queue.backoff.ms": 10,
    "fetch.error.backoff.ms": 100,
    "isolation.level": "read_committed",
}


def read_properties(path: str | Path) -> dict[str, str]:
    """The properties of a client properties file; ConfigError (one line) if it cannot be read or a line
    is not `key=value`."""
    where = Path(path)
    try:
        text = where.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the Kafka client properties {where}: {exc}") from None
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if cut < 0:
            raise ConfigError(f"{where}:{number}: not a key=value line: {line[:60]!r}")
        key, value = line[:cut].strip(), line[cut + 1 :].strip()
        if not key:
            raise ConfigError(f"{where}:{number}: no key before '{line[cut]}'")
        out[key] = value
    return out


def environment_config() -> dict[str, str]:
    """The properties of the file `CEC_KAFKA_CONFIG` names ({} when unset), read again when it changes."""
    path = os.environ.get(ENV, "").strip()
    if not path:
        return {}
    try:
        stamp = Path(path).stat().st_mtime_ns
    except OSError as exc:
        raise ConfigError(f"{ENV}={path}: cannot read the Kafka client properties: {exc}") from None
    key = (path, stamp)
    found = _cache.get(key)
    if found is None:
        found = read_properties(path)
        _cache.clear()
        _cache[key] = found
    return dict(found)


def quiet_librdkafka(level: int) -> None:
    """A command's logging at `level`: librdkafka's lines only from INFO (--log-level info). It warns
    about settings cec makes on purpose (the experimental gapless guarantee) and reports every lost
    connection, retried request and failed producer on its own; cec reports the failures that matter as
    its own one-line errors, with their cause."""
    for name in LIBRDKAFKA_LOGGERS:
        logging.getLogger(name).setLevel(level if level <= logging.INFO else logging.CRITICAL + 10)


def redact_config(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of a client config that is safe to print: credentials and TLS material are masked.

    Whole `sasl.*`/`ssl.*` families are masked rather than a list of known secret names, because new
    secret-bearing properties appear in librdkafka over time and a leak is worse than an opaque repr.
    """
    out: dict[str, Any] = {}
    for key, value in config.items():
        lowered = key.lower()
        if lowered.startswith(_SENSITIVE_PREFIXES) or any(w in lowered for w in _SENSITIVE_WORDS):
            out[key] = _REDACTED
        else:
            out[key] = value
    return out


def transactional_id(prefix: str, topic: str, partition: int) -> str:
    """The transactional.id of the writer of `topic[partition]`: the same on every host, which is what
    makes a new writer fence the old one. The partition comes last, so the id is unambiguous."""
    return f"{prefix}cec.{topic}.{partition}"


def lease_group_id(prefix: str, topic: str, partition: int) -> str:
    """The consumer group of the writer lease of `topic[partition]` (`queuestore.kafka.lease`): the same on
    every host, as the transactional id is, under the same prefix."""
    return f"{prefix}cec-lease.{topic}.{partition}"


@dataclass(frozen=True)
class ClientSettings:
    """Where and how cec's clients of one cluster connect: the bootstrap list, the user's settings (code
    over the `CEC_KAFKA_CONFIG` file), the request timeout the client's operations are bounded by, and the
    logger librdkafka's lines go to. Each method gives one kind of client's complete config: defaults,
    then the user's settings, then what cec's guarantees depend on (never weakened by a user's setting)."""

    bootstrap_servers: str
    user_config: Mapping[str, Any] = field(default_factory=dict)
    request_timeout: float = 30.0
    logger: Any = STORE_LOG

    def client(self, client_id: str) -> dict[str, Any]:
        """Connection, security and logging of any client (an admin client's whole config)."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": client_id,
            "logger": self.logger,
            # Without a log queue, warnings raised while the client is being built bypass the logger and
            # land on stderr; queued, they are served by poll() like everything else.
            "log.queue": True,
            # How long librdkafka waits for any answer before it gives the request up and sends it again
            # (its default, 60 s, is twice the store's own bound): a third of `request_timeout`, so that
            # a lost answer (a produce's, a fetch's) is asked again well within the time cec gives an
            # operation before it fails it.
            "socket.timeout.ms": max(1000, int(self.request_timeout * 1000 / 3)),
        }
        if _REBOOTSTRAPS:
            # No re-bootstrap when every known broker is down (librdkafka's default since 2.10). In
            # librdkafka 2.16 a consumer that re-bootstrapped while its connections were being cut could
            # deadlock inside librdkafka (gdb: its main thread's OffsetForLeaderEpoch leader query waiting on
            # the metadata lock against a failing broker thread undelegating the partitions), and its next
            # assign or unassign, which waits for that main thread without a timeout and holds the GIL,
            # froze the whole process: `cec run --input-topic` hung at its start in find_ends' unassign
            # (found by a soak of wire faults; benchmarks/soak_ends.py: 2 hangs in 47 rounds and seed 10
            # every time with it, none in 367 rounds without). Re-bootstrapping re-learns every partition's
            # leader, which sets off those epoch validations while brokers fail; without it the client
            # retries the brokers it knows, as before 2.10. A user's setting still wins.
            conf["metadata.recovery.strategy"] = "none"
        conf.update(environment_config())
        conf.update(self.user_config)
        return conf

    def consumer(
        self,
        client_id: str,
        *,
        group_id: str | None = None,
        tuning: Mapping[str, Any] = STORE_CONSUMER_TUNING,
        read_committed: bool = True,
    ) -> dict[str, Any]:
        """A consumer that positions itself (assign at explicit offsets): no group of its own unless
        `group_id` (which then only receives commits), nothing auto-committed or auto-created, partition
        EOF events on, and a seek out of range reported, never moved silently. `read_committed` forces
        that isolation level over the user's settings (the store's readers: never a record of an open
        transaction, it may still be aborted)."""
        conf: dict[str, Any] = dict(tuning)
        conf.update(self.client(client_id))
        conf.update(
            {
                "group.id": group_id or f"{client_id}-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "error",
                "allow.auto.create.topics": False,
            }
        )
        if read_committed:
            conf["isolation.level"] = "read_committed"
        return conf

    def lease_consumer(self, client_id: str, group_id: str, lease_timeout: float) -> dict[str, Any]:
        """A member of a writer lease's group (`queuestore.kafka.lease`): its session is the lease, its
        assignor never moves a partition away from a live member."""
        session_ms = max(1, round(lease_timeout * 1000))
        conf = self.client(client_id)
        conf.update(
            {
                "group.id": group_id,
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": session_ms,
                # Three heartbeats a session, Kafka's rule of thumb: one lost heartbeat does not end a lease.
                "heartbeat.interval.ms": max(1, session_ms // 3),
                # The lease's own thread polls every 0.1 s; the bound only has to exceed the session (a
                # librdkafka rule) and cover a thread that a busy process delays for a while.
                "max.poll.interval.ms": max(session_ms, 30_000),
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "latest",
                "allow.auto.create.topics": False,
            }
        )
        return conf

    def transactional_producer(
        self, client_id: str, transactional_id: str, *, max_outstanding: int = 100_000
    ) -> dict[str, Any]:
        """A transactional producer (`queuestore.kafka.producer`): ordered, duplicate-free, gapless."""
        conf: dict[str, Any] = {
            # Throughput: small linger lets batches form without adding visible latency to checkpoints.
            "linger.ms": 5,
            "batch.num.messages": 10_000,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": max(max_outstanding, 1),
            # Connect to the cluster's brokers when the client starts, not when a request first needs one:
            # with sparse connections init_transactions() finds no broker up, and its PID timer retries
            # 50-500 ms later (measured: 55-505 ms per init against 2-3 ms). Every writer open pays it: a
            # Spark write task, a restarted operator, a takeover.
            "enable.sparse.connections": False,
        }
        conf.update(self.client(client_id))
        conf.update(
            {
                # One writer per transactional.id across hosts: a new one's init_transactions() fences it.
                "transactional.id": transactional_id,
                # The log must be an ordered, duplicate-free prefix of what was appended.
                "enable.idempotence": True,
                "acks": "all",
                # A batch that fails for good must stop the producer instead of leaving a hole that later
                # batches would land after.
                "enable.gapless.guarantee": True,
                # No timeout: a timed-out message is the one failure gapless delivery cannot cover. Callers
                # bound their waits with flush(timeout) instead.
                "message.timeout.ms": 0,
            }
        )
        return conf

    def idempotent_producer(self, client_id: str) -> dict[str, Any]:
        """A plain idempotent producer (attachments: a handful of records, no transaction)."""
        conf = self.client(client_id)
        conf.update({"enable.idempotence": True, "acks": "all"})
        return conf
