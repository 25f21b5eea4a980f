"""Kafka backend of the queue store, on confluent-kafka (librdkafka).

Each output partition of an operator is a Kafka partition written by one transactional producer, so the
log is always an ordered, duplicate-free prefix of what the operator appended (DESIGN-NOTES section 3),
and one writer per partition holds *across hosts*: the `transactional.id` is derived from (topic,
partition), so a new writer's `init_transactions()` aborts its predecessor's open transaction and fences
it; the predecessor's next produce or commit fails and it stops (`WriterFencedError`) without writing
anything further. The local file lock stays as the same-host guard with a clear error.

Records are committed in transactions cut at the writer's `poll()`/`flush()` calls (the operator runtime
polls after each input batch): `poll()` commits once the open transaction is `commit_interval` seconds
old or holds `commit_records` records, `flush()` always commits. Durable-completion callbacks fire only
after the commit, so the stream index never maps a record that a crash could still abort. Any prefix is a
valid log for recovery, so where a commit falls is a matter of cost and latency, never of correctness.
The commits `poll()` starts are pipelined: delivery of the transaction's records and its commit run in a
committer thread while the operator goes on (its appends meanwhile wait in order in the writer, and are
produced, in a new transaction, once the commit is through); the callbacks still fire only after the
commit, in the caller's thread, in append order.

No transaction ends in doubt and goes on in the same producer epoch. librdkafka implements Kafka's
transactions v1 only (no KIP-890 transactions v2): the broker knows a transaction by the producer id and
epoch alone, so a request of an earlier transaction that arrives late acts on whatever transaction is open
then. Measured on Apache Kafka 4.3.1 with librdkafka 2.16 (tests/test_kafka_txn_faults.py): an EndTxn
held in the network past `socket.timeout.ms` is retried by librdkafka, the retry commits and
`commit_transaction()` reports success; when the held request arrives it commits the next transaction half
way (its first records visible to read_committed readers, the rest refused, its side records never
written). So whenever the transaction coordinator's connection failed or one of its requests timed out
while a transaction was open (librdkafka's log says so on the coordinator's connection, `_CoordinatorWatch`),
the writer replaces its producer after the commit: the new producer's `init_transactions()` bumps the
epoch and every late request of the old one is fenced. A commit that failed (its outcome unknown) replaces
the producer the same way before the writer stops with `CommitOutcomeUnknownError`: the log is final when
the owner recovers from it.

Readers consume with `isolation.level=read_committed`. Transaction markers take offsets that are never
delivered, so offsets are not dense (`dense_offsets = False`): every read path steps by the offsets it is
given, never by counting.

Each record's `RecordMeta` travels once, compactly (`encode_message`; docs/kafka.md):
- header `cec.kind`: the kind's name (R, GOPEN, GCHECK, DEAD, EOS, ...), so that downstream consumers can
  skip control tuples without decoding values, and tools such as kcat show it;
- message key: the window key (UTF-8), or no key;
- value: a small frame (`FRAME_MAGIC`, the kind as one byte, time and seq as zigzag varints) followed by
  the value appended. Record readers take the kind from the header (what consumers see), bulk readers
  (recovery's backward scan) from the frame, because confluent-kafka materialises headers at several
  microseconds per message; either way the record's checksum covers the kind read (cec.records), so a
  damaged header or frame is detected by whichever reader relies on it.
Logs written in the legacy layout (meta packed in the message key plus four headers `cec.kind`,
`cec.time`, `cec.key`, `cec.seq`; `meta_to_key`/`meta_to_headers`) still read.

The readers never trust broker watermarks or time lookups to locate data: some Kafka-protocol brokers
get them wrong (Tansu 0.6 understates `get_watermark_offsets` and answers 0 to every
`offsets_for_times`). The end of a partition is therefore always the offset of a `PARTITION_EOF` event
reached by consuming. The only use of a
watermark is the one cached from fetch responses, as a *suspicion* that a seek went past the end (Tansu
answers such fetches with silence instead of OFFSET_OUT_OF_RANGE); the suspicion is then confirmed or
refuted by consuming to EOF. Apache Kafka answers a fetch below the log start (records deleted by
trimming or retention) with OFFSET_OUT_OF_RANGE too: only then the reader asks for the log start, and a
backward read stops there, while a forward read below it is `LogTrimmedError`, as on SQLite.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from cec.exceptions import CodecError
from cec.native import native
from cec.records import read_zigzag, zigzag
from queuestore.base import (
    ATTACHMENT_NAME,
    DurableCallback,
    PartitionReader,
    PartitionWriter,
    QueueStore,
    RecordMeta,
    Row,
    StoredRecord,
)
from queuestore.exceptions import (
    BrokerUnavailableError,
    CommitOutcomeUnknownError,
    PartitionLockedError,
    QueueStoreError,
    RecordTooLargeError,
    StoreClosedError,
    TopicMismatchError,
    UnknownTopicError,
    WriterFencedError,
    WriterResetError,
)
from queuestore.kafka_config import environment_config

__all__ = [
    "ATTACHMENT_TOPIC_PREFIX",
    "FRAME_KINDS",
    "FRAME_MAGIC",
    "HEADER_KEY",
    "HEADER_KIND",
    "HEADER_SEQ",
    "HEADER_TIME",
    "KafkaPartitionReader",
    "KafkaPartitionWriter",
    "KafkaQueueStore",
    "decode_message",
    "encode_message",
    "meta_from_headers",
    "meta_to_headers",
    "meta_to_key",
    "redact_config",
    "transactional_id",
]

log = logging.getLogger(__name__)
# librdkafka's own log lines go through Python logging instead of stderr, so that applications control them.
_rdkafka_log = logging.getLogger(__name__ + ".librdkafka")

HEADER_KIND = "cec.kind"
HEADER_TIME = "cec.time"
HEADER_KEY = "cec.key"
HEADER_SEQ = "cec.seq"
# Attachments of topic T (see QueueStore.read_attachment) live in topic ATTACHMENT_TOPIC_PREFIX + T.
ATTACHMENT_TOPIC_PREFIX = "cec-meta."
_ATTACHMENT_KIND = "META"
_ACK_PREFIX = "ack-"  # attachments that register a consumer and hold its acknowledged offset

# Below the broker default message.max.bytes (1 MB) with room for headers and batch overhead, so that a
# record accepted by `append` is never rejected by the broker later (which would surface asynchronously).
DEFAULT_MAX_RECORD_BYTES = 900_000
# Bytes we add on top of the value and its window key (the kind header, the frame, the record's framing in
# the batch); counted against `max_record_bytes`. It covers kinds of up to _MAX_KIND_BYTES.
_HEADER_OVERHEAD = 96
_MAX_KIND_BYTES = 16
# Commit cadence of the transactional writers: a commit drains the producer's pipeline and costs a round
# trip to the transaction coordinator, so commits are spaced by time and size (benchmarks/RESULTS.md has
# the measured cost against the idempotent producer). The interval is also the latency a read_committed
# consumer sees on top of the produce latency.
DEFAULT_COMMIT_INTERVAL = 0.1
DEFAULT_COMMIT_RECORDS = 50_000
# max.partition.fetch.bytes and fetch.max.bytes of the bulk reader's consumer, unless the store's config
# sets them (below receive.message.max.bytes' default, 100 MB, as librdkafka requires).
_BULK_FETCH_BYTES = 32 << 20

_SENSITIVE_PREFIXES = ("sasl.", "ssl.")
_SENSITIVE_WORDS = ("password", "secret", "token", "credential", "jaas", "key")
_REDACTED = "***"

# Offsets-out-of-range style answers: the seek went past the end of the partition (Apache Kafka answers
# this way; with auto.offset.reset=error librdkafka surfaces it as _AUTO_OFFSET_RESET).
_BEYOND_END_CODES = frozenset({KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE})
# A partition whose leadership is moving answers these for a moment: a topic just created (measured on
# Apache Kafka: the first ListOffsets after CreateTopics can meet NOT_LEADER_FOR_PARTITION), a broker
# restarting. Asked again until the request timeout.
# What a client reports when the broker does not answer (stalled, down, unreachable): said as such.
_NO_ANSWER_CODES = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._DESTROY_BROKER,
        KafkaError.REQUEST_TIMED_OUT,
    }
)


def _store_error(exc: KafkaException, bootstrap_servers: str, doing: str, timeout: float) -> QueueStoreError:
    """`doing` failed with `exc`: a broker that did not answer is said as such (`BrokerUnavailableError`,
    with the way out), any other answer as `cannot <doing>: <the broker's error>`."""
    if _error_code(exc) in _NO_ANSWER_CODES:
        return BrokerUnavailableError(bootstrap_servers, doing, timeout)
    return QueueStoreError(f"cannot {doing}: {exc}")


_LEADER_MOVING_CODES = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
    }
)
# A connection lost under a request or a request that timed out: a call that does not send its request
# again by itself (a watermark query) reports these, and asking again resolves them (found with the
# fault proxy: one cut connection under a ListOffsets stopped an operator).
_TRANSIENT_CODES = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._DESTROY_BROKER,  # the connection's broker handle went (a bootstrap one, after the cut)
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
    }
)
_UNKNOWN_CODES = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC}
)
# What a producer sees once a newer producer with its transactional.id has called init_transactions().
_FENCED_CODES = frozenset({KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH, KafkaError._FENCED})
# What a record reports when librdkafka drops it from its queues because the producer failed.
_PURGED_CODES = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})


def _lost_client_error(producer: Producer) -> KafkaException:
    """The error a producer call failed with when confluent-kafka lost it (it raised SystemError).

    Measured on Apache Kafka (confluent-kafka 2.16): when a writer is fenced, `flush` raises the fatal
    error from librdkafka's error callback but leaves it pending instead of saving it; a Python callback
    served after it in the same call (the log callback, a delivery report) can clear it, and `flush`
    then fails with "returned NULL without setting an exception". The producer still holds the fatal
    error in its transaction state: any transactional call reports it (`begin_transaction` changes
    nothing in that state; the writer stops either way).
    """
    try:
        producer.begin_transaction()
    except KafkaException as exc:
        err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if err is not None and err.fatal():
            return exc
    return KafkaException(
        KafkaError(KafkaError._FAIL, "the Kafka client failed without reporting an error", fatal=True)
    )


def transactional_id(prefix: str, topic: str, partition: int) -> str:
    """The transactional.id of the writer of `topic[partition]`: the same on every host, which is what
    makes a new writer fence the old one. The partition comes last, so the id is unambiguous."""
    return f"{prefix}cec.{topic}.{partition}"


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


def meta_to_headers(meta: RecordMeta) -> list[tuple[str, str | bytes | None]]:
    """The legacy layout's headers for a record's meta (absent key/seq omitted); still read, still what
    the Spark sink writes beside its own message key."""
    headers: list[tuple[str, str | bytes | None]] = [
        (HEADER_KIND, meta.kind.encode()),
        (HEADER_TIME, b"%d" % meta.time),
    ]
    if meta.key is not None:
        headers.append((HEADER_KEY, meta.key.encode()))
    if meta.seq != -1:
        headers.append((HEADER_SEQ, b"%d" % meta.seq))
    return headers


_NO_META = RecordMeta("", -1, None, -1)
_KEY_SEP = b"\x1f"

# The frame in front of each value: FRAME_MAGIC, a kind code (an index into FRAME_KINDS; 0: the kind
# follows spelled out, one length byte then UTF-8), time and seq as zigzag varints (Avro's long). The magic
# differs from the first byte of every value the legacy layout held (0xCE records, 0xCD parts), so the
# two layouts tell apart by the value alone. Codes are part of the format: append new kinds, never reorder.
FRAME_MAGIC = 0xCF
FRAME_KINDS = ("", "R", "GOPEN", "GCHECK", "DEAD", "EOS", "PART", "META")
_FRAME_CODE = {kind: code for code, kind in enumerate(FRAME_KINDS) if kind}
_FRAME_HEADS = {kind: bytes((FRAME_MAGIC, code)) for kind, code in _FRAME_CODE.items()}
_KIND_HEADERS = {kind: [(HEADER_KIND, kind.encode())] for kind in _FRAME_CODE}


# The frame and the value in one C call and one allocation (the writer's per-record path); None without
# the accelerator or with a build older than it.
_native_frame = getattr(native, "kafka_frame", None)


def encode_message(
    value: bytes, meta: RecordMeta
) -> tuple[bytes | None, bytes, list[tuple[str, str | bytes | None]]]:
    """(message key, message value, headers) of a record: the meta carried once (module docstring)."""
    kind = meta.kind
    head = _FRAME_HEADS.get(kind)
    headers = _KIND_HEADERS.get(kind)
    if head is None or headers is None:
        spelled = kind.encode()
        if len(spelled) > _MAX_KIND_BYTES:
            raise QueueStoreError(f"record kind {kind[:40]!r} is longer than {_MAX_KIND_BYTES} bytes")
        head = bytes((FRAME_MAGIC, 0, len(spelled))) + spelled
        headers = [(HEADER_KIND, spelled)]
    message = None if _native_frame is None else _native_frame(head, meta.time, meta.seq, value)
    if message is None:
        message = head + zigzag(meta.time) + zigzag(meta.seq) + value
    return (None if meta.key is None else meta.key.encode()), message, list(headers)


def _unframe(value: bytes, raw_key: object) -> tuple[RecordMeta, bytes] | None:
    """The meta (kind from the frame) and the value of a message in the framed layout; None when the
    message is in another layout (legacy, or another tool's); a malformed frame or key reads as kind "",
    which no checksum accepts."""
    if len(value) < 4 or value[0] != FRAME_MAGIC:
        return None
    try:
        code = value[1]
        at = 2
        if code == 0:
            size = value[2]
            kind = value[3 : 3 + size].decode()
            at = 3 + size
        else:
            kind = FRAME_KINDS[code]
        t, at = read_zigzag(value, at)
        seq, at = read_zigzag(value, at)
        key = None if raw_key is None else raw_key.decode() if isinstance(raw_key, bytes) else None
        if raw_key is not None and key is None:
            raise ValueError("message key is not bytes")
    except (ValueError, IndexError, CodecError):  # UnicodeDecodeError is a ValueError
        return _NO_META, value
    return RecordMeta(kind, t, key, seq), value[at:]


_Headers = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None] | None


def decode_message(value: bytes | None, raw_key: bytes | None, headers: _Headers) -> tuple[RecordMeta, bytes]:
    """(meta, value) of a stored message, as a record read gives it: the kind is the `cec.kind` header's
    (framed layout), so a damaged header fails the record's checksum instead of misleading a consumer
    that filters by it. Legacy-layout and foreign messages read as before (`meta_from_headers`)."""
    data = value if isinstance(value, bytes) else b""
    framed = _unframe(data, raw_key)
    if framed is None:
        meta = _meta_from_key(raw_key) if isinstance(raw_key, bytes) else None
        return (meta if meta is not None else meta_from_headers(headers)), data
    meta, body = framed
    stated = _header_kind(headers)
    return (meta if stated == meta.kind else meta._replace(kind=stated)), body


def _header_kind(headers: _Headers) -> str:
    """The `cec.kind` header's text ("" when absent or not text: no checksum accepts that kind)."""
    if not headers:
        return ""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    for name, raw in pairs:
        if name == HEADER_KIND:
            if isinstance(raw, bytes):
                try:
                    return raw.decode()
                except UnicodeDecodeError:
                    return ""
            return raw if isinstance(raw, str) else ""
    return ""


def meta_to_key(meta: RecordMeta) -> bytes:
    """The legacy layout's message key, the same meta packed: `kind US time US seq [US key]`.

    What the writer produced before the framed layout (and, as a fallback, what the reading paths still
    understand: confluent-kafka materialises headers at several microseconds per message, so the legacy
    readers took the meta from this key). The window key comes last so it may contain anything,
    separator included.
    """
    head = b"%s\x1f%d\x1f%d" % (meta.kind.encode(), meta.time, meta.seq)
    return head if meta.key is None else head + _KEY_SEP + meta.key.encode()


def _meta_from_key(raw: bytes) -> RecordMeta | None:
    parts = raw.split(_KEY_SEP, 3)
    if len(parts) < 3:
        return None
    try:
        return RecordMeta(
            parts[0].decode(), int(parts[1]), parts[3].decode() if len(parts) == 4 else None, int(parts[2])
        )
    except ValueError:  # not ours: a key written by another tool
        return None


def meta_from_headers(
    headers: Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None] | None,
) -> RecordMeta:
    """Rebuild `RecordMeta` from headers.

    Lenient on purpose: a record produced by a foreign tool (no cec headers) reads as kind "" and time -1
    rather than making the whole partition unreadable; CEC code treats an unknown kind as data it can skip.
    """
    if not headers:
        return _NO_META
    # One C-level dict() instead of a Python loop over the headers: recovery scans call this per record.
    found = headers if isinstance(headers, Mapping) else dict(headers)
    kind, t, key, seq = (
        found.get(HEADER_KIND),
        found.get(HEADER_TIME),
        found.get(HEADER_KEY),
        found.get(HEADER_SEQ),
    )
    return RecordMeta(
        "" if kind is None else (kind if isinstance(kind, str) else kind.decode()),
        -1 if t is None else int(t),
        None if key is None else (key if isinstance(key, str) else key.decode()),
        -1 if seq is None else int(seq),
    )


