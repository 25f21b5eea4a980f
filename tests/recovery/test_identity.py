"""A log belongs to one input: identities of sources, where a log keeps its own, and `bind_log`'s rules."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from operators.base import InputTuple
from operators.job import JobSpec, run_job
from operators.sources import CsvSource, InputChangedError, InputSource, PurchaseGenerator, QueueSource
from queuestore.base import QueueStore
from queuestore.sqlite import SqliteQueueStore
from recovery.exceptions import InputMismatchError
from recovery.identity import ATTACHMENT, bind_log, check_log, differences
from tests.conftest import StoreBackend
from tests.helpers import results


# -- sources state their identity ----------------------------------------------------------------------
def test_a_csv_is_its_content_not_its_name(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_bytes(b"k,v\na,1\nb,2\n")
    (tmp_path / "b.csv").write_bytes(b"k,v\na,1\nb,2\n")
    (tmp_path / "c.csv").write_bytes(b"k,v\na,1\nb,3\n")  # same size, one byte differs
    ids = {}
    for name in ("a", "b", "c"):
        source = CsvSource(tmp_path / f"{name}.csv")
        ids[name] = source.identity()
        source.close()
    assert ids["a"] == ids["b"]
    assert ids["a"]["bytes"] == ids["c"]["bytes"] and ids["a"] != ids["c"]
    assert ids["a"]["type"] == "csv" and len(ids["a"]["sha256"]) == 64


def test_a_csv_edited_in_place_while_being_read_stops_the_source(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_text("k,v\n" + "".join(f"a,{i}\n" for i in range(10)))
    source = CsvSource(path)
    try:
        source.identity()
        assert source.poll(3)
        with path.open("r+") as f:  # same size, and an mtime the source has not seen
            f.seek(4)
            f.write("b")
        os.utime(path, ns=(0, 1))
        with pytest.raises(InputChangedError, match="changed while it was being read"):
            source.poll(3)
    finally:
        source.close()


def test_a_csv_replaced_by_rename_is_read_as_it_was_opened(tmp_path: Path) -> None:
    """Editors save by writing a new file and renaming it: the open source keeps reading what it
    fingerprinted, so its identity stays true to what it yields."""
    path = tmp_path / "in.csv"
    path.write_text("k,v\na,1\n")
    source = CsvSource(path)
    try:
        before = source.identity()
        (tmp_path / "new.csv").write_text("k,v\nz,9\n")
        os.replace(tmp_path / "new.csv", path)
        batch = source.poll(10)
        assert batch is not None and [t.value for t in batch] == [{"k": "a", "v": "1"}]
        assert source.identity() == before
    finally:
        source.close()


def test_generator_identity_covers_every_parameter_and_the_partitions_read() -> None:
    base = PurchaseGenerator(100, 10, seed=1, partitions=2).identity()
    assert PurchaseGenerator(100, 10, seed=1, partitions=2).identity() == base
    for other in (
        PurchaseGenerator(100, 10, seed=2, partitions=2),
        PurchaseGenerator(101, 10, seed=1, partitions=2),
        PurchaseGenerator(100, 10, seed=1, partitions=2, invalid_every=5),
        PurchaseGenerator(100, 10, seed=1, partitions=2, only=[1]),
    ):
        assert other.identity() != base


def test_queue_identity_names_store_topic_partitions(store_backend: StoreBackend) -> None:
    store = store_backend()
    topic = store_backend.topic("in")
    store.create_topic(topic, 3)
    from operators.sources import PURCHASE_SCHEMA

    source = QueueSource(store, topic, PURCHASE_SCHEMA, [1])
    try:
        ident = source.identity()
    finally:
        source.close()
    assert ident["topic"] == topic and ident["partitions"] == 3 and ident["read"] == [1]
    assert ident["store"]["type"] == ("kafka" if store_backend.name == "kafka" else "SqliteQueueStore")
    if store_backend.name == "kafka":
        assert ident["store"]["cluster"]


# -- the log keeps it: attachments on both backends ------------------------------------------------------
def test_attachments_are_kept_with_the_log(store_backend: StoreBackend) -> None:
    store = store_backend()
    topic = store_backend.topic()
    store.create_topic(topic, 2)
    assert store.read_attachment(topic, 0, "input") is None
    store.write_attachment(topic, 0, "input", b"first")
    store.write_attachment(topic, 1, "input", b"other partition")
    store.write_attachment(topic, 0, "input", b"second")
    assert store.read_attachment(topic, 0, "input") == b"second"
    assert store.read_attachment(topic, 1, "input") == b"other partition"
    assert store.read_attachment(topic, 0, "something-else") is None
    # Another host, or a fresh --store-dir on the same broker: the attachment is with the log, not the state dir.
    if store_backend.name == "kafka":
        from queuestore.kafka import KafkaQueueStore

        assert store_backend.bootstrap is not None
        elsewhere = KafkaQueueStore(store_backend.bootstrap, store_backend.root.parent / "another-state-dir")
        try:
            assert elsewhere.read_attachment(topic, 0, "input") == b"second"
        finally:
            elsewhere.close()
    else:
        assert store_backend().read_attachment(topic, 0, "input") == b"second"


def test_attachment_names_are_checked(sqlite_store: SqliteQueueStore) -> None:
    sqlite_store.create_topic("t", 1)
    with pytest.raises(Exception, match="invalid attachment name"):
        sqlite_store.write_attachment("t", 0, "../escape", b"x")


# -- bind_log: record on an empty log, check on resume -----------------------------------------------------
def _bind(store: QueueStore, log_end: int, ident: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
    return bind_log(store, "out", 0, log_end=log_end, input_identity=ident, operator={"agg": "avg"}, **kw)


def test_an_empty_log_is_bound_to_the_input_it_starts_with(sqlite_store: SqliteQueueStore) -> None:
    sqlite_store.create_topic("out", 1)
    assert _bind(sqlite_store, 0, {"type": "csv", "sha256": "aa"}) == {"type": "csv", "sha256": "aa"}
    recorded = json.loads(sqlite_store.read_attachment("out", 0, ATTACHMENT) or b"")
    assert recorded == {"format": 1, "input": {"type": "csv", "sha256": "aa"}, "operator": {"agg": "avg"}}
    # Still empty (e.g. killed before its first record): nothing in it came from "aa", so it is rebound.
    assert _bind(sqlite_store, 0, {"type": "csv", "sha256": "bb"})["sha256"] == "bb"
    assert _bind(sqlite_store, 5, {"type": "csv", "sha256": "bb"})["sha256"] == "bb"


def test_resuming_against_another_input_is_a_clear_error(sqlite_store: SqliteQueueStore) -> None:
    sqlite_store.create_topic("out", 1)
    _bind(sqlite_store, 0, {"type": "csv", "sha256": "aa" * 32, "bytes": 10})
    with pytest.raises(InputMismatchError) as err:
        _bind(sqlite_store, 7, {"type": "csv", "sha256": "bb" * 32, "bytes": 10})
    message = str(err.value)
    assert "\n" not in message
    assert f"out[0] in {sqlite_store.root} was built from another input" in message
    assert "input.sha256: " in message and "in the log" in message and "input.bytes" not in message
    assert "to start fresh, use a new --store-dir or delete topic 'out'" in message


def test_resuming_with_another_operator_is_refused_too(sqlite_store: SqliteQueueStore) -> None:
    sqlite_store.create_topic("out", 1)
    _bind(sqlite_store, 0, {"type": "csv", "sha256": "aa"})
    with pytest.raises(InputMismatchError, match=r"another operator \(operator.agg: \"avg\" in the log"):
        bind_log(sqlite_store, "out", 0, log_end=3, input_identity={"type": "csv", "sha256": "aa"},
                 operator={"agg": "sum"})  # fmt: skip


def test_a_log_without_a_recorded_input_is_not_resumed(sqlite_store: SqliteQueueStore) -> None:
    sqlite_store.create_topic("out", 1)
    with pytest.raises(InputMismatchError, match="no record of the input it was built from"):
        _bind(sqlite_store, 3, {"type": "csv", "sha256": "aa"})
    sqlite_store.write_attachment("out", 0, ATTACHMENT, b"{not json")
    with pytest.raises(InputMismatchError, match="unreadable"):
        _bind(sqlite_store, 3, {"type": "csv", "sha256": "aa"})


def test_pinned_fields_come_from_the_log(sqlite_store: SqliteQueueStore) -> None:
    """A bounded run's end positions are fixed at its first start: a restart stops at the same place
    although the topic has grown, and they are never a reason to refuse the log."""
    sqlite_store.create_topic("out", 1)
    first = {"type": "topic", "topic": "in", "end": [10, 20]}
    _bind(sqlite_store, 0, first, pinned=("end",))
    grown = {"type": "topic", "topic": "in", "end": [15, 40]}
    assert _bind(sqlite_store, 4, grown, pinned=("end",)) == first
    with pytest.raises(InputMismatchError, match=r"input\.topic"):
        _bind(sqlite_store, 4, {**grown, "topic": "other"}, pinned=("end",))


def test_differences_are_named_field_by_field() -> None:
    assert differences({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 3}, "d": 4}) == [
        "b.c: 2 in the log, 3 now",
        "d: none in the log, 4 now",
    ]
    assert differences({"a": [1, 2]}, {"a": [1, 2]}) == []


class _BoundedSource(InputSource):
    """A source with a pinned end (what a bounded topic run does): yields offsets below `end`."""

    partitions = 1
    pinned_fields: ClassVar[tuple[str, ...]] = ("end",)

    def __init__(self, end: int) -> None:
        self.end = end
        self._next = 0

    def describe(self) -> str:
        return "bounded"

    def identity(self) -> dict[str, Any]:
        return {"type": "bounded", "end": [self.end]}

    def pin(self, recorded: Mapping[str, Any]) -> None:
        self.end = int(recorded["end"][0])

    def seek(self, positions: Sequence[int]) -> None:
        self._next = positions[0]

    def poll(self, max_records: int) -> list[InputTuple] | None:
        if self._next >= self.end:
            return None
        o, self._next = self._next, self._next + 1
        return [InputTuple(0, o, {"k": "a", "v": 1})]


def test_run_job_pins_a_bounded_source_to_the_end_it_started_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import operators.job_runner as job_module

    ends = iter([6, 50])  # the first start sees 6 tuples; by the restart the input has grown
    sources: list[_BoundedSource] = []

    def build(spec: Mapping[str, Any], store: QueueStore) -> InputSource:
        sources.append(_BoundedSource(next(ends)))
        return sources[-1]

    monkeypatch.setattr(job_module, "build_source", build)
    spec = JobSpec(
        operator={"type": "aggregate", "key_field": "k", "value_field": "v", "agg": "sum", "window_count": 2},
        source={"type": "generator", "count": 0, "keys": 1},  # a valid spec; `build` gives the source
        store={"type": "sqlite", "root": str(tmp_path)},
        output_topic="out",
        batch_size=1,
    )
    run_job(spec, max_inputs=3)  # stopped midway: a log without EOS, as a crash leaves it
    run_job(spec)
    assert sources[1].end == 6
    assert [r["value"] for r in results(SqliteQueueStore(tmp_path), "out")] == [2.0, 2.0, 2.0]


# -- run_job: a queue-source job whose input topic is swapped ----------------------------------------------
def _upstream(store_spec: dict[str, Any], topic: str, seed: int) -> None:
    run_job(
        JobSpec(
            operator={"type": "filter", "field": "item_price", "op": ">", "value": 0, "schema": "purchase"},
            source={"type": "generator", "count": 300, "keys": 20, "seed": seed},
            store=store_spec,
            output_topic=topic,
        )
    )


def test_a_queue_job_refuses_a_swapped_input_topic(store_backend: StoreBackend) -> None:
    spec_store = store_backend.spec
    up_a, up_b, out = store_backend.topic("up-a"), store_backend.topic("up-b"), store_backend.topic("agg")
    _upstream(spec_store, up_a, seed=1)
    _upstream(spec_store, up_b, seed=2)

    def job(upstream: str) -> JobSpec:
        return JobSpec(
            operator={"type": "aggregate", "key_field": "item_id", "value_field": "item_price",
                      "agg": "avg", "window_count": 4},
            source={"type": "queue", "topic": upstream, "schema": "purchase"},
            store=spec_store,
            output_topic=out,
            batch_size=1,
        )  # fmt: skip

    run_job(job(up_a), max_inputs=100)  # killed midway, as far as the log can tell
    before = results(store_backend(), out)
    with pytest.raises(InputMismatchError) as err:
        run_job(job(up_b))
    message = str(err.value)
    assert f"{out}[0]" in message and "another input" in message and "input.topic" in message
    assert f"delete topic {out!r}" in message
    assert results(store_backend(), out) == before  # nothing was written
    run_job(job(up_a))  # the right input resumes
    run_job(job(up_a))  # and a finished log stays finished
    assert len(results(store_backend(), out)) > len(before)


def test_check_log_only_looks(sqlite_store: SqliteQueueStore) -> None:
    sqlite_store.create_topic("out", 1)
    ident = {"type": "csv", "sha256": "aa"}
    assert check_log(sqlite_store, "out", 0, log_end=0, input_identity=ident) is None
    assert sqlite_store.read_attachment("out", 0, ATTACHMENT) is None  # nothing recorded
    bind_log(sqlite_store, "out", 0, log_end=0, input_identity=ident)
    assert check_log(sqlite_store, "out", 0, log_end=2, input_identity=ident) == ident
    with pytest.raises(InputMismatchError):
        check_log(sqlite_store, "out", 0, log_end=2, input_identity={"type": "csv", "sha256": "bb"})
