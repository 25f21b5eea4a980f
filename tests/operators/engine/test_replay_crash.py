"""A crash while a large log is replayed, through the replay path production runs (the engine's
`_replay_run`: the product has no other path for it, and no fault branch that would choose one).

Three drifting input partitions, long windows (the extent spans most of the input, so a recovery replays
tens of thousands of tuples): the first run is SIGKILLed mid-input; the first recovery is SIGKILLed from
the test side after exactly 20,000 replayed tuples (tests/killpoints: the run of tuples is cut there, the
loop itself runs up to it); the second recovery is SIGKILLed from outside as soon as it says it started
replaying; the third ends, every tuple it replays counted through the fast replay path. The results
equal the failure-free run's, per key.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from cec.config import Checkpointing
from operators.base import InputTuple
from operators.engine import OperatorInstance
from operators.job import JobSpec, run_job
from queuestore.sqlite import SqliteQueueStore
from tests.helpers import child_env, per_key, results, start_worker, wait_for

COUNT = 120_000


def _spec(root: Path) -> JobSpec:
    return JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "avg",
            "window_count": 60,
        },
        source={
            "type": "generator",
            "count": COUNT,
            "keys": 1000,
            "seed": 5,
            "partitions": 3,
            "invalid_every": 41,
            "interleave": 3,
        },
        # A small bound on what is appended but not yet durable: the first run is killed after a number of
        # input tuples, and with the default bound a fast run can be killed before its writer committed
        # anything (an empty log, so no replay to kill), whatever the machine's speed.
        store={"type": "sqlite", "root": str(root), "max_outstanding": 64},
        output_topic="agg",
        checkpointing=Checkpointing(),  # G-open only: the replay reaches back to the oldest window's opening
        batch_size=256,
        progress=True,
    )


def _logged(root: Path) -> int:
    store = SqliteQueueStore(root)
    try:
        if not store.topic_exists("agg"):
            return 0
        with store.reader("agg", 0) as reader:
            return reader.end_offset()
    finally:
        store.close()


def test_sigkills_while_a_large_log_is_replayed_recover_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_job(_spec(tmp_path / "reference"))
    want = results(SqliteQueueStore(tmp_path / "reference"), "agg")

    root = tmp_path / "crashed"
    spec = _spec(root)
    first = start_worker(spec, tmp_path / "spec.json", faults=f"runtime.after_input:{COUNT // 2}")
    first.communicate(timeout=600)
    assert first.returncode == -signal.SIGKILL
    assert _logged(root) > 0

    # Killed inside the replay loop, after exactly 20,000 replayed tuples: nothing is written while
    # replaying, so the log is unchanged.
    before = _logged(root)
    second = start_worker(spec, tmp_path / "spec.json", faults="runtime.replaying:20000")
    _, err = second.communicate(timeout=600)
    assert second.returncode == -signal.SIGKILL, err.decode()[-2000:]
    assert "caught up with the crash point" not in err.decode()
    assert _logged(root) == before

    # Killed from outside once it says the replay started.
    stderr = tmp_path / "third.err"
    env = {**child_env(), "CEC_LOG_LEVEL": "INFO"}
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(spec.to_json())
    with stderr.open("wb") as err_file:
        third = subprocess.Popen([sys.executable, "-m", "operators.worker", str(spec_path)], env=env,
                                 stdout=subprocess.DEVNULL, stderr=err_file)  # fmt: skip
        try:
            wait_for(lambda: third.poll() is not None or b"replay from" in stderr.read_bytes(), timeout=300)
        finally:
            third.send_signal(signal.SIGKILL)
            third.communicate(timeout=60)
    said = stderr.read_text()
    assert third.returncode == -signal.SIGKILL and "replay from" in said
    if "caught up with the crash point" not in said:  # the kill landed inside the replay, as intended
        assert _logged(root) == before

    # The last recovery runs here, with the fast replay path counted from the test side: every tuple it
    # replays goes through it (the replay report counts the tuples of both paths).
    fast: list[int] = []
    replay_run = OperatorInstance._replay_run

    def counted(self: OperatorInstance, tuples: Sequence[InputTuple], first: int) -> int:
        stop = replay_run(self, tuples, first)
        fast.append(stop - first)
        return stop

    monkeypatch.setattr(OperatorInstance, "_replay_run", counted)
    stats = run_job(spec)
    assert stats.completed and stats.recovery is not None
    assert stats.recovery.tuples_replayed > 20_000  # the replay reaches back over most of the input
    assert sum(fast) == stats.recovery.tuples_replayed
    got = results(SqliteQueueStore(root), "agg")
    assert per_key(got) == per_key(want) and len(got) == len(want)
