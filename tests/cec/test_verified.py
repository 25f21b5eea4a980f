"""Readers verify before they trust (cec/verified.py): every reader of an output log checks a record's
checksum before it filters by kind, and a missing offset of a dense log is damage. The damage is done to
a real operator's log the way a failing disk would: a stored kind flipped (R -> Q), a row hidden."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cec.config import Checkpointing
from cec.records import Kind, OutputRecord, RecordCodec
from cec.verified import LogVerifier, verified_records
from operators.aggregate import RESULT_SCHEMA
from operators.base import DEAD_LETTER_SCHEMA
from operators.job import JobSpec, run_job
from operators.sinks import count_kinds, iter_payloads
from operators.sources import QueueSource
from queuestore.chunks import PART_KIND
from queuestore.exceptions import DamagedLogError
from queuestore.output import OutputQueue
from queuestore.sqlite import SqliteQueueStore
from tests.helpers import flip_stored_kind, hide_row, log_records, set_stored_kind

TOPIC = "agg"


def _aggregate_log(root: Path) -> tuple[SqliteQueueStore, list[OutputRecord]]:
    """A finished aggregate's log: results, G-opens, G-checks, dead letters, EOS."""
    spec = JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "sum",
            "window_count": 4,
        },
        source={"type": "generator", "count": 300, "keys": 7, "seed": 5, "invalid_every": 9},
        store={"type": "sqlite", "root": str(root)},
        output_topic=TOPIC,
        checkpointing=Checkpointing(q_target=5, ci_ms=10.0, cp_ms=10.0),
    )
    run_job(spec)
    store = SqliteQueueStore(root)
    return store, log_records(store, TOPIC)


