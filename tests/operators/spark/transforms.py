"""Named `transform=` functions for driver scripts that take `cec_aggregate`'s arguments as JSON
(tests/operators/spark/attach_driver.py: `"transform": "<name>"`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# The filter and the derived column of `filter_derive`, shared with the tests' pandas truth.
MIN_PRICE = 20.0
SCALE = 1000.0


def filter_derive(df: DataFrame) -> DataFrame:
    """Purchases of at least MIN_PRICE, with the price in thousands (`price_k`)."""
    from pyspark.sql import functions as F

    return df.where(F.col("price") >= MIN_PRICE).withColumn("price_k", F.col("price") / SCALE)


TRANSFORMS: dict[str, Callable[[DataFrame], DataFrame]] = {"filter_derive": filter_derive}
