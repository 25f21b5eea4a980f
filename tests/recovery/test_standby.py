"""The standby (design S1, `operators.standby`): a second process with the same job follows the primary's
output log; when the primary dies it takes over and the output is exactly the failure-free output. Real
processes, SIGKILL, three input partitions, SQLite and Apache Kafka:
- failover: the primary is frozen (SIGSTOP) once its log holds records, the standby follows it up to the
  log's end (its status says so), then the primary is SIGKILLed: its writer lock goes with it and the
  standby takes over from what it followed;
- a standby SIGKILLed during its takeover (after the EC build, during the replay), then a new standby or a
  plain restart: exact;
- on Kafka, a standby on another host (another state directory: no shared lock) without a lease fences a
  frozen primary at once; the primary, let go, stops with one line and never writes (read_committed output
  exact);
- on Kafka with the writer lease (`lease_timeout_s`), a standby on another host follows a running primary
  (over a live input, so the primary is demonstrably writing) and never fences it; the primary SIGKILLed
  mid-run, the standby takes over once the lease lapsed, from what it followed: exact.
And the model: what the follower holds after reading the log up to X is the eventual checkpoint the
builder reads back from log[0..X], for every prefix X of a real run's log, followed in steps of any size.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cec.records import RecordCodec
from operators.job import JobSpec, run_job
from operators.sinks import iter_payloads
from operators.standby import read_status
from queuestore.base import QueueStore, Row
from queuestore.kafka import KafkaQueueStore
from queuestore.sqlite import SqliteQueueStore
from recovery.eventual import EventualCheckpoint, EventualCheckpointBuilder
from recovery.standby import LogFollower
from tests.brokers import Broker
from tests.helpers import cec, child_env, per_key, results, start_worker, wait_for
from tests.helpers.log_prefix import LogPrefix, ec_view, logged_rows

TUPLES = 150_000
CODEC = RecordCodec()


def _spec(store: dict[str, Any], stats: Path | None = None) -> JobSpec:
    return JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "sum",
            "window_count": 6,
        },
        source={
            "type": "generator",
            "count": TUPLES,
            "keys": 300,
            "seed": 11,
            "partitions": 3,
            "invalid_every": 41,
            "interleave": 13,
        },
        store=store,
        output_topic="agg",
        checkpointing={"u_target": 2000, "ci_ms": 20, "cp_ms": 40},
        batch_size=64,
        stats_path=None if stats is None else str(stats),
    )


def _sqlite(root: Path) -> dict[str, Any]:
    # A kill loses at most this many appended records (back-pressure), so the frozen log is close to what
    # the primary produced.
    return {"type": "sqlite", "root": str(root), "max_outstanding": 512}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("ref")
    run_job(_spec(_sqlite(root)))
    return per_key(results(SqliteQueueStore(root), "agg"))


def _start_standby(
    spec: JobSpec, path: Path, faults: str | None = None, *, replica: bool = True
) -> subprocess.Popen[bytes]:
    path.write_text(spec.to_json())
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "operators.worker",
            str(path),
            "--standby",
            *([] if replica else ["--no-replica"]),
        ],
        env=child_env(faults),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _stats(path: Path) -> dict[str, Any]:
    stats: dict[str, Any] = json.loads(path.read_text())
    return stats


def _log_end(store: QueueStore, topic: str = "agg") -> int:
    with store.reader(topic, 0) as reader:
        return reader.end_offset()


def _kill_primary(primary: subprocess.Popen[bytes], standby: subprocess.Popen[bytes]) -> tuple[int, bytes]:
    """SIGKILL the primary, then wait for its standby to end: the primary's exit code, the standby's stderr."""
    os.kill(primary.pid, signal.SIGKILL)
    primary.wait(timeout=60)
    _, err = standby.communicate(timeout=300)
    return primary.returncode, err


def _frozen_primary(
    spec: JobSpec, tmp_path: Path, checker: QueueStore
) -> tuple[subprocess.Popen[bytes], int]:
    """The primary started, then frozen (SIGSTOP: it keeps its writer) once its log holds records; it and
    its log's end then."""
    primary = start_worker(spec, tmp_path / "primary.json")
    wait_for(lambda: checker.topic_exists("agg") and _log_end(checker) >= 3000, timeout=120)
    os.kill(primary.pid, signal.SIGSTOP)
    return primary, _log_end(checker)


