"""The end-of-partition finder (queuestore.kafka.ends) when the log start moves under it: the broker's
out-of-range answer sends the read back to the log start, asked again, so the finder never gives "no end"
(the flake "could not find the end of out-…[2]") and never a wrong end."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest

from queuestore.base import RecordMeta
from queuestore.kafka import KafkaQueueStore
from tests.brokers import Broker
from tests.faultproxy import API_KEYS, Fault, FaultPlan, FaultProxy, Rule
from tests.helpers import wait_for

pytestmark = pytest.mark.kafka_transactions

FETCH = frozenset({API_KEYS["Fetch"]})
DEADLINE = 60.0


def _append(store: KafkaQueueStore, topic: str, first: int, count: int) -> None:
    with store.writer(topic, 0) as writer:
        for i in range(first, first + count):
            writer.append(b"rec-%d" % i, RecordMeta("R", i, f"k{i}", 0))
        writer.flush(DEADLINE)


def test_the_end_is_found_while_trimming_moves_the_log_start(
    fault_proxy: FaultProxy, proxied_broker: Broker, tmp_path: Path
) -> None:
    """A reader looks for the end from the log start while the writer trims: the finder's first fetch is
    held by the proxy until the log start has moved above the offset it asks for (on a loaded machine, a
    trim that lands between the finder's log-start lookup and its fetch). The broker answers that fetch
    with OFFSET_OUT_OF_RANGE; the finder used to take that for "past the end" and fail with "could not find
    the end". It must read again from the new log start and give the true end."""
    topic = f"out-{uuid.uuid4().hex[:10]}"
    store = KafkaQueueStore(fault_proxy.address, tmp_path / "state", request_timeout=20)
    try:
        store.create_topic(topic, 1)
        _append(store, topic, 0, 30)
        with store.reader(topic, 0) as fresh:
            true_end = fresh.end_offset()
        found: list[int | BaseException] = []
        fault_proxy.plan = FaultPlan(Rule(Fault.HOLD, apis=FETCH, client="cec-bulk-", nth=1))
        with store.reader(topic, 0) as reader:

            def find() -> None:
                try:
                    found.append(reader.end_offset())
                except BaseException as exc:  # reported by the assertion below
                    found.append(exc)

            finder = threading.Thread(target=find)
            finder.start()
            wait_for(lambda: fault_proxy.by_fault().get("hold", 0) > 0, timeout=DEADLINE)
            with store.writer(topic, 0) as writer:
                assert writer.trim(20) == 20  # above the offset the held fetch asks for
            assert fault_proxy.release() == 1
            finder.join(DEADLINE)
        assert found == [true_end]
    finally:
        store.close()
