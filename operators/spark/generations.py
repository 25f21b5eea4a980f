"""Output topic generations of an attached aggregation (`operators.spark.attach`).

A restart with another partition count P' cannot reuse the output topic: Kafka topics cannot lose
partitions and keys must move. So P' writes a new generation: topic `<output>.g<g>` with P' partitions
(generation 0 is `<output>` itself). Old logs stay the record of what was output; `read_results` unions
all generations. Windows are not copied: a window carried over keeps its footprint in the old log, which
recovery still reads, and N of a log counts only windows whose latest footprint is in that log, so each
log's EC scan stays self-contained. (Copying the EC into the new logs was rejected: a copied footprint
must keep its pos_w, and as the last record of a new log that pos would be read as the crash point of keys
that came from other old partitions.) Restarting with the latest P continues the latest generation. A
generation whose topic exists but is empty (crash right after creating it) is harmless: its crash points
are zero vectors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from queuestore.kafka import KafkaQueueStore

__all__ = ["Generation", "generation_topic", "list_generations"]


@dataclass(frozen=True)
class Generation:
    """One output topic generation: all output partitions written with one partition count."""

    index: int
    topic: str
    partitions: int


def generation_topic(output_topic: str, index: int) -> str:
    """Generation 0 is the output topic itself, so a query that never changes P has exactly one topic."""
    return output_topic if index == 0 else f"{output_topic}.g{index}"


def list_generations(store: KafkaQueueStore, output_topic: str) -> list[Generation]:
    """The existing generations, oldest first (numbered without gaps from 0)."""
    out: list[Generation] = []
    while store.topic_exists(topic := generation_topic(output_topic, len(out))):
        out.append(Generation(len(out), topic, store.partitions(topic)))
    return out