@pytest.mark.parametrize("replica", [True, False], ids=["replica", "no-replica"])
def test_failover_to_a_following_standby_is_exact(
    tmp_path: Path, reference: dict[str, list[dict[str, Any]]], replica: bool
) -> None:
    root = tmp_path / "store"
    stats = tmp_path / "standby.stats.json"
    store = SqliteQueueStore(root)
    primary, end = _frozen_primary(_spec(_sqlite(root)), tmp_path, store)
    standby = _start_standby(_spec(_sqlite(root), stats), tmp_path / "standby.json", replica=replica)
    try:

        def followed_to_the_end() -> bool:
            status = read_status(store, "agg", 0)
            if status is None or status.state != "following" or status.applied < end:
                return False
            # With a replica: it has applied the input up to the frozen log's crash point.
            return not replica or (status.replica == "applying" and status.replica_behind == 0)

        wait_for(followed_to_the_end, timeout=120)
        assert standby.poll() is None  # still waiting: the frozen primary holds the writer
        # `cec inspect` shows the standby's lag (none: it has followed the frozen log to its end).
        shown = cec("inspect", "agg", "--store-dir", str(root), "--json")
        assert shown.returncode == 0, shown.stderr
        lag = json.loads(shown.stdout)["partitions"][0]["standby"]
        assert lag["state"] == "following" and lag["pid"] == standby.pid
        assert lag["applied"] >= end and lag["lag_records"] == lag["log_end"] - lag["applied"] == 0
        text = cec("inspect", "agg", "--store-dir", str(root)).stdout
        assert f"  standby: pid {standby.pid} following, applied up to offset {lag['applied']:,}" in text
        assert "lag 0 records" in text
        if replica:
            assert lag["replica"] == "applying" and lag["replica_behind"] == 0, lag
            assert "; replica 0 input tuples behind that log's crash point" in text
        else:
            assert lag["replica"] == "off" and "replica" not in text
        killed, err = _kill_primary(primary, standby)
        assert killed == -signal.SIGKILL
        assert standby.returncode == 0, err.decode()[-3000:]
    finally:
        for proc in (primary, standby):
            if proc.poll() is None:
                proc.kill()
    assert per_key(results(store, "agg")) == reference
    report = _stats(stats)["recovery"]
    assert report["ec_source"] == "standby", report
    # What the standby read at its takeover is the tail it had not followed: at most what the primary
    # appended after the freeze (its writer drained what it had outstanding), not the extent.
    assert report["records_read"] <= _log_end(store) - end
    if replica:  # its states at the crash point replaced the EC's and the replay from the footprints
        assert report["replica"] == "used", report
        assert report["tuples_replayed"] == 0 and report["replay_span"] == 0, report
    else:
        assert report["replica"] == "" and report["tuples_replayed"] > 0, report
    status = read_status(store, "agg", 0)
    assert status is not None and status.state == "took over"
    # Written as the writer became ours, before the replica handed its states to recovery.
    assert status.replica == ("applying" if replica else "off")


HOPPING = {"window_ms": 600, "slide_ms": 200, "time_field": "item_time", "allowed_lateness_ms": 0}


