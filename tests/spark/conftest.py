"""Fixtures of the Spark tests: one SparkSession (`local[2,3]`) for the whole session.

pyspark is in the `spark` extra that `make test` installs: a missing pyspark fails these tests instead of
skipping them, so that a broken install can never pass CI silently. The Kafka broker is the suite's
session-wide `kafka_broker` (tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow  # noqa: F401 - the Python Data Source API needs it: fail here, clearly, if it is missing
import pyspark  # noqa: F401
import pytest

from tests.brokers import Broker

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SPARK_MASTER = "local[2,3]"  # 2 task slots, 3 attempts per task


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from operators.spark.datasource import register
    from operators.spark.session import local_session

    session = local_session(SPARK_MASTER, app_name="cec-tests", shuffle_partitions=2)
    register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def spark_kafka_broker(kafka_broker: Broker) -> Broker:
    return kafka_broker
