"""Batched G-checks (`OperatorRuntime(gcheck_batch=...)`): the next oldest windows the policy wants are
G-checked at one moment, their states and records encoded in one call each and appended in one store call.

They must write exactly the records one-at-a-time G-checks write, deliver the checkpoint budget (duty within
20% of CI/CP on an injected clock), recover exactly after a SIGKILL, and give the same bytes with the C
accelerator as without it.
"""

from __future__ import annotations

import random
import signal
from pathlib import Path
from typing import Any

import pytest

import cec.avro_codec as avro_codec
import cec.wire as wire
from cec.config import Checkpointing
from cec.native import native
from cec.policy import CheckpointPolicy, TargetPolicy, WindowView
from cec.records import AvroCodec, Kind, RecordCodec
from cec.schedule import CheckpointSchedule
from operators.aggregate import STATE_SCHEMA, AggState, KeyedAggregate
from operators.job import JobSpec, run_job
from operators.runtime import OperatorRuntime, RunStats
from operators.sources import PurchaseGenerator
from queuestore.output import OutputQueue
from queuestore.sqlite import SqliteQueueStore
from tests.helpers import log_records, results, start_worker, wait_for


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TimedAggregate(KeyedAggregate):
    """The count-window average taking `tuple_s` of (fake) time per tuple and `state_s` per footprint
    state it encodes (one at a time or in a run: the batched G-check's cost is per window too)."""

    def __init__(self, clock: FakeClock, tuple_s: float, state_s: float, window: int) -> None:
        super().__init__(key_field="item_id", value_field="item_price", window_count=window)
        self.clock = clock
        self.tuple_s = tuple_s
        self.state_s = state_s
        self.runs: list[int] = []  # sizes of the runs of states encoded for G-checks

    def process(self, tup: Any, ctx: Any) -> None:
        self.clock.now += self.tuple_s
        super().process(tup, ctx)

    def encode_footprints(self, states: list[AggState]) -> list[bytes]:
        self.runs.append(len(states))
        self.clock.now += self.state_s * len(states)
        return super().encode_footprints(states)


class GapPolicy(CheckpointPolicy):
    """Wants the oldest window while u > U and its gap to the next one is not empty: a policy that needs
    the whole view, so the runtime cannot pick its runs by thresholds."""

    def __init__(self, u_target: int) -> None:
        self.u_target = u_target

    def wants_checkpoint(self, extent_size: int, replay_size: int) -> bool:
        return replay_size > self.u_target

    def wants_oldest(self, view: WindowView) -> bool:
        return view.replay_size > self.u_target and view.gap_in + view.gap_out > 0

    def describe(self) -> str:
        return f"gap U={self.u_target}"


def _run(
    root: Path,
    policy: CheckpointPolicy,
    *,
    gcheck_batch: int,
    ci_ms: float = 100.0,
    count: int = 20_000,
    keys: int = 1500,
    window: int = 40,
    tuple_s: float = 0.0,
    state_s: float = 0.0,
) -> tuple[RunStats, TimedAggregate]:
    clock = FakeClock()
    store = SqliteQueueStore(root)
    store.create_topic("agg", 1)
    output = OutputQueue(store, "agg", 0)
    operator = TimedAggregate(clock, tuple_s, state_s, window)
    try:
        runtime = OperatorRuntime(
            operator,
            PurchaseGenerator(count, keys, seed=5),
            output,
            policy=policy,
            schedule=CheckpointSchedule(ci_ms, 100.0, clock=clock),
            batch_size=64,
            gcheck_batch=gcheck_batch,
        )
        return runtime.run(), operator
    finally:
        output.close()
        store.close()


def _log(root: Path) -> list[tuple[int, str, int, str | None, int, bytes]]:
    store = SqliteQueueStore(root)
    try:
        with store.reader("agg", 0) as reader:
            return [
                (r.offset, r.meta.kind, r.meta.time, r.meta.key, r.meta.seq, r.value)
                for r in reader.scan_forward()
            ]
    finally:
        store.close()


