"""Kafka backend of the queue store, on confluent-kafka (librdkafka), by role: `config` (every client's
config), `framing` (a record's meta on the wire), `admin` (topics, retention, offsets, attachments' produce),
`lock` (the same-host guard), `producer` (the one transactional producer: fencing, transactions in
doubt), `writer`, `reader`, `ends` (the one end-of-partition finder), `store` (`KafkaQueueStore`).

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

Transactions in doubt never go on in the same producer epoch (`queuestore.kafka.producer`). Readers
consume with `isolation.level=read_committed`; transaction markers take offsets that are never delivered,
so offsets are not dense (`dense_offsets = False`). Each record's `RecordMeta` travels once, compactly:
the kind in the `cec.kind` header and a small frame in front of the value, the window key as message key
(`queuestore.kafka.framing`; docs/kafka.md). The end of a partition is always found by consuming to a
`PARTITION_EOF` event, never taken from a broker's watermark (`queuestore.kafka.ends`).
"""

from queuestore.kafka.admin import ATTACHMENT_TOPIC_PREFIX
from queuestore.kafka.config import redact_config, transactional_id
from queuestore.kafka.framing import (
    FRAME_KINDS,
    FRAME_MAGIC,
    HEADER_KEY,
    HEADER_KIND,
    HEADER_SEQ,
    HEADER_TIME,
    decode_message,
    encode_message,
    meta_from_headers,
    meta_to_headers,
    meta_to_key,
)
from queuestore.kafka.reader import KafkaPartitionReader
from queuestore.kafka.store import (
    DEFAULT_COMMIT_INTERVAL,
    DEFAULT_COMMIT_RECORDS,
    DEFAULT_MAX_RECORD_BYTES,
    KafkaQueueStore,
)
from queuestore.kafka.writer import KafkaPartitionWriter

__all__ = [
    "ATTACHMENT_TOPIC_PREFIX",
    "DEFAULT_COMMIT_INTERVAL",
    "DEFAULT_COMMIT_RECORDS",
    "DEFAULT_MAX_RECORD_BYTES",
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
