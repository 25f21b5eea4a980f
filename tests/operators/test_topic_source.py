"""KafkaTopicSource on a real broker (the `kafka_broker` fixture): topics written by plain producers."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from cec.native import native
from operators.base import InputTuple
from operators.exceptions import RetentionError
from operators.topic_source import KafkaTopicSource, resolve_bounds
from tests.brokers import Broker
from tests.topic_data import PURCHASE_AVSC, as_json, avro_body, create_topic, encoded, make_purchases, produce

_DEADLINE_S = 60.0


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def drain(source: KafkaTopicSource) -> list[InputTuple]:
    """Everything a bounded source delivers, until it says it has ended."""
    out: list[InputTuple] = []
    deadline = time.monotonic() + _DEADLINE_S
    while time.monotonic() < deadline:
        batch = source.poll(256)
        if batch is None:
            return out
        out.extend(batch)
    raise AssertionError(f"bounded source did not end; got {len(out)} tuples")


def poll_until(source: KafkaTopicSource, done: Callable[[list[InputTuple]], bool]) -> list[InputTuple]:
    out: list[InputTuple] = []
    deadline = time.monotonic() + _DEADLINE_S
    while not done(out):
        assert time.monotonic() < deadline, f"condition not reached; got {len(out)} tuples"
        batch = source.poll(256)
        assert batch is not None, "a following source never ends"
        out.extend(batch)
    return out


def by_partition(tuples: list[InputTuple]) -> dict[int, list[tuple[int, Any]]]:
    out: dict[int, list[tuple[int, Any]]] = {}
    for t in tuples:
        out.setdefault(t.partition, []).append((t.offset, t.value if t.error is None else t.error))
    return out


def expected(purchases: list[tuple[int, dict[str, Any]]]) -> dict[int, list[tuple[int, Any]]]:
    out: dict[int, list[tuple[int, Any]]] = {}
    for p, rec in purchases:
        rows = out.setdefault(p, [])
        rows.append((len(rows), rec))
    return out


@pytest.fixture
def json_topic(kafka_broker: Broker) -> tuple[str, list[tuple[int, dict[str, Any]]]]:
    topic = _topic("purchases-json")
    create_topic(kafka_broker.bootstrap, topic, 3)
    purchases = make_purchases(300, keys=30, partitions=3)
    produce(kafka_broker.bootstrap, topic, encoded(purchases, as_json))
    return topic, purchases


def _source(broker: Broker, topic: str, **kw: Any) -> KafkaTopicSource:
    kw.setdefault("fmt", "json")
    return KafkaTopicSource(broker.bootstrap, topic, key_field="item", value_field="price", **kw)


def test_bounded_reads_every_partition_and_restarts_stop_at_the_first_runs_end(
    kafka_broker: Broker, json_topic: tuple[str, list[tuple[int, dict[str, Any]]]]
) -> None:
    topic, purchases = json_topic
    source = _source(kafka_broker, topic)
    try:
        assert source.partitions == 3
        source.seek([0, 0, 0])
        got = drain(source)
    finally:
        source.close()
    assert by_partition(got) == expected(purchases)
    pinned = source.bounds.as_dict()
    assert pinned == {
        "start_offsets": [0, 0, 0],
        "end_offsets": [len(expected(purchases)[p]) for p in range(3)],
    }
    assert source.identity()["end_offsets"] == pinned["end_offsets"]

    more = make_purchases(30, keys=30, partitions=3, seed=99)
    produce(kafka_broker.bootstrap, topic, encoded(more, as_json))
    restarted = _source(kafka_broker, topic, **pinned)  # the bounds kept with the log
    try:
        restarted.seek([0, 0, 0])
        assert by_partition(drain(restarted)) == expected(purchases)
    finally:
        restarted.close()
    fresh = resolve_bounds(kafka_broker.bootstrap, topic)
    assert sum(fresh.ends) == len(purchases) + len(more)


def test_a_broker_that_understates_the_end_of_a_partition_cuts_nothing_off_a_bounded_run(
    kafka_broker: Broker,
    json_topic: tuple[str, list[tuple[int, dict[str, Any]]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tansu 0.6 lists a partition's end as its last batch's base offset + 1 (DESIGN-NOTES section 4).
    Failed before: a bounded run took the listed end as its end and silently missed each partition's last
    batch (the issue's `cec run --input-topic` over three partitions: 4,423 windows instead of 4,589, exit
    0). Now the end is where consuming reaches the end of the partition, whatever the listing says.
    The listing is stood in (Apache Kafka answers it exactly); everything else is the real broker."""
    from confluent_kafka.admin import OffsetSpec

    import operators.topic_bounds as topic_bounds

    topic, purchases = json_topic
    want = expected(purchases)
    assert resolve_bounds(kafka_broker.bootstrap, topic).ends == tuple(len(want[p]) for p in range(3))
    listed = topic_bounds.list_offsets
    latest = OffsetSpec.latest()

    def understated(admin: Any, topic: str, partitions: Any, spec: OffsetSpec) -> list[int]:
        real = listed(admin, topic, partitions, spec)
        return [max(0, end - 37) for end in real] if type(spec) is type(latest) else real

    monkeypatch.setattr(topic_bounds, "list_offsets", understated)
    assert resolve_bounds(kafka_broker.bootstrap, topic).ends == tuple(len(want[p]) for p in range(3))
    source = _source(kafka_broker, topic)
    try:
        source.seek([0, 0, 0])
        assert by_partition(drain(source)) == want
    finally:
        source.close()


