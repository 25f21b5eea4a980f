"""Event-time watermarks (operators.aggregate with an allowed lateness; the rule: recovery.contract).

A time window closes when the watermark (max event time per input partition less the allowed lateness,
min over partitions) passes its end, whether or not its key comes back; later tuples are dead letters
"late"; a recovery closes the same windows as the failure-free run, crashes at any point included.
"""

from __future__ import annotations

import csv
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from cec.config import Checkpointing
from cec.exceptions import ConfigError
from cec.records import Kind
from operators.aggregate import KeyedAggregate
from operators.base import InputTuple
from operators.job import JobSpec, aggregate_operator, run_job
from operators.runtime import OperatorRuntime
from operators.sources import InputSource
from queuestore.output import OutputQueue
from queuestore.sqlite import SqliteQueueStore
from tests.helpers import log_records, per_key, results, run_through_crashes, start_worker


def _csv(path: Path, rows: list[tuple[str, float, int]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["k", "v", "t"])
        w.writerows(rows)
    return path


def _csv_job(
    root: Path, input_path: Path, *, lateness: int | None, window_ms: int = 10, **ckpt: Any
) -> JobSpec:
    return JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "k",
            "value_field": "v",
            "agg": "sum",
            "window_ms": window_ms,
            "time_field": "t",
            "allowed_lateness_ms": lateness,
        },
        source={"type": "csv", "path": str(input_path)},
        store={"type": "sqlite", "root": str(root)},
        output_topic="agg",
        checkpointing=Checkpointing(**ckpt) if ckpt else Checkpointing(),
        batch_size=1,
    )


def _windows(rows: list[dict[str, Any]]) -> list[tuple[str, int, int, float]]:
    return [(r["key"], r["start"], r["end"], r["value"]) for r in rows]


def test_an_idle_keys_window_closes_when_the_watermark_passes_its_end(tmp_path: Path) -> None:
    rows = [("a", 1.0, 0)] + [("b", 2.0, t) for t in range(5, 100, 10)]
    data = _csv(tmp_path / "in.csv", rows)
    run_job(_csv_job(tmp_path / "wm", data, lateness=0))
    store = SqliteQueueStore(tmp_path / "wm")
    got = _windows(results(store, "agg"))
    # a never comes back: the watermark (b at 15) closes [0, 10) of a and of b, in (end, key) order.
    assert got[:2] == [("a", 0, 10, 1.0), ("b", 0, 10, 2.0)]
    assert got == [("a", 0, 10, 1.0)] + [("b", s, s + 10, 2.0) for s in range(0, 90, 10)]
    log = log_records(store, "agg")
    assert log[-1].kind is Kind.EOS and log[-1].n == 1  # only b's [90, 100) is open at the end
    r_a = next(i for i, r in enumerate(log) if r.kind is Kind.R and r.key == "a")
    assert log[r_a].marks == (5,)  # closed by b@15, whose record does not claim it: m from before b@15

    run_job(_csv_job(tmp_path / "plain", data, lateness=None))
    plain = _windows(results(SqliteQueueStore(tmp_path / "plain"), "agg"))
    assert ("a", 0, 10, 1.0) not in plain  # per-key closing only: a's window is open for ever


def test_tuples_behind_the_watermark_are_dead_letters_late(tmp_path: Path) -> None:
    rows = [("a", 1.0, 0), ("b", 1.0, 5), ("b", 1.0, 15), ("b", 1.0, 25), ("a", 4.0, 7), ("a", 8.0, 19)]
    data = _csv(tmp_path / "in.csv", rows)
    run_job(_csv_job(tmp_path / "wm", data, lateness=10))
    store = SqliteQueueStore(tmp_path / "wm")
    # b closes its own windows at 15 and 25; b@25 first puts W at 15, which closes a's [0, 10) (a never
    # came back). Then a@7 is late; a@19 falls in [10, 20), still open (20 > 15).
    assert _windows(results(store, "agg")) == [("b", 0, 10, 1.0), ("a", 0, 10, 1.0), ("b", 10, 20, 1.0)]
    dead = results(store, "agg", Kind.DEAD)
    assert [(d["offset"], d["reason"].split(":")[0]) for d in dead] == [(4, "late")]
    assert "watermark 15" in dead[0]["reason"]
    assert log_records(store, "agg")[-1].n == 2  # a's [10, 20) and b's [20, 30)


def test_allowed_lateness_needs_a_time_window_and_is_not_negative() -> None:
    with pytest.raises(ConfigError, match="needs a time window"):
        KeyedAggregate(key_field="k", value_field="v", window_count=3, allowed_lateness=0)
    with pytest.raises(ConfigError, match=">= 0"):
        KeyedAggregate(key_field="k", value_field="v", window_ms=10, time_field="t", allowed_lateness=-1)
    assert (
        aggregate_operator("k", "v", "sum", window_time="10s", time="t", allowed_lateness="2s")[
            "allowed_lateness_ms"
        ]
        == 2000
    )


# -- crash and recovery --------------------------------------------------------------------------------


