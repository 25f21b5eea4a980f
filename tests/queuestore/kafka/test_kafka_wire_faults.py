"""The transactional writer under wire faults on its transaction coordinator and its produce requests, on
Apache Kafka, through the fault proxy (tests.faultproxy).

librdkafka implements Kafka's transactions v1 only (no KIP-890 transactions v2): a transaction is known to
the broker by the producer id and epoch alone, so a request of an earlier transaction that reaches the
broker late, in the same epoch, acts on whatever transaction is open then. Measured here (Kafka 4.3.1,
librdkafka 2.16): an EndTxn(commit) held in the network past librdkafka's socket.timeout.ms is retried by
librdkafka, the retry commits, `commit_transaction()` reports success, and when the held request arrives
it commits the *next* transaction half way (a torn transaction: records of it visible to read_committed
readers although its commit never happened, results-topic records missing beside them).

The writer's defence (queuestore.kafka.KafkaPartitionWriter): an EndTxn whose outcome was unknown at any
moment (librdkafka timed it out or lost its connection, even if a retry then succeeded; or the commit
failed) never lets the writer go on in the same producer epoch. The producer is replaced and the new one's
`init_transactions()` bumps the epoch, fencing every request of the old one still on its way. A commit
that succeeded goes on in the new epoch; one that failed stops the writer with `CommitOutcomeUnknownError`
after the fence, and the operator recovers from the log, whose content is final by then.
"""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from cec.records import Kind
from operators.aggregate import RESULT_SCHEMA
from operators.job import JobSpec, aggregate_operator, run_job
from operators.sinks import iter_payloads
from operators.topic_source import resolve_bounds
from queuestore.base import RecordMeta
from queuestore.exceptions import BrokerUnavailableError, CommitOutcomeUnknownError, QueueStoreError
from queuestore.kafka import KafkaPartitionWriter, KafkaQueueStore
from tests.brokers import Broker
from tests.faultproxy import API_KEYS, Fault, FaultPlan, FaultProxy, Rule
from tests.helpers import wait_for
from tests.topic_data import create_topic, end_aware_consumer, produce

pytestmark = pytest.mark.kafka_transactions

ENDTXN = frozenset({API_KEYS["EndTxn"]})
PRODUCE = frozenset({API_KEYS["Produce"]})
DEADLINE = 60.0


