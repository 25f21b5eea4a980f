"""EC reconstruction from a Kafka log of many small transactions and many G-checks per window.

An operator's log is what recovery reads, and its shape is not a benchmark's: the writer commits every
100 ms and lingers 5 ms, so its batches hold 30-100 records, and with a recovery target most records are
G-checks of windows already checkpointed. Tansu answers a fetch with the batches it gathers within the
consumer's fetch.wait.max.ms; with a 2 ms wait a loaded machine got one batch per round trip and the EC
build of an 86k-record extent took 44-68 s (benchmarks/RESULTS.md, "Side by side with Quix Streams").
These tests count what the build reads and how many fetch answers that took: counts, not times.
"""

from __future__ import annotations

import logging
import re
import uuid
from pathlib import Path

from cec.records import Kind, OutputRecord, RecordCodec
from queuestore.kafka import KafkaQueueStore
from recovery.eventual import EventualCheckpointBuilder
from tests.brokers import Broker

KEYS = 200
ROUNDS = 30  # G-check rounds over every window but the oldest: ~6,000 G-checks for 200 windows
TRANSACTION = 20  # records per transaction: 300 small transactions, each at least one producer batch


class _FetchAnswers(logging.Handler):
    """Counts the fetch answers that carried records, from librdkafka's "fetch" debug lines."""

    _ENQUEUE = re.compile(r"Enqueue (\d+) message\(s\)")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.answers = 0
        self.messages = 0

    def emit(self, record: logging.LogRecord) -> None:
        found = self._ENQUEUE.search(record.getMessage())
        if found and int(found.group(1)) > 0:
            self.answers += 1
            self.messages += int(found.group(1))


def _write_g_check_heavy_log(store: KafkaQueueStore, topic: str) -> tuple[dict[str, int], int]:
    """KEYS windows opened, then ROUNDS G-checks of every window except key 0's, whose G-open stays its
    latest footprint: the extent is the whole log. Returns each key's latest footprint offset and the
    number of records written."""
    codec = RecordCodec()
    latest: dict[str, int] = {}
    written = 0

    def append(kind: Kind, key: str, n: int) -> None:
        nonlocal written
        written += 1
        record = OutputRecord(kind, written, (written,), n, key, 0, b"state-" + key.encode())

        def durable(offset: int, err: object, key: str = key) -> None:
            assert err is None
            latest[key] = offset

        writer.append(codec.encode(record), record.meta(), durable)
        writer.poll()  # commits once the transaction holds TRANSACTION records

    with store.writer(topic, 0) as writer:
        for i in range(KEYS):
            append(Kind.GOPEN, f"k{i}", i + 1)
        for _ in range(ROUNDS):
            for i in range(1, KEYS):
                append(Kind.GCHECK, f"k{i}", KEYS)
        writer.flush()
    return latest, written


def test_ec_build_of_a_log_of_small_transactions_reads_the_extent_in_few_fetches(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    # The commit cadence by count alone (an hour is never reached): every transaction is TRANSACTION
    # records, so the log holds at least written / TRANSACTION batches whatever the machine's speed.
    writing = KafkaQueueStore(
        kafka_broker.bootstrap, tmp_path / "writer", commit_interval=3600.0, commit_records=TRANSACTION
    )
    topic = f"ec-small-batches-{uuid.uuid4().hex[:8]}"
    try:
        writing.create_topic(topic, 1)
        latest, written = _write_g_check_heavy_log(writing, topic)
    finally:
        writing.close()
    batches = written // TRANSACTION
    assert batches >= 300

    answers = _FetchAnswers()
    rdkafka = logging.getLogger(f"test-rdkafka-{uuid.uuid4().hex[:8]}")
    rdkafka.setLevel(logging.DEBUG)
    rdkafka.addHandler(answers)
    rdkafka.propagate = False
    # Debug lines straight from librdkafka's threads (no log queue): none is lost before a poll serves it.
    reading = KafkaQueueStore(
        kafka_broker.bootstrap,
        tmp_path / "reader",
        config={"debug": "fetch", "logger": rdkafka, "log.queue": False},
    )
    try:
        with reading.reader(topic, 0) as reader:
            ec = EventualCheckpointBuilder(reader).build()
    finally:
        reading.close()

    # The EC itself: every window, each at its latest footprint; key 0's G-open makes the extent the log.
    assert ec.n == KEYS and len(ec.windows) == KEYS
    assert {key: fp.offset for key, fp in ec.windows.items()} == latest
    assert ec.extent_start == latest["k0"] == 0
    # The scan reads the extent and nothing beyond it, however many G-checks each window has there.
    assert ec.records_read == written
    assert ec.records_read <= ec.extent_size
    # Round trips: a fetch answer brings many of the log's batches, not one. The build reads the log
    # twice (its end, found by consuming to EOF from offset 0 on a fresh reader; then the scan back), so
    # 2 x 308 batches: measured 2-5 answers with the 10 ms wait at load ~18, and 21-31 with the former
    # 2 ms wait at the same load (one batch per answer on a loaded machine). The bound is 16 batches per
    # answer on average, counted over one pass.
    assert answers.messages >= written
    assert answers.answers <= batches // 16, (
        f"{answers.answers} fetch answers for {batches} batches ({answers.messages} messages)"
    )