def test_seek_is_a_replay_from_kafka_offsets(
    kafka_broker: Broker, json_topic: tuple[str, list[tuple[int, dict[str, Any]]]]
) -> None:
    topic, purchases = json_topic
    want = expected(purchases)
    source = _source(kafka_broker, topic, partitions=[2, 0])  # an instance reading two of the partitions
    try:
        assert source.global_partitions == (2, 0)
        source.seek([7, 3])
        got = by_partition(drain(source))
    finally:
        source.close()
    assert got == {0: want[2][7:], 1: want[0][3:]}  # local partition i = global_partitions[i]


def test_bad_records_are_error_tuples_with_reasons_and_good_ones_are_exact(kafka_broker: Broker) -> None:
    topic = _topic("purchases-bad")
    create_topic(kafka_broker.bootstrap, topic, 1)
    good = {"item": "a", "price": 1.5, "ts": 1}
    records: list[tuple[int, bytes | None, bytes | None]] = [
        (0, b"a", as_json(good)),
        (0, b"a", b"{not json"),
        (0, b"a", as_json({"item": "a", "ts": 2})),  # no price
        (0, None, as_json({"item": None, "price": 2.0, "ts": 3})),  # null key field
        (0, b"a", None),  # tombstone
        (0, b"a", b"[1, 2]"),
        (0, b"a", as_json({**good, "ts": 4})),
    ]
    produce(kafka_broker.bootstrap, topic, records)
    source = _source(kafka_broker, topic)
    try:
        source.seek([0])
        got = drain(source)
    finally:
        source.close()
    assert [(t.offset, t.value) for t in got if t.error is None] == [(0, good), (6, {**good, "ts": 4})]
    reasons = {t.offset: t.error for t in got if t.error is not None}
    assert set(reasons) == {1, 2, 3, 4, 5} and all(t.value is None for t in got if t.error)
    assert reasons[1] is not None and reasons[1].startswith("not JSON")
    assert reasons[2] is not None and reasons[2].startswith("missing field 'price'")
    assert reasons[3] is not None and reasons[3].startswith("null field 'item'")
    assert reasons[4] == "null value (tombstone)"
    assert reasons[5] == "JSON value is a list, not an object"


