"""The recovery rules at every possible crash point, deterministically.

The property test SIGKILLs at random points; this one stops the operator after each input tuple k in turn
(everything produced so far durable, nothing after), resumes it with a fresh runtime, and requires the
failure-free output. Exhaustive over k, so off-by-one errors at the crash point cannot hide. It also
checks EC reconstruction against damaged footprints.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cec.config import Checkpointing
from cec.records import AvroCodec, Kind, RecordCodec
from operators.aggregate import RESULT_SCHEMA
from operators.job import JobSpec, run_job
from queuestore.exceptions import DamagedLogError
from queuestore.sqlite import SqliteQueueStore
from recovery.eventual import EventualCheckpointBuilder
from recovery.exceptions import RecoveryError
from tests.helpers import (
    copy_input_identity,
    hide_row,
    log_records,
    one_calibration_per_module,
    results,
    set_stored_kind,
)
from tests.queuestore.damage import corrupt_record


@pytest.fixture(scope="module", autouse=True)
def _one_calibration() -> Iterator[None]:
    """Hundreds of short runs here, each of which would calibrate the EC rates at its start."""
    yield from one_calibration_per_module()


def _spec(
    root: Path,
    *,
    count: int = 60,
    keys: int = 4,
    window: int = 3,
    q: int | None = 2,
    partitions: int = 1,
    timed: bool = False,
) -> JobSpec:
    win: dict[str, Any] = (
        {"window_ms": window * 5, "time_field": "item_time"} if timed else {"window_count": window}
    )
    return JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "sum",
            **win,
        },
        source={
            "type": "generator",
            "count": count,
            "keys": keys,
            "seed": 11,
            "partitions": partitions,
            "invalid_every": 6,
        },
        store={"type": "sqlite", "root": str(root)},
        output_topic="agg",
        # CI = CP: no budget limit, G-checks as often as the policy asks
        checkpointing=Checkpointing(q_target=q, ci_ms=10.0, cp_ms=10.0),
        batch_size=1,
    )


def _run_until(spec: JobSpec, inputs: int | None) -> None:
    """Run in this process; stop after `inputs` tuples with all output durable, as a crash right there."""
    run_job(spec, max_inputs=inputs)


@pytest.mark.parametrize(
    "shape",
    [
        {"window": 1},
        {"window": 3},
        {"window": 3, "q": None},
        {"window": 4, "partitions": 2},
        {"window": 3, "timed": True},
    ],
    ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()),
)
def test_resume_after_every_possible_crash_point(tmp_path: Path, shape: dict[str, Any]) -> None:
    reference = _spec(tmp_path / "ref", **shape)
    run_job(reference)
    want = results(SqliteQueueStore(tmp_path / "ref"), "agg")
    want_dead = results(SqliteQueueStore(tmp_path / "ref"), "agg", Kind.DEAD)
    assert want and want_dead, "the workload must produce results and dead letters"
    total = reference.source["count"]
    for k in range(1, total):
        spec = _spec(tmp_path / f"stop{k}", **shape)
        _run_until(spec, k)
        _run_until(spec, k + 7)  # a second crash after recovery, before or after catching up
        _run_until(spec, None)
        got = results(SqliteQueueStore(spec.store["root"]), "agg")
        got_dead = results(SqliteQueueStore(spec.store["root"]), "agg", Kind.DEAD)
        if shape.get("partitions", 1) == 1:
            assert (got, got_dead) == (want, want_dead), f"stopped after {k} tuples"
        else:
            assert sorted(map(repr, got)) == sorted(map(repr, want)), f"stopped after {k} tuples"
            assert sorted(map(repr, got_dead)) == sorted(map(repr, want_dead)), f"stopped after {k} tuples"


def _crashed_log(tmp_path: Path, q: int | None = 3) -> tuple[JobSpec, SqliteQueueStore, list[Any]]:
    spec = _spec(tmp_path / "log", count=200, keys=5, window=6, q=q)
    _run_until(spec, 120)
    store = SqliteQueueStore(spec.store["root"])
    return spec, store, log_records(store, "agg")


def _results_past(store: SqliteQueueStore, damaged: set[int]) -> list[dict[str, Any]]:
    """The results of a log whose only damage is the footprints a test damaged itself, passing over
    exactly those: what the results reader gives for an intact log (it refuses a damaged one)."""
    codec, payloads = RecordCodec(), AvroCodec(RESULT_SCHEMA)
    out = []
    with store.reader("agg", 0) as reader:
        for stored in reader.scan_forward(0):
            if stored.offset in damaged:
                continue
            codec.verify(stored.value, stored.meta)
            if stored.meta.kind == Kind.R.value:
                out.append(payloads.decode(codec.decode(stored.value, stored.meta).payload or b""))
    return out


def test_damaged_g_check_falls_back_to_an_older_footprint(tmp_path: Path) -> None:
    reference = _spec(tmp_path / "ref", count=200, keys=5, window=6, q=3)
    run_job(reference)
    want = results(SqliteQueueStore(tmp_path / "ref"), "agg")

    spec, store, records = _crashed_log(tmp_path)
    with store.reader("agg", 0) as reader:
        before = EventualCheckpointBuilder(reader).build()
    # Damage the latest footprint of every window in the EC that has an older footprint to fall back to.
    damaged = []
    for key, fp in before.windows.items():
        older = [
            i
            for i, r in enumerate(records[: fp.offset])
            if r.key == key and r.seq == fp.record.seq and r.kind in (Kind.GOPEN, Kind.GCHECK)
        ]
        if older:
            corrupt_record(store, "agg", 0, fp.offset)
            damaged.append((key, fp.offset, older[-1]))
    assert damaged, "the workload must give some window more than one footprint"
    with store.reader("agg", 0) as reader:
        after = EventualCheckpointBuilder(reader).build()
    assert after.corrupt_skipped == len(damaged)
    for key, bad_offset, older_offset in damaged:
        assert after.windows[key].offset == older_offset != bad_offset
    assert after.extent_size >= before.extent_size  # longer replay...

    _run_until(spec, None)
    assert _results_past(store, {o for _, o, _ in damaged}) == want  # ...same result
    # Recovery may pass over a damaged footprint; a results reader may not (it cannot know the damaged
    # record is not a result): it names the first one.
    first = min(o for _, o, _ in damaged)
    with pytest.raises(DamagedLogError, match=f"agg\\[0\\] offset {first} is damaged"):
        results(store, "agg")


def test_damaged_newest_footprint_moves_the_crash_point_back_safely(tmp_path: Path) -> None:
    reference = _spec(tmp_path / "ref", count=200, keys=5, window=6, q=3)
    run_job(reference)
    want = results(SqliteQueueStore(tmp_path / "ref"), "agg")
    spec, store, records = _crashed_log(tmp_path)
    last = len(records) - 1
    while records[last].kind not in (Kind.GOPEN, Kind.GCHECK):
        last -= 1
    damaged = set()
    for offset in range(last, len(records)):
        if records[offset].kind in (Kind.GOPEN, Kind.GCHECK):
            corrupt_record(store, "agg", 0, offset)
            damaged.add(offset)
    _run_until(spec, None)
    assert _results_past(store, damaged) == want


def test_damaged_g_open_without_fallback_is_a_clear_error(tmp_path: Path) -> None:
    _, store, records = _crashed_log(tmp_path)
    with store.reader("agg", 0) as reader:
        ec = EventualCheckpointBuilder(reader).build()
    key, fp = next(iter(ec.windows.items()))
    g_open = next(
        i for i, r in enumerate(records) if r.key == key and r.seq == fp.record.seq and r.kind is Kind.GOPEN
    )
    for i, r in enumerate(records):
        if r.key == key and r.seq == fp.record.seq and r.kind in (Kind.GOPEN, Kind.GCHECK):
            corrupt_record(store, "agg", 0, i)
    with (
        store.reader("agg", 0) as reader,
        pytest.raises(RecoveryError, match="open windows before the start"),
    ):
        EventualCheckpointBuilder(reader).build()
    assert g_open >= 0


def test_damaged_result_record_is_never_used(tmp_path: Path) -> None:
    _, store, records = _crashed_log(tmp_path, q=None)  # G-open only: a long extent
    with store.reader("agg", 0) as reader:
        ec = EventualCheckpointBuilder(reader).build()
    r_offset = max(i for i, r in enumerate(records) if r.kind is Kind.R)
    assert r_offset > ec.extent_start, "the workload must close a window inside the extent"
    corrupt_record(store, "agg", 0, r_offset, flip_at=10)
    with store.reader("agg", 0) as reader, pytest.raises(RecoveryError, match="damaged"):
        EventualCheckpointBuilder(reader).build()
    with pytest.raises(DamagedLogError, match=f"offset {r_offset} is damaged"):
        results(store, "agg")


def _copy_prefix(source: SqliteQueueStore, topic: str, target_root: Path, length: int) -> None:
    """A log holding the first `length` records of `topic`: what a crash right after the
    `length`-th record became durable leaves (the log is always a prefix of what was produced)."""
    target = SqliteQueueStore(target_root)
    target.create_topic(topic, 1)
    copy_input_identity(source, target, topic)
    with source.reader(topic, 0) as reader, target.writer(topic, 0) as writer:
        for stored in reader.read_forward(0, length):
            writer.append(stored.value, stored.meta)


@pytest.mark.parametrize(
    "shape",
    [{"window": 3, "timed": True}, {"window": 2, "timed": True, "q": None}, {"window": 3}],
    ids=["time,Q=2", "time,G-open-only", "count,Q=2"],
)
def test_recovery_from_every_prefix_of_the_log(tmp_path: Path, shape: dict[str, Any]) -> None:
    """Every crash point at record granularity, including between two records one tuple produced (a time
    window's R and the next window's G-open)."""
    reference = _spec(tmp_path / "ref", count=50, **shape)
    run_job(reference)
    ref_store = SqliteQueueStore(tmp_path / "ref")
    want = results(ref_store, "agg")
    want_dead = results(ref_store, "agg", Kind.DEAD)
    with ref_store.reader("agg", 0) as reader:
        length = reader.end_offset()
    for cut in range(1, length):
        root = tmp_path / f"cut{cut}"
        _copy_prefix(ref_store, "agg", root, cut)
        run_job(_spec(root, count=50, **shape))
        store = SqliteQueueStore(root)
        assert results(store, "agg") == want, f"log cut after {cut} records"
        assert results(store, "agg", Kind.DEAD) == want_dead, f"log cut after {cut} records"


def test_a_hidden_row_inside_the_extent_stops_recovery_naming_it(tmp_path: Path) -> None:
    """A SQLite row lost to damage leaves an offset gap: the EC scan reports it (store, topic[partition],
    offset) instead of rebuilding a checkpoint from a log with a hole, and a resumed run stops on it."""
    spec, store, records = _crashed_log(tmp_path, q=None)  # G-open only: a long extent
    with store.reader("agg", 0) as reader:
        ec = EventualCheckpointBuilder(reader).build()
    hidden = (ec.extent_start + ec.end_offset) // 2
    assert ec.extent_start < hidden < ec.end_offset - 1
    hide_row(spec.store["root"], "agg", hidden)
    where = f"{spec.store['root']}/agg/0.sqlite: agg\\[0\\] offset {hidden} is missing"
    with store.reader("agg", 0) as reader, pytest.raises(DamagedLogError, match=where):
        EventualCheckpointBuilder(reader).build()
    # Read back from the log: a restart with the EC cache (on by default) reads only the log's tail and
    # never meets a hole inside the extent, whose footprints it holds already (checked by checksum).
    with pytest.raises(DamagedLogError, match=where):
        _run_until(replace(spec, ec_cache=False), None)
    with store.reader("agg", 0) as reader:  # the resumed run appended nothing after the hole
        assert len(reader.read_forward(0, len(records) + 10)) == len(records) - 1


def test_a_result_damaged_into_a_part_inside_the_extent_is_an_error(tmp_path: Path) -> None:
    """Parts of chunked values are passed over by kind, but only once their shape says they are parts: a
    result whose stored kind became PART is damage, not a part (else its window would look open)."""
    spec, store, records = _crashed_log(tmp_path, q=None)  # G-open only: a long extent
    with store.reader("agg", 0) as reader:
        ec = EventualCheckpointBuilder(reader).build()
    r_offset = max(i for i, r in enumerate(records) if r.kind is Kind.R)
    assert r_offset > ec.extent_start
    set_stored_kind(spec.store["root"], "agg", r_offset, "PART")
    with (
        store.reader("agg", 0) as reader,
        pytest.raises(RecoveryError, match=f"offset {r_offset} is damaged \\(a record of kind 'PART'"),
    ):
        EventualCheckpointBuilder(reader).build()
