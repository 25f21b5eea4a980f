"""The closed-window directory of an attached query's trimmed output logs, carried in Kafka (`operators.spark.trim`).

A key with no open window opens its next one with the sequence after its last R (DESIGN-NOTES section 2),
which may lie anywhere in the log. When the write tasks trim a partition on the executors, nothing there
keeps the driver's stream index up to date, so before a task trims its log to `low` it writes, in the very
transaction of its micro-batch's records, the (key, seq) of every R from where the directory stood up to
`low`, and a marker saying the directory now covers the log below `low`. The trim follows the commit: a
record is never trimmed before what a restart needs from it is durable, and a killed or fenced attempt's
entries abort with its records.

Where: topic `cec-meta.<output topic>.closed-windows`, one partition per output partition, compacted
(newest value per message key: one entry per key and one marker, whatever the run's length). Each entry is
a framed record (`queuestore.kafka.framing`) whose message key is `k` + the window key and whose seq is the
window's; the marker's key is `c` and its time the offset covered. The value is a CRC-32 of the entry, so a
damaged entry is detected, never believed (`DamagedDirectoryError`).

A start whose index is behind its log's start (a lost `state_dir`, or a driver that never saw what the
executors trimmed) takes the directory from here (`queuestore.index.StreamIndex.adopt_closed_windows`).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from queuestore.base import RecordMeta
from queuestore.exceptions import QueueStoreError
from queuestore.kafka.admin import ATTACHMENT_TOPIC_PREFIX
from queuestore.kafka.framing import encode_message

if TYPE_CHECKING:
    from queuestore.kafka import KafkaPartitionWriter, KafkaQueueStore

__all__ = [
    "DamagedDirectoryError",
    "Directory",
    "carry",
    "create_directory_topic",
    "directory_topic",
    "read_directory",
]

_KIND = "DIR"
_ENTRY, _MARKER = "k", "c"
_CRC = struct.Struct(">I")
# Compacted: the newest entry per key and the newest marker stay; 1 MB segments so that compaction can
# reach all but the newest megabyte (the active segment is never compacted).
_CONFIGS = {"cleanup.policy": "compact", "segment.bytes": str(1 << 20), "retention.ms": "-1"}


class DamagedDirectoryError(QueueStoreError):
    """An entry of the carried directory fails its checksum."""


def directory_topic(topic: str) -> str:
    """Where the closed-window directory of output topic `topic` is carried (module doc)."""
    return f"{ATTACHMENT_TOPIC_PREFIX}{topic}.closed-windows"


def create_directory_topic(store: KafkaQueueStore, topic: str, partitions: int) -> None:
    store.create_topic(directory_topic(topic), partitions, configs=_CONFIGS)


@dataclass
class Directory:
    """The carried directory of one partition: the last closed seq of every key with an R below `covered`
    (more entries, from records at or above it, may be there too: module doc)."""

    covered: int
    seqs: dict[str, int] = field(default_factory=dict)


def _crc(meta: RecordMeta) -> bytes:
    return _CRC.pack(zlib.crc32(f"{meta.key}\x00{meta.time}\x00{meta.seq}".encode()))


def _message(meta: RecordMeta) -> tuple[bytes | None, bytes]:
    key, value, _headers = encode_message(_crc(meta), meta)
    return key, value


def carry(
    writer: KafkaPartitionWriter, topic: str, q: int, closed: Iterable[tuple[str, int, int]], covered: int
) -> None:
    """Add to the writer's open transaction the entries (key, seq, offset of the R) and the marker that
    the directory of `topic[q]` covers the log below `covered` (entries first: a reader that meets the
    marker has met them)."""
    where = directory_topic(topic)
    for key, seq, offset in closed:
        writer.append_side(where, q, *_message(RecordMeta(_KIND, offset, _ENTRY + key, seq)))
    writer.append_side(where, q, *_message(RecordMeta(_KIND, covered, _MARKER, -1)))


def read_directory(store: KafkaQueueStore, topic: str, q: int) -> Directory | None:
    """The directory of `topic[q]` as committed, None when none was ever carried."""
    where = directory_topic(topic)
    if not store.topic_exists(where):
        return None
    found: Directory | None = None
    seqs: dict[str, int] = {}
    with store.reader(where, q) as reader:
        for record in reader.scan_forward(reader.start_offset()):
            meta = record.meta._replace(kind=_KIND)  # side records carry no kind header (module doc)
            if meta.key is None or record.value != _crc(meta):
                raise DamagedDirectoryError(
                    f"{where}[{q}] offset {record.offset}: a damaged entry of the closed-window directory"
                )
            if meta.key == _MARKER:
                found = Directory(meta.time)
            elif meta.key.startswith(_ENTRY):
                seqs[meta.key[len(_ENTRY) :]] = meta.seq
    if found is not None:
        found.seqs = seqs
    return found
