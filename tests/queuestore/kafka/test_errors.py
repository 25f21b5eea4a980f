"""How cec reads Kafka's error codes: which answers are asked again."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from queuestore.kafka.errors import settles_if_asked_again


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._TRANSPORT,
        KafkaError.REQUEST_TIMED_OUT,
    ],
)
def test_a_moving_leader_or_a_lost_connection_is_asked_again_without_the_retriable_flag(code: int) -> None:
    """An admin call's per-partition answer comes without the client's retriable flag (a ListOffsets
    meeting NOT_LEADER_FOR_PARTITION failed a CI run on Apache Kafka 4.3.1 when only the flag was read)."""
    err = KafkaError(code, retriable=False)
    assert not err.retriable()
    assert settles_if_asked_again(KafkaException(err))


@pytest.mark.parametrize(
    "code", [KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.INVALID_REQUEST, KafkaError._FENCED]
)
def test_an_answer_asking_again_cannot_change_is_not_asked_again(code: int) -> None:
    assert not settles_if_asked_again(KafkaException(KafkaError(code)))


def test_the_clients_retriable_flag_is_honoured_and_an_exception_without_an_error_is_not() -> None:
    assert settles_if_asked_again(KafkaException(KafkaError(KafkaError.NOT_COORDINATOR, retriable=True)))
    assert not settles_if_asked_again(KafkaException("no KafkaError inside"))
