"""Spark's Kafka connector (`spark-sql-kafka-0-10`): where its jars are, and whether a session has it.

PySpark from PyPI ships no Kafka connector. `make spark-kafka-jars` resolves it from Maven Central
(tools/spark-kafka/pom.xml, at the pinned PySpark's version) into `.cache/spark-kafka/<version>/libs` of the
source tree; `CEC_SPARK_KAFKA_JARS` names another folder of those jars. `local_session` puts them on the
classpath (`spark.jars`) when they are there, so that `readStream.format("kafka")` works with nothing
downloaded when the session starts (no `spark.jars.packages`: what runs is what the build file resolved).
A session made elsewhere has the connector if its application was started with it (`--jars`,
`--packages`, `spark.jars`): `has_kafka_connector` asks the session's JVM.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["JARS_ENV", "KAFKA_PROVIDER_CLASS", "connector_jars", "has_kafka_connector", "jars_conf"]

JARS_ENV = "CEC_SPARK_KAFKA_JARS"
# The class behind format("kafka"): present on the classpath exactly when the connector is.
KAFKA_PROVIDER_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
_ROOT = Path(__file__).resolve().parents[2]  # the source tree (an editable install, the tests, CI)


def _default_dir() -> Path:
    import pyspark

    return _ROOT / ".cache" / "spark-kafka" / pyspark.__version__ / "libs"


def connector_jars() -> list[Path]:
    """The connector's jars: from `CEC_SPARK_KAFKA_JARS` if set, else the source tree's cache for the
    installed PySpark's version if `make spark-kafka-jars` completed there (its `.complete` stamp); [] when
    there are none."""
    given = os.environ.get(JARS_ENV)
    if given:
        folder = Path(given)
    else:
        folder = _default_dir()
        if not (folder / ".complete").exists():
            return []
    return sorted(folder.glob("*.jar"))


def jars_conf(existing: str | None = None) -> dict[str, str]:
    """`spark.jars` with the connector's jars added to `existing` (a comma-separated list); {} without
    jars."""
    jars = [str(p) for p in connector_jars()]
    if not jars:
        return {}
    listed = [j for j in (existing or "").split(",") if j.strip()]
    return {"spark.jars": ",".join([*listed, *(j for j in jars if j not in listed)])}


def has_kafka_connector(spark: SparkSession) -> bool:
    """Can this session's JVM load Spark's Kafka source (classic sessions; a Spark Connect session is
    asked nothing and answers False)?"""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return False
    try:
        jvm.org.apache.spark.util.Utils.classForName(KAFKA_PROVIDER_CLASS, True, False)
    except Exception:  # py4j's error for ClassNotFoundException: not on the classpath
        return False
    return True