def _offset(msg: Message) -> int:
    # Typed optional by confluent-kafka's stubs, but always set on fetched messages and EOF events.
    offset = msg.offset()
    if offset is None:
        raise QueueStoreError("consumer event without an offset")
    return offset


def _to_record(msg: Message, offset: int) -> StoredRecord:
    """A record read (see `decode_message`)."""
    meta, value = decode_message(msg.value(), msg.key(), msg.headers())
    return StoredRecord(offset, value, meta)


def _to_row(msg: Message, offset: int) -> Row:
    """The row of a bulk read (recovery's backward scan; `cec._native.message_rows` is its fast path and
    falls back to it for anything but the plain case): the kind from the frame, headers never
    materialised (several microseconds per message in confluent-kafka); legacy-layout messages from
    their meta key, foreign ones from their headers."""
    value = msg.value()
    data = value if isinstance(value, bytes) else b""
    raw_key = msg.key()
    framed = _unframe(data, raw_key)
    if framed is not None:
        meta, data = framed
    else:
        legacy = _meta_from_key(raw_key) if isinstance(raw_key, bytes) else None
        meta = legacy if legacy is not None else meta_from_headers(msg.headers())
    return (offset, meta.kind, meta.time, meta.key, meta.seq, data)


def _error_code(exc: KafkaException) -> int | None:
    err = exc.args[0] if exc.args else None
    return err.code() if isinstance(err, KafkaError) else None


