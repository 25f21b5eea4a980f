"""The one transactional producer of cec: a `transactional.id`'s producer with its fencing and in-doubt rule.
Used by the queue store's partition writer (`queuestore.kafka.writer`) and by the Spark "cec-kafka" sink
(`operators.spark.datasource`).

Init fences: a new producer's `init_transactions()` aborts the open transaction of any earlier producer
with the id (a crashed writer, one alive on another host, an earlier attempt of a Spark task) and fences
it; from then on the new producer alone can add under the id, in a new epoch.

No transaction ends in doubt and goes on in the same producer epoch. librdkafka implements Kafka's
transactions v1 only (no KIP-890 transactions v2): the broker knows a transaction by the producer id and
epoch alone, so a request of an earlier transaction that arrives late acts on whatever transaction is open
then. Measured on Apache Kafka 4.3.1 with librdkafka 2.16 (tests/queuestore/kafka/test_kafka_wire_faults.py): an EndTxn
held in the network past `socket.timeout.ms` is retried by librdkafka, the retry commits and
`commit_transaction()` reports success; when the held request arrives it commits the next transaction half
way (its first records visible to read_committed readers, the rest refused, its side records never
written). So whenever the transaction coordinator's connection failed or one of its requests timed out
while a transaction was open (librdkafka's log says so on the coordinator's connection, `CoordinatorWatch`),
the owner replaces its producer after the commit (`settled`): the new producer's `init_transactions()`
bumps the epoch and every late request of the old one is fenced. A commit that failed (its outcome
unknown) replaces the producer the same way before the owner stops with `CommitOutcomeUnknownError`
(`reset`): the log is final when the owner recovers from it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from queuestore.exceptions import (
    BrokerUnavailableError,
    CommitOutcomeUnknownError,
    QueueStoreError,
    WriterFencedError,
    WriterResetError,
)
from queuestore.kafka.config import STORE_LOG
from queuestore.kafka.errors import _FENCED_CODES, _NO_ANSWER_CODES, _error_code, _lost_client_error

__all__ = ["CoordinatorWatch", "InDoubtError", "TransactionalProducer"]

log = logging.getLogger(__name__)

# librdkafka's log facilities that say a request may be lost in transit: its connection failed (FAIL) or it
# timed out in flight (REQTMOUT). On the transaction coordinator's connection (librdkafka's logical broker
# "TxnCoordinator"), either one means a transactional request (AddPartitionsToTxn, EndTxn) may still
# reach the broker later, in this producer's epoch.
_TRANSIT_FACILITIES = frozenset({"FAIL", "REQTMOUT"})
_COORDINATOR = "TxnCoordinator"


class CoordinatorWatch:
    """The `logger` of one transactional producer: forwards every line to `forward` (the store's librdkafka
    logger) and counts the ones that say a request to the transaction coordinator was lost in transit.
    librdkafka retries such requests by itself (an EndTxn too) and reports nothing else to the application
    when a retry succeeds, so its log is the only place that tells. Lines are queued (`log.queue`) and
    served by the producer's poll and flush, in the thread that owns the producer."""

    __slots__ = ("forward", "incidents")

    def __init__(self, forward: Any = STORE_LOG) -> None:
        self.incidents = 0
        self.forward = forward

    def log(self, level: int, fmt: str, *args: object) -> None:
        # confluent-kafka calls log(level, "%s [%s] %s", facility, client name, text).
        if len(args) == 3 and args[0] in _TRANSIT_FACILITIES and _COORDINATOR in str(args[2]):
            self.incidents += 1
        self.forward.log(level, fmt, *args)


class InDoubtError(QueueStoreError):
    """A commit that failed with its outcome unknown, before the owner fenced its producer (`reset`)."""


