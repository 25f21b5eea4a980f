"""The cross-host lease of a partition's writer (`KafkaQueueStore(lease_timeout=...)`, `cec run
--lease-timeout`): a Kafka consumer-group membership, so that a writer's death is seen from another host.

The flock (`queuestore.kafka.lock`) shows a writer's death only to processes that share its state
directory. The lease of output partition `topic[p]` is the one partition of the lease topic
`cec-meta.<topic>.lease` (created on demand, never written to) in the consumer group `lease_group_id(prefix,
topic, p)`: every process that wants to write `topic[p]` joins that group, and the member the partition is
assigned to holds the lease.

- Heartbeats: librdkafka's background thread sends them; `session.timeout.ms` is the lease timeout, so a
  holder that dies (SIGKILL, a frozen process, a lost host) loses the lease once the broker has not heard
  from it for that long, and the group gives the partition to a waiting member.
- A waiter never takes the lease from a live holder: `cooperative-sticky` keeps the partition with its
  owner when a member joins (a joining member gets nothing), and the holder rejoins each rebalance without
  giving it up.
- Polling: a member must poll (`max.poll.interval.ms`) to serve its rebalances; each lease has a thread that
  does, for the holder and for a waiter alike, so neither the writer's loop nor a standby's has to.
- Acquiring: join (or stay joined) and wait until the group has answered once; held -> the writer opens;
  not held -> `PartitionLockedError`, the flock's error, so `open_output`'s `while_locked` loop (a standby)
  needs no path of its own. A waiter's lease stays in the store (`KafkaQueueStore._lease`) across tries:
  it stays a member of the group, so it is next when the holder dies.
- Safety does not rest on the lease: a holder that loses it while alive (frozen past the timeout, cut off
  from the broker) may keep writing until its successor's `init_transactions()` fences its transactional
  id (`queuestore.kafka.producer`); from then its produce or commit fails (`WriterFencedError`). So two
  writers never both write, whatever the lease says; the lease only decides when a standby starts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from queuestore.exceptions import PartitionLockedError, QueueStoreError

__all__ = ["LEASE_TOPIC_SUFFIX", "LeaseRefusedError", "PartitionLease", "lease_topic"]

log = logging.getLogger(__name__)

LEASE_TOPIC_SUFFIX = ".lease"
# How often the lease's thread serves the consumer (rebalances, errors): well within any lease timeout.
_POLL_S = 0.1


def lease_topic(attachment_topic: str) -> str:
    """The lease topic of the output topic whose companion (attachment) topic is `attachment_topic`
    (`cec-meta.<topic>`): beside it, so that listings that hide companions hide it too."""
    return attachment_topic + LEASE_TOPIC_SUFFIX


class LeaseRefusedError(QueueStoreError):
    """The broker refuses the lease's group settings (a session timeout outside its bounds)."""


class PartitionLease:
    """The lease of one output partition (module doc): a group member from construction to `close()`.

    `config`: the consumer's complete config (`ClientSettings.lease_consumer`); `topic`: the lease topic;
    `where`: the output partition, for messages; `timeout_s`: the lease timeout (messages); `first_answer_s`:
    how long `acquire` waits for the group's first answer before it says the partition is taken."""

    def __init__(
        self,
        config: dict[str, Any],
        topic: str,
        *,
        where: str,
        timeout_s: float,
        first_answer_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.topic = topic
        self.where = where
        self.timeout_s = timeout_s
        self.first_answer_s = first_answer_s
        self._clock = clock
        self._changed = threading.Condition()
        self._held = False
        self._answered = False  # the group assigned this member (something or nothing) at least once
        self._refused: QueueStoreError | None = None
        self._stopping = threading.Event()
        self._consumer = Consumer(config)
        try:
            self._consumer.subscribe(
                [topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
            )
        except BaseException:
            self._consumer.close()
            raise
        self._thread = threading.Thread(target=self._serve, name=f"cec-lease-{where}", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.where}, held={self._held})"

    # -- the group's callbacks (in the lease's thread, inside poll) ------------------------------------------

    def _ours(self, partitions: list[TopicPartition]) -> bool:
        return any(tp.topic == self.topic for tp in partitions)

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        with self._changed:
            self._answered = True
            if self._ours(partitions):
                self._held = True
            self._changed.notify_all()

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._lose(partitions, "revoked")

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._lose(partitions, "lost (the broker stopped hearing from this process)")

    def _lose(self, partitions: list[TopicPartition], how: str) -> None:
        with self._changed:
            if not (self._held and self._ours(partitions)):
                return
            self._held = False
            self._changed.notify_all()
        if not self._stopping.is_set():
            # Not a failure of the writer: if a standby takes over, its producer fences this one, whose
            # next commit then fails (module doc).
            log.warning("the writer lease of %s was %s", self.where, how)

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                msg = self._consumer.poll(_POLL_S)
            except (KafkaException, RuntimeError) as exc:  # closed under us, or a fatal client error
                if not self._stopping.is_set():
                    self._refuse(QueueStoreError(f"the writer lease of {self.where} failed: {exc}"))
                return
            err = None if msg is None else msg.error()
            if err is None:
                continue  # nothing is ever written to the lease topic; a record would mean nothing
            if err.code() == KafkaError.INVALID_SESSION_TIMEOUT:
                self._refuse(
                    LeaseRefusedError(
                        f"the broker refuses the writer lease of {self.where} ({err.str()}): a lease "
                        f"timeout of {self.timeout_s:g} s must lie within the broker's "
                        "group.min.session.timeout.ms and group.max.session.timeout.ms"
                    )
                )
            elif err.fatal():
                self._refuse(QueueStoreError(f"the writer lease of {self.where} failed: {err.str()}"))
            else:
                log.debug("writer lease of %s: %s", self.where, err.str())

    def _refuse(self, exc: QueueStoreError) -> None:
        with self._changed:
            if self._refused is None:
                self._refused = exc
            self._changed.notify_all()

    # -- the writer's side -----------------------------------------------------------------------------------

    @property
    def held(self) -> bool:
        return self._held

    def acquire(self) -> None:
        """Return once this member holds the lease; `PartitionLockedError` if another member holds it (the
        group has answered and gave this member nothing), or if the group gave no answer within
        `first_answer_s` (a holder that is still being timed out); the broker's refusal as it is."""
        deadline = self._clock() + self.first_answer_s
        with self._changed:
            while True:
                if self._refused is not None:
                    raise self._refused
                if self._held:
                    return
                if self._answered:
                    raise PartitionLockedError(
                        f"another writer holds the lease of {self.where} (group of {self.topic})"
                    )
                left = deadline - self._clock()
                if left <= 0:
                    raise PartitionLockedError(
                        f"the lease of {self.where} was not given within {self.first_answer_s:g} s "
                        "(another writer may hold it, or the broker does not answer)"
                    )
                self._changed.wait(min(left, _POLL_S))

    def wait_held(self, timeout: float) -> bool:
        """Whether this member holds the lease within `timeout` seconds (the broker's refusal raises)."""
        deadline = self._clock() + timeout
        with self._changed:
            while not self._held:
                if self._refused is not None:
                    raise self._refused
                left = deadline - self._clock()
                if left <= 0:
                    return False
                self._changed.wait(min(left, _POLL_S))
            return True

    def close(self) -> None:
        """Leave the group: a waiting member gets the lease at the next rebalance, without a timeout."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._thread.join()
        try:
            self._consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.debug("closing the writer lease of %s: %s", self.where, exc)
        with self._changed:
            self._held = False
