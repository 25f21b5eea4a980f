"""Trimming on the attached query: `cec_aggregate(..., trim_every=N)`, the engine's rule
(`operators.engine.trimming`) applied by the driver (`operators.spark.trim`), on a real broker and real
local Spark, over two input partitions and two output partitions.

A downstream consumer (the test's own, registered with `QueueStore.acknowledge` before the first run, as a
downstream `cec run` registers itself) reads the results as they are written and acknowledges what it
read. Three runs: the first is SIGKILLed mid-write (its consumer has acknowledged nothing yet, so nothing
may be trimmed); the consumer catches up; the second is SIGKILLed mid-write after it trimmed (up to what
the consumer acknowledged, never past it); the third runs to the end. What the consumer read over the
three runs is exactly the failure-free results, each window once, and the logs' starts advanced.

Trimming on the executors under kills inside a trim, in recovery and in a write task's commit is
test_attach_trim_executors.py's (a file of its own, so that CI's `--dist loadfile` can run it on another
worker).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cec.exceptions import ConfigError
from cec.records import AvroCodec, Kind, RecordCodec
from operators.aggregate import RESULT_SCHEMA
from operators.engine.trimming import DEFAULT_TRIM_EVERY
from operators.spark.attach import RESULT_COLUMNS, cec_aggregate
from queuestore.kafka import KafkaQueueStore
from tests.brokers import Broker
from tests.helpers.attached import run_to_end
from tests.operators.spark.test_attach import (
    Purchases,
    _args,
    _killed_driver,
    purchases,  # noqa: F401 - the module's fixture
    write_purchases,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CONSUMER = "downstream-test"
TRIM_EVERY = 40


class Downstream:
    """A consumer of every output partition: reads from where it stands to the end, keeps the results, and
    acknowledges the offset after what it read."""

    def __init__(self, store: KafkaQueueStore, topic: str, partitions: int) -> None:
        self.store = store
        self.topic = topic
        self.positions = [0] * partitions
        self.results: dict[tuple[str, int], tuple[Any, ...]] = {}
        self.repeated: list[tuple[str, int]] = []
        self.codec = AvroCodec(RESULT_SCHEMA)
        self.records = RecordCodec()
        for q in range(partitions):
            store.acknowledge(topic, q, CONSUMER, 0)

    def catch_up(self) -> None:
        for q, position in enumerate(self.positions):
            with self.store.reader(self.topic, q) as reader:
                # Never below the log start: trimming must not pass what this consumer acknowledged.
                assert reader.start_offset() <= position
                for record in reader.scan_forward(position):
                    position = record.offset + 1
                    if record.meta.kind != Kind.R.value:
                        continue
                    payload = self.records.decode(record.value, record.meta).payload
                    assert payload is not None
                    row = self.codec.decode(payload)
                    window = (str(row["key"]), int(row["window"]))
                    if window in self.results:
                        self.repeated.append(window)
                    self.results[window] = tuple(row[c] for c in RESULT_COLUMNS)
            self.positions[q] = position
            self.store.acknowledge(self.topic, q, CONSUMER, position)

    def per_key(self) -> dict[str, list[tuple[Any, ...]]]:
        out: dict[str, list[tuple[Any, ...]]] = {}
        for (key, _), row in sorted(self.results.items()):
            out.setdefault(key, []).append(row)
        return out


def _starts(store: KafkaQueueStore, topic: str) -> list[int]:
    starts = []
    for q in range(store.partitions(topic)):
        with store.reader(topic, q) as reader:
            starts.append(reader.start_offset())
    return starts


def test_trimmed_logs_recover_exactly_after_driver_sigkills_and_keep_unread_records(
    spark: SparkSession,
    purchases: Purchases,  # noqa: F811
    tmp_path: Path,
) -> None:
    output = f"avg-trim-{uuid.uuid4().hex[:8]}"
    store = KafkaQueueStore(purchases.bootstrap, tmp_path / "downstream")
    try:
        store.create_topic(output, 2)  # generation 0, so that the consumer registers before any record
        downstream = Downstream(store, output, 2)
        # From the logs: the trimmed logs are what the restarts read back.
        args = _args(
            purchases, tmp_path, output, partitions=2, trim_every=TRIM_EVERY, resume_checkpoint=False
        )

        _killed_driver(args, tmp_path / "first", hit=3)
        assert _starts(store, output) == [0, 0]  # nothing read downstream yet: nothing trimmed
        downstream.catch_up()
        read_first = list(downstream.positions)
        assert all(read_first)

        _killed_driver(args, tmp_path / "second", hit=3)
        after_second = _starts(store, output)
        assert all(after_second), after_second  # it trimmed before it was killed ...
        assert all(s <= r for s, r in zip(after_second, read_first, strict=True))  # ... never past the reads
        downstream.catch_up()

        query = run_to_end(spark, args)
        assert query.recovery.resumed and query.recovery.ec_windows > 0
        assert query.cec_progress["trimmed_offsets"] > 0
        downstream.catch_up()
        final = _starts(store, output)
        assert all(f >= s for f, s in zip(final, after_second, strict=True)) and final != after_second
    finally:
        store.close()
    assert downstream.repeated == []
    assert downstream.per_key() == purchases.truth


def test_trim_every_is_refused_below_zero(
    spark: SparkSession,
    purchases: Purchases,  # noqa: F811
    tmp_path: Path,
) -> None:
    for bad in (-1, -3, 2.5, True):
        with pytest.raises(ConfigError, match="trim_every"):
            cec_aggregate(spark, **_args(purchases, tmp_path, "never-made", trim_every=bad))


def test_trimming_is_on_by_default_and_trim_every_zero_turns_it_off(
    spark: SparkSession,
    spark_kafka_broker: Broker,
    tmp_path: Path,
) -> None:
    """Without `trim_every` the query trims every DEFAULT_TRIM_EVERY records (its results stream from the
    log as it runs, as a `cec run --follow`'s do); `trim_every=0` never trims. Count windows of 2 give
    about one record per tuple: 25,000 tuples are 2.5 trim intervals of one output partition."""
    count = int(2.5 * DEFAULT_TRIM_EVERY)
    source = write_purchases(
        spark_kafka_broker.bootstrap, tmp_path / "input", partitions=1, seed=17, count=count
    )
    store = KafkaQueueStore(source.bootstrap, tmp_path / "observer")
    try:
        for every, trims in ((None, True), (0, False)):
            output = f"avg-default-{uuid.uuid4().hex[:8]}"
            extra: dict[str, Any] = {} if every is None else {"trim_every": every}
            args = _args(source, tmp_path / output, output, partitions=1, window_count=2,
                         max_records_per_trigger=DEFAULT_TRIM_EVERY // 2, **extra)  # fmt: skip
            query = run_to_end(spark, args)
            assert sum(query.cec_progress["records"].values()) >= 2 * DEFAULT_TRIM_EVERY
            [start] = _starts(store, output)
            assert (query.cec_progress["trimmed_offsets"] > 0) is trims
            assert (start >= DEFAULT_TRIM_EVERY) is trims, start
    finally:
        store.close()
