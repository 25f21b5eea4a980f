"""The standby's replica (`operators.replica`, design S2).

The model: for prefixes of a real run's log (3 input partitions, dead letters, G-checks), whatever the
steps in which the log grew and the replica applied input, the replica's states at the prefix's crash point
are the ones a cold recovery there rebuilds from the footprints (the eventual checkpoint read back, loaded,
and the input replayed to the crash point; replayed here one tuple at a time from the generator, without
the replica's code). And its failures: an input that stops short of the crash point, an operator that
raises, windows that differ from the log's: a reason, never an exception, and recovery then replays from
the footprints (`recovery.manager.load_checkpoint`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cec.records import RecordCodec
from cec.registry import OpenWindow
from operators.base import InputTuple
from operators.engine import OperatorInstance
from operators.job import JobSpec, run_job
from operators.replica import DiscardedRecords, StandbyReplica
from operators.sources import InputSource, PurchaseGenerator
from queuestore.base import Row
from queuestore.sqlite import SqliteQueueStore
from recovery.eventual import EventualCheckpoint, EventualCheckpointBuilder
from recovery.manager import load_checkpoint
from recovery.standby import LogFollower
from tests.helpers.log_prefix import LogPrefix, logged_rows

CODEC = RecordCodec()
GENERATOR = {"count": 3000, "keys": 40, "seed": 9, "partitions": 3, "invalid_every": 37}


def _spec(root: Path) -> JobSpec:
    return JobSpec(
        operator={"type": "aggregate", "key_field": "item_id", "value_field": "item_price", "agg": "sum",
                  "window_count": 6},
        source={"type": "generator", **GENERATOR, "interleave": 5},
        store={"type": "sqlite", "root": str(root)},
        output_topic="agg",
        checkpointing={"u_target": 150, "ci_ms": 50, "cp_ms": 50},
        batch_size=16,
    )  # fmt: skip


def _generator(interleave: int | None = None) -> PurchaseGenerator:
    return PurchaseGenerator(
        GENERATOR["count"],
        GENERATOR["keys"],
        seed=GENERATOR["seed"],
        partitions=GENERATOR["partitions"],
        invalid_every=GENERATOR["invalid_every"],
        interleave=interleave,
    )


@pytest.fixture(scope="module")
def run_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[JobSpec, list[Row]]:
    root = tmp_path_factory.mktemp("replica")
    spec = _spec(root)
    run_job(spec)
    rows = logged_rows(SqliteQueueStore(root), "agg")
    assert len(rows) > 1000 and {"GOPEN", "GCHECK", "R"} <= {row[1] for row in rows}
    return spec, rows


def _recovered_by_replay(spec: JobSpec, rows: list[Row], end: int) -> dict[str, tuple[int, bytes]]:
    """What a cold recovery at log[0..end] holds at its crash point: key -> (seq, encoded state)."""
    ec = EventualCheckpointBuilder(LogPrefix(rows, end), CODEC).build()
    assert ec.crash_pos is not None
    operator = spec.operator.build()
    closed: dict[str, int] = {}
    for row in rows[:end]:
        if row[1] == "R" and row[3] is not None:
            closed[row[3]] = row[4]
    instance = OperatorInstance(operator, DiscardedRecords(), 3, closed_seq=closed.get)
    instance.restore(load_checkpoint(ec, operator.decode_state, CODEC, 3))
    generator = _generator()
    start = list(instance.positions)
    # Partitions in turn, one tuple each: each key lives in one partition, so any interleaving will do.
    while any(o < c for o, c in zip(start, ec.crash_pos, strict=True)):
        for j in range(3):
            if start[j] < ec.crash_pos[j]:
                instance.apply(InputTuple(j, start[j], generator.tuple_at(j, start[j])))
                start[j] += 1
    return {w.key: (w.seq, operator.encode_state(w.state)) for w in instance.registry}


def _replica(spec: JobSpec, source: InputSource | None = None) -> StandbyReplica:
    return StandbyReplica(spec.operator.build(), source or _generator(interleave=3), batch_size=16)


def _follow_and_replicate(
    rows: list[Row], replica: StandbyReplica, steps: list[int], budgets: list[int], end: int
) -> tuple[LogFollower, EventualCheckpoint]:
    """The log grows to `end` in `steps`, the standby following it and its replica applying `budgets`
    tuples after each step (cycled); the final checkpoint as the follower holds it."""
    log = LogPrefix(rows, topic="growing")
    follower = LogFollower(CODEC)
    for i, step in enumerate(steps):
        log.end = min(end, log.end + step)
        follower.catch_up(log)
        replica.advance(follower, budgets[i % len(budgets)])
        if log.end == end:
            break
    log.end = end
    follower.catch_up(log)
    ec = follower.forward.checkpoint(CODEC, end)
    assert ec is not None
    return follower, ec


def _states(replica: StandbyReplica, ec: EventualCheckpoint) -> dict[str, tuple[int, bytes]]:
    held = replica.states_at(ec, within=1 << 30)
    assert not isinstance(held, str), held
    encode = replica.operator.encode_state
    return {key: (w.seq, encode(w.state)) for key, w in held.items() if key in ec.windows}


@settings(max_examples=30, deadline=None)
@given(
    data=st.data(),
    steps=st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=30),
    budgets=st.lists(st.integers(min_value=1, max_value=600), min_size=1, max_size=5),
)
def test_the_replicas_states_at_a_crash_point_are_what_a_replay_from_the_footprints_rebuilds(
    run_log: tuple[JobSpec, list[Row]], data: st.DataObject, steps: list[int], budgets: list[int]
) -> None:
    spec, rows = run_log
    end = data.draw(
        st.integers(min_value=min(len(rows) - 1, sum(steps)), max_value=len(rows) - 1), label="end"
    )
    replica = _replica(spec)
    _, ec = _follow_and_replicate(rows, replica, steps, budgets, end)
    expected = _recovered_by_replay(spec, rows, end)
    got = _states(replica, ec)
    assert got == {key: expected[key] for key in ec.windows}
    assert replica.unusable == "handed over" and replica.states_at(ec, 1 << 30) == "handed over"


def test_the_replica_never_applies_input_past_the_crash_point_it_followed(
    run_log: tuple[JobSpec, list[Row]],
) -> None:
    spec, rows = run_log
    replica = _replica(spec)
    log = LogPrefix(rows, end=len(rows) // 3, topic="growing")
    follower = LogFollower(CODEC)
    follower.catch_up(log)
    while replica.advance(follower, 50):
        pass
    ec = follower.forward.checkpoint(CODEC, log.end)
    assert ec is not None and ec.crash_pos is not None and replica.instance is not None
    assert list(replica.instance.positions) == list(ec.crash_pos)  # exactly there, no further


class _ShortInput(InputSource):
    """The generator, but nothing at or past `stop` on partition 0 (a source that stalls)."""

    def __init__(self, stop: int) -> None:
        self.inner = _generator(interleave=3)
        self.partitions = 3
        self.stop = stop

    def seek(self, positions: Sequence[int]) -> None:
        self.inner.seek(positions)

    def poll(self, max_records: int) -> list[InputTuple] | None:
        batch = self.inner.poll(max_records)
        if batch is None:
            return []
        return [t for t in batch if t.partition != 0 or t.offset < self.stop]

    def describe(self) -> str:
        return "short"

    def identity(self) -> dict[str, Any]:
        return {}


def test_an_input_that_stops_short_of_the_crash_point_makes_the_replica_unusable_not_an_error(
    run_log: tuple[JobSpec, list[Row]],
) -> None:
    spec, rows = run_log
    ticks = iter(range(0, 10_000, 1))
    replica = StandbyReplica(
        spec.operator.build(), _ShortInput(stop=100), batch_size=16, clock=lambda: next(ticks)
    )
    _, ec = _follow_and_replicate(rows, replica, [len(rows) // 4], [10_000], len(rows) // 2)
    why = replica.states_at(ec, within=1 << 30)
    assert isinstance(why, str) and why.startswith("the input did not reach the crash point"), why


def test_a_replica_further_behind_than_the_footprints_replay_gives_way_to_it(
    run_log: tuple[JobSpec, list[Row]],
) -> None:
    spec, rows = run_log
    replica = _replica(spec)
    _, ec = _follow_and_replicate(rows, replica, [len(rows) // 4], [1], len(rows) // 2)
    assert ec.crash_pos is not None and replica.instance is not None
    behind = sum(ec.crash_pos) - sum(replica.instance.positions)
    assert behind > 100
    assert replica.states_at(ec, within=behind - 1) == (
        f"the replica was {behind:,} tuples behind the crash point, a replay from the footprints {behind - 1:,}"
    )


def test_an_operator_that_raises_in_the_replica_makes_it_unusable_and_the_standby_goes_on(
    run_log: tuple[JobSpec, list[Row]],
) -> None:
    spec, rows = run_log
    replica = _replica(spec)

    def broken(tup: InputTuple, ctx: Any) -> None:
        raise RuntimeError("a bug the primary does not hit")

    replica.operator.process = broken  # type: ignore[method-assign]
    follower, ec = _follow_and_replicate(rows, replica, [len(rows) // 2], [500], len(rows) // 2)
    assert replica.unusable == "the replica failed: RuntimeError: a bug the primary does not hit"
    assert replica.advance(follower, 500) == 0
    assert replica.states_at(ec, 1 << 30) == replica.unusable


class _Held:
    """States some replica holds (`recovery.manager.LiveStates`)."""

    def __init__(self, states: dict[str, tuple[int, Any]]) -> None:
        self.windows = {key: OpenWindow(key, seq, state, 0, 0, 0, 0) for key, (seq, state) in states.items()}

    def states_at(self, ec: EventualCheckpoint, within: int) -> dict[str, OpenWindow]:
        return self.windows


def test_recovery_takes_a_replicas_states_only_when_they_are_the_checkpoints_windows(
    run_log: tuple[JobSpec, list[Row]],
) -> None:
    spec, rows = run_log
    end = len(rows) // 2
    ec = EventualCheckpointBuilder(LogPrefix(rows, end), CODEC).build()
    operator = spec.operator.build()
    decode = operator.decode_state
    exact = {key: (fp.row[4], decode(fp.record.state or b"")) for key, fp in ec.windows.items()}
    held = _Held(exact)
    used = load_checkpoint(ec, decode, CODEC, 3, replica=held)
    assert used.at_crash_point and used.report.replica == "used" and used.report.replay_span == 0
    installed = used.windows
    assert {w.key: w.state for w in installed} == {key: state for key, (_, state) in exact.items()}
    # The held windows themselves, with the marks a decoded window gets from its footprint.
    decoded = load_checkpoint(ec, decode, CODEC, 3).windows
    assert [w.key for w in installed] == [w.key for w in decoded]
    assert all(w is held.windows[w.key] for w in installed)
    assert [(w.seq, w.tau1, w.tau2, w.out_mark, w.in_mark) for w in installed] == [
        (w.seq, w.tau1, w.tau2, w.out_mark, w.in_mark) for w in decoded
    ]
    key = next(iter(ec.windows))
    for live in (
        {**exact, key: (exact[key][0] + 1, exact[key][1])},
        {k: v for k, v in exact.items() if k != key},
    ):
        refused = load_checkpoint(ec, decode, CODEC, 3, replica=_Held(live))
        assert not refused.at_crash_point and refused.report.replay_span == refused.plan.replay_span > 0
        assert refused.report.replica.startswith("the replica's windows differ from the log's"), (
            refused.report
        )
        assert f"key {key!r}" in refused.report.replica
