"""The fault-proxy chaos runs at the size CI affords (benchmarks/chaos.py is the long run): `cec run
--input-topic` with count and with time windows and `--results-topic`, and `cec_aggregate`, each under
hundreds of injected wire faults (delays, dropped answers, cut connections on Produce, Fetch,
ListOffsets, InitProducerId, AddPartitionsToTxn and EndTxn) and SIGKILLs of its process: the results
CSV, a read_committed consumer of the results topic and the output log equal the failure-free output,
nothing lost or duplicated; every stop is one clear line and a restart recovers; no crash loop.

The fault schedule and the kills come from the seed below; a failure prints it with the proxy's plan
and latest injections (tests/conftest.py), and the report of the run (pytest -s prints it whole)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.brokers import Broker
from tests.chaos.harness import ChaosReport, one_stop_line
from tests.chaos.local import LocalChaos
from tests.chaos.spark import SparkChaos
from tests.faultproxy import FaultProxy
from tests.helpers import child_env, wait_for

pytestmark = [pytest.mark.kafka_transactions, pytest.mark.slow]

SEED = 20261127


def _check(report: ChaosReport, *, faults: int, kills: int) -> None:
    print(json.dumps(report.as_dict()))  # the figures, for the record (pytest -s)
    doc = report.as_dict()
    assert all(c.exact for c in report.results.values()), doc
    assert report.lost == 0 and report.duplicated == 0, doc
    assert report.injected >= faults, doc
    assert report.kills == kills, doc
    assert len(report.faults) == 4, doc  # every kind of fault, delays, drops and both cuts


@pytest.mark.parametrize(("window", "seed"), [("count", SEED), ("time", SEED + 1)])
def test_cec_run_under_wire_faults_and_sigkills_equals_the_failure_free_run(
    fault_proxy: FaultProxy, proxied_broker: Broker, tmp_path: Path, window: str, seed: int
) -> None:
    chaos = LocalChaos(
        proxied_broker, fault_proxy, tmp_path, window=window, records=20_000, keys=200, seed=seed
    )
    report = chaos.round("ci", seed=seed, faults=150, rate=0.3, kills=3, between_kills=(40, 250), reruns=6)
    _check(report, faults=100, kills=3)


def test_cec_aggregate_under_wire_faults_and_driver_sigkills_equals_the_failure_free_output(
    fault_proxy: FaultProxy, proxied_broker: Broker, tmp_path: Path
) -> None:
    chaos = SparkChaos(proxied_broker, fault_proxy, tmp_path, records=8_000, keys=120, seed=SEED)
    report = chaos.round("ci", seed=SEED, faults=80, rate=0.15, kills=1, between_kills=(150, 500), reruns=2)
    _check(report, faults=40, kills=1)


def test_a_fault_the_client_cannot_resolve_stops_cec_run_in_one_line_and_a_restart_recovers(
    fault_proxy: FaultProxy, proxied_broker: Broker, tmp_path: Path
) -> None:
    """The writer of output partition 1 is blackholed in the middle of the run (every request of its
    client swallowed, nothing answers, as a host cut off from the cluster): no client can resolve that, so
    the run stops, once the store's timeout has passed, with one line that names the partition. Healed, a
    restart of the same command recovers, and its results equal the failure-free run's."""
    chaos = LocalChaos(
        proxied_broker, fault_proxy, tmp_path, window="count", records=20_000, keys=200, seed=SEED
    )
    command, results, results_topic = chaos.command(fault_proxy.address, "cut-off")
    output = command[command.index("--output-topic") + 1]
    proc = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=child_env()
    )
    try:
        # The run is writing: partition 1's writer has committed (its EndTxn went through the proxy).
        wait_for(
            lambda: proc.poll() is not None or _commits_of(fault_proxy, f"cec-writer-{output}-1") >= 2, 300
        )
        assert proc.poll() is None, "the run ended before the fault"
        fault_proxy.blackhole(client=f"cec-writer-{output}-1")
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    line = one_stop_line(err)
    assert proc.returncode == 2 and line is not None, err[-3000:]
    assert f"{output}[1]" in line, line
    assert fault_proxy.by_fault()["blackhole"] > 0
    fault_proxy.heal()
    again = subprocess.run(command, capture_output=True, text=True, timeout=600, env=child_env())
    assert again.returncode == 0, again.stderr[-3000:]
    checked = chaos.check(results, results_topic)
    assert all(c.exact for c in checked.values()), checked


def _commits_of(proxy: FaultProxy, client: str) -> int:
    """EndTxn requests of the clients whose id starts with `client` the proxy has seen (its own count)."""
    return proxy.requests_of(client)["EndTxn"]
