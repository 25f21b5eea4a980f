"""Checkpoint intensity of `cec_aggregate` under a driver SIGKILL: a recovery target and a Q target, on
a real broker and local Spark (one driver subprocess for the module; the restarts run in the test's session).

One driver runs two queries over the same JSON topic at once, one with `Checkpointing(recovery_target=...)`
and one with `Checkpointing(q_target=Q)`, and is SIGKILLed from a write task in the middle of a micro-batch
(its process group: driver, JVM, Python workers). Then, per query:
- what the controller chose is read back from the killed run's own state (`read_controls`: each state
  partition's (Q, U) in force at its last committed micro-batch);
- the restart (the recovery-target query with another partition count, 3 -> 2; the Q query with the
  same) gives exactly a plain-Python per-key aggregation of the topic;
- recovery-target query: the restart replayed at most the U the controller chose plus two micro-batches
  (timers fire between micro-batches, and the crash hits inside one); a G-open-only restart would replay
  nearly the whole input (rare keys keep windows open from their first tuple), which the bound is far
  below;
- Q query: the EC scans read at most Q plus two micro-batches' records per output partition, far below
  the log a G-open-only extent would span.
The measured recovery time (`replay_s`) is printed for the report (pytest -s), never asserted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from operators.sinks import count_kinds
from operators.spark.attach import RESULT_COLUMNS, cec_aggregate, list_generations, read_results
from operators.spark.checkpointing import read_controls
from operators.spark.processor import STATE_NAME
from queuestore.kafka import KafkaQueueStore
from tests.brokers import Broker
from tests.helpers import child_env, process_group_gone, wait_for
from tests.killpoints import SINK_MID_BATCH
from tests.topic_data import create_topic, make_purchases, produce

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PARTITIONS = 3
KEYS = 60
TUPLES = 9000
WINDOW = 7
TRIGGER_ROWS = 600  # 15 micro-batches
KILL_AT = 11  # the first query to reach its 11th micro-batch kills the driver from a write task
Q = 60
# Far below what a Spark restart's fixed costs take, so the controller is in its best-effort regime, where
# A target below what restarting a Spark query alone takes (its start, measured at each start): refused out
# loud, and held best-effort: U = (1 - safety) x target x the partition's measured replay rate, which at
# 30 ms keeps U (and the bound below) well under half the input before the kill also on a machine several
# times faster than CI's (100 ms gave U = 3,191 of 6,318 there).
RECOVERY_TARGET = "30ms"
RARE = ("rare-a", "rare-b", "rare-c")  # fewer tuples than a window: open from their first tuple on
# Records one micro-batch may add to one output partition: R and G-open per window of its share of the
# input (with room for skew), and a G-check of each of its open windows.
BATCH_RECORDS = int(TRIGGER_ROWS / PARTITIONS * 2 / WINDOW * 1.5) + KEYS // PARTITIONS + len(RARE)


@pytest.fixture(scope="module")
def topic(spark_kafka_broker: Broker) -> tuple[str, str, list[tuple[int, int, dict[str, Any]]]]:
    bootstrap = spark_kafka_broker.bootstrap
    name = f"rto-purchases-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, name, PARTITIONS)
    values: list[tuple[int, dict[str, Any]]] = []
    for i, (p, rec) in enumerate(make_purchases(TUPLES, KEYS, PARTITIONS, seed=11)):
        values.append((p, rec))
        if i % 1500 == 10:
            values.extend((r % PARTITIONS, {"item": k, "price": 2.0, "ts": i}) for r, k in enumerate(RARE))
    produce(bootstrap, name, [(p, None, json.dumps(v).encode()) for p, v in values])
    offsets = [0] * PARTITIONS
    records = []
    for p, v in values:  # one producer, in order, no transactions: offsets are dense per partition
        records.append((p, offsets[p], v))
        offsets[p] += 1
    return bootstrap, name, records


def _reference(records: list[tuple[int, int, dict[str, Any]]]) -> dict[tuple[str, int], tuple[Any, ...]]:
    per_key: dict[str, list[tuple[int, float]]] = {}
    for _, o, rec in sorted(records, key=lambda r: (r[0], r[1])):
        per_key.setdefault(str(rec["item"]), []).append((o, float(rec["price"])))
    out = {}
    for key, tuples in per_key.items():
        for w in range(len(tuples) // WINDOW):
            chunk = tuples[w * WINDOW : (w + 1) * WINDOW]
            out[(key, w)] = (key, w, sum(x for _, x in chunk) / WINDOW, WINDOW, chunk[0][0], chunk[-1][0])
    return out


def _results(spark: SparkSession, bootstrap: str, output: str) -> dict[tuple[str, int], tuple[Any, ...]]:
    rows = read_results(spark, output, bootstrap).collect()
    assert max(Counter((r["key"], r["window"]) for r in rows).values()) == 1, "a window has two results"
    return {(str(r["key"]), r["window"]): tuple(r[c] for c in RESULT_COLUMNS) for r in rows}


def _assert_exact(got: dict[Any, tuple[Any, ...]], want: dict[Any, tuple[Any, ...]]) -> None:
    assert got.keys() == want.keys()
    for k, w in want.items():
        g = got[k]
        assert g[:2] == w[:2] and g[3:] == w[3:] and g[2] == pytest.approx(w[2], rel=1e-12), (g, w)


def _args(
    bootstrap: str, name: str, root: Path, output: str, checkpointing: dict[str, Any]
) -> dict[str, Any]:
    return {
        "input_topic": name,
        "input_format": "json",
        "bootstrap_servers": bootstrap,
        "output_topic": output,
        "key": "item",
        "value": "price",
        "agg": "avg",
        "window_count": WINDOW,
        "state_dir": str(root / "state"),
        "checkpoint_location": str(root / "checkpoints"),
        "max_records_per_trigger": TRIGGER_ROWS,
        "checkpointing": checkpointing,
        "resume_checkpoint": False,  # the replay and EC read from the logs are what the targets bound
    }


def _log_records(bootstrap: str, root: Path, output: str) -> int:
    store = KafkaQueueStore(bootstrap, root / "probe")
    try:
        return sum(count_kinds(store, list_generations(store, output)[0].topic).values())
    finally:
        store.close()


def test_recovery_target_and_q_hold_across_a_driver_kill(
    spark: SparkSession, topic: tuple[str, str, list[tuple[int, int, dict[str, Any]]]], tmp_path: Path
) -> None:
    bootstrap, name, records = topic
    runs = {
        "rto": _args(bootstrap, name, tmp_path / "rto", f"avg-rto-{uuid.uuid4().hex[:8]}",
                     {"recovery_target": RECOVERY_TARGET, "ci_ms": 20, "cp_ms": 100}),
        "q": _args(bootstrap, name, tmp_path / "q", f"avg-q-{uuid.uuid4().hex[:8]}",
                   {"q_target": Q, "ci_ms": 20, "cp_ms": 100}),
    }  # fmt: skip
    work = tmp_path / "driver"
    work.mkdir()
    spec = work / "args.json"
    spec.write_text(json.dumps({"queries": list(runs.values()), "done": str(work / "done")}))
    _driver_child_many(spec, work)
    assert not (work / "done").exists()

    # What the controllers chose, from the killed runs' state (the last committed micro-batch).
    chosen = {}
    for label, args in runs.items():
        (run_dir,) = Path(args["checkpoint_location"]).glob("run-*")
        controls = read_controls(spark, str(run_dir), STATE_NAME)
        assert controls, f"{label}: no state partition recorded its checkpointing"
        chosen[label] = controls
    u_chosen = max(c.targets[1] or 0 for c in chosen["rto"].values())
    assert u_chosen > 0 and all(c.targets[1] is not None for c in chosen["rto"].values())
    assert all(c.targets == (Q, None) for c in chosen["q"].values())
    assert sum(c.gchecks for c in chosen["q"].values()) > 0

    reference = _reference(records)
    figures = {}
    for label, args in runs.items():
        log_size = _log_records(bootstrap, Path(args["state_dir"]).parent, args["output_topic"])
        partitions = 2 if label == "rto" else PARTITIONS  # the recovery target: another partition count
        query = cec_aggregate(spark, available_now=True, partitions=partitions, **args)
        assert query.awaitTermination(600) is True and query.exception() is None
        rec = query.lastProgress["cec"]["recovery"]
        assert rec["resumed"] and rec["replay_s"] is not None
        _assert_exact(_results(spark, bootstrap, args["output_topic"]), reference)
        crash_total = sum(rec["crash_point"])
        figures[label] = {**rec, "log_records_at_kill": log_size, "u_chosen": u_chosen}
        if label == "rto":
            # Each state partition's controller, as the query's progress reports it, is what its state
            # holds (targets, G-checks, what it said): it reaches the driver with the rows, no Spark job.
            reported = {c["partition"]: c for c in query.lastProgress["cec"]["checkpointing"]}
            controls = query.checkpoint_controls(spark)
            assert reported.keys() == controls.keys() == set(range(partitions)), reported
            for q, control in controls.items():
                assert (reported[q]["q_target"], reported[q]["u_target"]) == control.targets
                assert (reported[q]["gchecks"], reported[q]["messages"]) == (control.gchecks, control.said)
                assert reported[q]["u_target"] > 0
                assert any("cannot be met: restarting" in m for m in reported[q]["messages"]), reported[q]
            bound = u_chosen + 2 * TRIGGER_ROWS
            assert rec["replay_tuples"] <= bound < crash_total // 2, (rec, bound)
        else:
            bound = PARTITIONS * (Q + 2 * BATCH_RECORDS)
            assert rec["ec_records_read"] <= bound < log_size // 2, (rec, bound, log_size)
    print(f"recovery after the driver kill: {json.dumps(figures, default=str)}")  # the report's figures


def _driver_child_many(spec: Path, work: Path) -> None:
    """Run tests.operators.spark.rto_driver in a session of its own (its process group: driver, JVM, Python workers),
    SIGKILLed from a write task in the middle of micro-batch KILL_AT; wait until the whole group is gone."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.operators.spark.rto_driver", str(spec)],
        env=child_env(f"{SINK_MID_BATCH}:{KILL_AT}"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        _, err = child.communicate(timeout=900)
        assert child.returncode == -signal.SIGKILL, (
            f"driver exited {child.returncode}:\n{err.decode()[-3000:]}"
        )
        wait_for(process_group_gone(child.pid), timeout=300, interval=0.05)
    finally:
        if child.poll() is None or not process_group_gone(child.pid)():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