def _read(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[bytes]:
    """The values of partition 0 of `topic`, to its end, as a plain consumer with `isolation` reads them."""
    consumer = end_aware_consumer(bootstrap, isolation)
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        values: list[bytes] = []
        deadline = time.monotonic() + DEADLINE
        while True:
            assert time.monotonic() < deadline, f"no end of {topic} within {DEADLINE}s"
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                return values
            values.append(bytes(msg.value() or b""))
    finally:
        consumer.close()


def _payloads(values: list[bytes]) -> list[bytes]:
    """The appended values in a log read as plain messages (the writer's frame stripped: the values
    tests append end with their own text, so the suffix after the last NUL-free frame head is enough)."""
    return [v[v.index(b"rec-") :] for v in values]


def _store(proxy: FaultProxy, tmp_path: Path, **config: str) -> KafkaQueueStore:
    return KafkaQueueStore(proxy.address, tmp_path / "state", config=dict(config), request_timeout=20)


def _writer(store: KafkaQueueStore, topic: str) -> KafkaPartitionWriter:
    writer = store.writer(topic, 0)
    assert isinstance(writer, KafkaPartitionWriter)
    return writer


def _patient_store(proxy: FaultProxy, tmp_path: Path) -> KafkaQueueStore:
    """A store whose operations give up after 4 s while librdkafka would wait 60 s for an answer before it
    sends a request again: a lost answer fails the operation instead of being asked again (the case of a
    broker that answers nothing for longer than the store's timeout)."""
    config = {"socket.timeout.ms": "60000"}
    return KafkaQueueStore(proxy.address, tmp_path / "state", config=config, request_timeout=4)


def _meta(i: int) -> RecordMeta:
    return RecordMeta("R", i, f"k{i}", 0)


def test_a_late_endtxn_never_commits_the_next_transaction(
    fault_proxy: FaultProxy, proxied_broker: Broker, tmp_path: Path
) -> None:
    """The first EndTxn(commit) is held past librdkafka's 3 s socket timeout: librdkafka retries it and
    the commit succeeds. The writer goes on with the next transaction while the held EndTxn is on its way:
    one record reaches the broker, then (released) the held EndTxn, then a second record and a side record.
    The transaction commits whole. Without the defence the held request committed the first record alone,
    the second one's produce was refused (the partition was no longer in a transaction), the writer
    stopped, and the first record was in the log without its side record: a result lost for the side
    topic's readers, for good (recovery never emits a result the log holds)."""
    output, side = f"txn-{uuid.uuid4().hex[:10]}", f"side-{uuid.uuid4().hex[:10]}"
    store = _store(fault_proxy, tmp_path, **{"socket.timeout.ms": "3000"})
    try:
        store.create_topic(output, 1)
        store.create_topic(side, 1)
        writer = _writer(store, output)
        with writer:
            writer.append(b"rec-0", _meta(0))
            writer.flush(DEADLINE)  # a first transaction, unharmed: the coordinator is known
            fault_proxy.plan = FaultPlan(Rule(Fault.HOLD, apis=ENDTXN, nth=1))
            writer.append(b"rec-1", _meta(1))
            writer.append_side(side, 0, b"k1", b"rec-1-side")
            writer.flush(DEADLINE)  # librdkafka's retry of the held EndTxn commits it
            assert fault_proxy.injected()[("hold", "EndTxn")] == 1
            writer.append(b"rec-2", _meta(2))
            wait_for(lambda: len(_read(proxied_broker.bootstrap, output, "read_uncommitted")) == 3, DEADLINE)
            assert fault_proxy.late_answers()["EndTxn"] == 0
            fault_proxy.release()
            # The broker has acted on the held EndTxn (it answered it) before the next produce.
            wait_for(lambda: fault_proxy.late_answers()["EndTxn"] == 1, DEADLINE, interval=0.02)
            writer.append(b"rec-3", _meta(3))
            writer.append_side(side, 0, b"k2", b"rec-2-side")
            writer.flush(DEADLINE)
            assert writer.renewals == 1  # the producer was replaced once, after the unsure commit
    finally:
        store.close()
    assert _payloads(_read(proxied_broker.bootstrap, output)) == [b"rec-0", b"rec-1", b"rec-2", b"rec-3"]
    assert _read(proxied_broker.bootstrap, side) == [b"rec-1-side", b"rec-2-side"]


def _commit(writer: KafkaPartitionWriter, path: str) -> None:
    """Commit what the writer holds, the way `path` says: `flush` (the caller's own commit) or `poll` (the
    pipelined commit the operator runtime starts from its polls, run in the committer thread)."""
    if path == "flush":
        writer.flush(DEADLINE)
        return
    deadline = time.monotonic() + DEADLINE
    while writer.outstanding:
        assert time.monotonic() < deadline, "the pipelined commit did not end"
        writer.poll(0.05)


@pytest.mark.parametrize("path", ["flush", "poll"])
@pytest.mark.parametrize("fault", [Fault.DISCONNECT_BEFORE, Fault.DISCONNECT_AFTER])
def test_a_disconnect_during_endtxn_replaces_the_producer_and_goes_on(
    fault_proxy: FaultProxy, proxied_broker: Broker, tmp_path: Path, fault: Fault, path: str
) -> None:
    """The coordinator's connection is cut when the EndTxn arrives (it never reaches the broker) or
    instead of its answer (the broker committed): librdkafka retries it on a new connection and the commit
    succeeds either way, but its outcome was unknown for a moment, so the writer goes on in a new epoch.
    Nothing is lost or doubled, and the callbacks say where each record is."""
    output = f"txn-{uuid.uuid4().hex[:10]}"
    store = _store(fault_proxy, tmp_path)
    offsets: list[int | None] = []
    try:
        store.create_topic(output, 1)
        writer = _writer(store, output)
        with writer:
            writer.append(b"rec-0", _meta(0), lambda o, e: offsets.append(o if e is None else None))
            _commit(writer, path)
            fault_proxy.plan = FaultPlan(Rule(fault, apis=ENDTXN, nth=1))
            writer.append(b"rec-1", _meta(1), lambda o, e: offsets.append(o if e is None else None))
            _commit(writer, path)
            assert fault_proxy.injected()[(fault.value, "EndTxn")] == 1
            assert writer.renewals == 1 and writer.failure is None
            writer.append(b"rec-2", _meta(2), lambda o, e: offsets.append(o if e is None else None))
            _commit(writer, path)
            assert writer.renewals == 1  # a clean commit goes on in the epoch it has
    finally:
        store.close()
    assert _payloads(_read(proxied_broker.bootstrap, output)) == [b"rec-0", b"rec-1", b"rec-2"]
    assert None not in offsets and len(offsets) == 3
    assert offsets == sorted(o for o in offsets if o is not None)


@pytest.mark.parametrize("path", ["flush", "poll"])
def test_a_lost_endtxn_answer_fences_the_producer_and_the_log_decides(
    fault_proxy: FaultProxy, proxied_broker: Broker, tmp_path: Path, path: str
) -> None:
    """The EndTxn's answer is dropped: the broker committed, the writer cannot know. Its commit times out
    (librdkafka's own socket timeout is longer here), the writer fences its producer and stops with
    CommitOutcomeUnknownError, the records' callbacks report that error, and the log is final at once:
    it holds the transaction. A new writer (the operator recovering) reads it there and goes on."""
    output = f"txn-{uuid.uuid4().hex[:10]}"
    store = _patient_store(fault_proxy, tmp_path)
    errors: list[Exception | None] = []
    try:
        store.create_topic(output, 1)
        writer = _writer(store, output)
        writer.append(b"rec-0", _meta(0))
        _commit(writer, path)
        fault_proxy.plan = FaultPlan(Rule(Fault.DROP, apis=ENDTXN, nth=1))
        writer.append(b"rec-1", _meta(1), lambda _o, e: errors.append(e))
        with pytest.raises(CommitOutcomeUnknownError, match=r"outcome is unknown.*recover from the log"):
            _commit(writer, path)
        assert writer.renewals == 1 and isinstance(writer.failure, CommitOutcomeUnknownError)
        assert len(errors) == 1 and isinstance(errors[0], CommitOutcomeUnknownError)
        with pytest.raises(QueueStoreError, match="recover from the log"):
            writer.append(b"rec-x", _meta(9))  # fail-stop
        writer.close()
        # Final already (no transaction timeout to wait for): the lost answer was a commit's.
        assert _payloads(_read(proxied_broker.bootstrap, output)) == [b"rec-0", b"rec-1"]
        again = _writer(store, output)
        with again:
            again.append(b"rec-2", _meta(2))
            _commit(again, path)
    finally:
        store.close()
    assert _payloads(_read(proxied_broker.bootstrap, output)) == [b"rec-0", b"rec-1", b"rec-2"]


def test_an_endtxn_held_past_the_commit_timeout_is_fenced_when_it_lands(
    fault_proxy: FaultProxy, proxied_broker: Broker, tmp_path: Path
) -> None:
    """The EndTxn is held past the writer's 4 s commit timeout: the writer fences its producer (the open
    transaction is aborted there and then) and stops; the operator recovers and writes the records again,
    in a new transaction. When the held EndTxn lands (released) it is refused (old epoch): nothing
    doubled."""
    output = f"txn-{uuid.uuid4().hex[:10]}"
    store = _patient_store(fault_proxy, tmp_path)
    try:
        store.create_topic(output, 1)
        writer = _writer(store, output)
        writer.append(b"rec-0", _meta(0))
        writer.flush(DEADLINE)
        fault_proxy.plan = FaultPlan(Rule(Fault.HOLD, apis=ENDTXN, nth=1))
        writer.append(b"rec-1", _meta(1))
        with pytest.raises(CommitOutcomeUnknownError):
            writer.flush(DEADLINE)
        writer.close()
        assert _payloads(_read(proxied_broker.bootstrap, output)) == [b"rec-0"]  # aborted by the fence
        again = _writer(store, output)
        with again:
            again.append(b"rec-1", _meta(1))  # recovery writes it again
            again.append(b"rec-2", _meta(2))
            again.flush(DEADLINE)
            assert fault_proxy.late_answers()["EndTxn"] == 0
            fault_proxy.release()
            wait_for(lambda: fault_proxy.late_answers()["EndTxn"] == 1, DEADLINE, interval=0.02)
    finally:
        store.close()
    assert _payloads(_read(proxied_broker.bootstrap, output)) == [b"rec-0", b"rec-1", b"rec-2"]


def test_a_produce_delayed_past_its_transactions_abort_never_lands_in_the_next(
    fault_proxy: FaultProxy, proxied_broker: Broker, tmp_path: Path
) -> None:
    """Jepsen's case (a produce of an aborted transaction that reaches the broker after the abort, in the
    same producer epoch, lands in the next transaction). The writer's produce of rec-1 is held: it cannot
    deliver within its 4 s timeout and stops (the broker did not answer); the operator recovers with a new
    writer, whose epoch aborts the old transaction, and writes rec-2 in a new one. The held produce is
    released while that transaction is open, after its partition joined it, and before its commit: a
    read_committed reader never sees rec-1 (nor does any reader: the old epoch is refused)."""
    output = f"txn-{uuid.uuid4().hex[:10]}"
    store = _patient_store(fault_proxy, tmp_path)
    try:
        store.create_topic(output, 1)
        writer = _writer(store, output)
        writer.append(b"rec-0", _meta(0))
        writer.flush(DEADLINE)
        fault_proxy.plan = FaultPlan(Rule(Fault.HOLD, apis=PRODUCE, nth=1))
        writer.append(b"rec-1", _meta(1))
        with pytest.raises(BrokerUnavailableError, match="not delivered"):
            _commit(writer, "poll")
        writer.close()
        fault_proxy.plan = None
        again = _writer(store, output)
        with again:
            again.append(b"rec-2", _meta(2))
            wait_for(lambda: len(_read(proxied_broker.bootstrap, output, "read_uncommitted")) == 2, DEADLINE)
            assert fault_proxy.late_answers()["Produce"] == 0  # rec-2's transaction is open: rec-1 comes now
            assert fault_proxy.release() == 1
            wait_for(lambda: fault_proxy.late_answers()["Produce"] == 1, DEADLINE, interval=0.02)
            again.flush(DEADLINE)
    finally:
        store.close()
    assert _payloads(_read(proxied_broker.bootstrap, output)) == [b"rec-0", b"rec-2"]
    assert b"rec-1" not in b"".join(_read(proxied_broker.bootstrap, output, "read_uncommitted"))


def test_a_flush_without_a_timeout_stops_once_the_broker_answers_nothing_for_the_request_timeout(
    fault_proxy: FaultProxy, proxied_broker: Broker, tmp_path: Path
) -> None:
    """An operator's last flush (the end of its input) has no timeout of its own; the producer never times
    a record out (message.timeout.ms=0). A broker that then answers nothing (the writer's client cut off)
    must stop it once a whole request timeout passed with nothing delivered, with the broker's one line,
    not hold the run forever (found with a broker SIGKILLed at the end of a run's input)."""
    output = f"txn-{uuid.uuid4().hex[:10]}"
    store = _patient_store(fault_proxy, tmp_path)
    try:
        store.create_topic(output, 1)
        writer = _writer(store, output)
        writer.append(b"rec-0", _meta(0))
        writer.flush()
        fault_proxy.blackhole(client=f"cec-writer-{output}-0")
        writer.append(b"rec-1", _meta(1))
        with pytest.raises(
            BrokerUnavailableError, match=r"did not answer for 4 s \(1 appends to .* not delivered"
        ):
            writer.flush()
        assert fault_proxy.by_fault()["blackhole"] > 0
        writer.close(timeout=1)
    finally:
        fault_proxy.heal()
        store.close()
    assert _payloads(_read(proxied_broker.bootstrap, output)) == [b"rec-0"]


def test_a_flush_that_gave_up_stops_the_writer_so_its_close_neither_waits_again_nor_warns(
    fault_proxy: FaultProxy, proxied_broker: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run's last flush that gives up on a broker answering nothing stops the writer (fail-stop, as a
    pipelined commit that cannot deliver does): the close that follows on the run's way out purges at once.
    Before, the writer stayed open, so close() waited its own 60 s for the same broker and then warned
    "closing ... with 1 appends not durable: purging them" beside the run's one error line (a CI run of
    `cec run --input-topic` with the broker stalled printed both)."""
    output = f"txn-{uuid.uuid4().hex[:10]}"
    store = _patient_store(fault_proxy, tmp_path)
    try:
        store.create_topic(output, 1)
        writer = _writer(store, output)
        writer.append(b"rec-0", _meta(0))
        writer.flush()
        fault_proxy.blackhole(client=f"cec-writer-{output}-0")
        writer.append(b"rec-1", _meta(1))
        with pytest.raises(BrokerUnavailableError, match=r"\(1 appends to .* not delivered"):
            writer.flush()
        assert isinstance(writer.failure, BrokerUnavailableError)  # stopped: nothing more is appended
        with pytest.raises(QueueStoreError, match="failed earlier"):
            writer.append(b"rec-2", _meta(2))
        with caplog.at_level(logging.WARNING, logger="queuestore.kafka.writer"):
            writer.close()  # the default timeout (60 s): not waited, the writer has stopped
        assert not [r.getMessage() for r in caplog.records if r.name == "queuestore.kafka.writer"]
        assert fault_proxy.by_fault()["blackhole"] > 0
    finally:
        fault_proxy.heal()
        store.close()
    assert _payloads(_read(proxied_broker.bootstrap, output)) == [b"rec-0"]


def test_a_lost_produce_answer_is_asked_again_within_the_commit_timeout(
    fault_proxy: FaultProxy, proxied_broker: Broker, tmp_path: Path
) -> None:
    """librdkafka waits socket.timeout.ms for an answer before it sends a request again; its default (60 s)
    was twice the store's own bound, so one lost produce answer stopped the writer ("not delivered after
    30 s") although the client would have resolved it. The store now derives the socket timeout from its
    request timeout (a third): the produce is sent again and the commit goes through, nothing doubled."""
    output = f"txn-{uuid.uuid4().hex[:10]}"
    store = KafkaQueueStore(fault_proxy.address, tmp_path / "state", request_timeout=6)
    try:
        store.create_topic(output, 1)
        writer = _writer(store, output)
        with writer:
            writer.append(b"rec-0", _meta(0))
            writer.flush(DEADLINE)
            fault_proxy.plan = FaultPlan(Rule(Fault.DROP, apis=PRODUCE, nth=1))
            writer.append(b"rec-1", _meta(1))
            writer.append(b"rec-2", _meta(2))
            _commit(writer, "poll")
            assert fault_proxy.injected() == {("drop", "Produce"): 1}
    finally:
        store.close()
    assert _payloads(_read(proxied_broker.bootstrap, output)) == [b"rec-0", b"rec-1", b"rec-2"]


def test_a_lost_fetch_answer_is_asked_again_within_the_read_timeout(
    fault_proxy: FaultProxy, proxied_broker: Broker, tmp_path: Path
) -> None:
    """The same for a reader: a lost fetch answer made `read_forward` fail after the store's 30 s ("no data
    nor end-of-partition") while librdkafka would ask again only after 60 s."""
    output = f"txn-{uuid.uuid4().hex[:10]}"
    direct = KafkaQueueStore(proxied_broker.bootstrap, tmp_path / "direct")
    store = KafkaQueueStore(fault_proxy.address, tmp_path / "state", request_timeout=6)
    try:
        direct.create_topic(output, 1)
        writer = _writer(direct, output)
        with writer:
            for i in range(50):
                writer.append(b"rec-%d" % i, _meta(i))
            writer.flush(DEADLINE)
        fault_proxy.plan = FaultPlan(Rule(Fault.DROP, apis=frozenset({API_KEYS["Fetch"]}), nth=1))
        with store.reader(output, 0) as reader:
            records = reader.read_forward(0, 50)
        assert fault_proxy.injected() == {("drop", "Fetch"): 1}
    finally:
        store.close()
        direct.close()
    assert [r.value for r in records] == [b"rec-%d" % i for i in range(50)]


