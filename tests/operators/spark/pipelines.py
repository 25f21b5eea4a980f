"""The pipelines the Spark tests run (shared with `driver_script.py`, which runs in its own process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cec.config import Checkpointing
from operators.job import JobSpec, instance_spec, run_job

__all__ = ["AGGREGATED", "FILTERED", "filter_aggregate", "run_reference"]

FILTERED = "filtered"
AGGREGATED = "aggregated"


def filter_aggregate(store: dict[str, Any], *, count: int, keys: int, partitions: int = 2) -> list[JobSpec]:
    """generator -> filter (price > 0) -> count-window average per item, P partitions end to end.

    Every 7th-ish price is 0 (`bad_every`), so the filter really drops tuples; small Q/U targets make the
    aggregate write G-checks, so recovery meets all footprint kinds.
    """
    common: dict[str, Any] = {
        "store": store,
        "output_partitions": partitions,
        "batch_size": 256,
    }
    return [
        JobSpec(
            operator={"type": "filter", "field": "item_price", "op": ">", "value": 0, "schema": "purchase"},
            source={
                "type": "generator",
                "count": count,
                "keys": keys,
                "seed": 7,
                "partitions": partitions,
                "bad_every": 7,
            },
            output_topic=FILTERED,
            **common,
        ),
        JobSpec(
            operator={
                "type": "aggregate",
                "key_field": "item_id",
                "value_field": "item_price",
                "agg": "avg",
                "window_count": 5,
            },
            source={"type": "queue", "topic": FILTERED, "schema": "purchase"},
            output_topic=AGGREGATED,
            checkpointing=Checkpointing(q_target=200, u_target=400, ci_ms=2.0, cp_ms=10.0),
            **common,
        ),
    ]


def run_reference(pipeline: list[JobSpec]) -> None:
    """The failure-free run, in this process and without Spark: stage by stage, partition by partition."""
    for template in pipeline:
        for p in range(template.output_partitions):
            stats = run_job(instance_spec(template, p))
            assert stats.completed, (template.output_topic, p)


if __name__ == "__main__":  # timing aid: python -m tests.operators.spark.pipelines ROOT COUNT
    import sys
    import time

    started = time.perf_counter()
    run_reference(
        filter_aggregate({"type": "sqlite", "root": str(Path(sys.argv[1]))}, count=int(sys.argv[2]), keys=200)
    )
    print(f"{time.perf_counter() - started:.2f}s")