@pytest.mark.parametrize(
    "policy",
    [TargetPolicy(u_target=700), TargetPolicy(q_target=2500), TargetPolicy(1800, 900), GapPolicy(600)],
    ids=["U", "Q", "Q+U", "view"],
)
def test_batched_gchecks_write_exactly_the_records_one_at_a_time_writes(
    tmp_path: Path, policy: CheckpointPolicy
) -> None:
    # Windows of 5 over 1,500 keys: results keep coming (q grows), windows stay open ~7,500 tuples (u).
    one_stats, _ = _run(tmp_path / "one", policy, gcheck_batch=1, count=12_000, window=5)
    batch_stats, operator = _run(tmp_path / "batch", policy, gcheck_batch=256, count=12_000, window=5)
    assert one_stats.gchecks > 1000  # the targets keep G-checks coming
    assert max(operator.runs) > 1  # ...in runs, not one by one
    assert batch_stats.gchecks == one_stats.gchecks
    one, batch = _log(tmp_path / "one"), _log(tmp_path / "batch")
    assert len(batch) == len(one)
    assert batch == one  # offsets, metadata and bytes


@pytest.mark.parametrize("ci_ms", [5.0, 25.0])
def test_batched_gchecks_deliver_the_budget_on_an_injected_clock(tmp_path: Path, ci_ms: float) -> None:
    # 2,000 long windows and U=500: holding U needs far more G-checks than any budget here gives.
    stats, operator = _run(
        tmp_path,
        TargetPolicy(u_target=500),
        gcheck_batch=256,
        ci_ms=ci_ms,
        count=30_000,
        keys=2000,
        window=1000,
        tuple_s=20e-6,
        state_s=30e-6,
    )
    budget = ci_ms / 100.0
    assert stats.gchecks > 0
    assert max(operator.runs) > 1  # batched
    assert abs(stats.checkpoint_duty - budget) <= 0.2 * budget, stats.checkpoint_duty
    g_time = stats.gchecks * 30e-6  # all G-check time on the fake clock is the states' encoding
    run_time = stats.inputs * 20e-6 + g_time
    assert stats.checkpoint_seconds == pytest.approx(g_time, rel=0.05)
    assert stats.checkpoint_duty == pytest.approx(g_time / run_time, rel=0.05)


def test_batched_gchecks_stop_when_the_targets_hold(tmp_path: Path) -> None:
    # A budget without limit: u is brought back to U after every look, never far below it (a run stops
    # at the first window the policy no longer wants).
    stats, _ = _run(tmp_path, TargetPolicy(u_target=700), gcheck_batch=256)
    assert stats.gchecks > 0
    assert stats.max_replay <= 700 + 32 + 64  # U plus what one look (check_every) and one batch add


def _crash_spec(root: Path) -> JobSpec:
    return JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "avg",
            "window_count": 30,
        },
        source={"type": "generator", "count": 60_000, "keys": 3000, "seed": 11, "partitions": 2},
        store={"type": "sqlite", "root": str(root)},
        output_topic="agg",
        checkpointing=Checkpointing(u_target=1500, ci_ms=50.0, cp_ms=100.0),
        batch_size=128,
    )


@pytest.mark.parametrize("crash", ["external", "store.before_commit:150", "runtime.before_append:5000"])
def test_sigkill_during_batched_gchecks_recovers_exactly(tmp_path: Path, crash: str) -> None:
    run_job(_crash_spec(tmp_path / "reference"))
    reference = SqliteQueueStore(tmp_path / "reference")
    want = results(reference, "agg")
    root = tmp_path / "crashed"
    spec = _crash_spec(root)
    if crash == "external":
        proc = start_worker(spec, tmp_path / "spec.json")
        store = SqliteQueueStore(root)

        def gchecks_logged() -> int:
            if not store.topic_exists("agg"):
                return 0
            with store.reader("agg", 0) as reader:
                return sum(r.meta.kind == "GCHECK" for r in reader.read_backward(reader.end_offset(), 4096))

        try:
            wait_for(lambda: proc.poll() is not None or gchecks_logged() >= 500, timeout=120)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        store.close()
        crashed = SqliteQueueStore(root)
        assert any(r.kind is Kind.GCHECK for r in log_records(crashed, "agg"))  # the crash hit a run of them
    else:
        # A fault site fires at a record count; whether G-checks (paid from a wall-clock budget) had begun
        # by then depends on the machine's speed, so it is not a precondition here: exact either way.
        proc = start_worker(spec, tmp_path / "spec.json", faults=crash)
        proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL
        crashed = SqliteQueueStore(root)
    proc = start_worker(spec, tmp_path / "spec.json")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err.decode()[-2000:]
    got = results(crashed, "agg")
    assert sorted(map(repr, got)) == sorted(map(repr, want))
    assert len(got) == len(want)


