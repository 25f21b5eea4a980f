"""The embedded store's group commit inserts its rows in a few multi-row statements (`insert_rows`): the same
rows as one INSERT per row, in far fewer statements (one statement per row let a busy operator thread
starve the I/O thread of the GIL: the log's durable end stood still for seconds)."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from queuestore.base import RecordMeta
from queuestore.sqlite import SqliteQueueStore
from queuestore.sqlite.files import _COLUMNS
from queuestore.sqlite.writer import insert_rows

_ROW = st.tuples(
    st.sampled_from(["R", "GOPEN", "GCHECK", "EOS"]),
    st.integers(-(2**63), 2**63 - 1),
    st.one_of(st.none(), st.text(max_size=8)),
    st.integers(-(2**63), 2**63 - 1),
    st.binary(max_size=16),
)


def _table() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute(
        "CREATE TABLE log (offset INTEGER PRIMARY KEY, kind TEXT, time INTEGER, key TEXT, seq INTEGER, value BLOB)"
    )
    return conn


@settings(max_examples=60, deadline=None)
@given(st.lists(_ROW, max_size=300), st.integers(1, 64))
def test_the_rows_are_those_one_insert_per_row_writes(
    body: list[tuple[Any, ...]], per_statement: int
) -> None:
    rows = [(offset, *row) for offset, row in enumerate(body)]
    batched, single = _table(), _table()
    insert_rows(batched, rows, per_statement)
    single.executemany(f"INSERT INTO log ({_COLUMNS}) VALUES (?,?,?,?,?,?)", rows)
    query = f"SELECT {_COLUMNS} FROM log ORDER BY offset"
    assert batched.execute(query).fetchall() == single.execute(query).fetchall() == [tuple(r) for r in rows]


class _Counting:
    """A connection that counts its statements (sqlite3.Connection's methods cannot be replaced)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.statements = 0

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        self.statements += 1
        return self.conn.execute(sql, params)


@given(st.integers(0, 5000), st.sampled_from([1, 7, 64, 1024]))
@settings(max_examples=40, deadline=None)
def test_a_group_commit_takes_a_few_statements_not_one_per_row(count: int, per_statement: int) -> None:
    conn = _Counting(_table())
    rows = [(i, "R", i, f"k{i}", 1, b"v") for i in range(count)]
    insert_rows(conn, rows, per_statement)  # type: ignore[arg-type]
    assert conn.conn.execute("SELECT COUNT(*) FROM log").fetchone()[0] == count
    # Full statements, then the rest as powers of two below the full size (each SQL text cached).
    bound = count // per_statement + max(1, math.ceil(math.log2(per_statement)) + 1)
    assert conn.statements <= (bound if count else 0)


def test_many_small_group_commits_make_the_same_log(tmp_path: Path) -> None:
    """The operator hands the I/O thread a small batch at every poll; the coalesced transactions hold every
    record once, in order, whole."""
    store = SqliteQueueStore(tmp_path)
    store.create_topic("t", 1)
    writer = store.writer("t", 0)
    durable: list[int] = []
    values = [f"value {i}".encode() * (1 + i % 5) for i in range(3000)]
    for i, value in enumerate(values):
        writer.append(
            value, RecordMeta("GOPEN", i, f"k{i % 97}", i), lambda offset, error: durable.append(offset)
        )
        if i % 3 == 0:
            writer.poll()
    writer.flush()
    writer.close()
    assert durable == list(range(3000))
    with store.reader("t", 0) as reader:
        got = reader.read_range_rows(0, 3000)
    assert [row[0] for row in got] == list(range(3000))
    assert [row[5] for row in got] == values
    store.close()
