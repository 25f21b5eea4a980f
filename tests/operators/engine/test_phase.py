"""`operators.engine.phase`: RESTORING -> RUNNING -> DONE, and the one rule that ends recovery: every input
partition's position reached its crash point, or the input ended."""

from __future__ import annotations

import pytest

from cec.exceptions import CecError
from operators.engine.phase import Lifecycle, Phase
from operators.exceptions import EngineStateError
from recovery.contract import ReplayContract


def _restoring(crash: tuple[int, ...]) -> tuple[Lifecycle, list[str]]:
    told: list[str] = []
    life = Lifecycle()
    life.on_running = lambda: told.append("running")
    life.restore(ReplayContract((0,) * len(crash), crash, {}))
    return life, told


def test_a_fresh_instance_runs_and_is_restored_only_once() -> None:
    life = Lifecycle()
    assert life.phase is Phase.RUNNING and life.contract is None
    assert not life.advance([0, 0])  # nothing to end
    life.restore(ReplayContract.fresh(2))
    assert life.phase is Phase.RESTORING
    with pytest.raises(EngineStateError, match="restored once"):
        life.restore(ReplayContract.fresh(2))


def test_recovery_ends_when_every_partition_reached_its_crash_point_and_only_then() -> None:
    life, told = _restoring((5, 3))
    assert not life.advance([5, 2])  # partition 1 is still below its crash point
    assert not life.advance([4, 9])  # partition 0 is
    assert life.phase is Phase.RESTORING and told == []
    assert life.advance([5, 3])
    assert life.phase is Phase.RUNNING and life.contract is None and told == ["running"]
    assert not life.advance([9, 9])  # one transition: the host is told once
    assert told == ["running"]


def test_an_input_that_ends_first_ends_recovery() -> None:
    life, told = _restoring((5, 3))
    assert life.advance([2, 1], input_ended=True)
    assert life.phase is Phase.RUNNING and told == ["running"]
    life.finish()
    assert life.phase is Phase.DONE


def test_an_empty_replay_ends_recovery_at_once_and_a_restoring_instance_is_not_done() -> None:
    life, _ = _restoring((0, 0))
    with pytest.raises(EngineStateError, match="still restoring"):
        life.finish()
    assert life.advance([0, 0])


def test_a_host_that_drives_the_phase_out_of_order_gets_a_cec_error() -> None:
    """Under the package's one root: a caller that catches `cec.CecError` catches these too."""
    life, _ = _restoring((1, 1))
    with pytest.raises(CecError, match="still restoring"):
        life.finish()
    with pytest.raises(CecError, match="restored once"):
        life.restore(ReplayContract.fresh(2))
