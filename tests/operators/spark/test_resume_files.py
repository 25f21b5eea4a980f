"""The files `operators.spark.resume` reads before trusting a Spark checkpoint: the run's manifest, the
batch markers, Spark's offsets and commits. Whatever bytes they hold (damage, truncation, another
program's files), a start decides: it resumes only a checkpoint whose files are whole and agree, and
otherwise recovers from the logs with the reason, never raising. The output logs here are an empty
partition's (the agreement with real logs is tests/operators/spark/test_attach_resume.py's and
test_attach_resume_refused.py's)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cec.records import Kind, OutputRecord, RecordCodec
from operators.spark.generations import Generation
from operators.spark.planning import LogEnd
from operators.spark.resume import (
    FROM_LOGS,
    RESUMED,
    BatchMarker,
    Decision,
    RunManifest,
    decide,
    latest_checkpoint,
    run_checkpoint,
)
from queuestore.base import StoredRecord

TOPIC = "out.g0"
PARTITIONS = 2
INPUTS = 3


class _EmptyLog:
    """An output partition that holds nothing (end offset 0)."""

    def hint_end(self, offset: int) -> None:
        pass

    def end_offset(self) -> int:
        return 0

    def read_backward(self, before: int, n: int) -> list[Any]:
        return []


class _Log(_EmptyLog):
    """An output partition holding `records` at their offsets, ending at `end` (offsets between them are
    transaction markers, which a reader never returns)."""

    def __init__(self, records: dict[int, OutputRecord], end: int) -> None:
        self.records, self.end, self.codec = records, end, RecordCodec()

    def end_offset(self) -> int:
        return self.end

    def read_backward(self, before: int, n: int) -> list[Any]:
        offsets = sorted((o for o in self.records if o < before), reverse=True)[:n]
        return [StoredRecord(o, self.codec.encode(self.records[o]), self.records[o].meta()) for o in offsets]


class _Store:
    def __init__(self, logs: list[_EmptyLog] | None = None) -> None:
        self.logs = logs

    @contextlib.contextmanager
    def reader(self, topic: str, q: int) -> Iterator[_EmptyLog]:
        yield _EmptyLog() if self.logs is None else self.logs[q]


class _Output:
    log_end = 0  # the end an OutputQueue knows of (its index's, or the end a deferred index noted)


def _generations() -> list[Generation]:
    return [Generation(0, TOPIC, PARTITIONS)]


def _manifest() -> RunManifest:
    zeros = (0,) * INPUTS
    return RunManifest(
        input_topic="in",
        fingerprint="f",
        generations=_generations(),
        input_partitions=INPUTS,
        crash_points=[[zeros] * PARTITIONS],
        start=zeros,
        ends=[LogEnd(zeros, 0, 0, 0, (), (b"\x00r",)) for _ in range(PARTITIONS)],
        timers=False,
    )


def _whole_checkpoint(root: Path) -> Path:
    """A checkpoint as a run leaves it after batch 0 committed with nothing written to its logs."""
    run = root / "run-1-0a"
    _manifest().write(run)
    (run / "offsets").mkdir(parents=True)
    conf = {"spark.sql.shuffle.partitions": str(PARTITIONS)}
    (run / "offsets" / "0").write_text(
        "v1\n" + json.dumps({"conf": conf}) + "\n" + json.dumps({"in": {"0": 5, "1": 6, "2": 7}})
    )
    (run / "commits").mkdir()
    (run / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    for q in range(PARTITIONS):
        (run / "state" / "0" / str(q)).mkdir(parents=True)
    marker = run / "cec" / "batches"
    marker.mkdir(parents=True)
    (marker / "0").write_text(json.dumps({"batch": 0, "cursors": [[[0] * INPUTS, 0, 0, 0]] * PARTITIONS}))
    return run


def _decide(root: Path, logs: list[_EmptyLog] | None = None, **start: Any) -> Any:
    return decide(
        root,
        store=_Store(logs),  # type: ignore[arg-type]
        generations=_generations(),
        outputs=[_Output()] * PARTITIONS,  # type: ignore[list-item]
        input_topic="in",
        input_partitions=INPUTS,
        fingerprint="f",
        timers=False,
        **start,
    )


def test_a_whole_checkpoint_that_agrees_is_resumed(tmp_path: Path) -> None:
    run = _whole_checkpoint(tmp_path)
    decision = _decide(tmp_path)
    assert decision.path == RESUMED, decision.reason
    assert decision.checkpoint == run and latest_checkpoint(tmp_path) == run
    rec = decision.recovery
    assert rec.start == (5, 6, 7) and rec.checkpoint_batch == 0
    assert [e.results for e in rec.ends] == [(b"\x00r",)] * PARTITIONS  # the processor's, from the manifest


@pytest.mark.parametrize(
    ("start", "reason"),
    [
        ({"resume_checkpoint": False}, "resume_checkpoint=False"),
        ({"resume_checkpoint": False, "writers": "driver"}, "resume_checkpoint=False"),
        ({"writers": "driver"}, "writers='driver' (a rerun micro-batch would append its records again)"),
    ],
)
def test_a_start_that_may_not_resume_recovers_from_the_logs_whatever_the_checkpoint(
    tmp_path: Path, start: dict[str, Any], reason: str
) -> None:
    """The one decision (`decide`) also answers the starts that never resume: not asked, or a driver sink
    (which would append a rerun batch's records again), even beside a whole, agreeing checkpoint."""
    _whole_checkpoint(tmp_path)
    decision = _decide(tmp_path, **start)
    assert (decision.path, decision.reason) == (FROM_LOGS, reason)
    assert decision.checkpoint is None and decision.recovery is None
    assert _decide(tmp_path, resume_checkpoint=True, writers="executors").path == RESUMED


def test_a_run_from_the_logs_gets_a_new_checkpoint_that_the_next_start_finds(tmp_path: Path) -> None:
    """`run_checkpoint`: a resumed run keeps its checkpoint; a run from the logs gets a new run directory,
    the one `latest_checkpoint` picks at the next start, with its manifest when it may be resumed."""
    _whole_checkpoint(tmp_path / "a")
    resumed = _decide(tmp_path / "a")
    assert resumed.path == RESUMED
    same = run_checkpoint(
        resumed, resumed.recovery, tmp_path / "a", resumable=True, input_topic="in",
        input_partitions=INPUTS, fingerprint="f", timers=False,
    )  # fmt: skip
    assert same == resumed.checkpoint
    m = _manifest()
    recovery: Any = SimpleNamespace(
        generations=m.generations, crash_points=m.crash_points, start=m.start, ends=m.ends, path=FROM_LOGS
    )
    for root, resume in ((tmp_path / "b", True), (tmp_path / "c", False)):
        new = run_checkpoint(
            Decision(FROM_LOGS, "no earlier checkpoint"), recovery, root, resumable=resume,
            input_topic="in", input_partitions=INPUTS, fingerprint="f", timers=False,
        )  # fmt: skip
        assert new.parent == root
        if resume:
            assert latest_checkpoint(root) == new and RunManifest.read(new) == m
        else:
            assert not new.exists()


@given(
    which=st.sampled_from(["cec/run.json", "cec/batches/0", "offsets/0"]),
    how=st.sampled_from(["bytes", "truncate", "flip"]),
    data=st.binary(max_size=300),
    cut=st.integers(min_value=0, max_value=10_000),
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_damage_to_the_files_is_a_decision_never_an_error(
    tmp_path_factory: Any, which: str, how: str, data: bytes, cut: int
) -> None:
    root = tmp_path_factory.mktemp("ckpt")
    run = _whole_checkpoint(root)
    path = run / which
    whole = path.read_bytes()
    if how == "bytes":
        damaged = data
    elif how == "truncate":
        damaged = whole[: cut % max(1, len(whole))]
    else:
        at = cut % len(whole)
        damaged = whole[:at] + bytes([whole[at] ^ (1 + cut % 255)]) + whole[at + 1 :]
    path.write_bytes(damaged)
    decision = _decide(root)
    assert decision.path in (FROM_LOGS, RESUMED)
    if decision.path == FROM_LOGS:
        assert decision.reason and "\n" not in decision.reason
    else:  # still a whole, agreeing checkpoint (a flipped byte that left, e.g., another valid offset)
        assert decision.recovery is not None


@given(ahead=st.integers(min_value=1, max_value=1 << 40))
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_marker_ahead_of_the_log_is_never_resumed(tmp_path_factory: Any, ahead: int) -> None:
    root = tmp_path_factory.mktemp("ckpt")
    run = _whole_checkpoint(root)
    body = {"batch": 0, "cursors": [[[0] * INPUTS, 0, 0, ahead]] * PARTITIONS}
    (run / "cec" / "batches" / "0").write_text(json.dumps(body))
    decision = _decide(root)
    assert decision.path == FROM_LOGS and "ahead of the logs" in decision.reason


def test_what_is_missing_says_why(tmp_path: Path) -> None:
    assert _decide(tmp_path / "nothing").reason == "no earlier checkpoint"
    run = _whole_checkpoint(tmp_path)
    (run / "commits" / "0").unlink()
    assert _decide(tmp_path).reason == "the checkpoint has no committed micro-batch"
    (run / "commits" / "0").write_text("v1\n{}")
    (run / "state" / "0" / "1").rmdir()
    assert _decide(tmp_path).reason == "the checkpoint's state store is incomplete"


def test_the_marker_is_written_after_the_sink_and_old_ones_go(tmp_path: Path) -> None:
    calls: list[int] = []

    class _Cursor:
        def __init__(self) -> None:
            self.stamper = type("S", (), {"last": (1, 2, 3)})()
            self.n, self.time = 4, 5

    class _Sink:
        lock = contextlib.nullcontext()
        cursors = [_Cursor()]

        def __call__(self, df: Any, batch_id: int) -> None:
            calls.append(batch_id)

        def _durable_end(self, q: int) -> int:
            return 9

    marker = BatchMarker(_Sink(), tmp_path)  # type: ignore[arg-type]
    for batch in range(103):
        marker(None, batch)  # type: ignore[arg-type]
    assert calls == list(range(103))
    kept = sorted(int(p.name) for p in (tmp_path / "cec" / "batches").iterdir())
    assert kept == list(range(3, 103))
    assert json.loads((tmp_path / "cec" / "batches" / "102").read_text()) == {
        "batch": 102,
        "cursors": [[[1, 2, 3], 4, 5, 9]],
    }


def _r(pos: tuple[int, ...], n: int = 1, time: int = 7) -> OutputRecord:
    return OutputRecord(Kind.GOPEN, time, pos, n, key="k", seq=0, state=b"s")


def _marked(root: Path, next_offset: int, pos: tuple[int, ...], pending: dict[str, int] | None) -> None:
    """Batch 0's marker: both partitions at `next_offset` with their last record's pos, N 1, time 7; with
    `pending`, Spark planned batch 1 with these end offsets."""
    run = _whole_checkpoint(root)
    body = {"batch": 0, "cursors": [[list(pos), 1, 7, next_offset]] * PARTITIONS}
    (run / "cec" / "batches" / "0").write_text(json.dumps(body))
    if pending is not None:
        (run / "offsets" / "1").write_text("v1\n{}\n" + json.dumps({"in": pending}))


def test_a_commit_marker_after_the_batch_is_not_the_log_running_ahead(tmp_path: Path) -> None:
    """The cursor is one past the batch's last record; its transaction's commit marker takes the next
    offset (the log ends one further): resumed."""
    _marked(tmp_path, 4, (5, 6, 7), None)
    logs: list[_EmptyLog] = [_Log({3: _r((5, 6, 7))}, end=5) for _ in range(PARTITIONS)]
    decision = _decide(tmp_path, logs)
    assert decision.path == RESUMED, decision.reason
    assert decision.recovery.caught_up_at == (5, 6, 7)


def test_records_past_the_last_committed_batch(tmp_path: Path) -> None:
    """Past the cursor: the planned batch's own records resume (their pos within its end offsets); a later
    batch's, or any without a planned batch, are a checkpoint behind the logs; a last record that is not
    the marker's is another run's log."""

    def logs(tail: tuple[int, ...]) -> list[_EmptyLog]:
        return [_Log({3: _r((5, 6, 7)), 5: _r(tail)}, end=7) for _ in range(PARTITIONS)]

    _marked(tmp_path / "a", 4, (5, 6, 7), {"0": 9, "1": 9, "2": 9})
    decision = _decide(tmp_path / "a", logs((9, 6, 7)))
    assert decision.path == RESUMED, decision.reason
    assert decision.recovery.caught_up_at == (9, 6, 7)
    assert "behind the logs" in _decide(tmp_path / "a", logs((10, 6, 7))).reason
    _marked(tmp_path / "b", 4, (5, 6, 7), None)
    assert "behind the logs" in _decide(tmp_path / "b", logs((9, 6, 7))).reason
    _marked(tmp_path / "c", 4, (5, 6, 8), None)
    assert "is not what batch 0 wrote" in _decide(tmp_path / "c", logs((9, 6, 7))).reason
