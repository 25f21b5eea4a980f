"""The cross-host writer lease (`queuestore.kafka.lease`) on Apache Kafka: two stores with their own state
directories stand for two hosts (no flock is shared), so only the lease decides.

- a second writer of the partition is refused while the first holds the lease, and its tries never fence
  the first (which goes on committing); a writer of another partition is not refused;
- after the holder closes, the waiter (a member of the lease's group since its refused try) gets it;
- after the holder's process is SIGKILLed, the waiter gets it once the lease timed out (waited on as a
  condition, bounded by the timeout plus slack; no assertion of speed);
- a lease timeout the broker's group bounds refuse is one error naming them, not a wait.
"""

from __future__ import annotations

import multiprocessing as mp
import uuid
from collections.abc import Iterator
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import pytest

from queuestore.base import RecordMeta
from queuestore.exceptions import PartitionLockedError
from queuestore.kafka import KafkaQueueStore
from queuestore.kafka.lease import LeaseRefusedError
from queuestore.kafka.writer import KafkaPartitionWriter
from tests.brokers import Broker

LEASE_S = 1.0  # the test broker's group.min.session.timeout.ms is 500 ms (tests/brokers.py)
# What the group may take beyond the lease timeout to hand the lease on (a rebalance on a loaded machine).
SLACK_S = 60.0


def _host(broker: Broker, state_dir: Path, lease: float = LEASE_S) -> KafkaQueueStore:
    return KafkaQueueStore(broker.bootstrap, state_dir, lease_timeout=lease, commit_records=1)


@pytest.fixture
def topic(kafka_broker: Broker, tmp_path: Path) -> str:
    name = f"lease-{uuid.uuid4().hex[:12]}"
    admin = KafkaQueueStore(kafka_broker.bootstrap, tmp_path / "admin")
    try:
        admin.create_topic(name, 2)
    finally:
        admin.close()
    return name


@pytest.fixture
def hosts(kafka_broker: Broker, tmp_path: Path) -> Iterator[tuple[KafkaQueueStore, KafkaQueueStore]]:
    first, second = _host(kafka_broker, tmp_path / "host-a"), _host(kafka_broker, tmp_path / "host-b")
    try:
        yield first, second
    finally:
        second.close()
        first.close()


def _append_durably(writer: KafkaPartitionWriter, n: int) -> None:
    for i in range(n):
        writer.append(f"v{i}".encode(), RecordMeta("R", i, f"k{i}"))
    writer.flush()


def test_a_second_writer_on_another_host_is_refused_while_the_first_holds_the_lease(
    hosts: tuple[KafkaQueueStore, KafkaQueueStore], topic: str
) -> None:
    first, second = hosts
    holder = first.writer(topic, 0)
    for _ in range(3):  # tries, as a standby makes them: each refused, none fences the holder
        with pytest.raises(PartitionLockedError, match="another writer holds the lease"):
            second.writer(topic, 0)
    _append_durably(holder, 5)  # the holder still commits: it was never fenced
    assert holder.commits >= 1 and holder.failure is None
    second.writer(topic, 1).close()  # another partition's lease is another group
    holder.close()
    lease = second._lease(topic, 0)
    assert lease is not None and lease.wait_held(SLACK_S)  # it stayed a member: it is next
    taker = second.writer(topic, 0)
    taker.close()
    with first.reader(topic, 0) as reader:
        assert len(reader.read_forward(0, 100)) == 5


def _hold(bootstrap: str, state_dir: str, topic: str, held: EventType, forever: EventType) -> None:
    store = KafkaQueueStore(bootstrap, Path(state_dir), lease_timeout=LEASE_S)
    store.writer(topic, 0)
    held.set()
    forever.wait()  # until SIGKILLed


def test_after_the_holders_process_is_killed_the_waiter_gets_the_lease_once_it_timed_out(
    kafka_broker: Broker, hosts: tuple[KafkaQueueStore, KafkaQueueStore], topic: str, tmp_path: Path
) -> None:
    _, waiter = hosts
    ctx = mp.get_context("spawn")
    held, forever = ctx.Event(), ctx.Event()
    holder = ctx.Process(
        target=_hold, args=(kafka_broker.bootstrap, str(tmp_path / "host-c"), topic, held, forever)
    )
    holder.start()
    try:
        assert held.wait(SLACK_S), "the child did not take the writer"
        with pytest.raises(PartitionLockedError):
            waiter.writer(topic, 0)
        lease = waiter._lease(topic, 0)
        assert lease is not None and not lease.held
        holder.kill()  # SIGKILL: no LeaveGroup, the broker only stops hearing heartbeats
        holder.join(SLACK_S)
        assert holder.exitcode == -9
        assert lease.wait_held(LEASE_S + SLACK_S)
    finally:
        if holder.is_alive():
            holder.kill()
    writer = waiter.writer(topic, 0)  # the flock of this host was never taken: the lease decided
    _append_durably(writer, 2)
    writer.close()


def test_a_lease_timeout_the_broker_refuses_is_one_error(
    kafka_broker: Broker, tmp_path: Path, topic: str
) -> None:
    store = _host(kafka_broker, tmp_path / "short", lease=0.2)  # below group.min.session.timeout.ms
    try:
        with pytest.raises(LeaseRefusedError, match=r"group\.min\.session\.timeout\.ms"):
            store.writer(topic, 0)
    finally:
        store.close()
