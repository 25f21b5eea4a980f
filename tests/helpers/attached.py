"""Running an attached query (`cec_aggregate`) to the end of its bounded input in the test's process."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from operators.spark.attach import CecAggregateQuery, cec_aggregate

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["run_to_end"]


def run_to_end(spark: SparkSession, args: dict[str, Any], *, timeout_s: int = 600) -> CecAggregateQuery:
    """`cec_aggregate(spark, available_now=True, **args)` run until it ends (Trigger.AvailableNow); it must
    end within `timeout_s` (a bound for a hung query on a loaded machine, not a measurement) and without an
    exception."""
    query = cec_aggregate(spark, available_now=True, **args)
    assert query.awaitTermination(timeout_s) is True, "the query did not finish"
    assert query.exception() is None, query.exception()
    return query
