"""How an attached query's start recovers (`operators.spark.attach.cec_aggregate`): the resumed Spark
checkpoint's plan or a plan read from the output logs, as `operators.spark.resume.decide` chooses, then
checked against this start's settings (each log's event-time marks, the results' columns) before the
query is built on it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cec.exceptions import ConfigError
from operators.spark.generations import Generation
from operators.spark.planning import AttachRecovery, plan_recovery
from operators.spark.results import bind_result_schema
from operators.spark.resume import Decision, decide

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from queuestore.kafka import KafkaQueueStore
    from queuestore.output import OutputQueue

__all__ = ["check_watermarks", "start_recovery"]


def start_recovery(
    spark: SparkSession,
    store: KafkaQueueStore,
    generations: list[Generation],
    outputs: Sequence[OutputQueue],
    *,
    location: Path,
    resume_checkpoint: bool,
    writers: str,
    input_topic: str,
    input_partitions: int,
    fingerprint: str,
    timers: bool,
    client: Mapping[str, str],
    watermarks: bool,
    result_schema: Mapping[str, Any] | None,
) -> tuple[Decision, AttachRecovery]:
    """The start's decision (`decide`) and its recovery: the resumed run's, else planned from the logs (with
    the decision's reason). With `watermarks`, every log must carry this input's event-time marks;
    `result_schema` is recorded with the current generation (`bind_result_schema`). A refusal releases the
    recovery (its cached initial state) before it is raised."""
    decision = decide(
        location,
        store=store,
        generations=generations,
        outputs=outputs,
        input_topic=input_topic,
        input_partitions=input_partitions,
        fingerprint=fingerprint,
        timers=timers,
        resume_checkpoint=resume_checkpoint,
        writers=writers,
    )
    if decision.recovery is not None:
        recovery = decision.recovery
    else:
        for out in outputs:  # opened with a deferred index by a start that may resume (`open_outputs`)
            out.catch_up_index()
        recovery = plan_recovery(spark, store, generations, outputs, input_partitions, client=client)
        recovery.reason = decision.reason
    try:
        if watermarks:
            check_watermarks(recovery, input_partitions)
        # Several aggregates' results have their own columns: recorded with the topic for read_results,
        # and a log written with other columns is refused.
        bind_result_schema(store, generations, result_schema, resumed=recovery.resumed)
    except BaseException:
        recovery.release()
        raise
    return decision, recovery


def check_watermarks(recovery: AttachRecovery, input_partitions: int) -> None:
    """Watermarks resume from each log's crash record (`recovery.contract`, "watermarks"): a log written
    without event-time marks over this input is refused, with one ConfigError."""
    for q, end in enumerate(recovery.ends):
        if not any(end.pos) or len(end.marks) == input_partitions:
            continue  # an empty log, or one written with watermarks over this input
        raise ConfigError(
            f"{recovery.current.topic}[{q}]: the log's crash record carries event-time marks for "
            f"{len(end.marks)} input partitions, the input has {input_partitions} (was it written with "
            "another allowed_lateness setting?)"
        )