@pytest.mark.skipif(native is None, reason="the C accelerator is not built")
@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_the_c_batch_path_gives_exactly_the_python_paths_tuples(kafka_broker: Broker, fmt: str) -> None:
    """Plain records and every kind of bad one, mixed in the same batches, over 2 partitions: the source
    with `cec._native.topic_batch` and the source without it (the Python batch and per-record paths)
    deliver the same tuples, reasons and raw values; the records the C path holds are its mappings."""
    topic = _topic(f"parity-{fmt}")
    create_topic(kafka_broker.bootstrap, topic, 2)
    encode = as_json if fmt == "json" else avro_body
    good = [{"item": f"k{i}", "price": i / 4, "ts": i} for i in range(40)]
    bad: list[bytes | None] = [None, b"{not json", b"\x02\xff", encode({"item": None, "price": 1.0, "ts": 1})]
    if fmt == "json":
        bad += [
            as_json({"item": "a", "ts": 2}),
            b"[1, 2]",
            b'{"item": {"nested": 1}, "price": 1}',
            b'{"item": "\\ud800", "price": 1}',
            b'{"item": "a", "price": NaN}',
            b'{"it\\u0065m": "escaped", "price": 1e400, "extra": [1]}',
            b'{"item": "caf\xc3\xa9", "price": 123456789012345678901234567890}',
        ]
    records = [(i % 2, b"k", encode(r)) for i, r in enumerate(good)]
    records += [(i % 2, b"k", raw) for i, raw in enumerate(bad)]
    records += [(i % 2, b"k", encode(r)) for i, r in enumerate(good)]
    produce(kafka_broker.bootstrap, topic, records)
    got = []
    for c_path in (True, False):
        source = _source(kafka_broker, topic, fmt=fmt, schema=PURCHASE_AVSC)
        try:
            assert source._native_spec is not None
            if not c_path:
                source._native_spec = None
            source.seek([0, 0])
            got.append(drain(source))
        finally:
            source.close()
    # Each partition in its own order; how the two partitions interleave is when their fetches arrive.
    c_tuples, py_tuples = (sorted(tuples, key=lambda t: (t.partition, t.offset)) for tuples in got)
    assert len(c_tuples) == len(records)
    assert [(t.partition, t.offset, t.error, t.raw) for t in c_tuples] == [
        (t.partition, t.offset, t.error, t.raw) for t in py_tuples
    ]
    for c_tup, py_tup in zip(c_tuples, py_tuples, strict=True):
        assert c_tup.value == py_tup.value and (c_tup.value is None) == (py_tup.value is None)
    held = [t for t in c_tuples if isinstance(t.value, native.Record)]
    assert len(held) >= 2 * len(good)  # the plain ones, at least


def test_avro_topic_wrong_bodies_are_error_tuples(kafka_broker: Broker) -> None:
    topic = _topic("purchases-avro")
    create_topic(kafka_broker.bootstrap, topic, 1)
    good = {"item": "a", "price": 2.25, "ts": 1}
    produce(
        kafka_broker.bootstrap,
        topic,
        [
            (0, b"a", avro_body(good)),
            (0, b"a", b"\x02\xff"),
            (0, b"a", as_json(good)),
            (0, b"a", avro_body({**good, "price": None})),
        ],
    )
    source = _source(kafka_broker, topic, fmt="avro", schema=PURCHASE_AVSC)
    try:
        source.seek([0])
        got = drain(source)
    finally:
        source.close()
    assert [(t.offset, t.value) for t in got if t.error is None] == [(0, good)]
    errors = {t.offset: t.error or "" for t in got if t.error is not None}
    assert errors[1].startswith("not Avro") and errors[2].startswith("not Avro")
    assert errors[3].startswith("null field 'price'")


def test_record_timestamp_as_the_time_field(kafka_broker: Broker) -> None:
    topic = _topic("purchases-ts")
    # Timestamps from 2023: a broker with time retention (Kafka's default 7 days) deletes them at once.
    create_topic(kafka_broker.bootstrap, topic, 1, config={"retention.ms": "-1"})
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for i in range(3):
        producer.produce(
            topic, as_json({"item": "a", "price": 1.0}), partition=0, timestamp=1_700_000_000_000 + i
        )
    assert producer.flush(30) == 0
    source = _source(kafka_broker, topic, time_field="@timestamp")
    try:
        source.seek([0])
        got = drain(source)
    finally:
        source.close()
    assert [t.value["@timestamp"] for t in got if t.value] == [1_700_000_000_000 + i for i in range(3)]


