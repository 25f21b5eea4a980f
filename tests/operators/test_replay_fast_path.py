"""The replay loop (`OperatorInstance._replay_run`) against the per-tuple path it stands in for.

Recovery below the crash point runs through `_replay_run`, the path production runs (and the crash tests
too: their kills come from outside the product). The per-tuple path (`_apply`, every rule) must leave
exactly the same log and the same replay figures: the same crashed log is recovered both ways (the loop
turned off from the test side for one of them) and compared record by record."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest

from cec.config import Checkpointing
from cec.records import Kind
from cec.registry import OpenWindow, WindowRegistry
from operators.engine.instance import OperatorInstance
from operators.job import JobSpec, run_job
from queuestore.sqlite import SqliteQueueStore
from tests.helpers import log_records


def _specs(root: Path, *, queue: bool, partitions: int) -> tuple[JobSpec | None, JobSpec]:
    store = {"type": "sqlite", "root": str(root)}
    generator = {"type": "generator", "count": 3000, "keys": 120, "seed": 7, "invalid_every": 37}
    upstream = None
    if queue:
        upstream = JobSpec(
            operator={"type": "filter", "field": "item_price", "op": ">", "value": 0, "schema": "purchase"},
            source={**generator, "partitions": partitions},
            store=store,
            output_topic="purchases",
            output_partitions=partitions,
            batch_size=64,
        )
        source: dict[str, Any] = {"type": "queue", "topic": "purchases", "schema": "purchase"}
    else:
        source = {**generator, "partitions": partitions}
    agg = JobSpec(
        operator={"type": "aggregate", "key_field": "item_id", "value_field": "item_price", "agg": "avg",
                  "window_count": 7},
        source=source,
        store=store,
        output_topic="agg",
        checkpointing=Checkpointing(u_target=400, ci_ms=5.0, cp_ms=10.0),
        batch_size=50,
    )  # fmt: skip
    return upstream, agg


_FAST = OperatorInstance._replay_run  # the loop itself (the tests below patch it in turn)


def _recover(root: Path, agg: JobSpec, *, per_tuple: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    consumed: list[int] = []
    fast = _FAST

    def counted(self: Any, tuples: Any, first: int) -> int:
        if per_tuple:
            return first  # nothing taken: every tuple goes through `_apply`
        stopped = fast(self, tuples, first)
        consumed.append(stopped - first)
        return stopped

    monkeypatch.setattr(OperatorInstance, "_replay_run", counted)
    # G-open only after the crash: G-checks follow the wall clock, the log must not.
    spec = JobSpec.from_json(agg.to_json().replace(str(agg.store["root"]), str(root)))
    stats = run_job(dataclasses.replace(spec, checkpointing=Checkpointing()))
    assert (sum(consumed) > 0) is not per_tuple  # the loop replayed exactly when it was left on
    return stats


@pytest.mark.parametrize(("queue", "partitions"), [(False, 1), (False, 3), (True, 1)])
def test_replay_loop_leaves_what_the_per_tuple_path_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, queue: bool, partitions: int
) -> None:
    crashed = tmp_path / "crashed"
    upstream, agg = _specs(crashed, queue=queue, partitions=partitions)
    if upstream is not None:
        run_job(upstream)
    run_job(agg, max_inputs=1700)  # the log a crash there leaves
    figures = []
    logs = []
    for per_tuple in (True, False):
        root = tmp_path / f"per-tuple-{per_tuple}"
        shutil.copytree(crashed, root)
        stats = _recover(root, agg, per_tuple=per_tuple, monkeypatch=monkeypatch)
        r = stats.recovery
        assert r is not None and r.tuples_replayed > 0 and r.tuples_skipped > 0
        assert r.tuples_replayed > r.tuples_skipped  # some tuples rebuilt window state
        figures.append((r.tuples_replayed, r.tuples_skipped, stats.inputs, stats.results, stats.dead_letters))
        logs.append([(x.kind, x.key, x.seq, x.pos, x.n, x.state, x.payload) for x in
                     log_records(SqliteQueueStore(root), "agg")])  # fmt: skip
    assert figures[0] == figures[1]
    assert logs[0] == logs[1]
    assert logs[1][-1][0] is Kind.EOS


def test_a_registry_loads_windows_in_order_and_refuses_a_key_twice() -> None:
    registry = WindowRegistry()
    registry.open(OpenWindow("a", 0, None, 0, 0, 0, 0))
    registry.load([OpenWindow(k, 1, None, 0, 0, i, i) for i, k in enumerate("bcd")])
    assert [w.key for w in registry] == ["a", "b", "c", "d"]
    with pytest.raises(KeyError, match="'e' loaded twice"):
        registry.load([OpenWindow("e", 0, None, 0, 0, 0, 0), OpenWindow("e", 1, None, 0, 0, 0, 0)])
    with pytest.raises(KeyError, match="already has an open window"):
        registry.load([OpenWindow("a", 5, None, 0, 0, 0, 0)])