def _message_rows(
    batch: list[Message], i: int, start: int, stop_before: int, out: list[Row]
) -> tuple[int, bool]:
    """Pure-Python twin of `cec._native.message_rows`: rows of `batch[i:]` into `out` until an event
    that is not a record (returns its index), `stop_before` (-1: none) or the end of the batch."""
    for index in range(i, len(batch)):
        msg = batch[index]
        if msg.error() is not None:
            return index, False
        offset = _offset(msg)
        if offset < start:
            continue
        if 0 <= stop_before <= offset:
            return index, True
        out.append(_to_row(msg, offset))
        if offset == stop_before - 1:
            return index + 1, True
    return len(batch), False


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

    Writers are transactional (see the module docstring): `transactional_id_prefix` namespaces their
    `transactional.id`s (e.g. per deployment on a shared cluster; every writer of one partition must use
    the same prefix, or they do not fence each other); `commit_interval` (seconds) and `commit_records` set
    the commit cadence; `clock` is what `commit_interval` is measured with (injectable for tests).
    """

    # Transaction markers take offsets (module docstring): a gap between two offsets is not damage.
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
    ) -> None:
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
        self._config: dict[str, Any] = dict(config or {})
        self._topic_configs: dict[str, str] = {
            "cleanup.policy": "delete",
            "retention.ms": "-1",
            **(topic_configs or {}),
        }
        self._admin: AdminClient | None = None
        self._lock = threading.Lock()
        self._children: list[KafkaPartitionWriter | KafkaPartitionReader] = []
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(bootstrap_servers={self.bootstrap_servers!r}, "
            f"state_dir={str(self.state_dir)!r}, config={redact_config(self._config)!r})"
        )

    __str__ = __repr__

    # -- client configs ---------------------------------------------------------------------------------

    def _base_config(self, client_id: str) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": client_id,
            "logger": _rdkafka_log,
            # Without a log queue, warnings raised while the client is being built bypass the logger and
            # land on stderr; queued, they are served by poll() like everything else.
            "log.queue": True,
            # How long librdkafka waits for any answer before it gives the request up and sends it again
            # (its default, 60 s, is twice the store's own bound): a third of `request_timeout`, so that
            # a lost answer (a produce's, a fetch's) is asked again well within the time this store
            # gives an operation before it fails it.
            "socket.timeout.ms": max(1000, int(self.request_timeout * 1000 / 3)),
        }
        conf.update(environment_config())
        conf.update(self._config)
        return conf

    def _producer_config(self, topic: str, partition: int) -> dict[str, Any]:
        conf: dict[str, Any] = {
            # Throughput: small linger lets batches form without adding visible latency to checkpoints.
            "linger.ms": 5,
            "batch.num.messages": 10_000,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": max(self.max_outstanding, 1),
            # Connect to the cluster's brokers when the client starts, not when a request first needs one:
            # with sparse connections init_transactions() finds no broker up, and its PID timer retries
            # 50-500 ms later (measured: 55-505 ms per init against 2-3 ms). Every writer open pays it: a
            # Spark write task, a restarted operator, a takeover.
            "enable.sparse.connections": False,
        }
        conf.update(self._base_config(f"cec-writer-{topic}-{partition}"))
        conf.update(
            {
                # One writer per partition across hosts: a new writer's init_transactions() fences this one.
                "transactional.id": transactional_id(self.transactional_id_prefix, topic, partition),
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

    def consumer_config(self, purpose: str) -> dict[str, Any]:
        """The settings of the store's own consumers (connection and security, read_committed, partition
        EOF events) for a consumer of another topic of the same cluster, e.g. a results topic."""
        return self._consumer_config(purpose)

    def _consumer_config(self, purpose: str) -> dict[str, Any]:
        conf: dict[str, Any] = {
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
        conf.update(self._base_config(f"cec-{purpose}"))
        conf.update(
            {
                # Never a record of an open transaction: it may still be aborted (writer killed or fenced).
                "isolation.level": "read_committed",
                # Readers position themselves explicitly: no group, nothing committed, nothing auto-created.
                "group.id": f"cec-{purpose}-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                # A seek past the end must be reported (Apache Kafka), not silently moved to 0 or the end.
                "auto.offset.reset": "error",
                "allow.auto.create.topics": False,
            }
        )
        return conf

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
        """Partition count from cluster metadata, None when the topic does not exist.

        Lists all topics rather than asking for one: a metadata request naming a topic can auto-create it
        on brokers with auto.create.topics.enable (Tansu auto-creates on produce too).
        """
        try:
            md = self._admin_client().list_topics(timeout=self.request_timeout)
        except KafkaException as exc:
            raise _store_error(
                exc, self.bootstrap_servers, "read cluster metadata", self.request_timeout
            ) from None
        tmd = md.topics.get(topic)
        if tmd is None or tmd.error is not None or not tmd.partitions:
            return None
        return len(tmd.partitions)

    def _wait_partitions(self, topic: str) -> int:
        # Metadata propagates asynchronously after CreateTopics on a multi-broker cluster.
        deadline = time.monotonic() + self.request_timeout
        while True:
            n = self._topic_partitions(topic)
            if n is not None:
                return n
            if time.monotonic() >= deadline:
                raise QueueStoreError(
                    f"topic {topic!r} did not appear in metadata within {self.request_timeout}s"
                )
            time.sleep(0.05)  # pacing of a bounded metadata poll, not a wait for correctness

    def value_limit(self, meta: RecordMeta) -> int:
        # The window key travels beside the value (message key), the kind in the header and the frame.
        return self.max_record_bytes - _HEADER_OVERHEAD - len((meta.key or "").encode())

    def create_topic(self, topic: str, partitions: int, *, exist_ok: bool = True) -> None:
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        admin = self._admin_client()
        new = NewTopic(
            topic, num_partitions=partitions, replication_factor=-1, config=dict(self._topic_configs)
        )
        future = admin.create_topics([new], request_timeout=self.request_timeout)[topic]
        try:
            future.result()
        except KafkaException as exc:
            if _error_code(exc) != KafkaError.TOPIC_ALREADY_EXISTS:
                raise _store_error(
                    exc, self.bootstrap_servers, f"create topic {topic!r}", self.request_timeout
                ) from None
            if not exist_ok:
                raise TopicMismatchError(f"topic {topic!r} already exists") from exc
            existing = self._wait_partitions(topic)
            if existing != partitions:
                raise TopicMismatchError(
                    f"topic {topic!r} exists with {existing} partitions, {partitions} requested"
                ) from exc
            return
        existing = self._wait_partitions(topic)
        if existing != partitions:  # someone raced us with another count
            raise TopicMismatchError(f"topic {topic!r} has {existing} partitions, {partitions} requested")

    def topic_exists(self, topic: str) -> bool:
        return self._topic_partitions(topic) is not None

    def topics(self) -> list[str]:
        """Every topic of the cluster but the internal ones (`__consumer_offsets`, ...) and the companions
        that hold attachments (`cec-meta.*`): on a shared cluster that includes topics cec did not write."""
        try:
            md = self._admin_client().list_topics(timeout=self.request_timeout)
        except KafkaException as exc:
            raise _store_error(
                exc, self.bootstrap_servers, "read cluster metadata", self.request_timeout
            ) from None
        return sorted(
            name
            for name, tmd in md.topics.items()
            if tmd.error is None and not name.startswith(("_", ATTACHMENT_TOPIC_PREFIX))
        )

    def cluster_id(self) -> str:
        """The cluster's id (the same through any bootstrap address); the bootstrap list if the broker
        reports none."""
        try:
            md = self._admin_client().list_topics(timeout=self.request_timeout)
        except KafkaException as exc:
            raise _store_error(
                exc, self.bootstrap_servers, "read cluster metadata", self.request_timeout
            ) from None
        return md.cluster_id or self.bootstrap_servers

    def partitions(self, topic: str) -> int:
        n = self._topic_partitions(topic)
        if n is None:
            raise UnknownTopicError(f"topic {topic!r} does not exist")
        return n

    def _check_partition(self, topic: str, partition: int) -> None:
        n = self.partitions(topic)
        if not 0 <= partition < n:
            raise UnknownTopicError(
                f"topic {topic!r} has {n} partitions; partition {partition} does not exist"
            )

    # -- writers and readers ----------------------------------------------------------------------------

    def writer(self, topic: str, partition: int) -> KafkaPartitionWriter:
        # Checked first because producing to a missing topic would auto-create it on Tansu.
        self._check_partition(topic, partition)
        w = KafkaPartitionWriter(self, topic, partition)
        with self._lock:
            self._children.append(w)
        return w

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
        Written only when a log starts (a handful of records per topic), so it needs no compaction and
        keeps the store's default configs (nothing in it is ever deleted)."""
        return ATTACHMENT_TOPIC_PREFIX + topic

    @staticmethod
    def _attachment_meta(partition: int, name: str) -> RecordMeta:
        if not ATTACHMENT_NAME.match(name):
            raise QueueStoreError(f"invalid attachment name {name!r}")
        return RecordMeta(_ATTACHMENT_KIND, 0, f"{partition}/{name}")

    def read_attachment(self, topic: str, partition: int, name: str) -> bytes | None:
        wanted = self._attachment_meta(partition, name)
        self._check_partition(topic, partition)
        companion = self.attachment_topic(topic)
        if self._topic_partitions(companion) is None:
            return None
        found: bytes | None = None
        with self.reader(companion, 0) as reader:
            for record in reader.scan_forward(0):
                if record.meta == wanted:
                    found = record.value
        return found

    def write_attachment(self, topic: str, partition: int, name: str, value: bytes) -> None:
        meta = self._attachment_meta(partition, name)
        self._check_partition(topic, partition)
        companion = self.attachment_topic(topic)
        self.create_topic(companion, 1)
        # A producer of its own, not a partition writer: the instances of every output partition write
        # to the one companion partition, and none of them owns it.
        conf = self._base_config(f"cec-attach-{topic}-{partition}")
        conf.update({"enable.idempotence": True, "acks": "all"})
        producer = Producer(conf)
        failures: list[KafkaError] = []
        message_key, message_value, headers = encode_message(value, meta)
        producer.produce(
            companion,
            value=message_value,
            key=message_key,
            headers=headers,
            partition=0,
            on_delivery=lambda err, _msg: failures.append(err) if err is not None else None,
        )
        left = producer.flush(self.request_timeout)
        if failures:
            raise QueueStoreError(
                f"cannot write {name} of {topic}[{partition}] to {companion}: {failures[0].str()}"
            )
        if left:
            raise BrokerUnavailableError(
                self.bootstrap_servers,
                f"writing {name} of {topic}[{partition}] to {companion}",
                self.request_timeout,
            )

    # -- trimming (DESIGN-NOTES section 3): cec trims; the broker must not -----------------------------
    def check_retention(self, topic: str) -> None:
        """Refuse an output topic the broker itself may trim (finite retention, compaction): it would
        delete footprints recovery needs, or results no consumer has acknowledged, on its own clock."""
        resource = ConfigResource("topic", topic)
        try:
            futures = self._admin_client().describe_configs([resource], request_timeout=self.request_timeout)
            configs = next(iter(futures.values())).result(self.request_timeout)
        except KafkaException as exc:
            raise _store_error(
                exc, self.bootstrap_servers, f"read the configs of topic {topic!r}", self.request_timeout
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

    def acknowledge(self, topic: str, partition: int, consumer: str, offset: int) -> None:
        self.write_attachment(topic, partition, _ACK_PREFIX + consumer, str(int(offset)).encode())

    def forget_consumer(self, topic: str, partition: int, consumer: str) -> None:
        self.write_attachment(topic, partition, _ACK_PREFIX + consumer, b"")

    def acknowledged(self, topic: str, partition: int) -> dict[str, int]:
        self._check_partition(topic, partition)
        companion = self.attachment_topic(topic)
        if self._topic_partitions(companion) is None:
            return {}
        prefix = f"{partition}/{_ACK_PREFIX}"
        acks: dict[str, bytes] = {}
        with self.reader(companion, 0) as reader:
            for record in reader.scan_forward(0):
                key = record.meta.key
                if record.meta.kind == _ATTACHMENT_KIND and key is not None and key.startswith(prefix):
                    acks[key[len(prefix) :]] = record.value  # newest wins
        return {name: int(value) for name, value in acks.items() if value}

    def _forget(self, child: KafkaPartitionWriter | KafkaPartitionReader) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._children.remove(child)

    def close(self) -> None:
        if self._closed:
            return
        with self._lock:
            children = list(self._children)
        for child in children:
            try:
                child.close()
            except Exception:  # close the rest even if one fails; the error is not about them
                log.exception("closing %r failed", child)
        self._closed = True
        self._admin = None


class _PartitionLock:
    """Best-effort single-host exclusivity of a partition's writer.

    An flock on `state_dir/locks/<topic>.<partition>.lock` is released by the kernel when the holder dies,
    so a crashed writer never blocks its successor. It protects only writers sharing this host and state
    directory; across hosts, the writers' transactional ids fence each other (see `KafkaPartitionWriter`):
    this lock only turns a same-host second writer into a clear error before it fences the first. The file
    is never deleted: removing it would let two processes lock two different inodes.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        fh: IO[bytes] = open(path, "a+b")  # noqa: SIM115 - held open for the lock's lifetime
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            fh.close()
            raise PartitionLockedError(f"another writer holds {path}") from exc
        except BaseException:
            fh.close()
            raise
        # The holder's pid helps an operator find who owns the partition; not used for correctness.
        fh.truncate(0)
        fh.write(str(os.getpid()).encode())
        fh.flush()
        self._fh: IO[bytes] | None = fh

    def release(self) -> None:
        if self._fh is not None:
            try:
                fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            finally:
                self._fh.close()
                self._fh = None


# librdkafka's log facilities that say a request may be lost in transit: its connection failed (FAIL) or it
# timed out in flight (REQTMOUT). On the transaction coordinator's connection (librdkafka's logical broker
# "TxnCoordinator"), either one means a transactional request (AddPartitionsToTxn, EndTxn) may still
# reach the broker later, in this producer's epoch.
_TRANSIT_FACILITIES = frozenset({"FAIL", "REQTMOUT"})
_COORDINATOR = "TxnCoordinator"


class _CoordinatorWatch:
    """The `logger` of one writer's producer: forwards every line to the store's librdkafka logger and counts
    the ones that say a request to the transaction coordinator was lost in transit. librdkafka retries such
    requests by itself (an EndTxn too) and reports nothing else to the application when a retry succeeds,
    so its log is the only place that tells. Lines are queued (`log.queue`) and served by the producer's
    poll and flush, in the thread that owns the producer."""

    __slots__ = ("incidents",)

    def __init__(self) -> None:
        self.incidents = 0

    def log(self, level: int, fmt: str, *args: object) -> None:
        # confluent-kafka calls log(level, "%s [%s] %s", facility, client name, text).
        if len(args) == 3 and args[0] in _TRANSIT_FACILITIES and _COORDINATOR in str(args[2]):
            self.incidents += 1
        _rdkafka_log.log(level, fmt, *args)


class _InDoubt(QueueStoreError):
    """A commit that failed with its outcome unknown, before the writer fenced its producer (`_reset`)."""


class KafkaPartitionWriter(PartitionWriter):
    """The single transactional producer of one partition.

    Completion callbacks run inside `poll()`/`flush()` (and inside `append` when it must make room),
    always in the caller's thread, in append order, and only once the transaction holding the record is
    committed: a delivery report says the broker holds the record, not that it will stay in the log.

    Fail-stop: after the first failed delivery or commit the writer refuses further appends and commits
    nothing more, because anything appended later could no longer be guaranteed to follow the failed
    record in the log; the owner must recover from the log. The records of the failed transaction report
    failure. A fenced writer (a newer writer of the partition called `init_transactions()`) raises
    `WriterFencedError`; a failed commit, whose outcome is unknown, `CommitOutcomeUnknownError` once the
    writer has fenced its own producer (module docstring: no transaction in doubt goes on in the same
    epoch; `renewals` counts the producers replaced so).
    """

    def __init__(self, store: KafkaQueueStore, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self._store = store
        self._max_record_bytes = store.max_record_bytes
        self._max_outstanding = max(store.max_outstanding, 1)
        self._timeout = store.request_timeout
        self._clock = store.clock
        self._commit_interval = store.commit_interval
        self._commit_records = store.commit_records
        self.transactional_id = transactional_id(store.transactional_id_prefix, topic, partition)
        self._lock = _PartitionLock(store.state_dir / "locks" / f"{topic}.{partition}.lock")
        try:
            producer, watch = self._new_producer("take over")
        except BaseException:
            self._lock.release()
            raise
        self._producer: Producer | None = producer
        self._watch = watch
        self.renewals = 0  # producers replaced after a transaction in doubt (module docstring)
        self._incidents_at_begin = 0  # the watch's count when the open transaction began
        self._reset_decided = False  # the first stop decided whether to fence the own producer
        self._appended = 0
        self._served = 0
        self._failure: QueueStoreError | None = None
        self._in_transaction = False
        self._transaction_started = 0.0
        self._transaction_records = 0
        # Delivered records of the open transaction, in offset order: (callback, offset), served on commit.
        self._delivered: list[tuple[DurableCallback | None, int]] = []
        self._undelivered: list[tuple[DurableCallback | None, KafkaError]] = []
        self._side: list[tuple[str, int, bytes | None, bytes]] = []  # see append_side
        self.commits = 0
        # The pipelined commit (module doc): the committer thread, what it left (flush's undelivered count,
        # the commit's error) and the appends that wait, in order, for the next transaction.
        self._committer: threading.Thread | None = None
        self._commit_remaining = 0
        self._commit_error: KafkaException | None = None
        self._waiting: list[tuple[bytes, RecordMeta, DurableCallback | None]] = []
        # Bound once: most appends have no callback and must not pay for a closure each.
        self._plain_report = self._make_report(None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(topic={self.topic!r}, partition={self.partition})"

    def _new_producer(self, purpose: str) -> tuple[Producer, _CoordinatorWatch]:
        """A producer with this writer's transactional.id, initialised: its `init_transactions()` aborts the
        open transaction of any earlier producer with the id (a crashed writer, one alive on another host,
        this writer's own previous producer) and fences it: from here on this producer alone can add to
        the partition, in a new epoch."""
        watch = _CoordinatorWatch()
        conf = self._store._producer_config(self.topic, self.partition)
        conf["logger"] = watch
        producer = Producer(conf)
        try:
            producer.init_transactions(self._timeout)
        except KafkaException as exc:
            if _error_code(exc) in _NO_ANSWER_CODES:
                raise BrokerUnavailableError(
                    self._store.bootstrap_servers,
                    f"{purpose} {self.topic}[{self.partition}] as transactional.id {self.transactional_id!r}",
                    self._timeout,
                ) from None
            raise QueueStoreError(
                f"cannot {purpose} {self.topic}[{self.partition}] as transactional.id "
                f"{self.transactional_id!r}: "
                f"{exc.args[0].str() if exc.args and isinstance(exc.args[0], KafkaError) else exc}"
            ) from None
        return producer, watch

    def _renew(self, producer: Producer) -> None:
        """Replace `producer` (this writer's, owned by the calling thread) by a new one in a new epoch, so
        that no request of a transaction in doubt can act on a later one (module docstring). The old one is
        dropped without waiting: anything it still sends is fenced. Raises QueueStoreError if the new one
        cannot be initialised: the writer must then stop (the old producer stays only to be closed: its
        epoch is not safe to go on in)."""
        with contextlib.suppress(KafkaException, SystemError):
            producer.purge(in_queue=True, in_flight=True, blocking=False)
            producer.poll(0)
        new, watch = self._new_producer("fence the previous producer of")
        self._producer, self._watch = new, watch
        self.renewals += 1
        log.info("%r: producer replaced (epoch bumped) after a transaction in doubt", self)

    def _settled(self, producer: Producer) -> None:
        """After a successful commit: replace the producer if its transaction was in doubt at some moment
        (the coordinator's connection failed or a request on it timed out since the transaction began)."""
        with contextlib.suppress(KafkaException, SystemError):
            producer.poll(0)  # serve the log lines queued during the commit
        if self._watch.incidents != self._incidents_at_begin:
            self._renew(producer)

    def _commit_failed(self, err: KafkaError | None) -> QueueStoreError:
        """The failure a failed `commit_transaction()` stands for: fenced (the newer writer's epoch must
        stand), or in doubt (`_stop` then fences this writer's own producer before it reports it)."""
        failure = self._failed(err, "commit of")
        if isinstance(failure, WriterFencedError):
            return failure
        detail = err.str() if err is not None else "unknown error"
        return _InDoubt(f"commit of {self.topic}[{self.partition}] failed ({detail}): its outcome is unknown")

    def _reset(self, failure: QueueStoreError) -> QueueStoreError:
        """`failure` after fencing this writer's own producer (module docstring): a failed producer, or a
        commit in doubt, may still have requests on their way; once a new producer's init_transactions()
        bumped the epoch none of them can land, and the log is final for the owner to recover from."""
        producer = self._producer
        if producer is None:
            return failure
        try:
            self._renew(producer)
        except BrokerUnavailableError as exc:
            # No new producer while the broker does not answer: the run stops with that one line (and the
            # rerun's writer fences the old producer); the failure it followed is in the log at info.
            log.info("%r: %s", self, failure)
            return exc
        except QueueStoreError as exc:
            return QueueStoreError(f"{failure}; and {exc}")
        kind = CommitOutcomeUnknownError if isinstance(failure, _InDoubt) else WriterResetError
        return kind(
            f"{failure}; the producer was replaced (a new epoch: nothing of the old one can land any more); "
            "recover from the log"
        )

    @property
    def outstanding(self) -> int:
        return self._appended - self._served

    @property
    def failure(self) -> Exception | None:
        """The first delivery or commit failure, after which appends are refused."""
        return self._failure

    def _failed(self, err: KafkaError | None, what: str) -> QueueStoreError:
        """The error a failed delivery or commit stands for; a fenced writer gets its own, one line."""
        if err is not None and err.code() == KafkaError._FATAL and self._producer is not None:
            # "Local: Fatal error" says only that the producer failed earlier: the cause is its fatal
            # error (fenced, most often), which a transactional call reports (`_lost_client_error`).
            cause = _lost_client_error(self._producer).args[0]
            if isinstance(cause, KafkaError) and cause.code() != KafkaError._FATAL:
                err = cause
        if err is not None and err.code() in _FENCED_CODES:
            return WriterFencedError(
                f"fenced: another writer took over {self.topic}[{self.partition}] (transactional.id "
                f"{self.transactional_id!r}); this writer stopped and wrote nothing further"
            )
        if err is not None and err.code() in _NO_ANSWER_CODES:
            return BrokerUnavailableError(
                self._store.bootstrap_servers, f"{what} {self.topic}[{self.partition}]", self._timeout
            )
        detail = err.str() if err is not None else "unknown error"
        return QueueStoreError(f"{what} {self.topic}[{self.partition}] failed: {detail}")

    def _stop(self, exc: QueueStoreError, *, reset: bool = True) -> QueueStoreError:
        """Stop for good: the records of the open transaction will never be committed by this writer. The
        first failure that a new producer resolves is reported once the own producer is fenced (`_reset`):
        not a fenced writer's (the newer epoch stands), nor a broker that does not answer (`reset=False`:
        a new producer would wait as long again), nor a writer being closed."""
        if self._failure is None:
            self._failure = exc
        if not self._reset_decided:  # the first stop decides
            self._reset_decided = True
            if reset and not isinstance(self._failure, WriterFencedError | WriterResetError):
                self._failure = self._reset(self._failure)
        failure = self._failure
        self._side.clear()
        delivered, self._delivered = self._delivered, []
        waiting, self._waiting = self._waiting, []
        for on_durable in [d for d, _ in delivered] + [w[2] for w in waiting]:
            self._served += 1
            if on_durable is not None:
                on_durable(None, failure)
        return failure

    def _make_report(
        self, on_durable: DurableCallback | None
    ) -> Callable[[KafkaError | None, Message], None]:
        def report(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                self._delivered.append((on_durable, _offset(msg)))
            else:
                # Looked at after the serving call returns: librdkafka may run this callback while the
                # call is raising the producer's fatal error, and then the error object cannot be used.
                self._undelivered.append((on_durable, err))

        return report

    def _settle_undelivered(self) -> None:
        undelivered, self._undelivered = self._undelivered, []
        if not undelivered:
            return
        # A record purged from the producer's queue failed only because the producer did (fenced, or
        # stopped by another error): it reports that failure, whether its own report came first or not.
        own = [
            None if err.code() in _PURGED_CODES else self._failed(err, "append to") for _, err in undelivered
        ]
        cause = self._failure or next((exc for exc in own if exc is not None), None)
        for (on_durable, err), exc in zip(undelivered, own, strict=True):
            self._served += 1
            if exc is None:
                exc = cause if cause is not None else self._failed(err, "append to")
            if self._failure is None:
                self._failure = exc
            if on_durable is not None:
                on_durable(None, exc)

    def _live_producer(self) -> Producer:
        if self._producer is None:
            raise StoreClosedError(f"writer of {self.topic}[{self.partition}] is closed")
        return self._producer

    def _check_failure(self) -> None:
        if self._failure is None:
            return
        failure = self._stop(self._failure)  # a failure a serving call recorded: settled (and fenced) once
        if isinstance(failure, WriterFencedError):
            raise WriterFencedError(str(failure))
        if isinstance(failure, WriterResetError):  # the owner may recover from it: keep its kind
            raise type(failure)(f"writer of {self.topic}[{self.partition}] failed earlier ({failure})")
        raise QueueStoreError(
            f"writer of {self.topic}[{self.partition}] failed earlier ({failure}); recover from the log"
        )

    def _serve(self, call: Callable[[float], int], timeout: float) -> int:
        """`producer.poll`/`flush`, which serve delivery reports, and which raise a fatal producer error
        themselves (a fenced producer that opened a new transaction learns it when adding the partition)."""
        try:
            try:
                return call(timeout)
            except SystemError:
                raise _lost_client_error(self._live_producer()) from None
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            # The producer's own error first: the records it purged report only its consequence.
            failure = self._failed(err, "append to")
            if self._failure is None:
                self._failure = failure
            self._settle_undelivered()
            raise self._stop(failure) from None
        finally:
            self._settle_undelivered()

    def _deliver(self, producer: Producer, flush_timeout: float | None) -> tuple[int, float]:
        """Deliver what the producer holds: (what is left, the seconds waited without a delivery). Within
        `flush_timeout`; with None, for as long as the broker keeps answering: the producer never times a
        record out (message.timeout.ms=0), so a wait with no bound would hold the run forever on a broker
        that went away (a run's last flush); a request timeout that delivered nothing ends it."""
        if flush_timeout is not None:
            return self._serve(producer.flush, flush_timeout), flush_timeout
        remaining = len(producer)
        while True:
            before = remaining
            remaining = self._serve(producer.flush, self._timeout)
            if remaining == 0 or remaining >= before:
                return remaining, self._timeout

    def _commit_transaction(self, producer: Producer) -> None:
        """Commit the open transaction, its records delivered: the one place a transaction of this writer
        becomes visible (the tests' crash points wrap it: tests/killpoints)."""
        producer.commit_transaction(self._timeout)

    def _commit(self, flush_timeout: float | None) -> int:
        """Commit the open transaction, then serve its records' callbacks; returns how many were served."""
        if not self._in_transaction:
            return 0
        producer = self._live_producer()
        remaining, waited = self._deliver(producer, flush_timeout)
        if remaining > 0:
            raise BrokerUnavailableError(
                self._store.bootstrap_servers,
                f"{self.outstanding:,} appends to {self.topic}[{self.partition}] not delivered",
                waited,
            )
        if self._failure is not None:
            raise self._stop(self._failure)
        if self._side:
            self._produce_side(producer, flush_timeout)
        try:
            self._commit_transaction(producer)
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            raise self._stop(self._commit_failed(err)) from None
        self._in_transaction = False
        self.commits += 1
        try:
            self._settled(producer)
        except QueueStoreError as exc:
            self._serve_delivered()  # committed: their callbacks say so, then the writer stops
            raise self._stop(exc) from None
        return self._serve_delivered()

    def _serve_delivered(self) -> int:
        """Serve the committed transaction's callbacks, in append order."""
        delivered, self._delivered = self._delivered, []
        for on_durable, offset in delivered:
            self._served += 1
            if on_durable is not None:
                on_durable(offset, None)
        return len(delivered)

    def _commit_due(self) -> bool:
        return (
            self._transaction_records >= self._commit_records
            or self._clock() - self._transaction_started >= self._commit_interval
        )

    def append(self, value: bytes, meta: RecordMeta, on_durable: DurableCallback | None = None) -> None:
        producer = self._live_producer()
        self._check_failure()
        limit = self._store.value_limit(meta)
        if len(value) > limit:
            raise RecordTooLargeError(
                f"record of {len(value)} bytes exceeds the {limit} bytes a record with this key may carry "
                f"(max_record_bytes={self._max_record_bytes}); write it through OutputQueue, which chunks it"
            )
        # At most one transaction's worth waits behind a commit (then the append waits for it): the commit
        # cadence stays one per `commit_records`, and memory stays bounded.
        full = self.outstanding >= self._max_outstanding or len(self._waiting) >= self._commit_records
        if self._committer is not None and not self._reap(block=full):
            # The previous transaction is still committing: this record waits for the next one, in order.
            self._waiting.append((value, meta, on_durable))
            self._appended += 1
            return
        # Bounded outstanding: records complete only when committed, so commit (serving callbacks here, in
        # the caller's thread) when the bound is reached; memory stays bounded when the broker is slow.
        if self._appended - self._served >= self._max_outstanding:
            self._commit_or_stop()
        self._produce(producer, value, meta, on_durable)
        self._appended += 1

    def _produce(
        self, producer: Producer, value: bytes, meta: RecordMeta, on_durable: DurableCallback | None
    ) -> None:
        self._begin_transaction(producer)
        report = self._plain_report if on_durable is None else self._make_report(on_durable)
        record_key, message, headers = encode_message(value, meta)
        while True:
            try:
                producer.produce(
                    self.topic,
                    message,
                    record_key,
                    partition=self.partition,
                    headers=headers,
                    on_delivery=report,
                )
                break
            except BufferError:
                # librdkafka's local queue is full (size limit in bytes): let deliveries make room.
                self._serve(producer.poll, 0.05)
            except KafkaException as exc:
                if _error_code(exc) == KafkaError.MSG_SIZE_TOO_LARGE:
                    raise RecordTooLargeError(str(exc)) from exc
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                raise self._stop(self._failed(err, "append to")) from None
        self._transaction_records += 1

    # -- the pipelined commit ------------------------------------------------------------------------------
    def _start_commit(self, producer: Producer) -> None:
        """Deliver and commit the open transaction in the committer thread; the caller goes on. Only the
        thread touches the producer until `_reap` joined it (appends wait in `_waiting`)."""

        def commit() -> None:
            try:
                # Delivery reports are appended to _delivered/_undelivered here: the caller's thread does
                # not touch them until it joined this thread.
                try:
                    self._commit_remaining = producer.flush(self._timeout)
                except SystemError:
                    raise _lost_client_error(producer) from None
                if self._commit_remaining > 0 or self._undelivered:
                    return
                self._commit_sent = True
                self._commit_transaction(producer)
                with contextlib.suppress(KafkaException, SystemError):
                    producer.poll(0)  # serve the log lines queued during the commit (the watch counts)
            except KafkaException as exc:
                self._commit_error = exc

        self._commit_remaining = 0
        self._commit_error = None
        self._commit_sent = False
        self._committer = threading.Thread(target=commit, name=f"cec-commit-{self.topic}-{self.partition}")
        self._committer.daemon = True
        self._committer.start()

    def _reap(self, *, block: bool, timeout: float | None = None) -> bool:
        """If the pipelined commit is over (`block`: once it is, or `timeout` passed): settle it (serve its
        callbacks, or stop the writer if it failed), produce the waiting appends in a new transaction, and
        return True; False while it is still running."""
        committer = self._committer
        if committer is None:
            return True
        if block or timeout:
            committer.join(timeout if not block else None)
        if committer.is_alive():
            return False
        self._committer = None
        exc = self._commit_error
        if exc is not None:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            # The producer's own error first (as in `_serve`): the records it purged report only that.
            if self._failure is None:
                self._failure = (
                    self._commit_failed(err) if self._commit_sent else self._failed(err, "commit of")
                )
            self._settle_undelivered()
            raise self._stop(self._failure) from None
        self._settle_undelivered()
        if self._failure is not None:
            raise self._stop(self._failure)
        if self._commit_remaining > 0:
            raise self._stop(
                BrokerUnavailableError(
                    self._store.bootstrap_servers,
                    f"{self.outstanding:,} appends to {self.topic}[{self.partition}] not delivered",
                    self._timeout,
                ),
                reset=False,
            )
        self._in_transaction = False
        self.commits += 1
        if self._watch.incidents != self._incidents_at_begin:
            try:
                self._renew(self._live_producer())
            except QueueStoreError as renewal:
                self._serve_delivered()  # committed: their callbacks say so, then the writer stops
                raise self._stop(renewal) from None
        self._serve_delivered()
        waiting, self._waiting = self._waiting, []
        if waiting:
            producer = self._live_producer()
            for value, meta, on_durable in waiting:
                self._produce(producer, value, meta, on_durable)
        return True

    def _begin_transaction(self, producer: Producer) -> None:
        """Open a transaction unless one is open (the first append or side record after a commit)."""
        if self._in_transaction:
            return
        try:
            producer.begin_transaction()
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            raise self._stop(self._failed(err, "transaction on")) from None
        self._in_transaction = True
        self._transaction_started = self._clock()
        self._transaction_records = 0
        self._incidents_at_begin = self._watch.incidents

    def append_side(self, topic: str, partition: int, key: bytes | None, value: bytes) -> None:
        """Add a plain record (no cec headers) for another topic to the open transaction (one is begun if
        none is open), so it commits or aborts with the records appended to this partition: a
        read_committed consumer of `topic` sees it exactly when they are in the log.

        Side records are produced at commit time, after this partition's records are delivered: on a
        broker that shows aborted records anyway (Tansu, docs/kafka.md) a side record is then visible only
        if the records appended before it are, never the other way round. A failed side record is the
        writer's failure."""
        producer = self._live_producer()
        self._check_failure()
        self._begin_transaction(producer)
        self._side.append((topic, partition, key, value))

    def _produce_side(self, producer: Producer, flush_timeout: float | None) -> None:
        """Produce the open transaction's side records (its own records are delivered) and deliver them."""
        side, self._side = self._side, []
        for topic, partition, key, value in side:
            while True:
                try:
                    producer.produce(topic, value, key, partition=partition, on_delivery=self._plain_report)
                    break
                except BufferError:
                    self._serve(producer.poll, 0.05)
                except KafkaException as exc:
                    err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                    raise self._stop(self._failed(err, f"side record to {topic!r} beside")) from None
            self._appended += 1
        remaining, waited = self._deliver(producer, flush_timeout)
        if remaining > 0:
            raise BrokerUnavailableError(
                self._store.bootstrap_servers,
                f"side records of {self.topic}[{self.partition}] not delivered",
                waited,
            )
        if self._failure is not None:
            raise self._stop(self._failure)

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery reports; start committing the open transaction when it is due (pipelined, see
        the module doc) and settle a commit that is through. Raises the writer's failure (fail-stop),
        `WriterFencedError` when another writer took over."""
        producer = self._live_producer()
        before = self._served
        if self._committer is not None and not self._reap(block=False, timeout=timeout):
            return self._served - before  # the producer is the committer's until it is through
        self._serve(producer.poll, timeout if self._served == before else 0.0)
        self._check_failure()
        if self._in_transaction and self._commit_due():
            if self._side:
                self._commit_or_stop()  # side records are produced at commit time: not pipelined
            else:
                self._start_commit(producer)
        return self._served - before

    def _commit_or_stop(self) -> None:
        """A commit on the writer's own initiative: one that cannot even deliver its records within the
        request timeout stops the writer (the caller did not ask to wait; flush() is the bounded wait)."""
        try:
            self._commit(self._timeout)
        except BrokerUnavailableError as exc:
            raise self._stop(exc, reset=False) from None

    def flush(self, timeout: float | None = None) -> None:
        """Commit everything appended; every callback is served when this returns. Without `timeout` it
        waits as long as the broker keeps taking records, and stops (`BrokerUnavailableError`) once a
        request timeout passed with nothing delivered."""
        self._live_producer()
        self._check_failure()
        self._reap(block=True)
        self._commit(timeout)
        if self.outstanding > 0:
            raise BrokerUnavailableError(
                self._store.bootstrap_servers,
                f"{self.outstanding:,} appends to {self.topic}[{self.partition}] not durable",
                self._timeout if timeout is None else timeout,
            )

    def close(self, timeout: float | None = 60.0) -> None:
        """Commit and release the partition.

        Bounded by `timeout` because appends never time out on their own: if the broker stays unreachable,
        unsent records are purged (their callbacks report failure) rather than hanging the caller forever.
        A failed writer commits nothing: its open transaction is left to the next writer's
        `init_transactions()` (or the broker's transaction timeout) to abort.
        """
        if self._producer is None:
            return
        producer = self._producer
        if self._committer is not None and self._failure is not None:
            self._committer.join()  # the producer is the committer's until it is through
        try:
            if self._failure is None:
                try:
                    self.flush(timeout)
                except BrokerUnavailableError:
                    log.warning(
                        "closing %r with %d appends not durable: purging them", self, self.outstanding
                    )
                    self._purge(producer)
                except QueueStoreError as exc:
                    log.warning("closing %r: %s", self, exc)
                    self._purge(producer)
                else:
                    producer.close()
            else:
                self._purge(producer)
        finally:
            self._producer = None
            self._lock.release()
            self._store._forget(self)

    def trim(self, before_offset: int) -> int:
        """`delete_records` below `before_offset`. A broker that cannot (Tansu 0.6 drops the connection on
        DeleteRecords, measured) keeps the whole log: said once, and nothing is lost."""
        if before_offset <= self._trimmed_to:
            return 0
        admin = self._store._admin_client()
        try:
            futures = admin.delete_records(
                [TopicPartition(self.topic, self.partition, before_offset)], request_timeout=self._timeout
            )
            next(iter(futures.values())).result(self._timeout)
        except KafkaException as exc:
            if not self._trim_refused:
                self._trim_refused = True
                log.warning(
                    "%s[%d]: the broker did not delete records below %d (%s); the log is kept whole",
                    self.topic, self.partition, before_offset, exc,
                )  # fmt: skip
            return 0
        trimmed = before_offset - self._trimmed_to
        self._trimmed_to = before_offset
        return trimmed

    _trimmed_to = 0  # the log start this writer last set (offsets below counted as trimmed by it)
    _trim_refused = False

    def _purge(self, producer: Producer) -> None:
        # A fenced or failed producer raises its fatal error again here, or confluent-kafka loses it on the
        # way (SystemError, see `_lost_client_error`): either way there is nothing left to deliver.
        with contextlib.suppress(KafkaException, SystemError):
            producer.purge(in_queue=True, in_flight=True, blocking=False)
            producer.flush(5.0)
        self._settle_undelivered()
        self._stop(
            self._failure or QueueStoreError(f"writer of {self.topic}[{self.partition}] closed"), reset=False
        )


@dataclass
class _ReadResult:
    records: list[StoredRecord] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)  # instead of records, for a read with as_rows
    eof: int | None = None  # offset of the PARTITION_EOF event, when one was reached
    beyond_end: bool = False  # the start offset lies past the end of the partition


class KafkaPartitionReader(PartitionReader):
    """Positioned reads of one partition through its own group-less consumer.

    Each operation re-assigns the partition at an explicit offset; nothing is committed. One reader is used
    by one thread; `tail` opens its own consumer so that it can run (in another thread, too) alongside
    positioned reads.
    """

    def __init__(self, store: KafkaQueueStore, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.dense_offsets = store.dense_offsets
        self.store_name = f"kafka {store.bootstrap_servers}"
        self._store = store
        self._stall_timeout = store.request_timeout
        # How long a positioned read waits in silence before suspecting it was positioned past the end
        # (Tansu answers those fetches with silence rather than OFFSET_OUT_OF_RANGE).
        self.beyond_end_suspicion = 0.5
        self._consumer: Consumer | None = Consumer(store._consumer_config(f"reader-{topic}-{partition}"))
        # Lowest offset known to be <= the end: a seek hint for end_offset, never an answer.
        self._known_end = 0
        # Where the consumer stands after a read that kept it assigned, and what it drained beyond it.
        self._cursor: int | None = None
        self._backlog: list[Message] = []
        # Bulk backward reads (recovery's EC scan) get a consumer of their own, made on first use: see
        # `_bulk_consumer`.
        self._bulk: Consumer | None = None

    def _bulk_consumer(self) -> Consumer:
        """The consumer of `read_backward_rows`: each of its reads ends unassigned, so it never idles at
        the live end.

        It keeps the store's fetch.wait.max.ms (10 ms). Tansu answers a fetch with the record batches it
        gathers within that wait (at least one), not with everything up to the byte limit, so the wait
        bounds how much one round trip brings. An operator's log is made of small batches (its writer
        lingers 5 ms: 30-100 records each at ~20k records/s). With a 2 ms wait, a loaded machine got
        one batch per fetch: ~1,400 round trips for an 86k-record extent, measured 68 s for the EC build
        with the client and broker held to 10% of a CPU against 2.3 s with 10 ms (the 44 s EC build of
        benchmarks/RESULTS.md, "Side by side with Quix Streams", at load ~29). On a quiet machine the
        shorter wait only saved ~85 ms per 84k-record read of a log of large batches."""
        self._live_consumer()
        if self._bulk is None:
            conf = self._store._consumer_config(f"bulk-{self.topic}-{self.partition}")
            # Fewer, larger fetches: an extent of ~90k small records is a few MB, read in a couple of
            # fetches instead of one per default 1 MB (each held for fetch.wait.max.ms by Tansu).
            conf.setdefault("max.partition.fetch.bytes", _BULK_FETCH_BYTES)
            conf.setdefault("fetch.max.bytes", _BULK_FETCH_BYTES)
            self._bulk = Consumer(conf)
        return self._bulk

    def __repr__(self) -> str:
        return f"{type(self).__name__}(topic={self.topic!r}, partition={self.partition})"

    def _live_consumer(self) -> Consumer:
        if self._consumer is None:
            raise StoreClosedError(f"reader of {self.topic}[{self.partition}] is closed")
        return self._consumer

    def _note_end(self, offset: int) -> None:
        if offset > self._known_end:
            self._known_end = offset

    def _check_error(self, err: KafkaError) -> bool:
        """Classify an error event; returns True when it means the position is beyond the end."""
        code = err.code()
        if code in _BEYOND_END_CODES:
            return True
        if code in _UNKNOWN_CODES:
            raise UnknownTopicError(f"{self.topic}[{self.partition}]: {err.str()}")
        if err.fatal():
            raise QueueStoreError(f"reading {self.topic}[{self.partition}] failed: {err.str()}")
        # Transport hiccups and the like: librdkafka retries by itself.
        log.debug("transient consumer error on %s[%d]: %s", self.topic, self.partition, err.str())
        return False

    def _read(
        self,
        start: int,
        *,
        want: int | None,
        stop_before: int | None,
        collect: bool = True,
        as_rows: bool = False,
        bulk: bool = False,
    ) -> _ReadResult:
        """Consume from `start` until `want` records, an offset >= `stop_before`, or the EOF event.

        A read that ends because it has `want` records keeps the consumer assigned, and the messages it
        drained but did not return: a next read starting right after it (a sequential reader such as an
        operator's queue source) continues from there instead of re-assigning, which would drop the
        prefetched data and wait for a new fetch (held for fetch.wait.max.ms on some brokers).
        """
        if as_rows or bulk:  # its own consumer, always re-assigned, never kept assigned (want is None)
            consumer = self._bulk_consumer()
            backlog: list[Message] = []
            consumer.assign([TopicPartition(self.topic, self.partition, start)])
        else:
            consumer = self._live_consumer()
            backlog = []
            if self._cursor == start:
                backlog = self._backlog
            else:
                consumer.assign([TopicPartition(self.topic, self.partition, start)])
            self._cursor, self._backlog = None, []
        keep_assigned = False
        result = _ReadResult()
        last_progress = time.monotonic()
        drain = 10_000 if want is None else min(want, 10_000)
        try:
            while True:
                if backlog:
                    batch, backlog = backlog, []
                    last_progress = time.monotonic()
                else:
                    if as_rows and stop_before is not None:
                        # Messages drained past `stop_before` become Python objects only to be dropped:
                        # drain about what is left (offsets may skip markers: a short drain only loops).
                        below = result.rows[-1][0] + 1 if result.rows else start
                        drain = max(1, min(10_000, stop_before - below))
                    fetched = self._fetch(consumer, start, result, last_progress, drain)
                    if fetched is None:
                        return result
                    if not fetched:
                        continue
                    batch = fetched
                    last_progress = time.monotonic()
                if as_rows:  # bulk: `want` is None here (see read_backward_rows)
                    if self._rows_from(batch, start, stop_before, result):
                        return result
                    continue
                for index, msg in enumerate(batch):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            eof = _offset(msg)
                            if eof >= start:
                                result.eof = eof
                                self._note_end(eof)
                                return result
                            continue
                        if self._check_error(err):
                            result.beyond_end = True
                            return result
                        continue
                    offset = _offset(msg)
                    if offset < start:
                        continue
                    if stop_before is not None and offset >= stop_before:
                        return result
                    if offset >= self._known_end:
                        self._known_end = offset + 1
                    if collect:
                        result.records.append(_to_record(msg, offset))
                    if want is not None and len(result.records) >= want:
                        self._cursor, self._backlog = offset + 1, batch[index + 1 :]
                        keep_assigned = True
                        return result
                    if stop_before is not None and offset == stop_before - 1:
                        return result
        finally:
            if not keep_assigned:
                # Stop fetching in the background between operations (and drop prefetched data).
                consumer.unassign()

    def _rows_from(
        self, batch: list[Message], start: int, stop_before: int | None, result: _ReadResult
    ) -> bool:
        """The rows of a fetched batch into `result.rows`, as `_read` collects records (offsets below
        `start` skipped, up to `stop_before`, EOF and error events handled alike); True when the read
        ends. The C accelerator converts runs of plain messages; anything else comes back here."""
        out = result.rows
        limit = -1 if stop_before is None else stop_before
        i, count = 0, len(batch)
        while i < count:
            if native is not None:
                i, stopped = native.message_rows(
                    batch, i, start, limit, out, _to_row, FRAME_MAGIC, FRAME_KINDS
                )
            else:
                i, stopped = _message_rows(batch, i, start, limit, out)
            if out:
                self._note_end(out[-1][0] + 1)
            if stopped:
                return True
            if i >= count:
                return False
            err = batch[i].error()  # message_rows stops at an event that is not a record
            i += 1
            if err is None:
                continue
            if err.code() == KafkaError._PARTITION_EOF:
                eof = _offset(batch[i - 1])
                if eof >= start:
                    result.eof = eof
                    self._note_end(eof)
                    return True
                continue
            if self._check_error(err):
                result.beyond_end = True
                return True
        return False

    def _fetch(
        self, consumer: Consumer, start: int, result: _ReadResult, last_progress: float, drain: int
    ) -> list[Message] | None:
        """The next batch of consumer events: [] when nothing came yet, None when the read must end (the
        start lies beyond the end, which `result` then says)."""
        first = consumer.poll(0.1)
        if first is None:
            idle = time.monotonic() - last_progress
            nothing_yet = not result.records and not result.rows
            if nothing_yet and idle >= self.beyond_end_suspicion and self._past_end(consumer, start):
                result.beyond_end = True
                return None
            if idle >= self._stall_timeout:
                raise BrokerUnavailableError(
                    self._store.bootstrap_servers,
                    f"no data nor end-of-partition from {self.topic}[{self.partition}] at offset {start:,}",
                    self._stall_timeout,
                )
            return []
        # poll() delivers one message; drain what librdkafka already prefetched without waiting
        # (consume() with a timeout would wait for the full count).
        return [first, *consumer.consume(drain, 0)]

    def _past_end(self, consumer: Consumer, start: int) -> bool:
        # The high watermark cached from the latest fetch response: a cheap suspicion only, confirmed by
        # the callers through an EOF scan, because it can be stale or (on Tansu, when queried) understated.
        try:
            wm = consumer.get_watermark_offsets(TopicPartition(self.topic, self.partition), cached=True)
        except KafkaException:
            return False
        if not wm:
            return False
        high = wm[1]
        return 0 <= high < start

    def hint_end(self, offset: int) -> None:
        # Finding the end means consuming to the EOF event (watermarks are unreliable, DESIGN-NOTES 4);
        # starting that read at a known lower bound spares reading the whole partition.
        self._note_end(offset)

    def start_offset(self) -> int:
        """The log start: the low watermark (Apache Kafka moves it on `delete_records`; Tansu reports 0)."""
        consumer = self._live_consumer()
        deadline = time.monotonic() + self._stall_timeout
        while True:
            try:
                low, _ = consumer.get_watermark_offsets(
                    TopicPartition(self.topic, self.partition),
                    timeout=max(0.1, deadline - time.monotonic()),
                )
                return max(0, int(low))
            except KafkaException as exc:
                code = _error_code(exc)
                # Unknown partition too: the store saw the topic when it made this reader, so the reader's
                # client has not learnt it yet (a topic just created; found by the chaos runs).
                settling = code in _LEADER_MOVING_CODES or code in _TRANSIENT_CODES or code in _UNKNOWN_CODES
                if not settling or time.monotonic() >= deadline:
                    if code in _NO_ANSWER_CODES:
                        raise BrokerUnavailableError(
                            self._store.bootstrap_servers,
                            f"reading the log start of {self.topic}[{self.partition}]",
                            self._stall_timeout,
                        ) from None
                    raise QueueStoreError(
                        f"cannot read the log start of {self.topic}[{self.partition}]: {exc}"
                    ) from None
            time.sleep(0.05)  # pacing of a bounded poll while the leadership or the connection settles

    def end_offset(self) -> int:
        # On the bulk consumer: it waits less per fetch, a forward reader's position is left alone, and
        # recovery's backward reads that follow find it connected already.
        hint = self._known_end
        if hint > 0:
            result = self._read(hint, want=None, stop_before=None, collect=False, bulk=True)
            if result.eof is not None:
                return result.eof
            # The hint overshoots: the partition shrank (topic recreated, broker lost its memory storage).
            log.warning(
                "%s[%d] ends below offset %d seen earlier; rescanning", self.topic, self.partition, hint
            )
            self._known_end = 0
        result = self._read(self.start_offset(), want=None, stop_before=None, collect=False, bulk=True)
        if result.eof is None:
            raise QueueStoreError(f"could not find the end of {self.topic}[{self.partition}]")
        self._known_end = result.eof
        return result.eof

    def read_forward(self, from_offset: int, max_records: int) -> list[StoredRecord]:
        if max_records <= 0:
            return []
        start = max(0, from_offset)
        result = self._read(start, want=max_records, stop_before=None)
        if result.beyond_end:
            if start < self.start_offset():  # "out of range" below the log start: trimmed, never a gap
                raise self.trimmed(start)
            if start >= self.end_offset():
                return []
            result = self._read(start, want=max_records, stop_before=None)
        return result.records

    def scan_forward_chunks(self, from_offset: int = 0, chunk: int = 4096) -> Iterator[list[StoredRecord]]:
        # Not the base class's record counting: with transaction markers in the way, `chunk` records from
        # `offset` can lie past the end found at the start, and the scan must stop at that end.
        end = self.end_offset()
        offset = max(0, from_offset)
        while offset < end:
            result = self._read(offset, want=max(1, chunk), stop_before=end)
            if result.beyond_end:
                if offset < self.start_offset():  # below the log start: trimmed, never a gap
                    raise self.trimmed(offset)
                # A stale suspicion: `end` was found by consuming to EOF.
                result = self._read(offset, want=max(1, chunk), stop_before=end)
            if not result.records:
                return  # only markers (or aborted records) left below the end
            yield result.records
            offset = result.records[-1].offset + 1

    def read_backward(self, before_offset: int, max_records: int) -> list[StoredRecord]:
        if max_records <= 0 or before_offset <= 0:
            return []
        # Offsets are not dense (transaction markers take offsets but are never delivered), so a window of
        # `max_records` offsets may hold fewer records: keep widening downwards until enough or offset 0.
        collected: list[StoredRecord] = []
        upper, floor = before_offset, 0
        while len(collected) < max_records and upper > floor:
            lower = max(floor, upper - (max_records - len(collected)))
            result = self._read(lower, want=None, stop_before=upper)
            if result.beyond_end:
                # "Out of range" below the log start (trimmed there): read down to the log start only.
                log_start = self.start_offset()
                if lower < log_start:
                    floor = log_start
                    continue
                end = self.end_offset()
                if end >= upper:  # stale suspicion: the data is there after all
                    result = self._read(lower, want=None, stop_before=upper)
                else:
                    upper = end
                    continue
            collected[:0] = result.records
            upper = lower
        collected.reverse()
        return collected[:max_records]

    def read_range_rows(self, start: int, stop_before: int) -> list[Row]:
        # One bulk read of the range, rows built by the C accelerator (as read_backward_rows does): no
        # StoredRecord and no headers per message. It ends early at the end of the partition.
        if stop_before <= start:
            return []
        result = self._read(max(0, start), want=None, stop_before=stop_before, as_rows=True)
        if result.beyond_end and start < self.start_offset():
            raise self.trimmed(start)
        if result.beyond_end and self.end_offset() > start:  # stale suspicion: the data is there after all
            result = self._read(max(0, start), want=None, stop_before=stop_before, as_rows=True)
        return result.rows

    def read_backward_rows(self, before_offset: int, max_records: int) -> list[Row]:
        # read_backward without a StoredRecord per message: one forward read of the whole window
        # (offsets may have gaps: widen downwards until enough, as read_backward does). Each read is at
        # least one fetch round trip, so the window starts a little wider than asked: a transaction
        # marker per commit (and the aborted tail a crash leaves) would otherwise cost a second read of a
        # few offsets for almost every chunk; the surplus rows, the oldest, are dropped.
        if max_records <= 0 or before_offset <= 0:
            return []
        collected: list[Row] = []
        upper, floor = before_offset, 0
        while len(collected) < max_records and upper > floor:
            missing = max_records - len(collected)
            lower = max(floor, upper - missing - missing // 64 - 16)
            result = self._read(lower, want=None, stop_before=upper, as_rows=True)
            if result.beyond_end:
                # "Out of range" below the log start (trimmed there): read down to the log start only.
                log_start = self.start_offset()
                if lower < log_start:
                    floor = log_start
                    continue
                end = self.end_offset()
                if end >= upper:  # stale suspicion: the data is there after all
                    result = self._read(lower, want=None, stop_before=upper, as_rows=True)
                else:
                    upper = end
                    continue
            collected[:0] = result.rows
            upper = lower
        collected.reverse()
        return collected[:max_records]

    def tail(
        self,
        from_offset: int,
        *,
        stop: Callable[[], bool] | None = None,
        idle_timeout: float | None = None,
        batch: int = 4096,
    ) -> Iterator[list[StoredRecord]]:
        self._live_consumer()
        # Its own consumer: a tail runs for long and must not be repositioned by read_forward/end_offset.
        consumer = Consumer(self._store._consumer_config(f"tail-{self.topic}-{self.partition}"))
        batch = max(1, batch)
        try:
            consumer.assign([TopicPartition(self.topic, self.partition, max(0, from_offset))])
            last_data = time.monotonic()
            while stop is None or not stop():
                if self._consumer is None:
                    # The reader was closed, possibly from another thread: closing this consumer from
                    # there while it polls here is unsafe in librdkafka, so the tail notices and ends.
                    raise StoreClosedError(f"reader of {self.topic}[{self.partition}] is closed")
                wait = 0.1
                if idle_timeout is not None:
                    wait = max(0.0, min(wait, idle_timeout - (time.monotonic() - last_data)))
                first = consumer.poll(wait)
                if first is None:
                    if idle_timeout is not None and time.monotonic() - last_data >= idle_timeout:
                        return
                    continue
                out: list[StoredRecord] = []
                for msg in (first, *consumer.consume(batch - 1, 0)) if batch > 1 else (first,):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            self._note_end(_offset(msg))
                        elif self._check_error(err):
                            raise QueueStoreError(
                                f"tail of {self.topic}[{self.partition}] starts past the end ({from_offset})"
                            )
                        continue
                    out.append(_to_record(msg, _offset(msg)))
                if out:
                    last_data = time.monotonic()
                    self._note_end(out[-1].offset + 1)
                    yield out
        finally:
            # Also runs when an abandoned tail generator is garbage-collected.
            consumer.close()

    def close(self) -> None:
        if self._consumer is None:
            return
        consumer, self._consumer = self._consumer, None
        bulk, self._bulk = self._bulk, None
        try:
            consumer.close()
            if bulk is not None:
                bulk.close()
        finally:
            self._store._forget(self)
