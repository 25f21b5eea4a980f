"""The end-of-partition finder (queuestore.kafka.ends) when the log start moves under it: the broker's
out-of-range answer sends the read back to the log start, asked again, so the finder never gives "no end"
(the flake "could not find the end of out-…[2]") and never a wrong end."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from operators.topic_bounds import resolve_bounds
from queuestore.base import RecordMeta
from queuestore.kafka import KafkaQueueStore
from queuestore.kafka import config as kafka_config
from queuestore.kafka.config import ClientSettings
from tests.brokers import Broker
from tests.chaos.harness import CHAOS_MIX
from tests.faultproxy import API_KEYS, Chaos, Fault, FaultPlan, FaultProxy, Rule
from tests.helpers import child_env, wait_for
from tests.topic_data import create_topic, produce

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


# -- a client that re-bootstraps under wire faults ------------------------------------------------------------
def test_clients_do_not_rebootstrap_unless_the_user_says_so() -> None:
    """Every client cec makes keeps to the brokers it knows when all of them are down (queuestore.kafka.config:
    librdkafka 2.16's re-bootstrap left a consumer that never answered its next unassign); a user's
    setting wins, as with any default. (A librdkafka before 2.10 has no such property: nothing is set.)"""
    if not kafka_config._REBOOTSTRAPS:
        assert "metadata.recovery.strategy" not in ClientSettings("127.0.0.1:1").client("c")
        return
    plain = ClientSettings("127.0.0.1:1")
    for conf in (
        plain.client("c"),
        plain.consumer("c"),
        plain.consumer("c", group_id="g", read_committed=False),
        plain.lease_consumer("c", "g", 5.0),
    ):
        assert conf["metadata.recovery.strategy"] == "none"
    user = ClientSettings("127.0.0.1:1", {"metadata.recovery.strategy": "rebootstrap"})
    assert user.consumer("c")["metadata.recovery.strategy"] == "rebootstrap"


# Seeded chaos plans; seed 10 hung soak_ends.py's rounds twice out of two with re-bootstrap on (a Fetch's
# answer lost with its connection, then a ListOffsets' connection cut): it comes back four times.
SEEDS = [*range(12), 10, 10, 10, 10]
# One round in a process of its own: librdkafka's assign and unassign hold the GIL while they wait, so a
# round that hangs there freezes its whole process (a thread's deadline would never fire).
_ROUND = """
import json, sys
from operators.exceptions import TopicSourceError
from operators.topic_bounds import resolve_bounds
try:
    b = resolve_bounds(sys.argv[1], sys.argv[2])
    print(json.dumps({"starts": list(b.starts), "ends": list(b.ends)}))
except TopicSourceError as exc:
    print(json.dumps({"error": str(exc)}))
"""


def test_the_ends_of_an_input_are_found_under_wire_faults_without_hanging(
    fault_proxy: FaultProxy, proxied_broker: Broker
) -> None:
    """`resolve_bounds` (a topic input's ends, the first thing `cec run --input-topic` asks) through the fault
    proxy under seeded chaos (delays, lost answers, cut connections): every round returns the true ends or fails
    with the source's one-line error, within its deadline. With librdkafka's re-bootstrap on, a round hung
    for good in find_ends' unassign (2 of 47 rounds of benchmarks/soak_ends.py)."""
    topic = f"ends-chaos-{uuid.uuid4().hex[:8]}"
    create_topic(proxied_broker.bootstrap, topic, 4)
    produce(proxied_broker.bootstrap, topic, [(i % 4, b"k%d" % (i % 97), b"{}") for i in range(20_000)])
    truth = resolve_bounds(proxied_broker.bootstrap, topic)
    for seed in SEEDS:
        fault_proxy.reset()
        fault_proxy.plan = FaultPlan(Chaos(0.3, mix=CHAOS_MIX, delay_s=(0.01, 1.5)), seed=seed)
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _ROUND, fault_proxy.address, topic],
                env=child_env(),
                capture_output=True,
                text=True,
                timeout=DEADLINE,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"round {seed} hung for {DEADLINE:.0f} s: {fault_proxy.describe()}", pytrace=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outcome = json.loads(proc.stdout.splitlines()[-1])
        if "error" in outcome:
            assert "\n" not in outcome["error"], outcome
        else:
            assert (tuple(outcome["starts"]), tuple(outcome["ends"])) == (truth.starts, truth.ends), seed
