"""Long-running CEC operator tasks on Spark (DESIGN-NOTES section 5, first design).

A pipeline is a list of stages; each stage is a `JobSpec` template with P = `output_partitions` instances.
Instance p of a stage reads input partition p and writes output partition p of the stage's topic, so keys
stay where the upstream put them (one input partition per key keeps each key's order deterministic, which
exact recovery needs). All stages of a pipeline have the same P.

Each instance is a long-running Spark task that holds its windows in memory and writes every output tuple
to its own log. When the task's Python worker dies, Spark relaunches the task and the new attempt recovers
from that log (eventual checkpoint, replay from T); when the driver dies, running the pipeline again
resumes every instance from its log the same way, and instances that had finished (their log ends with
EOS) return at once.

Two ways to map instances to tasks:
- `chained` (default): one Spark job of P tasks; task p runs instance p of every stage, each in its own
  thread, the downstream one tailing its upstream's output queue (persisted before it is forwarded, as CEC
  requires). Holds P task slots. A crash kills the whole chain of partition p, and each stage of that
  chain recovers from its own log.
- `per-stage`: one Spark job per stage, all submitted at once. Holds the sum of the stages' P slots, which
  is checked up front: with fewer slots a downstream task could occupy a slot its upstream needs and wait
  for it forever.

Failure budget: Spark gives each task `task_max_failures(spark)` attempts (`local[N,F]` -> F,
`spark.task.maxFailures` on a cluster). A partition that crashes that many times fails its job; the host
then resubmits the job (up to `max_job_attempts` times), which is safe for the same reason a relaunched
task is: every instance resumes from its log.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from cec.config import Checkpointing
from cec.exceptions import ConfigError
from operators.exceptions import PipelineFailedError, StageFailedError
from operators.job import (
    JobSpec,
    build_operator,
    check_input,
    instance_spec,
    pin_source,
    run_job,
    source_partitions,
)
from operators.runtime import RunStats
from operators.spark.session import check_session, task_max_failures
from queuestore.factory import open_store

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["InstanceReport", "PipelineFailedError", "PipelineResult", "SparkOperatorHost", "pid_file_name"]

log = logging.getLogger(__name__)

Mode = Literal["chained", "per-stage"]


@dataclass(frozen=True)
class InstanceReport:
    """What one instance's final task attempt reported."""

    stage: int
    topic: str
    partition: int
    job_attempt: int  # 1-based submission of the Spark job that ran it
    task_attempt: int  # Spark's attempt number within that job (0 = first)
    pid: int
    stats: dict[str, Any]

    @property
    def resumed(self) -> bool:
        return bool(self.stats.get("resumed"))

    @property
    def completed(self) -> bool:
        return bool(self.stats.get("completed"))


@dataclass
class PipelineResult:
    instances: list[InstanceReport]
    job_attempts: dict[str, int]  # task group ("chain" or "stage<i>") -> submissions it took
    seconds: float
    failures: list[str] = field(default_factory=list)  # one line per failed job submission

    def instance(self, stage: int, partition: int) -> InstanceReport:
        for report in self.instances:
            if report.stage == stage and report.partition == partition:
                return report
        raise KeyError((stage, partition))


def pid_file_name(group: str, job_attempt: int, partition: int, task_attempt: int) -> str:
    """Where a task attempt records its Python worker's pid under `pid_dir` (for operations and tests)."""
    return f"{group}.j{job_attempt}.p{partition}.a{task_attempt}.pid"


def _write_pid(pid_dir: str, name: str) -> None:
    path = Path(pid_dir) / name
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(str(os.getpid()))
    tmp.replace(path)  # atomic: a reader never sees an empty or partial pid


