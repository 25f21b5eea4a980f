"""Prometheus metrics (cec/metrics.py): scraped from the endpoint while a job runs."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cec.exceptions import ConfigError
from cec.metrics import REGISTRY, OperatorMetrics, serve
from operators.job import JobSpec, run_job
from recovery.timeline import PHASES
from tests.helpers import cec, wait_for

NAMES = (
    "cec_open_windows",
    "cec_extent_records",
    "cec_replay_tuples",
    "cec_gopens_total",
    "cec_gchecks_total",
    "cec_checkpoint_duty_ratio",
    "cec_input_tuples_total",
    "cec_appended_records_total",
    "cec_outstanding_records",
    "cec_input_rate",
    "cec_append_rate",
    "cec_dead_letters_total",
    "cec_trimmed_offsets_total",
    "cec_recovery_phase",
    "cec_recovery_phase_seconds",
    "cec_recovery_seconds",
)


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())
    except (urllib.error.URLError, ConnectionError):
        return ""


def _names_for(text: str, topic: str) -> set[str]:
    return {
        line.split("{", 1)[0]
        for line in text.splitlines()
        if not line.startswith("#") and f'topic="{topic}"' in line
    }


def _spec(tmp_path: Path, topic: str, port: int) -> JobSpec:
    return JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "avg",
            "window_count": 10,
        },
        source={"type": "generator", "count": 10_000_000, "keys": 500, "seed": 5},
        store={"type": "sqlite", "root": str(tmp_path / "store")},
        output_topic=topic,
        checkpointing={"u_target": 2000, "ci_ms": 50, "cp_ms": 100},
        batch_size=64,
        metrics_port=port,
    )


def test_endpoint_scraped_during_a_run_and_a_recovery_holds_every_name(tmp_path: Path) -> None:
    port = serve(0)
    spec = _spec(tmp_path, "metered", port)
    run_job(spec, max_inputs=20_000)  # a log to recover from: the second run goes through every phase
    seen: dict[str, str] = {}
    scraped = threading.Event()

    def until_scraped() -> bool:
        return scraped.is_set()

    errors: list[BaseException] = []

    def run() -> None:
        try:
            run_job(spec, stop=until_scraped)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)
            scraped.set()

    thread = threading.Thread(target=run)
    thread.start()
    try:

        def complete() -> bool:
            text = _scrape(port)
            names = _names_for(text, "metered")
            labels = {"topic": "metered", "partition": "0"}
            idle = REGISTRY.get_sample_value("cec_recovery_phase", {**labels, "cec_recovery_phase": "idle"})
            if set(NAMES) <= names and idle == 1.0:  # every name served, the recovery over
                gchecks = REGISTRY.get_sample_value(
                    "cec_gchecks_total", {"topic": "metered", "partition": "0"}
                )
                if gchecks:  # the run is past its recovery and checkpointing
                    seen["text"] = text
                    return True
            return bool(errors)

        wait_for(complete, timeout=120, interval=0.05)
    finally:
        scraped.set()
        thread.join()
    assert not errors, errors
    labels = {"topic": "metered", "partition": "0"}
    assert REGISTRY.get_sample_value("cec_open_windows", labels) == pytest.approx(500, abs=500)
    # Every phase of the whole restart (recovery.timeline), and the recovery time they make up.
    phases = {
        phase: REGISTRY.get_sample_value("cec_recovery_phase_seconds", {**labels, "phase": phase})
        for phase in PHASES
    }
    assert None not in phases.values(), phases
    total = REGISTRY.get_sample_value("cec_recovery_seconds", labels)
    assert total == pytest.approx(sum(phases.values()))
    assert REGISTRY.get_sample_value("cec_input_tuples_total", labels) > 20_000
    # The run stopped: its final flush made every appended record durable, and the last sample says so.
    assert REGISTRY.get_sample_value("cec_outstanding_records", labels) == 0


def test_recovery_phases_are_timed_as_they_happen() -> None:
    now = [0.0]
    metrics = OperatorMetrics("phased", 3, clock=lambda: now[0])
    labels = {"topic": "phased", "partition": "3"}

    def state(name: str) -> float | None:
        return REGISTRY.get_sample_value("cec_recovery_phase", {**labels, "cec_recovery_phase": name})

    assert state("idle") == 1.0
    metrics.phase("ec_build")
    assert state("ec_build") == 1.0 and state("idle") == 0.0
    now[0] = 2.0
    metrics.phase("ec_load")
    now[0] = 2.5
    metrics.phase("replay")
    now[0] = 4.0
    metrics.phase("idle")
    seconds = {
        p: REGISTRY.get_sample_value("cec_recovery_phase_seconds", {**labels, "phase": p})
        for p in ("ec_build", "ec_load", "replay")
    }
    assert seconds == {"ec_build": 2.0, "ec_load": 0.5, "replay": 1.5}
    metrics.trimmed(7)
    metrics.trimmed(5)
    assert REGISTRY.get_sample_value("cec_trimmed_offsets_total", labels) == 12


def test_rates_come_from_the_injected_clock() -> None:
    now = [10.0]
    metrics = OperatorMetrics("rated", 0, clock=lambda: now[0])
    labels = {"topic": "rated", "partition": "0"}
    figures = {"open_windows": 3, "extent": 9, "replay": 4, "gopens": 2, "gchecks": 1, "duty": 0.05}
    metrics.sample(inputs=100, outputs=50, **figures)
    now[0] = 12.0
    metrics.sample(inputs=500, outputs=250, **figures)
    assert REGISTRY.get_sample_value("cec_input_rate", labels) == 200.0
    assert REGISTRY.get_sample_value("cec_append_rate", labels) == 100.0
    assert REGISTRY.get_sample_value("cec_input_tuples_total", labels) == 500
    assert REGISTRY.get_sample_value("cec_extent_records", labels) == 9
    assert REGISTRY.get_sample_value("cec_outstanding_records", labels) is None  # never given: not made up
    metrics.sample(inputs=600, outputs=300, outstanding=37, **figures)
    assert REGISTRY.get_sample_value("cec_outstanding_records", labels) == 37


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_cec_run_serves_metrics_while_it_runs(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    with data.open("w") as f:
        f.write("k,v\n")
        for i in range(150_000):
            f.write(f"k{i % 997},{i % 13}\n")
    port = _free_port()
    script = Path(sys.executable).parent / "cec"
    proc = subprocess.Popen(
        [str(script), "run", str(data), "--key", "k", "--value", "v", "--window-count", "5",
         "--results", str(tmp_path / "out.csv"), "--store-dir", str(tmp_path / "st"), "--U", "5000",
         "--metrics-port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    found: list[str] = []

    def scraped() -> bool:
        if proc.poll() is not None:
            raise AssertionError(
                f"cec run ended before its metrics were scraped:\n{proc.stderr.read() if proc.stderr else ''}"
            )
        text = _scrape(port)
        names = {line.split("{", 1)[0] for line in text.splitlines() if line.startswith("cec_")}
        if {"cec_open_windows", "cec_input_tuples_total", "cec_extent_records"} <= names and (
            "cec_input_tuples_total" in text and 'cec_input_tuples_total{partition="0"' in text
        ):
            found.append(text)
            return True
        return False

    try:
        wait_for(scraped, timeout=120, interval=0.02)
    finally:
        _out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    # This run recovers from nothing: the recovery time is not reported (no made-up 0), every other name is.
    served = {line.split("{", 1)[0] for line in found[0].splitlines() if line.startswith("cec_")}
    assert set(NAMES) - {"cec_recovery_seconds"} <= served
    assert "cec_recovery_seconds" not in served


def test_bad_or_busy_port_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot serve metrics on port {taken}: the port is in use"):
            serve(taken)
        data = tmp_path / "in.csv"
        data.write_text("k,v\na,1\n")
        out = cec("run", str(data), "--key", "k", "--value", "v", "--window-count", "2", "--results",
                  str(tmp_path / "o.csv"), "--metrics-port", str(taken))  # fmt: skip
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert out.stderr.strip() == f"cec: error: cannot serve metrics on port {taken}: the port is in use"
    out = cec("run", str(data), "--key", "k", "--value", "v", "--window-count", "2", "--results",
              str(tmp_path / "o.csv"), "--metrics-port", "70000")  # fmt: skip
    assert out.returncode == 2 and "must be 1..65535" in out.stderr and "Traceback" not in out.stderr
