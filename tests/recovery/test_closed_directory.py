"""The closed-window directory a fresh host's recovery reads back from the log's end as far as it needs
(`recovery.closed_directory`): every answer is the key's last R in the whole log, whatever the EC build
already read, how far the index got, the chunk size and the order of the questions; a key whose last R is
near the end costs no read; a damaged R on the way is damage, never an answer."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cec.records import Kind, OutputRecord, RecordCodec
from queuestore.base import PartitionReader, Row, StoredRecord
from queuestore.exceptions import DamagedLogError
from recovery.closed_directory import ClosedWindowDirectory

CODEC = RecordCodec()


class _Log(PartitionReader):
    """A partition in memory, read the way the directory reads a store; counts the rows it returns."""

    def __init__(self, rows: list[Row]) -> None:
        self.topic, self.partition = "dir", 0
        self.rows = rows
        self.rows_read = 0

    def end_offset(self) -> int:
        return len(self.rows)

    def read_backward_rows(self, before_offset: int, max_records: int) -> list[Row]:
        upper = min(before_offset, len(self.rows))
        rows = self.rows[max(0, upper - max_records) : upper][::-1]
        self.rows_read += len(rows)
        return rows

    def read_forward(self, from_offset: int, max_records: int) -> list[StoredRecord]:
        raise AssertionError("the directory reads back only")

    def read_backward(self, before_offset: int, max_records: int) -> list[StoredRecord]:
        raise AssertionError("the directory reads rows")

    def tail(self, from_offset: int, **_: Any) -> Any:
        raise AssertionError("the directory never tails")

    def close(self) -> None:
        pass


class _Index:
    """A stream index that holds the log below `next_offset`."""

    def __init__(self, rows: list[Row], next_offset: int) -> None:
        self.next_offset = next_offset
        self._seqs = _last_results(rows[:next_offset])

    def last_closed_seq(self, key: str) -> int | None:
        return self._seqs.get(key)


def _last_results(rows: list[Row]) -> dict[str, int]:
    last: dict[str, int] = {}
    for _, kind, _, key, seq, _ in rows:
        if kind == "R" and key is not None:
            last[key] = seq
    return last


def _rows(events: list[tuple[int, bool]]) -> list[Row]:
    """A log from (key number, closes?) events: a key's window opens (G-open) at its first event after a
    close, and an R closes it with its seq."""
    rows: list[Row] = []
    seqs: dict[str, int] = {}
    opened: set[str] = set()
    for i, (k, closes) in enumerate(events):
        key = f"k{k}"
        seq = seqs.get(key, 0)
        if closes and key in opened:
            record = OutputRecord(Kind.R, i, (i,), 1, key=key, seq=seq, payload=b"r")
            seqs[key] = seq + 1
            opened.discard(key)
        else:
            record = OutputRecord(Kind.GOPEN, i, (i,), 1, key=key, seq=seq, state=b"s")
            opened.add(key)
        meta = record.meta()
        rows.append((len(rows), meta.kind, meta.time, meta.key, meta.seq, CODEC.encode(record)))
    return rows


def _directory(rows: list[Row], scanned_from: int, next_offset: int, chunk: int) -> ClosedWindowDirectory:
    log = _Log(rows)
    closed = [(r[3], r[4]) for r in rows[scanned_from:] if r[1] == "R" and r[3] is not None]
    directory = ClosedWindowDirectory(
        lambda: log, _Index(rows, next_offset), scanned_from=scanned_from, closed=closed, codec=CODEC
    )
    directory.CHUNK = chunk
    return directory


@settings(max_examples=150, deadline=None)
@given(
    events=st.lists(st.tuples(st.integers(0, 7), st.booleans()), max_size=200),
    scanned=st.floats(0, 1),
    indexed=st.floats(0, 1),
    chunk=st.integers(1, 40),
    order=st.permutations(list(range(9))),
)
def test_every_answer_is_the_keys_last_result_in_the_whole_log(
    events: list[tuple[int, bool]], scanned: float, indexed: float, chunk: int, order: list[int]
) -> None:
    rows = _rows(events)
    scanned_from = int(scanned * len(rows))
    next_offset = int(indexed * len(rows))
    truth = _last_results(rows)
    directory = _directory(rows, scanned_from, next_offset, chunk)
    answers = {f"k{k}": directory.last_closed_seq(f"k{k}") for k in order}  # k8 never appears
    assert answers == {f"k{k}": truth.get(f"k{k}") for k in range(9)}
    again = {f"k{k}": directory.last_closed_seq(f"k{k}") for k in range(9)}
    assert again == answers  # asked again, in another order: the same
    # Never read below the index's prefix, nor anything the EC build had read.
    assert directory.records_read <= max(0, scanned_from - next_offset)


def test_a_key_closed_near_the_end_costs_no_read_and_one_closed_long_ago_reads_back_to_it() -> None:
    events = [(0, False), (0, True)] + [(1 + i % 5, i % 2 == 1) for i in range(5000)]
    rows = _rows(events)
    directory = _directory(rows, scanned_from=len(rows) - 100, next_offset=0, chunk=256)
    assert directory.last_closed_seq("k3") == _last_results(rows)["k3"]
    assert directory.records_read == 0
    assert directory.last_closed_seq("k0") == 0  # its only R is at offset 1: read back to it
    assert directory.low <= 1
    assert directory.last_closed_seq("k9") is None  # never closed: the rest of the log read once, no more
    assert directory.last_closed_seq("k9") is None
    assert directory.records_read == len(rows) - 100


def test_a_damaged_result_on_the_way_back_is_damage_never_an_answer() -> None:
    rows = _rows([(0, False), (0, True)] + [(1, i % 2 == 1) for i in range(200)])
    offset, kind, t, key, seq, value = rows[1]
    rows[1] = (offset, kind, t, key, seq, value[:-1] + bytes([value[-1] ^ 0xFF]))
    directory = _directory(rows, scanned_from=len(rows) - 10, next_offset=0, chunk=50)
    assert directory.last_closed_seq("k1") is not None  # found before the damage: no error
    with pytest.raises(DamagedLogError, match="offset 1 is damaged"):
        directory.last_closed_seq("k0")


def test_the_meta_beside_a_result_is_checked_too() -> None:
    rows = _rows([(0, False), (0, True)] + [(1, False)] * 50)
    offset, kind, t, key, seq, value = rows[1]
    rows[1] = (offset, kind, t, key, seq + 7, value)  # the store's seq column says another window
    directory = _directory(rows, scanned_from=len(rows) - 5, next_offset=0, chunk=8)
    with pytest.raises(DamagedLogError):
        directory.last_closed_seq("k0")
