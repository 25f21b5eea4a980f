"""Where an attached aggregation's records go in their log and the `pos` each one carries: the one rule that
both sinks (`operators.spark.sink`, `operators.spark.writer`) write with, and that the processor
(`operators.spark.processor`) applies to its own rows to know the exact footprint position of every open
window (the extent figures) without any record passing through the driver.

Rows are in `processor.EMIT_COLUMNS` order: (q, j, o, emission index, kind, ...).
- Log order (`log_order`): the records input tuples produced, in the order the partition's instance made
  them (their emission index: the order it applied its tuples, by (j, o) as unpacked, except that with
  watermarks a tuple held back while another input partition replays is applied, and its records made,
  once that partition reached its crash point), then the G-checks its timers made (emission index
  `GCHECK_ORDER`) in the order the processor made them. A G-check a tuple made (a session's fold, which
  footprints the receiving slice before it closes the giving one: `OperatorContext.checkpoint_window`) is
  one of that tuple's records and keeps its place among them.
  A G-check holds its window's state after every tuple of its key read so far (the processor makes them
  after a micro-batch's input), so at the end of the batch its pos (the floor, and at least its key's
  last tuple + 1) is below the key's next tuple, which a later micro-batch reads.
- pos (`positions`): `recovery.contract.PositionStamper` continuing from the log's previous record, over
  the live input position of the partition's instance when it made the record (per input partition the
  next offset after its last applied tuple there: every tuple of its keys below has been applied), as the
  local host stamps. A produced record claims its tuple (pos[j] = o + 1) when it is the tuple's last
  record, else pos[j] = o; a timer's G-check claims its key's last applied tuple (j, o): its state
  holds it.
  Without the live position (claims only), a state partition whose keys come from several input
  partitions would log a pos below what it had applied on the others, and a restart would apply those
  tuples again (keys spread over input partitions, `cec_aggregate(agg=[...], allowed_lateness=...)`). What follows a batch's last
  produced record (a G-check, or nothing) does not change that record's claim, so the processor can
  stamp its input rows and its G-checks in two passes and get the writer's positions exactly.
- time (`log_time`): the largest event time so far (non-decreasing along the log), or sum(pos) when the
  aggregate has no time field. The processor follows it as it follows pos, so a window's latest footprint
  has its exact time in the log: the time the stream index finds the footprint's offset by (trimming).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from cec.records import Kind
from recovery.contract import PositionStamper

__all__ = ["GCHECK_ORDER", "log_order", "log_time", "positions", "positions_and_times"]

_GCHECK = Kind.GCHECK.value
# The emission index of a G-check a timer made (after a micro-batch's input: the end of the batch's log).
GCHECK_ORDER = 1 << 30


def _timer_gcheck(row: Sequence[Any]) -> bool:
    return bool(row[4] == _GCHECK and row[3] == GCHECK_ORDER)


def log_order(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """A partition's rows in log order (module doc)."""
    produced = [r for r in rows if not _timer_gcheck(r)]
    produced.sort(key=lambda r: r[3])
    produced.extend(r for r in rows if _timer_gcheck(r))
    return produced


def positions(rows: Sequence[tuple[Any, ...]], stamper: PositionStamper) -> Iterator[tuple[int, ...]]:
    """The pos of each row (rows in log order), advancing `stamper` as they are made (module doc)."""
    last = len(rows) - 1
    stamp = stamper.stamp
    # `_timer_gcheck` inlined: this runs once per record in the processor and in both sinks.
    for idx, row in enumerate(rows):
        j, o = row[1], row[2]
        if idx == last or (row[3] == GCHECK_ORDER and row[4] == _GCHECK):
            claims = True
        else:
            nxt = rows[idx + 1]
            claims = (nxt[3] == GCHECK_ORDER and nxt[4] == _GCHECK) or nxt[1] != j or nxt[2] != o
        # The instance's live position (everything of its input below it is applied, as the local host
        # stamps); a row without one (made before rows carried it) stands on its claim alone.
        live = row[12] if len(row) > 12 else None
        yield stamp(live, j, o, claims=claims)


def log_time(previous: int, event_time: int, pos: Sequence[int], has_time: bool) -> int:
    """A record's logical time in its log, after a record of time `previous` (module doc): `event_time` is
    the row's event time (-1: none, a G-check's), `has_time` whether the aggregate has a time field."""
    if has_time:
        return previous if event_time < previous else event_time
    return max(previous, sum(pos))


def positions_and_times(
    rows: Sequence[tuple[Any, ...]], stamper: PositionStamper, previous: int, has_time: bool
) -> list[tuple[tuple[int, ...], int]]:
    """The pos and the logical time of each row (rows in log order), as `positions` and `log_time` make
    them one by one: `stamper` advanced, `previous` the time of the log's record before them."""
    out: list[tuple[tuple[int, ...], int]] = []
    append = out.append
    t_log = previous
    for row, pos in zip(rows, positions(rows, stamper), strict=True):
        if has_time:  # `log_time`, inline: a call fewer per row
            event_time = row[9]
            if event_time >= t_log:
                t_log = event_time
        else:
            offsets = sum(pos)
            if offsets > t_log:
                t_log = offsets
        append((pos, t_log))
    return out
