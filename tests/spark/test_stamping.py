"""`operators.spark.stamping`: the log order and `pos` of an attached aggregation's records.

The processor stamps its input rows and, later in the same task, its G-checks, in two passes; the writer
stamps the whole batch in one. They must agree record for record, whatever the batch holds, or the extent
figures the processor reports would not be the log's.
"""

from __future__ import annotations

import random
from typing import Any

from cec.records import Kind
from operators.spark.stamping import log_order, positions
from recovery.contract import PositionStamper

_R, _GOPEN, _GCHECK, _DEAD = Kind.R.value, Kind.GOPEN.value, Kind.GCHECK.value, Kind.DEAD.value


def _row(j: int, o: int, i: int, kind: str) -> tuple[Any, ...]:
    """A row of the processor (`EMIT_COLUMNS`); `i` is its emission index: the order the partition's
    instance made it in."""
    return (0, j, o, i, kind, f"k{o % 5}", 0, None, None, -1, 0, None)


def _batch(rng: random.Random, width: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(produced rows in log order, G-check rows): tuples emitting 0-2 records, G-checks of tuples among
    them (the last one often, the case where a G-check follows its own tuple's record)."""
    produced: list[tuple[Any, ...]] = []
    applied: list[tuple[int, int]] = []
    for j in range(width):
        for o in sorted(rng.sample(range(100), 12)):
            applied.append((j, o))
            kinds = rng.choice([[], [_GOPEN], [_R], [_R, _GOPEN], [_DEAD]])
            made = len(produced)
            produced.extend([_row(j, o, made + i, kind) for i, kind in enumerate(kinds)])
    gchecks = [_row(j, o, 1 << 30, _GCHECK) for j, o in rng.sample(applied, 4)]
    if produced:
        last = produced[-1]
        gchecks.append(_row(last[1], last[2], 1 << 30, _GCHECK))
    return produced, gchecks


def test_two_passes_stamp_what_one_pass_stamps() -> None:
    rng = random.Random(7)
    for _ in range(200):
        width = rng.randint(1, 3)
        produced, gchecks = _batch(rng, width)
        floor = tuple(rng.randint(0, 50) for _ in range(width))
        writer = PositionStamper(floor)
        whole = list(positions(log_order([*gchecks, *produced[::-1]]), writer))
        processor = PositionStamper(floor)
        first = list(positions(produced, processor))
        second = list(positions(gchecks, processor))
        assert [*first, *second] == whole
        assert processor.last == writer.last


def test_a_tuple_claims_itself_on_its_last_record_and_a_gcheck_claims_its_keys_tuple() -> None:
    rows = [_row(0, 5, 0, _R), _row(0, 5, 1, _GOPEN), _row(1, 2, 2, _GOPEN), _row(0, 5, 1 << 30, _GCHECK)]
    got = list(positions(log_order(rows), PositionStamper((3, 0))))
    # R of (0, 5) does not claim it (its G-open follows); the G-open does; (1, 2) claims itself although a
    # G-check follows; the G-check claims (0, 5) and keeps the floor everywhere else.
    assert got == [(5, 0), (6, 0), (6, 3), (6, 3)]


def test_log_order_puts_produced_records_as_made_then_gchecks_as_made() -> None:
    """The instance made them in the order it applied its tuples: by input position, except a tuple held
    back while another input partition replayed (watermarks), whose records follow that partition's."""
    rows = [_row(1, 0, 0, _GOPEN), _row(0, 9, 1 << 30, _GCHECK), _row(0, 3, 2, _GOPEN), _row(0, 3, 1, _R),
            _row(0, 1, 1 << 30, _GCHECK)]  # fmt: skip
    assert [(r[1], r[2], r[4]) for r in log_order(rows)] == [
        (1, 0, _GOPEN), (0, 3, _R), (0, 3, _GOPEN), (0, 9, _GCHECK), (0, 1, _GCHECK)
    ]  # fmt: skip
