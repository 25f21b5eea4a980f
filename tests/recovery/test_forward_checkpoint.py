"""The eventual checkpoint kept forward (design S0, `recovery.forward`) equals the one read back from the
log (`EventualCheckpointBuilder`) at every prefix of logs real runs wrote: count windows with G-checks and
dead letters, time windows with watermarks, hopping and session windows, three input partitions. This is
the invariant the EC cache rests on: EC(X) == builder(log[0..X]) for every X."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cec.records import RecordCodec
from operators.job import JobSpec, run_job
from queuestore.sqlite import SqliteQueueStore
from recovery.eventual import EventualCheckpointBuilder
from recovery.forward import ForwardCheckpoint
from tests.helpers.log_prefix import LogPrefix, ec_view

CODEC = RecordCodec()


OPERATORS: dict[str, dict[str, Any]] = {
    "count-gchecks": {"type": "aggregate", "key_field": "item_id", "value_field": "item_price",
                      "agg": "sum", "window_count": 5},
    "time-watermarks": {"type": "aggregate", "key_field": "item_id", "value_field": "item_price",
                        "agg": "avg", "window_ms": 40, "time_field": "item_time", "allowed_lateness_ms": 5},
    "hopping": {"type": "aggregate", "key_field": "item_id", "value_field": "item_price", "agg": "sum",
                "window_ms": 60, "slide_ms": 20, "time_field": "item_time"},
    "sessions": {"type": "aggregate", "key_field": "item_id", "value_field": "item_price", "agg": "max",
                 "session_gap_ms": 15, "time_field": "item_time"},
}  # fmt: skip


@pytest.mark.parametrize("name", list(OPERATORS))
def test_the_forward_checkpoint_is_the_one_read_back_at_every_prefix(tmp_path: Path, name: str) -> None:
    spec = JobSpec(
        operator=OPERATORS[name],
        source={"type": "generator", "count": 3000, "keys": 40, "seed": 9, "partitions": 3,
                "invalid_every": 37, "interleave": 5},
        store={"type": "sqlite", "root": str(tmp_path / "store")},
        output_topic="agg",
        checkpointing={"u_target": 150, "ci_ms": 50, "cp_ms": 50},
        batch_size=16,
    )  # fmt: skip
    run_job(spec)
    store = SqliteQueueStore(tmp_path / "store")
    try:
        with store.reader("agg", 0) as reader:
            rows = reader.read_range_rows(0, reader.end_offset())
    finally:
        store.close()
    assert len(rows) > 1000
    kinds = {row[1] for row in rows}
    assert {"GOPEN", "R"} <= kinds
    forward = ForwardCheckpoint()
    empty = forward.checkpoint(CODEC, 0)
    assert empty is not None and empty.crash_pos is None
    for end in range(1, len(rows) + 1):
        forward.apply(rows[end - 1])
        kept = forward.checkpoint(CODEC, end)
        read_back = EventualCheckpointBuilder(LogPrefix(rows, end), CODEC).build()
        assert kept is not None, end
        assert ec_view(kept) == ec_view(read_back), end
    assert "GCHECK" in kinds or name != "count-gchecks"