class TransactionalProducer:
    """The producer of one `transactional.id`, initialised (module docstring: it fenced every earlier one).

    `config` gives the producer's config (`ClientSettings.transactional_producer`); `where` names what it
    writes in messages (`topic[partition]`, or a Spark sink task). The producer itself is `producer`, used
    by one thread at a time; `begin`, `commit`, `settled` and `reset` keep the in-doubt rule, `failure`
    says what a Kafka error stands for in one line.
    """

    def __init__(
        self,
        config: Callable[[], dict[str, Any]],
        *,
        transactional_id: str,
        where: str,
        bootstrap_servers: str,
        timeout: float,
        fence_later: bool = False,
    ) -> None:
        """`fence_later`: return at once and fence in the background (see below); the owner calls
        `await_fence` before it trusts that no earlier writer can still add to the log."""
        self._config = config
        self.transactional_id = transactional_id
        self.where = where
        self.bootstrap_servers = bootstrap_servers
        self.timeout = timeout
        self.renewals = 0  # producers replaced after a transaction in doubt (module docstring)
        self._incidents_at_begin = 0  # the watch's count when the open transaction began
        self.producer: Producer | None
        self._fencing: threading.Thread | None = None  # the background init of `fence_later`
        self._fence_failure: QueueStoreError | None = None
        if not fence_later:
            self.producer, self.watch = self._open("take over")
            return
        # The fence (init_transactions) goes on in the background: after a writer died mid-transaction
        # the coordinator answers the first InitProducerId with CONCURRENT_TRANSACTIONS while it aborts
        # that transaction, and librdkafka asks again only 500 ms later (a fixed interval), so the fence
        # takes ~0.5 s that a restart can spend reading its log. Nothing is produced before it is done:
        # `begin` (every append's transaction) and `live` wait for it (`await_fence`).
        self.producer, self.watch = self._new("take over")
        self._fencing = threading.Thread(target=self._fence_in_background, name=f"fence {where}", daemon=True)
        self._fencing.start()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.where}, transactional.id={self.transactional_id!r})"

    def _open(self, purpose: str) -> tuple[Producer, CoordinatorWatch]:
        """A producer with the transactional.id, initialised: it fenced every earlier one."""
        producer, watch = self._new(purpose)
        self._init(producer, purpose)
        return producer, watch

    def _new(self, purpose: str) -> tuple[Producer, CoordinatorWatch]:
        """A producer with the transactional.id, not initialised yet."""
        conf = self._config()
        watch = CoordinatorWatch(conf.get("logger", STORE_LOG))
        conf["logger"] = watch
        return Producer(conf), watch

    def _init(self, producer: Producer, purpose: str) -> None:
        """`init_transactions`: fences every earlier producer of the id (module docstring)."""
        try:
            producer.init_transactions(self.timeout)
        except KafkaException as exc:
            if _error_code(exc) in _NO_ANSWER_CODES:
                raise BrokerUnavailableError(
                    self.bootstrap_servers,
                    f"{purpose} {self.where} as transactional.id {self.transactional_id!r}",
                    self.timeout,
                ) from None
            raise QueueStoreError(
                f"cannot {purpose} {self.where} as transactional.id {self.transactional_id!r}: "
                f"{exc.args[0].str() if exc.args and isinstance(exc.args[0], KafkaError) else exc}"
            ) from None

    def _fence_in_background(self) -> None:
        assert self.producer is not None
        try:
            self._init(self.producer, "take over")
        except QueueStoreError as exc:
            self._fence_failure = exc

    @property
    def fence_pending(self) -> bool:
        """Whether a `fence_later` fence has not been awaited yet."""
        return self._fencing is not None

    def await_fence(self) -> None:
        """Wait for the background fence of `fence_later` (at once otherwise, or once it was awaited): from
        its return no earlier producer of the id can add to the log. Raises what the fence failed with
        (the producer is then unusable: the owner closes it)."""
        fencing = self._fencing
        if fencing is None:
            if self._fence_failure is not None:
                raise self._fence_failure
            return
        fencing.join()
        self._fencing = None
        if self._fence_failure is not None:
            raise self._fence_failure

    def live(self) -> Producer:
        """The producer; StoreClosedError-free by design: callers check for a closed owner first."""
        self.await_fence()
        if self.producer is None:
            raise QueueStoreError(f"the producer of {self.where} is closed")
        return self.producer

    def renew(self) -> None:
        """Replace the producer (owned by the calling thread) by a new one in a new epoch, so that no request
        of a transaction in doubt can act on a later one (module docstring). The old one is dropped without
        waiting: anything it still sends is fenced. Raises QueueStoreError if the new one cannot be
        initialised: the owner must then stop (the old producer stays only to be closed: its epoch is not
        safe to go on in)."""
        old = self.producer
        if old is not None:
            with contextlib.suppress(KafkaException, SystemError):
                old.purge(in_queue=True, in_flight=True, blocking=False)
                old.poll(0)
        self.producer, self.watch = self._open("fence the previous producer of")
        self.renewals += 1
        log.info("%s: producer replaced (epoch bumped) after a transaction in doubt", self.where)

    def begin(self) -> None:
        """Begin a transaction (KafkaException as librdkafka raises it) and note the watch's count; the
        first waits for a `fence_later` fence."""
        self.live().begin_transaction()
        self._incidents_at_begin = self.watch.incidents

    @property
    def in_doubt(self) -> bool:
        """Whether a request of the open (or just committed) transaction may still be in transit."""
        return self.watch.incidents != self._incidents_at_begin

    def commit(self) -> None:
        """Commit the open transaction, its records delivered (KafkaException as librdkafka raises it)."""
        self.live().commit_transaction(self.timeout)

    def settled(self) -> None:
        """After a successful commit: replace the producer if its transaction was in doubt at some moment
        (the coordinator's connection failed or a request on it timed out since the transaction began)."""
        with contextlib.suppress(KafkaException, SystemError):
            self.live().poll(0)  # serve the log lines queued during the commit
        if self.in_doubt:
            self.renew()

    def failure(self, err: KafkaError | None, what: str) -> QueueStoreError:
        """The error a failed delivery, commit or transactional call stands for; a fenced producer gets its
        own, one line."""
        if err is not None and err.code() == KafkaError._FATAL and self.producer is not None:
            # "Local: Fatal error" says only that the producer failed earlier: the cause is its fatal
            # error (fenced, most often), which a transactional call reports (`_lost_client_error`).
            cause = _lost_client_error(self.producer).args[0]
            if isinstance(cause, KafkaError) and cause.code() != KafkaError._FATAL:
                err = cause
        if err is not None and err.code() in _FENCED_CODES:
            return WriterFencedError(
                f"fenced: another writer took over {self.where} (transactional.id "
                f"{self.transactional_id!r}); this writer stopped and wrote nothing further"
            )
        if err is not None and err.code() in _NO_ANSWER_CODES:
            return BrokerUnavailableError(self.bootstrap_servers, f"{what} {self.where}", self.timeout)
        detail = err.str() if err is not None else "unknown error"
        return QueueStoreError(f"{what} {self.where} failed: {detail}")

    def commit_failure(self, err: KafkaError | None) -> QueueStoreError:
        """The failure a failed `commit_transaction()` stands for: fenced (the newer writer's epoch must
        stand), or in doubt (`reset` then fences the own producer before the owner reports it)."""
        failure = self.failure(err, "commit of")
        if isinstance(failure, WriterFencedError):
            return failure
        detail = err.str() if err is not None else "unknown error"
        return InDoubtError(f"commit of {self.where} failed ({detail}): its outcome is unknown")

    def reset(self, failure: QueueStoreError) -> QueueStoreError:
        """`failure` after fencing the own producer (module docstring): a failed producer, or a commit in
        doubt, may still have requests on their way; once a new producer's init_transactions() bumped the
        epoch none of them can land, and the log is final for the owner to recover from."""
        if self.producer is None:
            return failure
        try:
            self.renew()
        except BrokerUnavailableError as exc:
            # No new producer while the broker does not answer: the run stops with that one line (and the
            # rerun's writer fences the old producer); the failure it followed is in the log at info.
            log.info("%s: %s", self.where, failure)
            return exc
        except QueueStoreError as exc:
            return QueueStoreError(f"{failure}; and {exc}")
        kind = CommitOutcomeUnknownError if isinstance(failure, InDoubtError) else WriterResetError
        return kind(
            f"{failure}; the producer was replaced (a new epoch: nothing of the old one can land any more); "
            "recover from the log"
        )