@pytest.mark.parametrize("window", ["count", "hopping"])
def test_a_running_primary_killed_mid_run_fails_over_to_its_replica_exactly(
    tmp_path: Path, reference: dict[str, list[dict[str, Any]]], window: str
) -> None:
    """The primary, frozen until the standby's replica runs, goes on and is SIGKILLed mid-run, wherever it
    is; the replica, behind it, catches up to the log's final crash point at the takeover. Hopping windows under a watermark (3 input partitions): the rules that
    hold tuples back while restoring and close windows by the watermark run in the replica too."""

    def spec(store: dict[str, Any], stats: Path | None = None) -> JobSpec:
        base = _spec(store, stats)
        if window == "count":
            return base
        raw = base.to_dict()
        operator = {k: v for k, v in raw["operator"].items() if k != "window_count"}
        return JobSpec.from_dict(
            {**raw, "operator": {**operator, **HOPPING}, "source": {**raw["source"], "count": 60_000}}
        )

    schema = spec(_sqlite(tmp_path)).operator.build().result_schema

    def logged(store: QueueStore) -> dict[str, list[dict[str, Any]]]:
        return per_key(list(iter_payloads(store, "agg", schema)))

    if window == "count":
        expected = reference
    else:
        ref_root = tmp_path / "reference"
        run_job(spec(_sqlite(ref_root)))
        expected = logged(SqliteQueueStore(ref_root))
        assert len(expected) > 250  # most of the 300 keys have results
    root = tmp_path / "store"
    stats = tmp_path / "standby.stats.json"
    store = SqliteQueueStore(root)
    primary, end = _frozen_primary(spec(_sqlite(root)), tmp_path, store)
    standby = _start_standby(spec(_sqlite(root), stats), tmp_path / "standby.json")
    try:

        def replicating() -> bool:
            status = read_status(store, "agg", 0)
            return status is not None and status.replica == "applying" and status.replica_applied > 0

        wait_for(replicating, timeout=120)
        os.kill(primary.pid, signal.SIGCONT)  # on again: killed while it runs, the replica behind it
        wait_for(lambda: _log_end(store) >= end + 2000 or primary.poll() is not None, timeout=120)
        assert primary.poll() is None, "the primary finished before it could be killed mid-run"
        _, err = _kill_primary(primary, standby)
        assert standby.returncode == 0, err.decode()[-3000:]
    finally:
        for proc in (primary, standby):
            if proc.poll() is None:
                proc.kill()
    assert logged(store) == expected
    report = _stats(stats)["recovery"]
    assert report["ec_source"] == "standby", report
    # The replica catches up unless it was further behind than the footprints' replay (a loaded machine):
    # exact either way, and the report says which.
    if report["replica"] == "used":
        assert report["tuples_replayed"] == 0, report
    else:
        assert report["replica"].startswith("the replica was ") and report["tuples_replayed"] > 0, report


@pytest.mark.parametrize(
    ("faults", "then", "replica"),
    [
        ("standby.took_over:1", "standby", True),
        ("standby.took_over:1", "restart", False),
        ("replica.states_at:1", "standby", True),
        ("replica.states_at:1", "restart", True),
        # Without a replica the takeover replays from the footprints: killed there.
        ("runtime.replaying:50", "standby", False),
        ("runtime.replaying:50", "restart", False),
    ],
)
def test_a_standby_killed_during_its_takeover_then_a_new_standby_or_a_restart_is_exact(
    tmp_path: Path, reference: dict[str, list[dict[str, Any]]], faults: str, then: str, replica: bool
) -> None:
    root = tmp_path / "store"
    store = SqliteQueueStore(root)
    spec = _spec(_sqlite(root))
    primary, _ = _frozen_primary(spec, tmp_path, store)
    standby = _start_standby(spec, tmp_path / "standby.json", faults=faults, replica=replica)
    try:

        def standing_by() -> bool:
            status = read_status(store, "agg", 0)
            return status is not None and (not replica or status.replica == "applying")

        wait_for(standing_by, timeout=120)
        _, err = _kill_primary(primary, standby)
        assert standby.returncode == -signal.SIGKILL, err.decode()[-3000:]
    finally:
        for proc in (primary, standby):
            if proc.poll() is None:
                proc.kill()
    if then == "standby":
        second = _start_standby(spec, tmp_path / "standby2.json")
    else:
        second = start_worker(spec, tmp_path / "restart.json")
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0, err.decode()[-3000:]
    assert per_key(results(store, "agg")) == reference


def _kafka_store(broker: Broker, state_dir: Path, **extra: Any) -> dict[str, Any]:
    """The Kafka store spec of one host of the tests below (its own state directory)."""
    return {
        "type": "kafka",
        "bootstrap_servers": broker.bootstrap,
        "state_dir": str(state_dir),
        "commit_records": 40,
        "max_outstanding": 512,
        **extra,
    }


