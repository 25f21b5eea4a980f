"""A stream index far behind its log (a fresh host: the state directory lost) is not rebuilt before the
operator starts: `OutputQueue(defer_index_above=...)` notes the gap, the records that become durable
meanwhile are held, and `catch_up_index` indexes the rest a slice at a time. At every step the index is
that of an exact prefix of the log, and once caught up it answers exactly what an index rebuilt from the
whole log answers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from queuestore.output import OutputQueue
from queuestore.sqlite import SqliteQueueStore
from tests.queuestore.test_index_damage import CODEC, TOPIC, _answers, _assert_exact, _records


@pytest.fixture
def store(tmp_path: Path) -> SqliteQueueStore:
    """A 9,000-record log whose index was lost."""
    store = SqliteQueueStore(tmp_path / "store")
    store.create_topic(TOPIC, 1)
    out = OutputQueue(store, TOPIC, 0)
    try:
        for record in _records(0, 9000):
            out.append(CODEC.encode(record), record.meta())
        out.flush()
    finally:
        out.close()
    shutil.rmtree(store.index_path(TOPIC, 0))
    return store


def _append_live(out: OutputQueue, first: int, count: int) -> None:
    for record in _records(first, count):
        out.append(CODEC.encode(record), record.meta())
    out.flush()


def test_a_deferred_index_catches_up_slice_by_slice_with_the_records_written_meanwhile(
    store: SqliteQueueStore,
) -> None:
    out = OutputQueue(store, TOPIC, 0, defer_index_above=1000)
    try:
        assert out.index.deferred and out.reconciled == 0
        assert (out.index.next_offset, out.log_end) == (0, 9000)
        _append_live(out, 9000, 3000)  # durable while deferred: held, not indexed yet
        assert out.index.next_offset == 0
        prefixes = []
        while not out.catch_up_index(1000):
            prefixes.append(out.index.next_offset)
        assert prefixes == list(range(1000, 9001, 1000))  # a committed prefix after every slice
        assert not out.index.deferred
        assert out.catch_up_index(1000)  # nothing left
        _assert_exact(_answers(out.index), store)  # the 12,000 records: the held ones indexed too
        _append_live(out, 12000, 500)  # and the index goes on as usual
        assert out.index.next_offset == 12500
        _assert_exact(_answers(out.index), store)
    finally:
        out.close()


def test_a_catch_up_cut_short_is_taken_up_from_its_prefix_at_the_next_start(store: SqliteQueueStore) -> None:
    out = OutputQueue(store, TOPIC, 0, defer_index_above=1000)
    try:
        assert not out.catch_up_index(2500)
        _append_live(out, 9000, 100)  # held; lost with the process, as a crash loses them
    finally:
        out.close()
    again = OutputQueue(store, TOPIC, 0, defer_index_above=1000)
    try:
        assert again.index.deferred
        assert (again.index.next_offset, again.log_end) == (2500, 9100)
        assert again.catch_up_index(None)
        _assert_exact(_answers(again.index), store)
    finally:
        again.close()


def test_a_small_gap_is_reconciled_at_once_and_without_a_threshold_nothing_is_deferred(
    store: SqliteQueueStore,
) -> None:
    out = OutputQueue(store, TOPIC, 0, defer_index_above=9000)  # the gap is 9,000: not above it
    try:
        assert not out.index.deferred and out.reconciled == 9000
        _assert_exact(_answers(out.index), store)
    finally:
        out.close()
    shutil.rmtree(store.index_path(TOPIC, 0))
    out = OutputQueue(store, TOPIC, 0)
    try:
        assert not out.index.deferred and out.reconciled == 9000
    finally:
        out.close()
