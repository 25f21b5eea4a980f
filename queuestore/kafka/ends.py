"""The one end-of-partition finder: the end of a partition is the offset of a `PARTITION_EOF` event that a
consumer reaches by consuming, never a broker's watermark or time lookup (some Kafka-protocol brokers get
those wrong: Tansu 0.6 understates `get_watermark_offsets` and answers 0 to every `offsets_for_times`,
DESIGN-NOTES section 4). Used by the queue store's readers (`KafkaPartitionReader.end_offset`), by
`operators.topic_source.resolve_bounds` and, through them, by the Spark data sources.

The rule, for each partition, from a start offset the caller believes is at or below the end (a hint):
- an EOF event at or above the start is the end;
- an offset-out-of-range answer (Apache Kafka's to a fetch past the end, or below a log start that
  trimming or retention moved) restarts the partition from its log start, asked of the broker again each
  time: the broker says where to read from, and a read from the log start always ends at an EOF;
- silence where a start past the end is possible (Tansu answers such fetches with no answer at all
  instead of out-of-range): after `suspicion_after` seconds the broker's watermark is asked (never the
  client's cached one, which may be left from an earlier assignment); a start above it restarts the
  partition from its log start. This only ever lowers a start: no end comes from a watermark, and a
  false suspicion (a slow broker, an understated watermark) costs a longer read, never a wrong end;
- the only deadline is `stall_timeout` without any event from the broker, which is a broker that does
  not answer (the callers' request timeout), not a guess at how fast this machine reads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from queuestore.kafka.errors import _BEYOND_END_CODES, _UNKNOWN_CODES

__all__ = ["find_ends"]

log = logging.getLogger(__name__)

_POLL_S = 0.1
_DRAIN = 10_000


def find_ends(
    consumer: Consumer,
    topic: str,
    partitions: Sequence[int],
    starts: Sequence[int],
    *,
    log_start: Callable[[int], int],
    stall_timeout: float,
    on_stall: Callable[[list[int]], Exception],
    on_unknown: Callable[[int, KafkaError], Exception],
    suspicion_after: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
) -> list[int]:
    """The end of each of `partitions` of `topic`, consuming with `consumer` (read_committed, partition EOF
    events on, `auto.offset.reset=error`) from `starts` (see the module docstring). `log_start(p)` asks the
    broker for partition p's log start; `on_stall(waiting)` and `on_unknown(p, err)` make the caller's
    errors. The consumer is left unassigned."""
    froms = {p: max(0, int(s)) for p, s in zip(partitions, starts, strict=True)}
    ends: dict[int, int] = {}
    # Partitions whose start is their log start: their read cannot lie past the end.
    grounded: set[int] = set()
    consumer.assign([TopicPartition(topic, p, froms[p]) for p in partitions])
    last_event = silent_since = clock()
    try:
        while len(ends) < len(froms):
            first = consumer.poll(_POLL_S)
            now = clock()
            if first is None:
                if now - last_event >= stall_timeout:
                    raise on_stall(sorted(set(froms) - set(ends)))
                if now - silent_since >= suspicion_after:
                    silent_since = now
                    for p in sorted(set(froms) - set(ends) - grounded):
                        if _past_end(consumer, topic, p, froms[p], stall_timeout):
                            _restart(consumer, topic, p, froms, grounded, log_start)
                continue
            last_event = silent_since = now
            for msg in (first, *consumer.consume(_DRAIN, 0)):
                err = msg.error()
                if err is None:
                    continue
                part = msg.partition()
                if part is None or part not in froms or part in ends:
                    continue
                p = part
                code = err.code()
                if code == KafkaError._PARTITION_EOF:
                    offset = msg.offset()
                    if offset is not None and offset >= froms[p]:
                        ends[p] = offset
                        consumer.incremental_unassign([TopicPartition(topic, p)])
                elif code in _BEYOND_END_CODES:
                    _restart(consumer, topic, p, froms, grounded, log_start)
                elif code in _UNKNOWN_CODES:
                    raise on_unknown(p, err)
                else:  # transport hiccups and the like: librdkafka asks again by itself
                    log.debug("finding the end of %s[%s]: %s", topic, p, err.str())
    finally:
        consumer.unassign()
    return [ends[p] for p in partitions]


def _restart(
    consumer: Consumer,
    topic: str,
    p: int,
    froms: dict[int, int],
    grounded: set[int],
    log_start: Callable[[int], int],
) -> None:
    """Read partition p again from its log start, as the broker says it is now."""
    low = log_start(p)
    log.debug("%s[%d]: no end at or above offset %d; reading from the log start %d", topic, p, froms[p], low)
    froms[p] = low
    grounded.add(p)
    consumer.incremental_unassign([TopicPartition(topic, p)])
    consumer.incremental_assign([TopicPartition(topic, p, low)])


def _past_end(consumer: Consumer, topic: str, p: int, start: int, timeout: float) -> bool:
    """Whether the broker's high watermark (asked now, not cached) lies below `start`: a suspicion only
    (module docstring). No answer is no evidence."""
    try:
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
    except KafkaException:
        return False
    return 0 <= high < start
