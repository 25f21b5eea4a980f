"""Trimming on the executors (the attached query's default writers) under driver SIGKILLs, on a real broker
and real local Spark, over three input and three output partitions (`cec_aggregate(..., trim_every=N)`;
the driver-side runs and the defaults are test_attach_trim.py's, whose helpers this module uses).

A reader registered through `read_results(consumer=...)` reads between the runs; the driver's process
group is SIGKILLed inside a trim (`DeleteRecords` answered, the driver told nothing), during a recovery,
inside a write task's commit of a transaction that carries a trim bound's closed-window directory, and
right after such a commit, before its `DeleteRecords`. What the reader got equals the failure-free
results (the input's plain-Python truth, `Purchases.truth`, which test_attach.py holds to a failure-free
run and to Spark's own aggregation), each window once, and no log is ever trimmed past the reader.
"""

from __future__ import annotations

import shutil
import signal
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cec.inspection import inspect_topic
from operators.spark.attach import read_results
from operators.spark.resume import FROM_LOGS, RESUMED
from queuestore.kafka import KafkaQueueStore
from tests.brokers import Broker
from tests.helpers.attached import run_to_end
from tests.killpoints import PLAN_AFTER_EC_BUILD, WRITER_BEFORE_TRIM, WRITER_IN_COMMIT, WRITER_IN_TRIM
from tests.operators.spark.test_attach import (
    Purchases,
    _args,
    _driver_child,
    _killed_driver,
    _per_key,
    write_purchases,
)
from tests.operators.spark.test_attach_trim import TRIM_EVERY, _starts

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="module")
def purchases3(spark_kafka_broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Purchases:
    """The purchases of `test_attach` over three input partitions."""
    state_dir = tmp_path_factory.mktemp("attach-trim-input")
    return write_purchases(spark_kafka_broker.bootstrap, state_dir, partitions=3, seed=13, invalid_every=37)


def _read(spark: SparkSession, source: Purchases, output: str, consumer: str) -> list[Any]:
    return read_results(spark, output, source.bootstrap, consumer=consumer).collect()


def test_executor_trims_stay_exact_through_driver_sigkills_in_a_trim_and_in_recovery(
    spark: SparkSession,
    purchases3: Purchases,
    tmp_path: Path,
) -> None:
    """Trimming on the executors (the default writers), three input and three output partitions, a
    reader registered through `read_results(consumer=...)` that reads between the runs:
    1. the driver is SIGKILLed mid-batch; its reader has acknowledged nothing, so nothing is trimmed;
    2. the reader reads (and, by reading again, acknowledges) what run 1 wrote; the driver is SIGKILLed by a
       write task right after its first trim (`DeleteRecords` answered, the driver told nothing): the logs
       were trimmed, never past what the reader acknowledged (the records it has not read are kept);
    3. the driver is SIGKILLed during the next start's recovery (its planning task), its `state_dir` then
       deleted: the closed-window directory of the trimmed part comes from Kafka;
    4. a run to the end.
    What the reader got over all its reads equals the failure-free results, each window exactly once.
    """
    output = f"avg-etrim-{uuid.uuid4().hex[:8]}"
    reader = "trim-reader"
    store = KafkaQueueStore(purchases3.bootstrap, tmp_path / "observer")
    got: list[Any] = []
    try:
        store.create_topic(output, 3)  # generation 0, so that the reader registers before any record
        assert _read(spark, purchases3, output, reader) == []  # registered at offset 0 everywhere
        # From the logs: the third start is killed in its recovery planning, which a resumed one skips.
        args = _args(
            purchases3, tmp_path, output, partitions=3, trim_every=TRIM_EVERY, resume_checkpoint=False
        )

        _killed_driver(args, tmp_path / "first", hit=2)
        assert _starts(store, output) == [0, 0, 0]  # nothing acknowledged: nothing trimmed
        got += _read(spark, purchases3, output, reader)
        got += _read(spark, purchases3, output, reader)  # acknowledges what the first read returned
        acked = [store.acknowledged(output, q)[reader] for q in range(3)]
        assert any(acked)

        _driver_child(args, tmp_path / "second", f"{WRITER_IN_TRIM}:1", expect=-signal.SIGKILL)
        trimmed = _starts(store, output)
        assert any(trimmed), trimmed  # a write task trimmed before the driver was killed ...
        assert all(s <= a for s, a in zip(trimmed, acked, strict=True))  # ... never past the reader

        _driver_child(args, tmp_path / "third", f"{PLAN_AFTER_EC_BUILD}:1", expect=-signal.SIGKILL)
        shutil.rmtree(tmp_path / "state")  # the closed-window directory of the trimmed part: in Kafka only

        query = run_to_end(spark, args)
        assert query.recovery.resumed
        got += _read(spark, purchases3, output, reader)
        got += _read(spark, purchases3, output, reader)
        assert all(f >= t for f, t in zip(_starts(store, output), trimmed, strict=True))
    finally:
        store.close()
    windows = Counter((r["key"], r["window"]) for r in got)
    assert windows and max(windows.values()) == 1, [w for w, n in windows.items() if n > 1][:5]
    assert _per_key(got) == purchases3.truth


@pytest.mark.parametrize("resume", [True, False], ids=["resumed", "from-logs"])
def test_executor_trims_stay_exact_and_bounded_through_sigkills_in_the_write_tasks_commit(
    spark: SparkSession,
    purchases3: Purchases,
    tmp_path: Path,
    resume: bool,
) -> None:
    """Trimming on the executors, three input and three output partitions, a registered reader reading
    between the runs (`read_results(consumer=...)`), on Apache Kafka:
    1. the driver is SIGKILLed mid-batch (so that the reader has something to acknowledge);
    2. it is SIGKILLed by a write task inside the commit of the first transaction that carries a trim
       bound's closed-window directory: the records sent and delivered, `commit_transaction` not called
       (the restart's writer aborts the open transaction: that batch's records and directory never were);
    3. it is SIGKILLed by a write task right after a commit that made a bound's directory durable, before
       its `DeleteRecords`: the bound is never applied in that run;
    4. a run to the end.
    What the reader got equals the failure-free results, each window exactly once; no log was ever
    trimmed past the reader; and the retained bound holds after the restarts: the last run trimmed every
    partition at least up to min(the reader's acknowledgement, the extent's start before that run), so no
    bound a kill left unapplied keeps records, and what a partition keeps is the extent plus what the last
    run wrote since. Each restart resumes Spark's checkpoint (the default) or recovers from the logs.
    """
    small = {"max_records_per_trigger": 600}  # about 7 micro-batches: every run takes a bound or more

    output = f"avg-ctrim-{uuid.uuid4().hex[:8]}"
    reader = "commit-kill-reader"
    store = KafkaQueueStore(purchases3.bootstrap, tmp_path / "observer")
    got: list[Any] = []

    def read_all() -> list[int]:
        """Read everything written (twice: the second call acknowledges what the first returned); the
        reader's acknowledged offsets, each never below its log's start."""
        got.extend(_read(spark, purchases3, output, reader))
        got.extend(_read(spark, purchases3, output, reader))
        acked = [store.acknowledged(output, q)[reader] for q in range(3)]
        assert all(s <= a for s, a in zip(_starts(store, output), acked, strict=True))
        return acked

    try:
        store.create_topic(output, 3)  # generation 0, so that the reader registers before any record
        assert _read(spark, purchases3, output, reader) == []
        args = _args(
            purchases3,
            tmp_path,
            output,
            partitions=3,
            trim_every=TRIM_EVERY,
            resume_checkpoint=resume,
            **small,
        )

        _killed_driver(args, tmp_path / "first", hit=2)
        acked = read_all()
        assert any(acked)

        _driver_child(args, tmp_path / "in-commit", f"{WRITER_IN_COMMIT}:1", expect=-signal.SIGKILL)
        acked = read_all()

        _driver_child(args, tmp_path / "before-trim", f"{WRITER_BEFORE_TRIM}:1", expect=-signal.SIGKILL)
        acked = read_all()
        extents = [s.checkpoint.extent_start for s in inspect_topic(store, output, shared=True)]
        before = _starts(store, output)

        query = run_to_end(spark, args)
        assert query.recovery.resumed and query.cec_progress["trimmed_offsets"] > 0
        recovery = query.cec_progress["recovery"]
        assert recovery["path"] == (RESUMED if resume else FROM_LOGS), recovery
        final = _starts(store, output)
        for q in range(3):
            assert final[q] <= acked[q], (q, final, acked)  # never past the reader ...
            # ... and at least to where the reader and the extent before the last run allowed: no bound
            # left unapplied by the kills holds records back.
            assert final[q] >= min(acked[q], extents[q]), (q, final, acked, extents, before)
        read_all()
    finally:
        store.close()
    windows = Counter((r["key"], r["window"]) for r in got)
    assert windows and max(windows.values()) == 1, [w for w, n in windows.items() if n > 1][:5]
    assert _per_key(got) == purchases3.truth
