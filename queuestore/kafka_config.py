"""The Kafka client properties file of `CEC_KAFKA_CONFIG`: now `queuestore.kafka.config` (re-exported here,
where `cec` and `operators` have always imported it from)."""

from queuestore.kafka.config import (
    ENV,
    LIBRDKAFKA_LOGGERS,
    environment_config,
    quiet_librdkafka,
    read_properties,
)

__all__ = ["ENV", "LIBRDKAFKA_LOGGERS", "environment_config", "quiet_librdkafka", "read_properties"]
