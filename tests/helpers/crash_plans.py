"""Crash plans of the local worker (`operators.worker`, killed with SIGKILL from tests/killpoints): kills
while it processes, right after it rebuilt its eventual checkpoint and while it replays, then a run to the
end. Shared by the aggregate tests (tumbling, hopping, session windows)."""

from __future__ import annotations

import signal
from pathlib import Path

from operators.job import JobSpec
from tests.helpers import run_through_crashes, run_worker, start_worker
from tests.helpers.flight_queues import logged

__all__ = ["crash_during_recovery", "run_after_crashes"]


def crash_during_recovery(spec: JobSpec, spec_path: Path, *, records: int = 200) -> None:
    """SIGKILL runs of the job until its log holds `records` records (each killed inside a store commit,
    so the batches before it are durable: how many varies with the writer thread's timing), then one run
    right after it rebuilt the eventual checkpoint and one while it replays below the crash point."""
    root = Path(spec.store["root"])
    tries = 0
    while logged(root, spec.output_topic) < records:
        tries += 1
        assert tries <= 10, f"the log holds {logged(root, spec.output_topic)} records after {tries - 1} kills"
        assert run_worker(spec, spec_path, faults=f"store.before_commit:{10 * tries}") == -signal.SIGKILL
    for plan in ("recovery.after_ec_build:1", "runtime.replaying:5"):
        assert run_worker(spec, spec_path, faults=plan) == -signal.SIGKILL, plan


def run_after_crashes(spec: JobSpec, spec_path: Path, crashes: list[tuple[str, int]]) -> int:
    """Run the job through the kills of `crashes` (`run_through_crashes`), then once more to its end,
    which must succeed; how many runs were killed."""
    killed = run_through_crashes(spec, spec_path, crashes)
    proc = start_worker(spec, spec_path)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()[-2000:]
    return killed