def test_follow_runs_past_the_first_end_and_commits_positions_to_the_group(
    kafka_broker: Broker, json_topic: tuple[str, list[tuple[int, dict[str, Any]]]]
) -> None:
    topic, purchases = json_topic
    group = f"cec-test-{uuid.uuid4().hex[:8]}"
    now = [0.0]
    source = _source(
        kafka_broker, topic, follow=True, group_id=group, clock=lambda: now[0], commit_interval_s=10
    )
    try:
        source.seek([0, 0, 0])
        got = poll_until(source, lambda out: len(out) >= len(purchases))
        assert len(got) == len(purchases)
        assert source.poll(64) == []  # at the live end: nothing yet, but not ended
        assert source.committed_positions() is None  # the injected clock has not reached the interval
        now[0] = 11.0
        more = make_purchases(12, keys=30, partitions=3, seed=5)
        produce(kafka_broker.bootstrap, topic, encoded(more, as_json))
        got += poll_until(source, lambda out: len(out) >= len(more))
    finally:
        source.close()  # commits synchronously
    ends = [len(expected(purchases)[p]) + len(expected(more).get(p, [])) for p in range(3)]
    assert len(got) == len(purchases) + len(more)
    monitor = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": group})
    try:
        committed = monitor.committed([TopicPartition(topic, p) for p in range(3)], timeout=30)
    finally:
        monitor.close()
    assert [tp.offset for tp in committed] == ends


def _delete_head(broker: Broker, topic: str, partition: int, before: int) -> bool:
    """delete_records on the broker; False where it is not supported (Tansu 0.6 drops the connection:
    the request fails with a transport error and nothing is deleted)."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    try:
        for future in admin.delete_records(
            [TopicPartition(topic, partition, before)], request_timeout=10
        ).values():
            future.result()
    except KafkaException:
        return False
    return True


def test_a_deleted_head_reads_from_the_log_start_and_a_replay_below_is_an_error_log_start_stood_in_on_tansu(
    kafka_broker: Broker, json_topic: tuple[str, list[tuple[int, dict[str, Any]]]]
) -> None:
    """On Apache Kafka (KAFKA_BOOTSTRAP_SERVERS, testcontainers) the head is really deleted with
    delete_records. Tansu 0.6 cannot delete records: it drops the connection on DeleteRecords
    (_TRANSPORT), and re-checked with every call form the client has (request_timeout alone,
    operation_timeout 0 and 5, offset OFFSET_END) it fails the same way or then finds no leader; its CLI
    has no record deletion either. So on Tansu only the broker's answer "log start = 20" is stood in
    (`DeletedHead._log_starts`); the reads, the bounds and the retention check are the real code."""
    topic, purchases = json_topic
    want = expected(purchases)
    deleted = _delete_head(kafka_broker, topic, 0, 20)
    if kafka_broker.kind == "tansu":
        assert not deleted, "Tansu now supports delete_records: drop the stand-in below"
    original = _source(
        kafka_broker, topic, start_offsets=[0, 0, 0], end_offsets=[len(want[p]) for p in range(3)]
    )
    original.close()

    class DeletedHead(KafkaTopicSource):
        """Where the broker cannot delete records (Tansu), the log start it would report after
        delete_records(partition 0, before=20) stands in for its answer; everything else is the broker's."""

        def _log_starts(self) -> list[int]:
            starts = super()._log_starts()
            return [20 if g == 0 else s for g, s in zip(self.global_partitions, starts, strict=True)]

    cls = KafkaTopicSource if deleted else DeletedHead
    # A run that first starts now: its input starts at the log start, and it reads from there.
    starts = [20, 0, 0]
    fresh = cls(
        kafka_broker.bootstrap,
        topic,
        fmt="json",
        key_field="item",
        value_field="price",
        start_offsets=None if deleted else starts,
        end_offsets=original.bounds.ends,
    )
    try:
        assert list(fresh.bounds.starts) == starts
        fresh.seek([0, 0, 0])
        got = by_partition(drain(fresh))
    finally:
        fresh.close()
    assert got == {0: want[0][20:], 1: want[1], 2: want[2]}
    # A run that started before the deletion and must now replay partition 0 from offset 5: a clear error.
    replay = cls(
        kafka_broker.bootstrap,
        topic,
        fmt="json",
        key_field="item",
        value_field="price",
        **original.bounds.as_dict(),
    )
    try:
        with pytest.raises(RetentionError) as err:
            replay.seek([5, 0, 0])
        replay.seek([20, 0, 0])  # from the log start on, the replay is possible
    finally:
        replay.close()
    assert str(err.value) == (
        f"input retention shorter than the replay needs: topic {topic!r} partition 0 needs offset 5, "
        "but its log starts at 20"
    )


