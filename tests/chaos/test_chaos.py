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
from pathlib import Path

import pytest

from tests.brokers import Broker
from tests.chaos.harness import ChaosReport
from tests.chaos.local import LocalChaos
from tests.chaos.spark import SparkChaos
from tests.faultproxy import FaultProxy

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
