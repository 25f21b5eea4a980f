"""`format("cec-topic")` in every SparkSession, whatever the import and session order (see
`pyspark_cec_kafka`)."""

from operators.spark.topic_reader import CecTopicDataSource as DefaultSource

__all__ = ["DefaultSource"]
