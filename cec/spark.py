"""cec for PySpark users: attach CEC to an aggregation over a Kafka topic and read its results.

    from cec.spark import cec_aggregate, read_dead_letters, read_results, register

Importing this module imports neither PySpark nor the Spark host: each name is resolved on first use, so
`import cec.spark` is cheap and works where PySpark is not installed (a name used there raises one
ConfigError line saying what to install). Spark registers the `cec-kafka` and `cec-topic` data sources in
every session by itself (the top-level modules `pyspark_cec_kafka`, `pyspark_cec_topic`), where its lookup
sees them (not an editable install's, outside the repository root); `cec_aggregate`, `read_results` and
`read_dead_letters` register them in the session they are given, and `register(spark)` does it explicitly.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cec.config import Checkpointing
from cec.exceptions import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from operators.spark.attach import (
        RESULT_COLUMNS,
        CecAggregateQuery,
        Generation,
        cec_aggregate,
        list_generations,
        read_results,
    )
    from operators.spark.results import read_dead_letters

__all__ = [
    "RESULT_COLUMNS",
    "CecAggregateQuery",
    "Checkpointing",
    "Generation",
    "cec_aggregate",
    "list_generations",
    "read_dead_letters",
    "read_results",
    "register",
]

# Where each public name lives (the Spark host's modules; their import paths keep working).
_LAZY = {
    "RESULT_COLUMNS": "operators.spark.attach",
    "CecAggregateQuery": "operators.spark.attach",
    "Generation": "operators.spark.attach",
    "cec_aggregate": "operators.spark.attach",
    "list_generations": "operators.spark.attach",
    "read_results": "operators.spark.attach",
    "read_dead_letters": "operators.spark.results",
}


def _host(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing in {"pyspark", "pyarrow", "pandas"}:
            raise ConfigError(
                f"cec.spark needs PySpark ({missing} is not installed): pip install 'cec-stream[spark]' "
                "(and Java 17)"
            ) from None
        raise


def register(spark: SparkSession) -> None:
    """Make `spark.read.format("cec-kafka")` (output logs) and `format("cec-topic")` (an ordinary topic,
    decoded as cec reads it) available in `spark`. Idempotent: a second call registers the same sources
    again, which changes nothing."""
    _host("operators.spark.attach").register_all(spark)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cec.spark' has no attribute {name!r}")
    value = getattr(_host(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
