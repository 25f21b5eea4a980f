"""The SQLite queue store (`SqliteQueueStore`): topics as directories of partition files, attachments
beside them, and registered consumers' acknowledgements."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from queuestore.base import (
    ATTACHMENT_NAME,
    QueueStore,
)
from queuestore.exceptions import (
    DamagedLogError,
    QueueStoreError,
    TopicMismatchError,
    UnknownTopicError,
)
from queuestore.sqlite.files import WAY_OUT, _create_partition_file
from queuestore.sqlite.reader import SqlitePartitionReader
from queuestore.sqlite.writer import SqlitePartitionWriter

__all__ = ["SqliteQueueStore"]

_ACK_PREFIX = "ack-"


class SqliteQueueStore(QueueStore):
    """Topics under `root/<topic>/`, a `topic.json` with the partition count, `<p>.sqlite` per partition,
    and `<p>.<name>` per attachment of partition p (written atomically: temporary file, fsync, rename)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        fsync: bool = False,
        max_record_bytes: int = 16 << 20,
        max_outstanding: int = 32_768,
    ):
        """`max_outstanding` bounds the records appended but not yet durable: an operator that outruns the
        disk waits rather than running ahead of it. It is what a crash can lose to replay, and how far
        trimming (which applies a bound only once everything appended before it is durable) can lag."""
        if max_outstanding < 1:
            raise QueueStoreError("max_outstanding must be at least 1")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.state_dir = self.root
        self.max_record_bytes = max_record_bytes
        self.max_outstanding = max_outstanding
        self._fsync = fsync

    def __repr__(self) -> str:
        return f"SqliteQueueStore({str(self.root)!r})"

    def _topic_dir(self, topic: str) -> Path:
        if not topic or "/" in topic or topic.startswith("."):
            raise QueueStoreError(f"invalid topic name {topic!r}")
        return self.root / topic

    def create_topic(self, topic: str, partitions: int, *, exist_ok: bool = True) -> None:
        if partitions < 1:
            raise QueueStoreError("a topic needs at least one partition")
        meta = self._topic_dir(topic) / "topic.json"
        if meta.exists():
            existing = self.partitions(topic)
            if not exist_ok:
                raise TopicMismatchError(f"topic {topic!r} already exists")
            if existing != partitions:
                raise TopicMismatchError(f"topic {topic!r} has {existing} partitions, asked for {partitions}")
            return
        meta.parent.mkdir(parents=True, exist_ok=True)
        for p in range(partitions):
            _create_partition_file(meta.parent / f"{p}.sqlite")
        tmp = meta.with_suffix(".tmp")
        tmp.write_text(json.dumps({"partitions": partitions}))
        os.replace(tmp, meta)  # atomic: a crash never leaves a half-written topic description

    def topic_exists(self, topic: str) -> bool:
        return (self._topic_dir(topic) / "topic.json").is_file()

    def topics(self) -> list[str]:
        return sorted(d.name for d in self.root.iterdir() if (d / "topic.json").is_file())

    def partitions(self, topic: str) -> int:
        meta = self._topic_dir(topic) / "topic.json"
        try:
            return int(json.loads(meta.read_text())["partitions"])
        except (FileNotFoundError, NotADirectoryError):
            raise UnknownTopicError(f"no topic {topic!r} in {self.root}") from None
        except (ValueError, KeyError, TypeError):
            raise DamagedLogError(f"{meta} is damaged; {WAY_OUT}") from None

    def _partition_path(self, topic: str, partition: int) -> Path:
        count = self.partitions(topic)
        if not 0 <= partition < count:
            raise QueueStoreError(f"{topic} has partitions 0..{count - 1}, not {partition}")
        return self._topic_dir(topic) / f"{partition}.sqlite"

    def writer(self, topic: str, partition: int, *, fence_later: bool = False) -> SqlitePartitionWriter:
        # The file lock excludes the other writers when it is taken: nothing is fenced later.
        return SqlitePartitionWriter(
            self._partition_path(topic, partition),
            topic,
            partition,
            max_record_bytes=self.max_record_bytes,
            fsync=self._fsync,
            max_outstanding=self.max_outstanding,
        )

    def reader(self, topic: str, partition: int) -> SqlitePartitionReader:
        reader = SqlitePartitionReader(self._partition_path(topic, partition), topic, partition)
        reader.dense_offsets = self.dense_offsets
        return reader

    def _attachment_path(self, topic: str, partition: int, name: str) -> Path:
        if not ATTACHMENT_NAME.match(name):
            raise QueueStoreError(f"invalid attachment name {name!r}")
        return self._partition_path(topic, partition).with_name(f"{partition}.{name}")

    def read_attachment(self, topic: str, partition: int, name: str) -> bytes | None:
        try:
            return self._attachment_path(topic, partition, name).read_bytes()
        except FileNotFoundError:
            return None

    def write_attachment(self, topic: str, partition: int, name: str, value: bytes) -> None:
        path = self._attachment_path(topic, partition, name)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            f.write(value)
            f.flush()
            os.fsync(f.fileno())  # the rename below must never expose an empty or partial file
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # and the rename itself must be durable before the log grows
        finally:
            os.close(dir_fd)

    # -- registered consumers: one attachment per consumer, so that each writes only its own ----------
    def _ack_name(self, consumer: str) -> str:
        name = _ACK_PREFIX + consumer
        if not ATTACHMENT_NAME.match(name):
            raise QueueStoreError(f"invalid consumer name {consumer!r} (lower-case letters, digits, '-')")
        return name

    def acknowledge(self, topic: str, partition: int, consumer: str, offset: int) -> None:
        self.write_attachment(topic, partition, self._ack_name(consumer), str(int(offset)).encode())

    def forget_consumer(self, topic: str, partition: int, consumer: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._attachment_path(topic, partition, self._ack_name(consumer)).unlink()

    def acknowledged(self, topic: str, partition: int) -> dict[str, int]:
        folder = self._partition_path(topic, partition).parent
        prefix = f"{partition}.{_ACK_PREFIX}"
        acks: dict[str, int] = {}
        for path in folder.glob(prefix + "*"):
            try:
                acks[path.name[len(prefix) :]] = int(path.read_bytes())
            except FileNotFoundError:  # unregistered meanwhile
                continue
            except ValueError:
                raise DamagedLogError(f"the acknowledgement {path} is damaged; {WAY_OUT}") from None
        return acks

    def close(self) -> None:
        pass