def _generator_job(root: Path, *, lateness: int | None, partitions: int = 3) -> JobSpec:
    return JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "sum",
            "window_ms": 60,
            "time_field": "item_time",
            "allowed_lateness_ms": lateness,
        },
        # Interleaved: a replay interleaves the partitions differently from the first run. Event times
        # increase within each partition, so no tuple is late whatever the interleaving, and the results
        # per key are a function of the input.
        source={
            "type": "generator",
            "count": 6000,
            "keys": 400,
            "seed": 7,
            "partitions": partitions,
            "invalid_every": 50,
            "interleave": 11,
        },
        store={"type": "sqlite", "root": str(root)},
        output_topic="agg",
        checkpointing=Checkpointing(u_target=300, ci_ms=10.0, cp_ms=10.0),
        batch_size=16,
    )


@pytest.mark.parametrize(
    "crashes",
    [
        [("runtime.after_input", 1500)],
        [("runtime.before_append", 900), ("external", 2500)],
        [("store.before_commit", 40), ("runtime.replaying", 200), ("runtime.after_append", 3000)],
    ],
)
def test_sigkill_and_recovery_close_the_same_windows_with_several_partitions(
    tmp_path: Path, crashes: list[tuple[str, int]]
) -> None:
    run_job(_generator_job(tmp_path / "reference", lateness=0))
    reference = SqliteQueueStore(tmp_path / "reference")
    want = results(reference, "agg")
    run_job(_generator_job(tmp_path / "plain", lateness=None))
    plain = results(SqliteQueueStore(tmp_path / "plain"), "agg")
    # The watermark closes windows whose keys never came back: more results than per-key closing gives.
    assert len(want) > len(plain)

    root = tmp_path / "crashed"
    spec = _generator_job(root, lateness=0)
    killed = run_through_crashes(spec, tmp_path / "spec.json", crashes)
    assert killed >= 1
    proc = start_worker(spec, tmp_path / "spec.json")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()[-2000:]

    crashed = SqliteQueueStore(root)
    got = results(crashed, "agg")
    assert per_key(got) == per_key(want)
    assert len(got) == len(want)
    assert sorted(map(repr, results(crashed, "agg", Kind.DEAD))) == sorted(
        map(repr, results(reference, "agg", Kind.DEAD))
    )
    log = log_records(crashed, "agg")
    assert [r.kind for r in log].count(Kind.EOS) == 1
    _assert_watermark_invariant(log, window_ms=60, lateness=0)


def _assert_watermark_invariant(log: list[Any], *, window_ms: int, lateness: int) -> None:
    """recovery.contract, "watermarks": at every record, every window whose end is at or below the
    watermark of the record's marks is closed (its R is before it). A record written while a recovering
    partition was still below its crash point, with another partition's tuples raising W, breaks it."""
    operator = KeyedAggregate(key_field="k", value_field="v", window_ms=window_ms, time_field="t")
    open_ends: dict[tuple[str, int], int] = {}
    for record in log:
        if record.kind is Kind.GOPEN:
            open_ends[(record.key, record.seq)] = operator.decode_state(record.state).start + window_ms
        elif record.kind is Kind.R and record.key is not None:
            open_ends.pop((record.key, record.seq), None)
        if record.marks and min(record.marks) > -(1 << 63):
            w = min(record.marks) - lateness
            # Records of a tuple that do not claim it (the R of the windows it closes) carry W from before it.
            stale = [wid for wid, end in open_ends.items() if end <= w]
            assert not stale, (record, stale[:3])


def _disordered_rows() -> list[tuple[str, float, int]]:
    """Out-of-order event times over 30 keys, some far behind: late tuples, idle keys and per-key closes."""
    rows = []
    for i in range(3000):
        h = (i * 2654435761) % 2**32
        jitter = h % 40  # up to 40 ms behind the stream's clock
        rows.append((f"k{h % 30}", float(1 + h % 97), max(0, 2 * i - jitter)))
    return rows


@pytest.mark.parametrize("site,n", [("runtime.after_input", 1200), ("runtime.before_append", 2100)])
def test_sigkill_and_recovery_reproduce_late_dead_letters_exactly(tmp_path: Path, site: str, n: int) -> None:
    data = _csv(tmp_path / "in.csv", _disordered_rows())
    reference = SqliteQueueStore(tmp_path / "reference")
    run_job(
        _csv_job(
            tmp_path / "reference", data, lateness=15, window_ms=25, u_target=100, ci_ms=10.0, cp_ms=10.0
        )
    )
    want, want_dead = results(reference, "agg"), results(reference, "agg", Kind.DEAD)
    assert any(d["reason"].startswith("late:") for d in want_dead)

    spec = _csv_job(
        tmp_path / "crashed", data, lateness=15, window_ms=25, u_target=100, ci_ms=10.0, cp_ms=10.0
    )
    proc = start_worker(spec, tmp_path / "spec.json", faults=f"{site}:{n}")
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    proc = start_worker(spec, tmp_path / "spec.json")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()[-2000:]
    crashed = SqliteQueueStore(tmp_path / "crashed")
    # One input partition: exactly the failure-free output, in order, dead letters included.
    assert results(crashed, "agg") == want
    assert results(crashed, "agg", Kind.DEAD) == want_dead


