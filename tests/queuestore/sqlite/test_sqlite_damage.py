"""A damaged SQLite partition file, met by every reader: one clear error naming the file and the way out,
or, where the damage is inside one record, that record failing its checksum (recovery then falls back
past a damaged footprint, DESIGN-NOTES section 2; a results reader refuses it). Never a sqlite3 error,
never a TypeError from a cell of the wrong type, never a record silently used or skipped.

SQLite keeps each row's cells with their own types and decodes TEXT as UTF-8 when it hands a row over:
a flipped bit can make a `kind` or `key` undecodable (before: `OperationalError: Could not decode to
UTF-8` from the whole read) or turn a cell into another type; a zeroed page makes SQLite itself say
`database disk image is malformed` (before: that `DatabaseError`, from whichever reader met it first).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from cec import inspection
from cec.config import Checkpointing
from cec.records import AvroCodec, Kind, OutputRecord, RecordCodec
from operators.aggregate import RESULT_SCHEMA
from operators.job import JobSpec, run_job
from queuestore.exceptions import DamagedLogError
from queuestore.output import OutputQueue
from queuestore.sqlite import SqliteQueueStore
from recovery.eventual import EventualCheckpointBuilder
from recovery.exceptions import RecoveryError
from tests.helpers import log_records, results

WAY_OUT = "restore it from a backup, or start over with a new store directory (--store-dir)"


def _spec(root: Path, *, q: int | None = 3) -> JobSpec:
    return JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "sum",
            "window_count": 6,
        },
        source={
            "type": "generator",
            "count": 400,
            "keys": 7,
            "seed": 5,
            "invalid_every": 9,
        },
        store={"type": "sqlite", "root": str(root)},
        output_topic="agg",
        checkpointing=Checkpointing(q_target=q, ci_ms=10.0, cp_ms=10.0),
        batch_size=1,
    )


def _db(root: Path) -> sqlite3.Connection:
    return sqlite3.connect(root / "agg" / "0.sqlite", isolation_level=None)


def _set(root: Path, offset: int, column: str, literal: str) -> None:
    """Overwrite one cell with an SQL literal of any type, as a flipped bit in a row can."""
    conn = _db(root)
    try:
        assert conn.execute(f"UPDATE log SET {column} = {literal} WHERE offset = ?", (offset,)).rowcount == 1
    finally:
        conn.close()


@pytest.fixture
def crashed(tmp_path: Path) -> tuple[JobSpec, list[Any], list[dict[str, Any]]]:
    """A log stopped midway (as by a crash) and the results of a failure-free run."""
    reference = _spec(tmp_path / "ref")
    run_job(reference)
    want = results(SqliteQueueStore(tmp_path / "ref"), "agg")
    spec = _spec(tmp_path / "log")
    run_job(spec, max_inputs=250)
    return spec, log_records(SqliteQueueStore(tmp_path / "log"), "agg"), want


def _extent_footprint(spec: JobSpec, records: list[Any]) -> int:
    """The offset of a window's latest footprint in the EC that has an older one to fall back to."""
    with SqliteQueueStore(spec.store["root"]).reader("agg", 0) as reader:
        ec = EventualCheckpointBuilder(reader).build()
    for key, fp in ec.windows.items():
        if any(
            r.key == key and r.seq == fp.record.seq and r.kind in (Kind.GOPEN, Kind.GCHECK)
            for r in records[: fp.offset]
        ):
            return fp.offset
    raise AssertionError("the workload must give some window two footprints")


# Damage inside one row: a text cell that is not UTF-8, or a cell of another type. (A damaged kind is
# its own case: recovery passes over a damaged record only when its stored kind says footprint.)
KIND_NOT_UTF8 = ("kind", "CAST(X'47FF50454E' AS TEXT)")
CELL_DAMAGE = {
    "key not UTF-8": ("key", "CAST(X'6BC0' AS TEXT)"),
    "value became text": ("value", "'not bytes'"),
    "value became an integer": ("value", "7"),
    "time became text": ("time", "'x12'"),  # (digits alone would be stored as an integer again)
    "time became a real": ("time", "12.5"),
    "key became a blob": ("key", "X'6B31'"),
}


@pytest.mark.parametrize("damage", list(CELL_DAMAGE))
def test_a_damaged_cell_of_a_footprint_is_a_damaged_record_recovery_falls_back_past(
    crashed: tuple[JobSpec, list[Any], list[dict[str, Any]]], damage: str
) -> None:
    spec, records, want = crashed
    root = Path(spec.store["root"])
    offset = _extent_footprint(spec, records)
    _set(root, offset, *CELL_DAMAGE[damage])
    store = SqliteQueueStore(root)
    with store.reader("agg", 0) as reader:
        ec = EventualCheckpointBuilder(reader).build()
    assert ec.fallbacks == [offset]
    run_job(spec)  # the index passes over it too; the run resumes and finishes
    # A results reader cannot know the damaged record was not a result: it names it, with the way out.
    where = f"{root}/agg/0.sqlite: agg\\[0\\] offset {offset} is damaged: .*; {WAY_OUT.replace('(', '.').replace(')', '.')}"
    with pytest.raises(DamagedLogError, match=where):
        results(store, "agg")
    assert _results_past(store, offset) == want  # ...and what it holds besides is exactly the results


