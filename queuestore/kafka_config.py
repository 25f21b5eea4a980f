"""librdkafka properties for every Kafka client cec makes in this process and its worker processes, from a
file named by the environment variable `CEC_KAFKA_CONFIG` (what `cec ... --kafka-config FILE` sets):
security settings (`security.protocol`, `sasl.*`, `ssl.*`), timeouts, anything librdkafka accepts.

The file is read where clients are made, never copied into job specs, logs or topics: it may hold
credentials. Its format is Kafka's client properties file (what Kafka's own tools take with
`--command-config`): one `key=value` (or `key: value`) a line; blank lines and lines starting with `#` or
`!` are comments. Settings given in code (`KafkaQueueStore(config=...)`) win over the file's, and the
settings the store's guarantees depend on are forced over both.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from cec.exceptions import ConfigError

__all__ = ["ENV", "LIBRDKAFKA_LOGGERS", "environment_config", "quiet_librdkafka", "read_properties"]

ENV = "CEC_KAFKA_CONFIG"

_cache: dict[tuple[str, int], dict[str, str]] = {}


def read_properties(path: str | Path) -> dict[str, str]:
    """The properties of a client properties file; ConfigError (one line) if it cannot be read or a line
    is not `key=value`."""
    where = Path(path)
    try:
        text = where.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the Kafka client properties {where}: {exc}") from None
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if cut < 0:
            raise ConfigError(f"{where}:{number}: not a key=value line: {line[:60]!r}")
        key, value = line[:cut].strip(), line[cut + 1 :].strip()
        if not key:
            raise ConfigError(f"{where}:{number}: no key before '{line[cut]}'")
        out[key] = value
    return out


def environment_config() -> dict[str, str]:
    """The properties of the file `CEC_KAFKA_CONFIG` names ({} when unset), read again when it changes."""
    path = os.environ.get(ENV, "").strip()
    if not path:
        return {}
    try:
        stamp = Path(path).stat().st_mtime_ns
    except OSError as exc:
        raise ConfigError(f"{ENV}={path}: cannot read the Kafka client properties: {exc}") from None
    key = (path, stamp)
    found = _cache.get(key)
    if found is None:
        found = read_properties(path)
        _cache.clear()
        _cache[key] = found
    return dict(found)


# The loggers librdkafka's own lines go to (every client cec makes logs through one of them).
LIBRDKAFKA_LOGGERS = ("queuestore.kafka.librdkafka", "operators.topic_source.librdkafka")


def quiet_librdkafka(level: int) -> None:
    """A command's logging at `level`: librdkafka's lines only from INFO (--log-level info). It warns
    about settings cec makes on purpose (the experimental gapless guarantee) and reports every lost
    connection, retried request and failed producer on its own; cec reports the failures that matter as
    its own one-line errors, with their cause."""
    for name in LIBRDKAFKA_LOGGERS:
        logging.getLogger(name).setLevel(level if level <= logging.INFO else logging.CRITICAL + 10)