# -- the CLI -------------------------------------------------------------------------------------------


def test_cec_run_allowed_lateness_closes_idle_windows_and_survives_a_crash(tmp_path: Path) -> None:
    from tests.helpers import cec

    rows = [("idle", 5.0, 0)] + [(f"k{i % 7}", float(i % 13), 3 * i) for i in range(1, 2000)]
    data = _csv(tmp_path / "in.csv", rows)
    args = ["run", str(data), "--key", "k", "--value", "v", "--time", "t", "--window-time", "50ms"]
    args += ["--agg", "sum", "--allowed-lateness", "0"]
    plain = cec(*args, "--results", str(tmp_path / "plain.csv"), "--store-dir", str(tmp_path / "s1"))
    assert plain.returncode == 0, plain.stderr
    crashed = cec(
        *args, "--results", str(tmp_path / "crashed.csv"), "--store-dir", str(tmp_path / "s2"),
        "--crash-after", "700",
    )  # fmt: skip
    assert crashed.returncode == 0, crashed.stderr
    assert (tmp_path / "plain.csv").read_text() == (tmp_path / "crashed.csv").read_text()
    lines = (tmp_path / "plain.csv").read_text().splitlines()
    assert any(line.startswith("idle,") for line in lines)  # closed by the watermark: idle never returns

    refused = cec("run", str(data), "--key", "k", "--value", "v", "--window-count", "3",
                  "--allowed-lateness", "1s", "--results", str(tmp_path / "r.csv"))  # fmt: skip
    assert refused.returncode != 0
    assert "--allowed-lateness needs --window-time" in refused.stderr and "Traceback" not in refused.stderr


# -- the hold-back rule, with an adversarial interleaving ----------------------------------------------


class _ScriptedSource(InputSource):
    """Two partitions delivered one tuple per poll in a given order of partitions (after a seek too)."""

    def __init__(self, rows: list[list[tuple[str, int]]], order: list[int]) -> None:
        self.rows, self.order, self.partitions = rows, order, len(rows)
        self._next = [0] * self.partitions

    def seek(self, positions: Sequence[int]) -> None:
        self._next = list(positions)

    def poll(self, max_records: int) -> list[InputTuple] | None:
        for j in self.order:
            o = self._next[j]
            if o < len(self.rows[j]):
                self._next[j] += 1
                key, t = self.rows[j][o]
                return [InputTuple(j, o, {"k": key, "v": 1.0, "t": t})]
        return None

    def describe(self) -> str:
        return "scripted"

    def identity(self) -> dict[str, Any]:
        return {"type": "scripted"}


def _scripted_run(root: Path, order: list[int], max_inputs: int | None = None) -> None:
    # Partition 0: a's window [0, 10) and x@15 (m0 = 15 from the second tuple on). Partition 1: b@5, then
    # b@20, which puts W at 15: a's window closes with its 3 tuples.
    rows = [[("a", 0), ("x", 15), ("a", 1), ("a", 2)], [("b", 5), ("b", 20)]]
    operator = KeyedAggregate(key_field="k", value_field="v", agg="count", window_ms=10, time_field="t",
                              allowed_lateness=0)  # fmt: skip
    store = SqliteQueueStore(root)
    store.create_topic("agg", 1)
    output = OutputQueue(store, "agg", 0)
    try:
        OperatorRuntime(operator, _ScriptedSource(rows, order), output, batch_size=1).run(
            max_inputs=max_inputs
        )
    finally:
        output.close()


def test_tuples_past_a_crash_point_wait_for_every_partition_to_reach_its_own(tmp_path: Path) -> None:
    """The crash leaves b@5 as the newest record (W = 5, a's window open). The recovery delivers
    partition 1 first: b@20, past its crash point, would put W at 15 while a@1 and a@2 are still to be
    replayed into a's window; a rebuild judged against that W would drop them as late, and a's result
    would count 1. Held back until partition 0 reached its crash point, b@20 closes a's window whole."""
    _scripted_run(tmp_path / "reference", [0, 1])
    want = sorted(_windows(results(SqliteQueueStore(tmp_path / "reference"), "agg")))
    assert ("a", 0, 10, 3.0) in want

    _scripted_run(tmp_path / "crashed", [0, 1], max_inputs=5)  # stops before b@20
    log = log_records(SqliteQueueStore(tmp_path / "crashed"), "agg")
    assert (log[-1].kind, log[-1].key, log[-1].pos) == (Kind.GOPEN, "b", (4, 1))
    _scripted_run(tmp_path / "crashed", [1, 0])  # recovery: partition 1 first
    crashed = SqliteQueueStore(tmp_path / "crashed")
    assert sorted(_windows(results(crashed, "agg"))) == want
    _assert_watermark_invariant(log_records(crashed, "agg"), window_ms=10, lateness=0)