def test_on_kafka_a_standby_fences_the_primary_which_then_stops_and_never_writes(
    kafka_broker: Broker, tmp_path: Path, reference: dict[str, list[dict[str, Any]]]
) -> None:
    topic = f"standby-{tmp_path.name[-20:]}".replace("_", "-")

    def kafka(state: str) -> dict[str, Any]:
        return _kafka_store(kafka_broker, tmp_path / state)

    spec = JobSpec.from_dict({**_spec(kafka("primary")).to_dict(), "output_topic": topic})
    # Another host: its own state directory, so no lock is shared and only the transactional id fences.
    other = JobSpec.from_dict(
        {**_spec(kafka("other-host"), tmp_path / "standby.stats.json").to_dict(), "output_topic": topic}
    )
    checker = KafkaQueueStore(kafka_broker.bootstrap, tmp_path / "check")
    primary = start_worker(spec, tmp_path / "primary.json")
    try:

        def logged() -> bool:
            if not checker.topic_exists(topic):
                return False
            with checker.reader(topic, 0) as reader:
                return reader.end_offset() >= 3000

        wait_for(logged, timeout=120)
        os.kill(primary.pid, signal.SIGSTOP)
        standby = _start_standby(other, tmp_path / "standby.json")
        _, err = standby.communicate(timeout=300)
        assert standby.returncode == 0, err.decode()[-3000:]
        os.kill(primary.pid, signal.SIGCONT)
        _, err = primary.communicate(timeout=120)
    finally:
        if primary.poll() is None:
            primary.kill()
    lines = [line for line in err.decode().splitlines() if line.strip()]
    assert "Traceback" not in err.decode()
    if primary.returncode == 2:  # told it was fenced: one line, nothing written after it
        assert len([line for line in lines if line.startswith("cec: error:")]) == 1, lines
        assert "fenced" in lines[-1].lower() or "took over" in lines[-1].lower(), lines
    else:
        # Stalled past its commit timeout, its commit was in doubt rather than fenced: it fenced in turn and
        # recovered from the log in this process (docs/recovery.md), which the standby had finished.
        assert primary.returncode == 0, lines
        assert any(line.endswith(": recovering in this process") for line in lines), lines
    assert per_key(results(checker, topic)) == reference
    # No lock is shared with another host and there is no lease: the standby took over at its start,
    # before following anything, and recovered from the log as a cold restart does.
    assert _stats(tmp_path / "standby.stats.json")["recovery"]["ec_source"] == "log"


LEASE_S = 3.0  # the writer lease of the test below (the test broker allows sessions from 0.5 s)


def test_on_kafka_with_a_lease_a_standby_on_another_host_follows_the_running_primary_and_takes_over_exactly(
    kafka_broker: Broker, tmp_path: Path, reference: dict[str, list[dict[str, Any]]]
) -> None:
    topic = f"lease-{tmp_path.name[-20:]}".replace("_", "-")

    def kafka(state: str) -> dict[str, Any]:
        return _kafka_store(kafka_broker, tmp_path / state, lease_timeout_s=LEASE_S)

    def job(state: str, stats: Path | None = None) -> JobSpec:
        raw = _spec(kafka(state), stats).to_dict()
        # A live stream (the same one for both: one epoch): the primary is still writing while the standby
        # starts and follows, and is killed mid-run. The rate is not part of the input (same reference).
        live = {**raw["source"], "rate": 5000.0, "arrival_epoch": epoch}
        return JobSpec.from_dict({**raw, "source": live, "output_topic": topic})

    epoch = time.time()
    checker = KafkaQueueStore(kafka_broker.bootstrap, tmp_path / "check")
    standby_host = KafkaQueueStore(kafka_broker.bootstrap, tmp_path / "standby-host")  # its status file
    primary = start_worker(job("primary-host"), tmp_path / "primary.json")
    standby: subprocess.Popen[bytes] | None = None
    try:
        wait_for(lambda: checker.topic_exists(topic) and _log_end(checker, topic) >= 3000, timeout=120)
        # Another host: its own state directory, no lock shared; only the lease keeps it from taking over.
        standby = _start_standby(
            job("standby-host", tmp_path / "standby.stats.json"), tmp_path / "standby.json"
        )

        def following() -> bool:
            status = read_status(standby_host, topic, 0)
            return status is not None and status.state == "following" and status.replica == "applying"

        wait_for(lambda: following() or primary.poll() is not None, timeout=120)
        assert primary.poll() is None, "the primary finished before the standby followed it"
        joined_at = _log_end(checker, topic)
        # The primary goes on writing beside its standby, a member of the lease's group: never fenced.
        wait_for(
            lambda: _log_end(checker, topic) >= joined_at + 2000 or primary.poll() is not None, timeout=120
        )
        assert primary.poll() is None, "the primary stopped while its standby followed it"
        assert following() and standby.poll() is None
        killed, err = _kill_primary(primary, standby)
        # Killed, not stopped by a fence (that is exit 2, or a recovery in its process and exit 0).
        assert killed == -signal.SIGKILL
        assert standby.returncode == 0, err.decode()[-3000:]
    finally:
        for proc in (primary, standby):
            if proc is not None and proc.poll() is None:
                proc.kill()
        standby_host.close()
    assert "Traceback" not in err.decode()
    assert per_key(results(checker, topic)) == reference
    report = _stats(tmp_path / "standby.stats.json")["recovery"]
    # It took over from what it followed (a standby that fenced at its start reads the log back: "log").
    assert report["ec_source"] == "standby", report
    checker.close()