def _run_chain(specs: Sequence[tuple[int, JobSpec]], lock_wait_s: float) -> list[tuple[int, RunStats]]:
    """Run several instances of one partition concurrently, one thread each; any failure stops them all.

    The threads must all be stopped before the task ends: a failed task's Python worker is reused for
    the next attempt, and a leftover thread would keep writing a partition the new attempt recovers.
    """
    if len(specs) == 1:
        stage, spec = specs[0]
        return [(stage, run_job(spec, lock_wait_s=lock_wait_s))]
    stop = threading.Event()
    results: dict[int, RunStats] = {}
    errors: list[tuple[int, BaseException]] = []

    def target(stage: int, spec: JobSpec) -> None:
        try:
            results[stage] = run_job(spec, stop=stop.is_set, lock_wait_s=lock_wait_s)
        except BaseException as exc:  # reported below, in the task's thread, where Spark sees it
            errors.append((stage, exc))
            stop.set()

    threads = [
        threading.Thread(target=target, args=(stage, spec), name=f"cec-{spec.output_topic}.{stage}")
        for stage, spec in specs
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        stage, exc = errors[0]
        partition = specs[0][1].output_partition
        raise StageFailedError(f"stage {stage}, partition {partition} failed: {exc!r}") from exc
    return [(stage, results[stage]) for stage, _ in specs]


def _partition_task(
    specs_json: Sequence[tuple[int, str]],
    group: str,
    job_attempt: int,
    pid_dir: str | None,
    lock_wait_s: float,
    partitions: Iterator[int],
) -> Iterator[str]:
    """The Spark task body: runs on an executor's Python worker (module-level, so it pickles by name)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    task_attempt = ctx.attemptNumber() if ctx is not None else 0
    for p in partitions:
        if pid_dir is not None:
            _write_pid(pid_dir, pid_file_name(group, job_attempt, p, task_attempt))
        specs = [(stage, instance_spec(JobSpec.from_json(text), p)) for stage, text in specs_json]
        topics = {stage: spec.output_topic for stage, spec in specs}
        for stage, stats in _run_chain(specs, lock_wait_s):
            yield json.dumps(
                {
                    "stage": stage,
                    "topic": topics[stage],
                    "partition": p,
                    "job_attempt": job_attempt,
                    "task_attempt": task_attempt,
                    "pid": os.getpid(),
                    "stats": stats.as_dict(),
                }
            )


class SparkOperatorHost:
    """Runs a pipeline of CEC operator stages as long-running Spark tasks until every instance ends.

    `run()` blocks until all instances have reached the end of their input (EOS in every log). It can be
    called again after a driver crash, in a new process: every instance resumes from its log.
    """

    def __init__(
        self,
        spark: SparkSession,
        pipeline: Sequence[JobSpec],
        *,
        mode: Mode = "chained",
        max_job_attempts: int = 3,
        pid_dir: str | os.PathLike[str] | None = None,
        lock_wait_s: float = 30.0,
        checkpointing: Checkpointing | None = None,
    ) -> None:
        """`checkpointing`, when given, replaces every stage's `JobSpec.checkpointing` (stateless stages
        have no windows, so it only acts on the stateful ones)."""
        if not pipeline:
            raise ConfigError("a pipeline needs at least one stage")
        if mode not in ("chained", "per-stage"):
            raise ConfigError(f"unknown mode {mode!r}")
        if max_job_attempts < 1:
            raise ConfigError("max_job_attempts must be >= 1")
        self.spark = spark
        if checkpointing is not None and not isinstance(checkpointing, Checkpointing):
            raise ConfigError(f"checkpointing must be a cec.Checkpointing, got {checkpointing!r}")
        self.pipeline = [
            spec if checkpointing is None else replace(spec, checkpointing=checkpointing) for spec in pipeline
        ]
        self.mode = mode
        self.max_job_attempts = max_job_attempts
        self.pid_dir = None if pid_dir is None else str(pid_dir)
        self.lock_wait_s = lock_wait_s
        self.partitions = self.pipeline[0].output_partitions
        self._check_stages()

    @property
    def task_max_failures(self) -> int:
        """Attempts Spark gives a task within one job (see `operators.spark.session.task_max_failures`)."""
        return task_max_failures(self.spark)

    def _check_stages(self) -> None:
        check_session(
            self.spark,
            embedded_store=any(spec.store.get("type") == "sqlite" for spec in self.pipeline),
            what="SparkOperatorHost",
        )
        topics = [spec.output_topic for spec in self.pipeline]
        if len(set(topics)) != len(topics):
            raise ConfigError(f"stages must write distinct topics, got {topics}")
        for i, spec in enumerate(self.pipeline):
            if spec.output_partitions != self.partitions:
                raise ConfigError(
                    f"stage {i} has {spec.output_partitions} partitions, stage 0 has {self.partitions}: "
                    "instances map partitions one-to-one, so all stages need the same count"
                )
            build_operator(spec.operator)  # configuration errors surface here, not as failed tasks

    def prepare(self) -> None:
        """Create every stage's output topic (P partitions), check that every input has P partitions and
        that no instance's log was built from another input (`operators.job.check_input`).

        Done on the driver before any task starts, so that a downstream instance finds its upstream's topic
        even when it starts first.
        """
        for spec in self.pipeline:
            store = open_store(spec.store)
            try:
                store.create_topic(spec.output_topic, spec.output_partitions)
            finally:
                store.close()
        for i, spec in enumerate(self.pipeline):
            if "input_partitions" in spec.source:
                raise ConfigError(f"stage {i}: the host assigns input partitions; remove input_partitions")
            if spec.source.get("type") == "topic":  # every task attempt must see the same bounds
                spec = self.pipeline[i] = replace(spec, source=pin_source(spec.source))
            store = open_store(spec.store)
            try:
                n = source_partitions(spec.source, store)
            finally:
                store.close()
            if n != self.partitions:
                raise ConfigError(f"stage {i} reads {n} input partitions, the pipeline has {self.partitions}")
        for (
            spec
        ) in self.pipeline:  # a log built from another input fails here once, not in every task attempt
            for p in range(self.partitions):
                check_input(instance_spec(spec, p))

    def _groups(self) -> list[tuple[str, list[int]]]:
        if self.mode == "chained":
            return [("chain", list(range(len(self.pipeline))))]
        return [(f"stage{i}", [i]) for i in range(len(self.pipeline))]

    def _run_group(self, group: str, stages: list[int], result: PipelineResult) -> list[InstanceReport]:
        sc = self.spark.sparkContext
        specs_json = [(i, self.pipeline[i].to_json()) for i in stages]
        for job_attempt in range(1, self.max_job_attempts + 1):
            result.job_attempts[group] = job_attempt
            # Job groups are per thread (PySpark pins Python threads to JVM threads), so each group can be
            # cancelled on its own.
            sc.setJobGroup(f"cec-{group}", f"CEC {group}, submission {job_attempt}", interruptOnCancel=True)
            task = partial(_partition_task, specs_json, group, job_attempt, self.pid_dir, self.lock_wait_s)
            try:
                rows = sc.parallelize(range(self.partitions), self.partitions).mapPartitions(task).collect()
            except Exception as exc:  # Py4JJavaError: the job failed (a task exhausted its attempts)
                line = f"{group} submission {job_attempt}: {str(exc).splitlines()[0][:300]}"
                result.failures.append(line)
                log.warning("CEC pipeline job failed, %s", line)
                if job_attempt == self.max_job_attempts:
                    raise PipelineFailedError(f"{group} failed {job_attempt} times; last: {line}") from exc
                continue
            return [InstanceReport(**json.loads(row)) for row in rows]
        raise AssertionError("unreachable")

    def run(self) -> PipelineResult:
        """Run (or resume) the pipeline until every instance has ended; returns what each reported."""
        started = time.perf_counter()
        self.prepare()
        groups = self._groups()
        if self.mode == "per-stage":
            slots = self.spark.sparkContext.defaultParallelism
            needed = self.partitions * len(self.pipeline)
            if slots < needed:
                raise ConfigError(
                    f"per-stage mode runs {needed} long-running tasks at once but Spark has {slots} slots; "
                    "use mode='chained' or more cores"
                )
        result = PipelineResult([], {}, 0.0)
        sc = self.spark.sparkContext
        with ThreadPoolExecutor(len(groups), thread_name_prefix="cec-host") as pool:
            futures = {pool.submit(self._run_group, group, stages, result): group for group, stages in groups}
            try:
                for future in futures:
                    result.instances.extend(future.result())
            except BaseException:
                # One group failed for good: the others may be waiting on it (a downstream stage tails its
                # upstream), so cancel them rather than hang.
                for group in futures.values():
                    sc.cancelJobGroup(f"cec-{group}")
                raise
        result.instances.sort(key=lambda r: (r.stage, r.partition))
        result.seconds = time.perf_counter() - started
        return result
