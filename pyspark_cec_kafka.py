"""`format("cec-kafka")` in every SparkSession, whatever the import and session order: Spark registers each
Python data source it finds in a top-level module named `pyspark_*` that has a `DefaultSource` (looked up
once per JVM, when a session first resolves a Python data source). `cec.spark.register(spark)` does the
same explicitly, for Python paths that lookup does not see (an editable install's modules)."""

from operators.spark.datasource import CecKafkaDataSource as DefaultSource

__all__ = ["DefaultSource"]