def test_missing_topic_is_one_clear_error(kafka_broker: Broker) -> None:
    from operators.exceptions import TopicSourceError

    with pytest.raises(TopicSourceError, match=r"input topic 'nope-.*' does not exist"):
        _source(kafka_broker, _topic("nope"))


def test_json_dumps_of_identity_is_plain_data(kafka_broker: Broker, json_topic: tuple[str, Any]) -> None:
    source = _source(kafka_broker, json_topic[0])
    source.close()
    assert json.loads(json.dumps(source.identity()))["topic"] == json_topic[0]


def test_csv_and_cec_formats_through_the_job_source_spec(kafka_broker: Broker, tmp_path: Any) -> None:
    from operators.job import JobSpec, build_source, run_job, source_partitions
    from operators.sources import PurchaseGenerator
    from queuestore.sqlite import SqliteQueueStore

    unused_store = SqliteQueueStore(tmp_path / "unused")  # topic sources do not read the job's store
    try:
        csv_topic = _topic("purchases-csv")
        create_topic(kafka_broker.bootstrap, csv_topic, 2)
        produce(
            kafka_broker.bootstrap,
            csv_topic,
            [(1, b"a", b"a,2.5,7"), (1, b"a", b"a,1"), (0, b"b", b'"b,x",3,8\n')],
        )
        spec = {"type": "topic", "bootstrap_servers": kafka_broker.bootstrap, "topic": csv_topic, "format": "csv",
                "columns": ["item", "price", "ts"], "key_field": "item", "value_field": "price"}  # fmt: skip
        assert source_partitions(spec, unused_store) == 2
        source = build_source(spec, unused_store)
        assert isinstance(source, KafkaTopicSource)
        try:
            source.seek([0, 0])
            got = by_partition(drain(source))
        finally:
            source.close()
        assert got == {
            0: [(0, {"item": "b,x", "price": "3", "ts": "8"})],
            1: [(0, {"item": "a", "price": "2.5", "ts": "7"}), (1, "CSV line has 2 fields, expected 3")],
        }

        # A cec queue written by a cec filter (R payloads, G-open-free stateless output, then EOS).
        queue = _topic("cec-queue")
        store = {
            "type": "kafka",
            "bootstrap_servers": kafka_broker.bootstrap,
            "state_dir": str(tmp_path / "kafka"),
        }
        run_job(
            JobSpec(
                operator={
                    "type": "filter",
                    "field": "item_price",
                    "op": ">",
                    "value": 0,
                    "schema": "purchase",
                },
                source={"type": "generator", "count": 200, "keys": 20, "bad_every": 4},
                store=store,
                output_topic=queue,
            )
        )
        cec_spec = {"type": "topic", "bootstrap_servers": kafka_broker.bootstrap, "topic": queue, "format": "cec",
                    "schema": "purchase", "state_dir": str(tmp_path / "reader")}  # fmt: skip
        cec_source = build_source(cec_spec, unused_store)
        try:
            cec_source.seek([0])
            values = []
            deadline = time.monotonic() + _DEADLINE_S
            while (batch := cec_source.poll(64)) is not None:
                assert time.monotonic() < deadline
                values += [t.value for t in batch]
        finally:
            cec_source.close()
        gen = PurchaseGenerator(200, 20, bad_every=4)
        want = [gen.tuple_at(0, o) for o in range(200)]
        assert values == [v for v in want if v["item_price"]] and len(values) < 200
    finally:
        unused_store.close()
