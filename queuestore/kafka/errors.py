"""Kafka's error codes as cec reads them: which answers mean "beyond the end", "no answer", "fenced",
"asked again resolves it", and the one-line errors they become."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException, Producer

from queuestore.exceptions import BrokerUnavailableError, QueueStoreError

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


def settles_if_asked_again(exc: KafkaException) -> bool:
    """Whether asking the broker again may answer: a leadership moving, a transient connection or timeout
    error, a topic or partition the client has not learnt yet, or an error the client flags retriable.

    Not `KafkaError.retriable()` alone: an admin call's per-partition answer (ListOffsets meeting
    NOT_LEADER_FOR_PARTITION) comes without the flag (seen on Apache Kafka 4.3.1 on a loaded machine)."""
    err = _kafka_error(exc)
    if err is None:
        return False
    code = err.code()
    return (
        code in _LEADER_MOVING_CODES or code in _TRANSIENT_CODES or code in _UNKNOWN_CODES or err.retriable()
    )


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


def _error_code(exc: KafkaException) -> int | None:
    err = exc.args[0] if exc.args else None
    return err.code() if isinstance(err, KafkaError) else None


def _kafka_error(exc: KafkaException) -> KafkaError | None:
    """The KafkaError an exception carries, if any."""
    return exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
