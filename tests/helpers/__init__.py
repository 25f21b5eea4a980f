"""Shared test helpers: run jobs in real child processes and read what they wrote.

Beside this module, the builders the aggregate tests share: `tests.helpers.engine_runs` (the engine in
memory, any-value rows), `flight_queues` (flights as a cec queue, results bit for bit), `topic_flights`
(flights on a Kafka topic), `truth` (plain-Python windows), `crash_plans` (SIGKILL plans of a worker)."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cec.records import Kind, RecordCodec
from operators.aggregate import RESULT_SCHEMA
from operators.base import DEAD_LETTER_SCHEMA
from operators.job import JobSpec
from operators.sinks import iter_payloads
from queuestore.base import QueueStore
from recovery.identity import ATTACHMENT as IDENTITY_ATTACHMENT
from tests import killpoints

ROOT = Path(__file__).resolve().parent.parent.parent


def child_env(faults: str | None = None) -> dict[str, str]:
    """The environment of a child process the tests start; `faults` ("site:n[,site:n...]"): where it
    SIGKILLs itself (tests/killpoints: wrappers installed from the test side at its start)."""
    env = dict(os.environ)
    env.pop(killpoints.ENV, None)
    paths = [str(ROOT)]
    if faults:
        killpoints.parse(faults)  # a typo is an error here, not a child that never dies
        env[killpoints.ENV] = faults
        paths.insert(0, killpoints.BOOT)
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    return env


def cec(
    *args: str, timeout: float = 300, faults: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The installed `cec` console script run as a user runs it (its output captured): the one runner of
    every CLI test."""
    script = Path(sys.executable).parent / "cec"
    command = [str(script)] if script.exists() else [shutil.which("cec") or "cec"]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=timeout, env=env or child_env(faults)
    )


def start_worker(spec: JobSpec, spec_path: Path, faults: str | None = None) -> subprocess.Popen[bytes]:
    spec_path.write_text(spec.to_json())
    return subprocess.Popen(
        [sys.executable, "-m", "operators.worker", str(spec_path)],
        env=child_env(faults),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def run_worker(spec: JobSpec, spec_path: Path, faults: str | None = None, timeout: float = 120) -> int:
    proc = start_worker(spec, spec_path, faults)
    _, err = proc.communicate(timeout=timeout)
    if proc.returncode not in (0, -9):
        raise AssertionError(f"worker failed ({proc.returncode}):\n{err.decode()[-3000:]}")
    return proc.returncode


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, interval: float = 0.005) -> None:
    """Wait on a condition (never a blind sleep): raises if it does not hold within `timeout`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(interval)


def process_group_gone(pgid: int) -> Callable[[], bool]:
    """A condition for `wait_for`: every process of group `pgid` has exited (e.g. a killed Spark driver's
    JVM and Python workers, which exit on their own shortly after the driver)."""

    def gone() -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        return False

    return gone


def one_calibration_per_module() -> Iterator[None]:
    """For a module-scoped fixture: every in-process run of the module plans with the EC rates of one real
    calibration (`recovery.calibrate`, measured at the first run's start, per backend), where each
    run would measure them again (~50-80 ms a run, half of a 60-tuple run). Planning inputs only:
    what the module's runs write and recover is checked as before; the calibration itself is
    tests/cec/test_policies.py's."""
    import pytest  # here: the benchmarks import this module without pytest's fixtures

    from recovery import calibrate

    measure = calibrate.calibrate_ec_rates
    measured: dict[str | None, tuple[float, float]] = {}

    def measured_once(*, backend: str | None = None, **kwargs: Any) -> tuple[float, float]:
        if backend not in measured:
            measured[backend] = measure(backend=backend, **kwargs)
        return measured[backend]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(calibrate, "calibrate_ec_rates", measured_once)
        yield


def copy_input_identity(source: QueueStore, target: QueueStore, topic: str, partition: int = 0) -> None:
    """A log copied record by record must take the identity of its input along (`recovery.identity`):
    without it, a non-empty log is refused as one whose input cannot be known."""
    recorded = source.read_attachment(topic, partition, IDENTITY_ATTACHMENT)
    assert recorded is not None, f"{topic}[{partition}] records no input identity"
    target.write_attachment(topic, partition, IDENTITY_ATTACHMENT, recorded)


def log_records(store: QueueStore, topic: str, partition: int = 0) -> list[Any]:
    codec = RecordCodec()
    with store.reader(topic, partition) as reader:
        return [codec.decode(r.value, r.meta) for r in reader.scan_forward(0)]


def results(store: QueueStore, topic: str, kind: Kind = Kind.R) -> list[dict[str, Any]]:
    """What a consumer sees: the payloads of `kind` records, control tuples dropped, in log order."""
    return list(iter_payloads(store, topic, RESULT_SCHEMA if kind is Kind.R else DEAD_LETTER_SCHEMA, kind))


def per_key(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row["key"], []).append(row)
    return out


def _partition_db(root: Path, topic: str, partition: int) -> sqlite3.Connection:
    return sqlite3.connect(Path(root) / topic / f"{partition}.sqlite", isolation_level=None)


def flip_stored_kind(root: Path, topic: str, offset: int, partition: int = 0, bits: int = 0x03) -> str:
    """Flip bits of the kind a SQLite store keeps beside a record (R -> Q with the default bits), as a
    failing disk would; the value is untouched. Returns the new kind."""
    conn = _partition_db(root, topic, partition)
    try:
        (kind,) = conn.execute("SELECT kind FROM log WHERE offset = ?", (offset,)).fetchone()
        damaged = chr(ord(kind[0]) ^ bits) + kind[1:]
        conn.execute("UPDATE log SET kind = ? WHERE offset = ?", (damaged, offset))
        return damaged
    finally:
        conn.close()


def set_stored_kind(root: Path, topic: str, offset: int, kind: str, partition: int = 0) -> None:
    conn = _partition_db(root, topic, partition)
    try:
        conn.execute("UPDATE log SET kind = ? WHERE offset = ?", (kind, offset))
    finally:
        conn.close()


def hide_row(root: Path, topic: str, offset: int, partition: int = 0) -> None:
    """Delete one record's row from a SQLite partition: damage that leaves a gap in the offsets."""
    conn = _partition_db(root, topic, partition)
    try:
        assert conn.execute("DELETE FROM log WHERE offset = ?", (offset,)).rowcount == 1
    finally:
        conn.close()


def run_through_crashes(spec: JobSpec, spec_path: Path, crashes: list[tuple[str, int]]) -> int:
    """Run a job's worker once per crash in `crashes`, each (site, n): "external" SIGKILLs it from outside once
    its log ("agg"[0] of the job's SQLite store) holds n records; any other site is a kill point armed at its
    n-th call. Every run ends by SIGKILL or completes; returns how many were killed."""
    from queuestore.sqlite import SqliteQueueStore

    def logged() -> int:
        store = SqliteQueueStore(Path(spec.store["root"]))
        if not store.topic_exists("agg"):
            return 0
        with store.reader("agg", 0) as reader:
            return reader.end_offset()

    killed = 0
    for site, n in crashes:
        if site == "external":
            proc = start_worker(spec, spec_path)
            try:
                wait_for(lambda p=proc, n=n: p.poll() is not None or logged() >= n, timeout=120)
            finally:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                proc.communicate(timeout=60)
        else:
            proc = start_worker(spec, spec_path, faults=f"{site}:{n}")
            proc.communicate(timeout=120)
        assert proc.returncode in (0, -signal.SIGKILL), proc.returncode
        killed += proc.returncode == -signal.SIGKILL
    return killed