def _results_past(store: SqliteQueueStore, damaged: int) -> list[dict[str, Any]]:
    """The results in the log, every record but `damaged` checked (decoding checks the checksum)."""
    codec, payloads = RecordCodec(), AvroCodec(RESULT_SCHEMA)
    out = []
    with store.reader("agg", 0) as reader:
        for stored in reader.scan_forward(0):
            if stored.offset != damaged:
                record = codec.decode(stored.value, stored.meta)
                if record.kind is Kind.R:
                    assert record.payload is not None
                    out.append(payloads.decode(record.payload))
    return out


@pytest.mark.parametrize(
    "damage", [KIND_NOT_UTF8, CELL_DAMAGE["value became text"], CELL_DAMAGE["time became text"]], ids=str
)
def test_a_damaged_cell_of_a_result_inside_the_extent_stops_recovery_naming_it(
    tmp_path: Path, damage: tuple[str, str]
) -> None:
    spec = _spec(tmp_path / "log", q=None)  # G-open only: a long extent
    run_job(spec, max_inputs=250)
    root = Path(spec.store["root"])
    records = log_records(SqliteQueueStore(root), "agg")
    with SqliteQueueStore(root).reader("agg", 0) as reader:
        ec = EventualCheckpointBuilder(reader).build()
    offset = max(i for i, r in enumerate(records) if r.kind is Kind.R)
    assert offset > ec.extent_start, "the workload must close a window inside the extent"
    _set(root, offset, *damage)
    with pytest.raises(RecoveryError, match=f"{root}/agg/0.sqlite: agg\\[0\\] offset {offset} is damaged"):
        run_job(spec)


def test_a_footprint_whose_kind_is_not_utf8_is_an_error_naming_it(
    crashed: tuple[JobSpec, list[Any], list[dict[str, Any]]],
) -> None:
    """Its kind is damaged too, so nothing says it was a footprint: an error, as for any damaged record
    recovery cannot prove it may pass over (never `OperationalError: Could not decode to UTF-8`)."""
    spec, records, _ = crashed
    root = Path(spec.store["root"])
    offset = _extent_footprint(spec, records)
    _set(root, offset, *KIND_NOT_UTF8)
    where = f"{root}/agg/0.sqlite: agg\\[0\\] offset {offset} is damaged"
    with pytest.raises(RecoveryError, match=where + " \\(a record of kind 'G\ufffdPEN'"):
        run_job(spec)
    with pytest.raises(DamagedLogError, match=where + ": checksum mismatch"):
        results(SqliteQueueStore(root), "agg")


def _zero_page(path: Path, page: int) -> None:
    with path.open("r+b") as f:
        f.seek(page * 4096)
        f.write(bytes(4096))


def _malformed(path: Path) -> str:
    return (
        f"the output log {path} is damaged \\(database disk image is malformed\\); restore it from a backup"
    )