def _middle(records: list[OutputRecord], kind: Kind) -> int:
    offsets = [i for i, r in enumerate(records) if r.kind is kind]
    return offsets[len(offsets) // 2]


def _drain(source: QueueSource) -> int:
    n = 0
    while (batch := source.poll(64)) is not None:
        n += len(batch)
    return n


def test_an_intact_log_reads_back_every_record(tmp_path: Path) -> None:
    store, records = _aggregate_log(tmp_path)
    with store.reader(TOPIC, 0) as reader:
        got = list(verified_records(reader, decode={Kind.R.value}))
    assert [v.offset for v in got] == list(range(len(records)))
    assert [v.meta for v in got] == [r.meta() for r in records]
    assert all((v.record is not None) == (v.meta.kind == "R") for v in got)
    assert count_kinds(store, TOPIC)[Kind.R.value] == sum(r.kind is Kind.R for r in records)


def test_a_result_whose_stored_kind_is_flipped_is_an_error_for_every_reader(tmp_path: Path) -> None:
    store, records = _aggregate_log(tmp_path)
    target = _middle(records, Kind.R)
    assert flip_stored_kind(tmp_path, TOPIC, target) == "Q"
    where = f"{tmp_path}/{TOPIC}/0.sqlite: {TOPIC}\\[0\\] offset {target} is damaged"
    # A reader that filtered by kind first would drop it silently (the result would just be missing).
    with pytest.raises(DamagedLogError, match=where):
        list(iter_payloads(store, TOPIC, RESULT_SCHEMA))
    with pytest.raises(DamagedLogError, match=where):  # dead letters: checked before filtering as well
        list(iter_payloads(store, TOPIC, DEAD_LETTER_SCHEMA, Kind.DEAD))
    with pytest.raises(DamagedLogError, match=where):
        count_kinds(store, TOPIC)
    source = QueueSource(store, TOPIC, RESULT_SCHEMA)
    try:
        with pytest.raises(DamagedLogError, match=where):
            _drain(source)
    finally:
        source.close()


def test_a_hidden_row_is_an_offset_gap_for_every_reader(tmp_path: Path) -> None:
    store, records = _aggregate_log(tmp_path)
    target = _middle(records, Kind.GOPEN)  # a control tuple: a reader of results would never look at it
    hide_row(tmp_path, TOPIC, target)
    where = f"{tmp_path}/{TOPIC}/0.sqlite: {TOPIC}\\[0\\] offset {target} is missing"
    with pytest.raises(DamagedLogError, match=where):
        list(iter_payloads(store, TOPIC, RESULT_SCHEMA))
    with pytest.raises(DamagedLogError, match=where):
        count_kinds(store, TOPIC)
    source = QueueSource(store, TOPIC, RESULT_SCHEMA)
    try:
        with pytest.raises(DamagedLogError, match=where):
            _drain(source)
        source.seek([target])  # resuming right at the hole: the first record read must be that offset
        with pytest.raises(DamagedLogError, match=where):
            source.poll(64)
    finally:
        source.close()
    with store.reader(TOPIC, 0) as reader:  # the scans themselves, in both directions
        with pytest.raises(DamagedLogError, match=where):
            list(reader.scan_forward(0, chunk=7))
        with pytest.raises(DamagedLogError, match=where):
            list(reader.scan_backward(chunk=7))


def test_offsets_that_need_not_be_dense_are_no_damage(tmp_path: Path) -> None:
    """A store without dense offsets (Kafka with transaction markers) may skip offsets."""
    store, records = _aggregate_log(tmp_path)
    hide_row(tmp_path, TOPIC, _middle(records, Kind.GOPEN))
    store.dense_offsets = False
    results = list(iter_payloads(store, TOPIC, RESULT_SCHEMA))
    assert len(results) == sum(r.kind is Kind.R for r in records)


def test_a_record_damaged_into_a_part_is_an_error(tmp_path: Path) -> None:
    store, records = _aggregate_log(tmp_path)
    target = _middle(records, Kind.R)
    set_stored_kind(tmp_path, TOPIC, target, PART_KIND)
    with pytest.raises(DamagedLogError, match=f"offset {target} is damaged: stored as a part"):
        list(iter_payloads(store, TOPIC, RESULT_SCHEMA))


def test_a_queue_source_still_delivers_an_intact_log(tmp_path: Path) -> None:
    store, records = _aggregate_log(tmp_path)
    source = QueueSource(store, TOPIC, RESULT_SCHEMA)
    try:
        assert _drain(source) == sum(r.kind is Kind.R for r in records)
    finally:
        source.close()


def test_chunked_values_are_joined_across_read_batches(tmp_path: Path) -> None:
    """Values written in parts, read in batches that cut through them, or starting in the middle of
    one: every value comes back whole and checked."""
    store = SqliteQueueStore(tmp_path, max_record_bytes=200)
    store.create_topic("big", 1)
    codec = RecordCodec()
    written = [
        OutputRecord(Kind.GCHECK, i, (i,), 1, "k", 0, os.urandom(150 * (i % 4)), None) for i in range(12)
    ]
    output = OutputQueue(store, "big", 0)
    for rec in written:
        output.append(codec.encode(rec), rec.meta())
    output.close()
    with store.reader("big", 0) as reader:
        end = reader.end_offset()
        for batch in (1, 2, 3, 5, 64):
            verifier = LogVerifier(reader, codec, decode={Kind.GCHECK.value})
            verifier.seek(0)
            got = []
            for start in range(0, end, batch):
                got.extend(v.record for v in verifier.check(reader.read_forward(start, batch)))
            assert got == written, f"batches of {batch}"
        part = next(r.offset for r in reader.read_forward(0, end) if r.meta.kind == PART_KIND)
        verifier = LogVerifier(reader, codec, decode={Kind.GCHECK.value})
        verifier.seek(part + 1)  # inside a value's parts: its manifest fetches the ones before
        tail = [v.record for v in verifier.check(reader.read_forward(part + 1, end))]
        assert tail == written[-len(tail) :] and tail


def test_batches_are_checked_in_one_pass_and_give_what_record_by_record_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of plain records (a queue source's read, replay after a crash included) is verified and
    decoded in C, with exactly the result of the record-by-record path; damage in a batch still makes the
    batch go record by record, which names the first damaged offset (the tests above)."""
    import cec.verified

    store, records = _aggregate_log(tmp_path)
    with store.reader(TOPIC, 0) as reader:
        stored = reader.read_forward(0, len(records))
        by_record = LogVerifier(reader, decode={Kind.R.value})
        by_record.seek(0)
        one_by_one = [v for s in stored for v in by_record.check(iter([s]))]
        if cec.verified.native is None:
            pytest.skip("the C accelerator is not built")

        def per_record(*args: object, **kwargs: object) -> OutputRecord:
            raise AssertionError("a plain batch was decoded record by record")

        monkeypatch.setattr(RecordCodec, "decode", per_record)
        batched = LogVerifier(reader, decode={Kind.R.value})
        batched.seek(0)
        assert list(batched.check(stored)) == one_by_one
        assert len(one_by_one) == len(records)


def test_rows_are_checked_as_records_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`check_rows` (a queue source's reads: flat rows, no object per record) gives, for a plain batch
    in two C calls, exactly the (offset, kind, record) that `check` gives; a batch with parts or damage
    goes through `check` (the damage tests above read through the queue source, hence through here)."""
    import cec.verified

    store, records = _aggregate_log(tmp_path)
    with store.reader(TOPIC, 0) as reader:
        stored = reader.read_forward(0, len(records))
        rows = reader.read_forward_rows(0, len(records))
        assert rows == [(s.offset, *s.meta, s.value) for s in stored]
        by_record = LogVerifier(reader, decode={Kind.R.value})
        by_record.seek(0)
        want = [(v.offset, v.meta.kind, v.record) for v in by_record.check(stored)]
        assert len(want) == len(records) and any(r is not None for _, _, r in want)
        if cec.verified.native is not None:

            def per_record(*args: object, **kwargs: object) -> OutputRecord:
                raise AssertionError("a plain batch was decoded record by record")

            monkeypatch.setattr(RecordCodec, "decode", per_record)
        verifier = LogVerifier(reader, decode={Kind.R.value})
        verifier.seek(0)
        assert list(verifier.check_rows(rows)) == want
        # The next batch must start where this one ended (dense store): a gap is not plain.
        assert verifier._plain_rows(rows[2:4]) is None
