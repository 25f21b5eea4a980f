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
from tests.helpers import child_env

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
    chaos = SparkChaos(proxied_broker, fault_proxy, tmp_path, records=4_000, keys=120, seed=SEED)
    report = chaos.round("ci", seed=SEED, faults=60, rate=0.3, kills=1, between_kills=(60, 180), reruns=2)
    _check(report, faults=40, kills=1)


def test_a_fault_the_client_cannot_resolve_stops_cec_run_in_one_line_and_a_restart_recovers(
    fault_proxy: FaultProxy, proxied_broker: Broker, tmp_path: Path
) -> None:
    """The writer of output partition 1 is blackholed in the middle of the run (every request of its
    client swallowed from its third commit on, nothing answers, as a host cut off from the cluster): no
    client can resolve that, so the run stops, once the store's timeout has passed, with one line that
    names the broker and the partition. Healed, a restart of the same command recovers, and its results
    equal the failure-free run's. The writer commits every 100 records (not by time), so the cut falls
    where the writer still has most of its work to do, whatever the machine's pace."""
    chaos = LocalChaos(
        proxied_broker, fault_proxy, tmp_path, window="count", records=20_000, keys=200, seed=SEED
    )
    command, results, results_topic = chaos.command(fault_proxy.address, "cut-off")
    output = command[command.index("--output-topic") + 1]
    cadence = {"CEC_KAFKA_COMMIT_INTERVAL": "3600", "CEC_KAFKA_COMMIT_RECORDS": "100"}
    fault_proxy.blackhole(client=f"cec-writer-{output}-1", after=2, api="EndTxn")
    cut = subprocess.run(
        command, capture_output=True, text=True, timeout=600,
        env={**child_env(), **cadence, "CEC_KAFKA_REQUEST_TIMEOUT": "5"},
    )  # fmt: skip
    line = one_stop_line(cut.stderr)
    assert cut.returncode == 2 and line is not None, cut.stderr[-3000:]
    assert line.startswith(f"cec: error: Kafka at {fault_proxy.address} did not answer for 5 s ("), line
    assert f"{output}[1]" in line and line.endswith("run the same command again to resume from it"), line
    assert fault_proxy.by_fault()["blackhole"] > 0
    fault_proxy.heal()
    again = subprocess.run(
        command, capture_output=True, text=True, timeout=600, env={**child_env(), **cadence}
    )
    assert again.returncode == 0, again.stderr[-3000:]
    checked = chaos.check(results, results_topic)
    assert all(c.exact for c in checked.values()), checked
