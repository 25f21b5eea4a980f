"""A log's first records as a `PartitionReader` (the log a crash at that point would have left, or what a
primary has appended so far), and the parts of an eventual checkpoint that two ways of building it must
agree on: for the every-prefix tests of the forward checkpoint and the standby."""

from __future__ import annotations

from typing import Any

from queuestore.base import PartitionReader, QueueStore, Row, StoredRecord
from recovery.eventual import EventualCheckpoint

__all__ = ["LogPrefix", "ec_view", "logged_rows"]


class LogPrefix(PartitionReader):
    """The first `end` records of `rows`; `end` may grow (a log being appended to). Reads rows only."""

    def __init__(self, rows: list[Row], end: int = 0, *, topic: str = "prefix") -> None:
        self.topic, self.partition = topic, 0
        self._rows, self.end = rows, end

    def end_offset(self) -> int:
        return self.end

    def read_range_rows(self, start: int, stop_before: int) -> list[Row]:
        return self._rows[start : min(stop_before, self.end)]

    def read_backward_rows(self, before_offset: int, max_records: int) -> list[Row]:
        upper = min(before_offset, self.end)
        return self._rows[max(0, upper - max_records) : upper][::-1]

    def read_forward(self, from_offset: int, max_records: int) -> list[StoredRecord]:
        raise AssertionError("rows only")

    def read_backward(self, before_offset: int, max_records: int) -> list[StoredRecord]:
        raise AssertionError("rows only")

    def tail(self, from_offset: int, **_: Any) -> Any:
        raise AssertionError("never tailed")

    def close(self) -> None:
        pass


def ec_view(ec: EventualCheckpoint) -> tuple[object, ...]:
    """What an eventual checkpoint decides recovery by: each window's footprint offset, the crash point,
    N, the time, the extent's start, whether the log was complete, the watermark marks."""
    return (
        {key: fp.offset for key, fp in ec.windows.items()},
        ec.crash_pos,
        ec.n,
        ec.time,
        ec.extent_start,
        ec.complete,
        ec.marks,
    )


def logged_rows(store: QueueStore, topic: str) -> list[Row]:
    """Every row of partition 0 of `topic` (a finished run's log, for the every-prefix tests); closes `store`."""
    try:
        with store.reader(topic, 0) as reader:
            return reader.read_range_rows(0, reader.end_offset())
    finally:
        store.close()
