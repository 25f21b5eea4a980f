"""The output side of an attached query's start (`operators.spark.attach.cec_aggregate`): which generation
of the output topic it writes (`operators.spark.generations`; another partition count starts a new one),
the results topic of `results_topic=`, and the generation's partitions opened as `OutputQueue`s (their
same-host writer locks, taken before recovery reads the logs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cec.exceptions import ConfigError
from operators.results_topic import ResultsTopicOutput
from operators.spark.generations import Generation, generation_topic, list_generations
from queuestore.exceptions import TopicMismatchError
from queuestore.output import OutputQueue

if TYPE_CHECKING:
    from queuestore.kafka import KafkaQueueStore

__all__ = ["create_results_topic", "open_outputs", "written_generations"]


def written_generations(
    store: KafkaQueueStore,
    output_topic: str,
    partitions: int | None,
    input_partitions: int,
    *,
    watermarks: bool,
) -> list[Generation]:
    """The output topic's generations, the last one the generation this start writes: `partitions` (default:
    the latest generation's, else the input's) other than the latest generation's creates a new one.
    With `watermarks` (`allowed_lateness`), a change of partitions, now or earlier, is one ConfigError."""
    generations = list_generations(store, output_topic)
    wanted = partitions or (generations[-1].partitions if generations else input_partitions)
    if watermarks and (len(generations) > 1 or (generations and generations[-1].partitions != wanted)):
        raise ConfigError(
            "allowed_lateness cannot resume after a change of partitions (each state partition's "
            "watermark is its own); restart with the latest partition count, or without allowed_lateness"
        )
    if not generations or generations[-1].partitions != wanted:
        topic = generation_topic(output_topic, len(generations))
        store.create_topic(topic, wanted)
        generations.append(Generation(len(generations), topic, wanted))
    return generations


def create_results_topic(store: KafkaQueueStore, topic: str, partitions: int) -> None:
    """The results topic, with a partition per output partition (results of output partition q go to its
    partition q), as `cec run --results-topic` makes it; one ConfigError for an existing one with another
    partition count (a restart with another `partitions` needs a new results topic)."""
    try:
        store.create_topic(topic, partitions)
    except TopicMismatchError as exc:
        raise ConfigError(
            f"results_topic {topic!r}: {exc}; results of output partition q go to its partition q (use a "
            "results topic with the output's partition count, or a new one)"
        ) from None


def open_outputs(
    store: KafkaQueueStore,
    gen: Generation,
    results: tuple[str, dict[str, Any]] | None = None,
    *,
    defer_index: bool = False,
) -> list[OutputQueue]:
    """The current generation's output partitions (their writer locks); with `results` (results topic,
    result schema), ones that publish each result there too, as `cec run --results-topic` does (the
    driver's writers, `writers="driver"`). `defer_index`: each partition's stream index only notes the
    log's end instead of indexing the records past it (`queuestore.output.OutputQueue`,
    `defer_index_above=0`): the executors' write tasks never index what they append, so a start reads
    every record the last run wrote, which only a recovery from the logs needs (`start_recovery` then
    catches the indexes up); a start that resumes the Spark checkpoint never reads them."""
    outputs: list[OutputQueue] = []
    defer_above = 0 if defer_index else None
    try:
        for q in range(gen.partitions):
            if results is None:
                outputs.append(OutputQueue(store, gen.topic, q, defer_index_above=defer_above))
            else:
                outputs.append(
                    ResultsTopicOutput(
                        store,
                        gen.topic,
                        q,
                        results_topic=results[0],
                        result_schema=results[1],
                        defer_index_above=defer_above,
                    )
                )
    except BaseException:
        for out in outputs:
            out.close()
        raise
    return outputs
