from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cec.config import Checkpointing
from cec.exceptions import ConfigError
from cec.policy import AnyOf, CostBenefitPolicy, GOpenOnly, RecoveryTimePolicy, TargetPolicy, make_policy
from cec.registry import OpenWindow, WindowRegistry
from cec.schedule import CheckpointSchedule


def _window(key: str, mark: int) -> OpenWindow:
    return OpenWindow(key, 0, None, mark, mark, mark, mark)


ops = st.lists(st.tuples(st.sampled_from(["open", "footprint", "close"]), st.integers(0, 9)), max_size=200)


@given(ops)
def test_registry_keeps_footprint_order(operations: list[tuple[str, int]]) -> None:
    """Model check against a naive list: the oldest window is always the one with the oldest footprint."""
    registry = WindowRegistry()
    model: dict[str, int] = {}  # key -> out_mark of its last footprint
    for out, (op, k) in enumerate(operations, start=1):
        key = f"k{k}"
        if op == "open" and key not in model:
            registry.open(_window(key, out))
            model[key] = out
        elif op == "footprint" and key in model:
            registry.footprint(key, time=out, out_mark=out, in_mark=out)
            model[key] = out
        elif op == "close" and key in model:
            registry.close(key)
            del model[key]
        assert registry.n == len(model)
        assert [w.key for w in registry] == sorted(model, key=model.__getitem__)
        oldest = registry.oldest()
        if model:
            assert oldest is not None and oldest.out_mark == min(model.values())
            assert registry.extent_size(out) == out - min(model.values())
        else:
            assert oldest is None and registry.extent_size(out) == 0


def test_registry_rejects_a_second_open_window_per_key() -> None:
    registry = WindowRegistry()
    registry.open(_window("a", 1))
    with pytest.raises(KeyError):
        registry.open(_window("a", 2))


def test_extent_and_replay_sizes_follow_the_oldest_window() -> None:
    registry = WindowRegistry()
    registry.open(OpenWindow("a", 0, None, 0, 0, out_mark=10, in_mark=100))
    registry.open(OpenWindow("b", 0, None, 0, 0, out_mark=20, in_mark=150))
    assert registry.extent_size(30) == 20 and registry.replay_size(200) == 100
    registry.footprint("a", time=5, out_mark=30, in_mark=200)
    assert registry.oldest().key == "b"  # type: ignore[union-attr]
    assert registry.extent_size(31) == 11 and registry.replay_size(200) == 50


def test_policies() -> None:
    assert not GOpenOnly().wants_checkpoint(10**9, 10**9)
    q_only = TargetPolicy(q_target=100)
    assert q_only.wants_checkpoint(101, 0) and not q_only.wants_checkpoint(100, 10**9)
    u_only = TargetPolicy(u_target=50)
    assert u_only.wants_checkpoint(0, 51) and not u_only.wants_checkpoint(10**9, 50)
    assert isinstance(make_policy(Checkpointing()), GOpenOnly)
    assert make_policy(Checkpointing(q_target=5, u_target=7)) == TargetPolicy(5, 7)
    assert isinstance(make_policy(Checkpointing(recovery_target="3s")), RecoveryTimePolicy)
    assert isinstance(make_policy(Checkpointing(policy="cost-benefit")), CostBenefitPolicy)
    both = make_policy(Checkpointing(recovery_target=3, u_target=100, policy="cost-benefit"))
    assert isinstance(both, AnyOf) and both.targets()[1] == 100  # U bounds what the RTO picks
    with pytest.raises(ConfigError):
        TargetPolicy(q_target=0)


def test_checkpoint_budget_accrues_ci_of_every_cp_and_carries_debt() -> None:
    now = [1000.0]
    schedule = CheckpointSchedule(ci_ms=10, cp_ms=100, clock=lambda: now[0])
    assert schedule.credit() == 0.0  # starts accruing at the first look
    now[0] += 0.050
    assert schedule.credit() == pytest.approx(0.005)  # 10% of 50 ms
    schedule.spend(0.008, 3)  # one G-check too many: a debt of 3 ms
    assert schedule.credit() == pytest.approx(-0.003)
    now[0] += 0.030
    assert schedule.credit() == pytest.approx(0.0)
    now[0] += 10.0  # a quiet spell saves at most one CI
    assert schedule.credit() == pytest.approx(0.010)
    assert schedule.spent_seconds == pytest.approx(0.008) and schedule.gchecks == 3
    assert schedule.real_duty() == pytest.approx(0.008 / 10.08)
    schedule.set_duty(0.25)
    assert schedule.duty == pytest.approx(0.25) and schedule.cp == pytest.approx(0.1)
    unlimited = CheckpointSchedule(ci_ms=10, cp_ms=10, clock=lambda: now[0])
    assert unlimited.unlimited and unlimited.credit() == float("inf")
    with pytest.raises(ConfigError):
        CheckpointSchedule(ci_ms=20, cp_ms=10)
