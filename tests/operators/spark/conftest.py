"""Fixtures of the Spark tests: one SparkSession (`local[2,3]`) for the whole session.

pyspark is in the `spark` extra that `make test` installs: a missing pyspark fails these tests instead of
skipping them, so that a broken install can never pass CI silently. The Kafka broker is the suite's
session-wide `kafka_broker` (tests/conftest.py).

`spark_cluster` (module scope: only the module that asks for it pays for it) is a Spark standalone master
plus two workers on 127.0.0.1 (tests/operators/spark/cluster.py), stopped by pid at the end of the module, with a
check that none of its processes outlived it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow  # noqa: F401 - the Python Data Source API needs it: fail here, clearly, if it is missing
import pyspark  # noqa: F401
import pytest

from tests.brokers import Broker
from tests.operators.spark.cluster import ClusterError, SparkCluster, start_cluster

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from operators.spark.reader_pool import ReaderPool

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


@pytest.fixture
def reader_pool() -> Iterator[ReaderPool]:
    """This process's pool of kept Kafka readers (`operators.spark.reader_pool.READERS`), emptied after the
    test: a reader kept past the broker's shutdown would only log connection failures at exit."""
    from operators.spark.reader_pool import READERS

    try:
        yield READERS
    finally:
        READERS.close()


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """Master + two workers (1 core, 1200m each, separate work dirs), every worker registered."""
    root: Path = tmp_path_factory.mktemp("spark-cluster")
    try:
        cluster = start_cluster(root, workers=2, cores=1, memory="1200m")
    except ClusterError as exc:
        # A fail, not a skip: CI must not go green without running the cluster tests.
        pytest.fail(str(exc), pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()
        left = cluster.leftovers()
        assert not left, f"processes of the Spark cluster outlived it: {left}"
