"""The writer of one output partition: appends in transactions cut at `poll()`/`flush()`, durable-completion
callbacks once committed, a pipelined commit, fail-stop (see `KafkaPartitionWriter` and the package
docstring). Its producer and the rule for transactions in doubt are `queuestore.kafka.producer`'s.
One job, the writer's transaction cycle (append, commit, reap, fail-stop, trim): long, not split."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from queuestore.base import DurableCallback, PartitionWriter, RecordMeta
from queuestore.exceptions import (
    BrokerUnavailableError,
    PartitionLockedError,
    QueueStoreError,
    RecordTooLargeError,
    StoreClosedError,
    WriterFencedError,
    WriterResetError,
)
from queuestore.kafka.config import transactional_id
from queuestore.kafka.errors import _PURGED_CODES, _error_code, _kafka_error, _lost_client_error
from queuestore.kafka.framing import _offset, encode_message
from queuestore.kafka.lock import PartitionLock
from queuestore.kafka.producer import TransactionalProducer

if TYPE_CHECKING:
    from queuestore.kafka.store import KafkaQueueStore

__all__ = ["KafkaPartitionWriter"]

log = logging.getLogger(__name__)


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
    writer has fenced its own producer (`queuestore.kafka.producer`: no transaction in doubt goes on in the same
    epoch; `renewals` counts the producers replaced so).
    """

    def __init__(
        self, store: KafkaQueueStore, topic: str, partition: int, *, fence_later: bool = False
    ) -> None:
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
        self._lock = PartitionLock(store.state_dir / "locks" / f"{topic}.{partition}.lock")
        try:
            # Before the producer: its init_transactions() fences the partition's current writer.
            lease = store._lease(topic, partition)
            if lease is not None:
                lease.acquire()  # PartitionLockedError while another live writer holds it
            self._txn = TransactionalProducer(
                lambda: store._producer_config(topic, partition),
                transactional_id=self.transactional_id,
                where=f"{topic}[{partition}]",
                bootstrap_servers=store.bootstrap_servers,
                timeout=self._timeout,
                fence_later=fence_later,
            )
        except PartitionLockedError:
            self._lock.release()  # the lease stays joined: this process is next (`KafkaQueueStore._lease`)
            raise
        except BaseException:
            self._lock.release()
            store._release_lease(topic, partition)
            raise
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
        # The pipelined commit (`queuestore.kafka` docstring): the committer thread, what it left (flush's undelivered count,
        # the commit's error) and the appends that wait, in order, for the next transaction.
        self._committer: threading.Thread | None = None
        self._commit_remaining = 0
        self._commit_error: KafkaException | None = None
        self._waiting: list[tuple[bytes, RecordMeta, DurableCallback | None]] = []
        # Bound once: most appends have no callback and must not pay for a closure each.
        self._plain_report = self._make_report(None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(topic={self.topic!r}, partition={self.partition})"

    @property
    def _producer(self) -> Producer | None:
        return self._txn.producer

    @_producer.setter
    def _producer(self, producer: Producer | None) -> None:
        self._txn.producer = producer

    @property
    def renewals(self) -> int:
        """Producers replaced after a transaction in doubt (`queuestore.kafka.producer`)."""
        return self._txn.renewals

    def _reset(self, failure: QueueStoreError) -> QueueStoreError:
        return self._txn.reset(failure)

    def _failed(self, err: KafkaError | None, what: str) -> QueueStoreError:
        return self._txn.failure(err, what)

    @property
    def outstanding(self) -> int:
        return self._appended - self._served

    @property
    def failure(self) -> Exception | None:
        """The first delivery or commit failure, after which appends are refused."""
        return self._failure

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

    def await_fence(self) -> None:
        self._txn.await_fence()

    def _live_producer(self) -> Producer:
        producer = self._txn.producer  # per append: one attribute, not the property
        if producer is None:
            raise StoreClosedError(f"writer of {self.topic}[{self.partition}] is closed")
        return producer

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
        self._delivered_or_raise(producer, flush_timeout, lambda: f"{self.outstanding:,} appends to")
        if self._side:
            self._produce_side(producer, flush_timeout)
        try:
            self._commit_transaction(producer)
        except KafkaException as exc:
            raise self._stop(self._txn.commit_failure(_kafka_error(exc))) from None
        self._in_transaction = False
        self.commits += 1
        try:
            self._txn.settled()
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
                    self._txn.commit_failure(err) if self._commit_sent else self._failed(err, "commit of")
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
        if self._txn.in_doubt:
            try:
                self._txn.renew()
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
            self._txn.begin()
        except KafkaException as exc:
            raise self._stop(self._failed(_kafka_error(exc), "transaction on")) from None
        self._in_transaction = True
        self._transaction_started = self._clock()
        self._transaction_records = 0

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
        self._delivered_or_raise(producer, flush_timeout, lambda: "side records of")

    def _delivered_or_raise(
        self, producer: Producer, flush_timeout: float | None, what: Callable[[], str]
    ) -> None:
        """Deliver what the producer holds (`_deliver`); raise if some of it (`what()` of this partition,
        said after the delivery) is not delivered, or if a delivery failed."""
        remaining, waited = self._deliver(producer, flush_timeout)
        if remaining > 0:
            # Stopped, as a pipelined commit that cannot deliver stops it (`_reap`): otherwise `close()`
            # waited its own timeout again for the same broker (60 s more on a run's way out) and then
            # warned about the records the run's one error line already covers.
            raise self._stop(
                BrokerUnavailableError(
                    self._store.bootstrap_servers,
                    f"{what()} {self.topic}[{self.partition}] not delivered",
                    waited,
                ),
                reset=False,
            )
        if self._failure is not None:
            raise self._stop(self._failure)

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery reports; start committing the open transaction when it is due (pipelined, see
        the `queuestore.kafka` docstring) and settle a commit that is through. Raises the writer's
        failure (fail-stop), `WriterFencedError` when another writer took over."""
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
        if self._txn.fence_pending:
            try:
                self._txn.await_fence()  # the producer is the fence's until it is through
            except QueueStoreError as exc:
                self._failure = self._failure or exc  # an unfenced producer commits nothing: purged
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
            self._store._release_lease(self.topic, self.partition)
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