# -- the model --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_log(tmp_path_factory: pytest.TempPathFactory) -> list[Row]:
    root = tmp_path_factory.mktemp("model")
    spec = JobSpec.from_dict(
        {
            **_spec(_sqlite(root)).to_dict(),
            "source": {"type": "generator", "count": 3000, "keys": 40, "seed": 9, "partitions": 3,
                       "invalid_every": 37, "interleave": 5},
            "checkpointing": {"u_target": 150, "ci_ms": 50, "cp_ms": 50},
            "batch_size": 16,
        }
    )  # fmt: skip
    run_job(spec)
    rows = logged_rows(SqliteQueueStore(root), "agg")
    assert len(rows) > 1000 and {"GOPEN", "GCHECK", "R"} <= {row[1] for row in rows}
    return rows


def _follow(rows: list[Row], steps: list[int]) -> None:
    log = LogPrefix(rows, topic="growing")
    follower = LogFollower(CODEC)
    at = 0
    earlier: list[tuple[EventualCheckpoint, tuple[object, ...]]] = []
    for step in [*steps, len(rows)]:
        log.end = min(len(rows), at + step)
        follower.catch_up(log)
        assert follower.unusable is None and follower.applied == log.end
        # A checkpoint handed out earlier is not changed by following on (its windows are copied on write).
        assert all(ec_view(ec) == view for ec, view in earlier)
        kept = follower.forward.checkpoint(CODEC, log.end)
        read_back = EventualCheckpointBuilder(log, CODEC).build()
        assert kept is not None and ec_view(kept) == ec_view(read_back), log.end
        # Every footprint's record was decoded as it was followed, and is the one the log holds; the
        # windows come oldest footprint first, as the log holds them.
        assert all(fp.decoded for fp in kept.windows.values())
        assert [fp.offset for fp in kept.windows.values()] == sorted(
            fp.offset for fp in kept.windows.values()
        )
        assert all(fp.record == read_back.windows[key].record for key, fp in kept.windows.items())
        earlier = [*earlier[-3:], (kept, ec_view(kept))]
        at = log.end
        if at == len(rows):
            break


def test_the_follower_holds_the_builders_checkpoint_at_every_prefix(real_log: list[Row]) -> None:
    _follow(real_log, [1] * len(real_log))


@settings(max_examples=25, deadline=None)
@given(steps=st.lists(st.integers(min_value=1, max_value=700), min_size=1, max_size=40))
def test_the_follower_holds_the_builders_checkpoint_whatever_it_reads_at_a_time(
    real_log: list[Row], steps: list[int]
) -> None:
    _follow(real_log, steps)


def test_a_log_trimmed_past_what_was_followed_makes_the_follower_unusable(tmp_path: Path) -> None:
    """The follower relies on its reader, which asks the log's start only when a read does not begin where
    asked (not before every read): a trim below what it followed changes nothing, one past it is a reason
    (then the takeover reads the log back)."""
    root = tmp_path / "store"
    spec = JobSpec.from_dict(
        {**_spec(_sqlite(root)).to_dict(),
         "source": {"type": "generator", "count": 3000, "keys": 40, "seed": 9, "partitions": 3}}
    )  # fmt: skip
    run_job(spec)
    store = SqliteQueueStore(root)
    rows = logged_rows(store, "agg")
    followed, behind = LogFollower(CODEC), LogFollower(CODEC)
    with store.reader("agg", 0) as reader:
        assert followed.catch_up(reader) == len(rows)
    behind.forward.next_offset = 0  # follows from the log's beginning, after the trim
    writer = store.writer("agg", 0)
    try:
        assert writer.trim(len(rows) // 2) > 0
    finally:
        writer.close()
    with store.reader("agg", 0) as reader:
        assert followed.catch_up(reader) == 0 and followed.unusable is None
        assert behind.catch_up(reader) == 0
        assert behind.unusable is not None and "trimmed" in behind.unusable
    store.close()