def _states(rnd: random.Random, n: int) -> list[AggState]:
    out = []
    for _ in range(n):
        count = rnd.choice([1, 1, 2, 7, 9])
        x = rnd.choice([0.0, -0.0, 1.5, rnd.uniform(-1e6, 1e6), float("inf")])
        lo, hi = (x, x) if count == 1 and rnd.random() < 0.7 else (x - 1.0, x + 2.0)
        start = rnd.choice([0, 5, -(2**40), 2**62])
        out.append(AggState(count, x * count, lo, hi, start, start + rnd.randrange(0, 10**6)))
    return out


def test_runs_encode_to_the_bytes_of_one_at_a_time_and_of_pure_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rnd = random.Random(7)
    operator = KeyedAggregate(key_field="item_id", value_field="item_price", window_count=10)
    states = _states(rnd, 400)
    keys = [rnd.choice(["a", "item-7", "é€", "k" * 200]) + str(i) for i in range(len(states))]
    seqs = [rnd.choice([0, 1, 63, 64, 2**40]) for _ in states]
    codec = RecordCodec()
    for pos, marks in (((250_000,), ()), ((3, 2**33, 0), (-(2**63), 5, 7))):
        state_bytes = operator.encode_footprints(states)
        assert state_bytes == [operator.encode_footprint(s) for s in states]
        run = codec.encode_run(Kind.GCHECK, 250_000, pos, 92_000, marks, keys, seqs, state_bytes)
        one = [
            codec.encode_fields(Kind.GCHECK, 250_000, pos, 92_000, k, q, s, None, marks)
            for k, q, s in zip(keys, seqs, state_bytes, strict=True)
        ]
        assert run == one
        # Without the C accelerator (CEC_NO_NATIVE=1): the same bytes from the pure-Python definitions.
        with monkeypatch.context() as m:
            m.setattr(wire, "_native_encode_gchecks", None)
            m.setattr(wire, "_native_encode", None)
            m.setattr(avro_codec, "_native_encode_avro", None)
            m.setattr(wire, "native", None)
            m.setattr(avro_codec, "native", None)
            assert AvroCodec(STATE_SCHEMA).encode_tuples(
                [(s.count, s.total, s.lo, s.hi, s.start, s.last) for s in states]
            ) == [operator.encode_state(s) for s in states]
            assert operator.encode_footprints(states) == state_bytes
            assert codec.encode_run(Kind.GCHECK, 250_000, pos, 92_000, marks, keys, seqs, state_bytes) == run


@pytest.mark.skipif(native is None, reason="the C accelerator is not built")
def test_the_c_runs_decline_what_one_record_declines() -> None:
    # A key that is not UTF-8 text: encode_compact declines it, so the whole run is left to Python.
    assert native.encode_gchecks(5, "GCHECK", 1, (1,), 1, (), ["ok", "\ud800"], [0, 0], [b"", b""]) is None
    assert (
        native.encode_avro_each(AvroCodec(STATE_SCHEMA)._program, [(1, 1, 1.0, 1.0, 0, 0)]) is None
    )  # int total
    with pytest.raises(ValueError):
        native.encode_gchecks(5, "GCHECK", 1, (1,), 1, (), ["a"], [0, 1], [b""])