def test_an_operator_recovers_in_its_process_from_a_commit_in_doubt(
    fault_proxy: FaultProxy, proxied_broker: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`run_job`: the answers of two EndTxns are lost (librdkafka would wait 60 s, the commit gives up after
    4 s): each time the writer fences its producer and the instance recovers from its log in the same
    process, and its results equal a run without faults."""
    operator = aggregate_operator("item_id", "item_price", "avg", window_count=5)
    source = {"type": "generator", "count": 20_000, "keys": 60, "seed": 3}

    def spec(bootstrap: str, name: str, **store: Any) -> JobSpec:
        return JobSpec(
            operator=operator,
            source=source,
            store={
                "type": "kafka",
                "bootstrap_servers": bootstrap,
                "state_dir": str(tmp_path / name),
                **store,
            },
            output_topic=f"{name}-{uuid.uuid4().hex[:10]}",
            batch_size=50,
        )

    reference = spec(proxied_broker.bootstrap, "clean")
    run_job(reference)
    chaotic = spec(
        fault_proxy.address,
        "doubt",
        request_timeout=4,
        config={"socket.timeout.ms": "60000"},
        # Commits by record count (about 48 in the run), not by the wall clock: a fast machine finished the
        # run in fewer than the 4 EndTxns the plan needs.
        commit_interval=3600.0,
        commit_records=500,
    )
    fault_proxy.plan = FaultPlan(Rule(Fault.DROP, apis=ENDTXN, nth=2), Rule(Fault.DROP, apis=ENDTXN, nth=4))
    with caplog.at_level(logging.WARNING, logger="operators.job"):
        stats = run_job(chaotic)
    assert fault_proxy.injected() == {("drop", "EndTxn"): 2}
    assert stats.completed and stats.recovery is not None
    recovered = [r for r in caplog.records if "outcome is unknown" in r.getMessage()]
    assert len(recovered) == 2 and all(
        r.getMessage().endswith(": recovering in this process") for r in recovered
    )
    store = KafkaQueueStore(proxied_broker.bootstrap, tmp_path / "probe")
    try:
        want = list(iter_payloads(store, reference.output_topic, RESULT_SCHEMA, Kind.R))
        got = list(iter_payloads(store, chaotic.output_topic, RESULT_SCHEMA, Kind.R))
    finally:
        store.close()
    assert len(want) > 500 and got == want


@pytest.mark.parametrize("fault", [Fault.DISCONNECT_BEFORE, Fault.DISCONNECT_AFTER])
def test_a_cut_connection_under_the_log_start_query_is_asked_again(
    fault_proxy: FaultProxy, proxied_broker: Broker, tmp_path: Path, fault: Fault
) -> None:
    """The log start is a watermark query (ListOffsets) that librdkafka does not send again by itself: one
    cut connection under it stopped the operator ("cannot read the log start ... transport failure"), and
    so did a reader's client that had not learnt the partition of a topic just created ("unknown
    partition"). Both are asked again within the request timeout."""
    output = f"txn-{uuid.uuid4().hex[:10]}"
    store = KafkaQueueStore(fault_proxy.address, tmp_path / "state", request_timeout=10)
    try:
        store.create_topic(output, 1)
        fault_proxy.plan = FaultPlan(Rule(fault, apis=frozenset({API_KEYS["ListOffsets"]}), nth=1))
        with store.reader(output, 0) as reader:  # right after the topic's creation, as recovery does
            assert reader.start_offset() == 0
        assert fault_proxy.injected() == {(fault.value, "ListOffsets"): 1}
    finally:
        store.close()


@pytest.mark.parametrize("fault", [Fault.DISCONNECT_BEFORE, Fault.DISCONNECT_AFTER, Fault.DROP])
def test_the_input_topics_bounds_are_listed_again_after_a_lost_answer(
    fault_proxy: FaultProxy, proxied_broker: Broker, fault: Fault
) -> None:
    """A bounded topic run pins its input's bounds (ListOffsets through the admin client) at its start, and
    checks its log starts at every restart: one lost answer there stopped the run ("cannot list the
    offsets ... No leaders found", "... transport failure"). They are asked again within the timeout."""
    topic = f"bounds-{uuid.uuid4().hex[:10]}"
    create_topic(proxied_broker.bootstrap, topic, 2)
    produce(proxied_broker.bootstrap, topic, [(p, None, b"v%d" % i) for i, p in enumerate([0, 1, 1, 0, 1])])
    fault_proxy.plan = FaultPlan(Rule(fault, apis=frozenset({API_KEYS["ListOffsets"]}), nth=1))
    bounds = resolve_bounds(fault_proxy.address, topic)
    assert (bounds.starts, bounds.ends) == ((0, 0), (2, 3))
    assert fault_proxy.injected() == {(fault.value, "ListOffsets"): 1}