def test_a_zeroed_page_is_one_error_naming_the_file_for_every_reader(
    crashed: tuple[JobSpec, list[Any], list[dict[str, Any]]],
) -> None:
    spec, records, _ = crashed
    root = Path(spec.store["root"])
    path = root / "agg" / "0.sqlite"
    pages = path.stat().st_size // 4096
    assert pages > 4
    _zero_page(path, pages // 3)  # a leaf among the older records
    store = SqliteQueueStore(root)
    with store.reader("agg", 0) as reader:
        with pytest.raises(DamagedLogError, match=_malformed(path)):
            list(reader.scan_forward(0))  # the forward reader (results, cec inspect, cec state)
        with pytest.raises(DamagedLogError, match=_malformed(path)):
            reader.read_range_rows(0, len(records))
        with pytest.raises((DamagedLogError, RecoveryError), match=str(path)):
            # The EC scan reads back from the end: it meets the page only if the extent reaches it.
            EventualCheckpointBuilder(reader, chunk=16).build()
            list(reader.scan_backward())
    with pytest.raises(DamagedLogError, match=_malformed(path)):
        results(store, "agg")


def test_a_damaged_file_header_is_one_error_for_the_writer_and_the_reader(tmp_path: Path) -> None:
    spec = _spec(tmp_path / "log")
    run_job(spec, max_inputs=100)
    path = tmp_path / "log" / "agg" / "0.sqlite"
    _zero_page(path, 0)  # the header and the schema
    store = SqliteQueueStore(tmp_path / "log")
    match = f"the output log {path} is damaged \\(file is not a database\\); restore it from a backup"
    with pytest.raises(DamagedLogError, match=match):
        store.reader("agg", 0)
    with pytest.raises(DamagedLogError, match=match):
        store.writer("agg", 0)
    with pytest.raises(DamagedLogError, match=match):
        run_job(spec)


def test_damage_met_by_trimming_is_one_error_naming_the_file(tmp_path: Path) -> None:
    store = SqliteQueueStore(tmp_path)
    store.create_topic("agg", 1)
    codec = RecordCodec()
    out = OutputQueue(store, "agg", 0)
    try:
        for i in range(3000):
            record = OutputRecord(Kind.DEAD, i, (i,), 0, payload=b"x" * 40)
            out.append(codec.encode(record), record.meta())
    finally:
        out.close()  # the last connection: SQLite moves the WAL into the file
    path = tmp_path / "agg" / "0.sqlite"
    _zero_page(path, path.stat().st_size // 4096 // 3)  # a leaf among the records a trim deletes
    with store.writer("agg", 0) as writer, pytest.raises(DamagedLogError, match=_malformed(path)):
        writer.trim(2000)


@pytest.mark.parametrize("value", ["'x'", "140", "60"], ids=["not a number", "too high", "too low"])
def test_a_damaged_log_start_is_damage_never_a_shorter_log(tmp_path: Path, value: str) -> None:
    """The log start of a trimmed log is a plain number beside the records. Before: one read too high made
    `cec inspect` and every reader start there, showing a log without its first records, exit 0."""
    spec = _spec(tmp_path / "log")
    run_job(spec, max_inputs=100)
    with SqliteQueueStore(tmp_path / "log").writer("agg", 0) as writer:
        writer.trim(100)
    conn = _db(tmp_path / "log")
    try:
        assert conn.execute(f"UPDATE meta SET value = {value} WHERE name = 'log_start'").rowcount == 1
    finally:
        conn.close()
    path = tmp_path / "log" / "agg" / "0.sqlite"
    store = SqliteQueueStore(tmp_path / "log")
    damaged = f"the output log {path} is damaged \\((log start 'x'|its oldest offset reads 100, its log start {value})\\)"
    with store.reader("agg", 0) as reader, pytest.raises(DamagedLogError, match=damaged):
        reader.start_offset()
    with pytest.raises(DamagedLogError, match=damaged):
        inspection.inspect_topic(store, "agg")
    with pytest.raises(DamagedLogError, match=damaged):
        store.writer("agg", 0)


def _newest_leaf(path: Path) -> int:
    """The page holding the newest records (1-based), which every reader meets."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        (page,) = conn.execute(
            "SELECT max(pageno) FROM dbstat WHERE name = 'log' AND pagetype = 'leaf'"
        ).fetchone()
    finally:
        conn.close()
    return int(page)


@pytest.mark.parametrize("damage", ["last page cut short", "last rowid flipped"])
def test_a_damaged_end_of_the_log_is_damage_never_a_shorter_log(
    crashed: tuple[JobSpec, list[Any], list[dict[str, Any]]], damage: str
) -> None:
    """SQLite takes the end of the rowid B-tree as it finds it. Before: a last page cut short read as
    cells of offset 0 (`cec inspect`: a log of one record, exit 0), and one flipped bit in the newest
    rowid made the log shorter to every reader (found by the damage fuzzer); a resumed run then failed on
    `UNIQUE constraint failed`."""
    spec, _, _ = crashed
    root = Path(spec.store["root"])
    path = root / "agg" / "0.sqlite"
    page = _newest_leaf(path)
    data = bytearray(path.read_bytes())
    if damage == "last page cut short":
        del data[(page - 1) * 4096 + 1024 :]
    else:
        # A table leaf page: an 8-byte header, then the cell pointers (2 bytes each, in rowid order);
        # a cell is its payload length (a varint: 1-2 bytes here) then its rowid (a varint).
        start = (page - 1) * 4096
        cells = int.from_bytes(data[start + 3 : start + 5], "big")
        last = start + int.from_bytes(data[start + 8 + 2 * (cells - 1) : start + 10 + 2 * (cells - 1)], "big")
        rowid = last + (1 if data[last] < 0x80 else 2)
        while data[rowid] & 0x80:
            rowid += 1  # the rowid's last byte
        low = data[rowid] & 0x7F
        assert low, "the newest rowid's last byte must have a bit to clear"
        data[rowid] ^= low & -low  # its lowest set bit: the rowid reads smaller
    path.write_bytes(bytes(data))
    store = SqliteQueueStore(root)
    with (
        store.reader("agg", 0) as reader,
        pytest.raises(DamagedLogError, match=f"the output log {path} is damaged"),
    ):
        reader.end_offset()
    with pytest.raises(DamagedLogError, match=f"the output log {path} is damaged"):
        inspection.inspect_topic(store, "agg")
    with pytest.raises(DamagedLogError, match=f"the output log {path} is damaged"):
        run_job(spec)
