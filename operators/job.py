"""A job: one operator instance with its input, output queue and checkpoint policy, as typed data.

The names every host and the CLI import, from the modules that hold them: the job as data
(`operators.job_spec.JobSpec`), what its specs build (`operators.job_builders`) and running it
(`operators.job_runner.run_job`).
"""

from __future__ import annotations

from operators.job_builders import (
    aggregate_operator,
    build_operator,
    build_source,
    instance_spec,
    job_source_spec,
    pin_source,
    purchase_filter,
    source_partitions,
)
from operators.job_runner import INDEX_DEFER_ABOVE, check_input, open_output, run_job
from operators.job_spec import JobSpec
from operators.specs import INPUT_PARTITIONS, SCHEMAS

__all__ = [
    "INDEX_DEFER_ABOVE",
    "INPUT_PARTITIONS",
    "SCHEMAS",
    "JobSpec",
    "aggregate_operator",
    "build_operator",
    "build_source",
    "check_input",
    "instance_spec",
    "job_source_spec",
    "open_output",
    "pin_source",
    "purchase_filter",
    "run_job",
    "source_partitions",
]
