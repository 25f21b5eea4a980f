"""Shared fixtures: the embedded store, the Kafka broker, and `store_backend` (the same test on both).

The broker is session-scoped and started lazily: only a test that requests `kafka_broker` (directly or
through the "kafka" parameter of `store_backend`) starts one, so SQLite-only runs never pay for it. When
no broker can be started the requesting tests ERROR instead of being skipped: a CI run that silently
skipped every Kafka test would look green while testing nothing (DESIGN-NOTES section 4). Each process
of the run (each pytest-xdist worker) starts its own broker; the terminal summary says which broker the
run used, once ("broker: apache-kafka 4.3.1 at 127.0.0.1:PORT ...").
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from queuestore.base import QueueStore
from queuestore.sqlite import SqliteQueueStore
from tests.brokers import Broker, KafkaUnavailable, start_apache_kafka, start_broker
from tests.faultproxy import FaultProxy
from tests.spark_cds import driver_jvm_options

__all__ = ["BACKENDS", "StoreBackend"]

# Property tests draw the same examples on every run by default ("ci"), so that CI time and verdicts do not
# depend on luck: the example counts in the tests are sized to catch the bugs their docstrings name with
# these seeds. HYPOTHESIS_PROFILE=dev explores new examples each run (and remembers failures locally).
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

BACKENDS = ["sqlite", "kafka"]

# The Spark driver JVMs of the tests (this process's session and every driver subprocess's, which inherit
# the environment: spark-submit reads SPARK_SUBMIT_OPTS) start with the options of tests/spark_cds.py
# (C1 only, the serial collector, the class-data-sharing archive of `make spark-cds`), which take a driver's
# start to about a third of the CPU seconds of the JVM's defaults; a SPARK_SUBMIT_OPTS already set is kept.
os.environ.setdefault("SPARK_SUBMIT_OPTS", driver_jvm_options())

# The files that take longest in CI, longest first (pytest_collection_modifyitems below): the suite's closing
# "slowest files" lines of the CI preview at 8e2c99c (2026-11-28: 5,988 test-seconds, 3,058 s on 2 workers).
LONGEST_FILES = (
    "tests/operators/spark/test_attach_trim_executors.py",
    "tests/operators/spark/test_attach.py",
    "tests/cec/test_cli_topic.py",
    "tests/operators/spark/test_attach_windows.py",
    "tests/chaos/test_chaos.py",
    "tests/cec/test_cli_trim.py",
    "tests/operators/spark/test_attach_resume_refused.py",
    "tests/cec/test_cli.py",
    "tests/operators/spark/test_attach_transform.py",
    "tests/operators/spark/test_attach_results.py",
    "tests/operators/spark/test_cluster.py",
    "tests/operators/spark/test_attach_several.py",
    "tests/operators/spark/test_attach_topic.py",
    "tests/recovery/test_standby.py",
    "tests/operators/spark/test_attach_resume.py",
    "tests/operators/spark/test_attach_watermarks.py",
    "tests/operators/spark/test_attach_rto.py",
    "tests/operators/spark/test_attach_spark_kafka.py",
    "tests/operators/spark/test_attach_trim.py",
    "tests/queuestore/kafka/test_kafka_wire_faults.py",
    "tests/recovery/test_recovery_rules.py",
    "tests/recovery/test_recovery_exact.py",
    "tests/queuestore/kafka/test_apache_kafka.py",
    "tests/operators/spark/test_host.py",
    "tests/cec/test_readme_examples.py",
)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> SqliteQueueStore:
    return SqliteQueueStore(tmp_path / "store")


# Where the broker lines of this process and (on the xdist controller) of its workers are kept.
_BROKERS_KEY = pytest.StashKey[list[str]]()
_WORKER_OUTPUT = "cec_brokers"


def _broker_lines(config: pytest.Config) -> list[str]:
    return config.stash.setdefault(_BROKERS_KEY, [])


@pytest.fixture(scope="session")
def kafka_broker(pytestconfig: pytest.Config) -> Iterator[Broker]:
    try:
        broker = start_broker()
    except RuntimeError as exc:
        # pytest.fail, not pytest.skip: see the module docstring.
        pytest.fail(f"no Kafka broker could be started for the Kafka tests:\n{exc}", pytrace=False)
    _broker_lines(pytestconfig).append(broker.describe())
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(autouse=True)
def _kafka_transactions(request: pytest.FixtureRequest) -> None:
    """Tests marked `kafka_transactions` check what only a broker with Kafka's transactions shows: records
    of aborted transactions hidden from read_committed consumers, `delete_records`. Skipped, with the
    reason, on the Tansu fallback (DESIGN-NOTES section 4), which has neither; CI runs on Apache Kafka."""
    if request.node.get_closest_marker("kafka_transactions") is None:
        return
    if request.getfixturevalue("kafka_broker").kind == "tansu":
        pytest.skip("Tansu 0.6 shows aborted transactions' records to read_committed readers, deletes none")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the files of LONGEST_FILES first, in its order, then the rest in collection order (a stable
    sort: each file's tests keep their order and stay together, so module fixtures are built once).

    CI runs `-n 2 --dist loadfile --no-loadscope-reorder` (Makefile): pytest-xdist hands whole files to
    its workers in this order, so the long Spark crash files start first and the short files fill in
    around them (longest first). xdist's own order (by number of tests) put those files, a few long
    tests each, last: the run ended with one worker in a long file while the other had nothing left."""
    rank = {path: i for i, path in enumerate(LONGEST_FILES)}
    missing = [path for path in LONGEST_FILES if not (config.rootpath / path).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py LONGEST_FILES names no such file: {missing}")
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture(scope="session")
def proxied_broker(kafka_broker: Broker, pytestconfig: pytest.Config) -> Iterator[Broker]:
    """A broker with a listener for the fault proxy: the session's own when this suite started Apache
    Kafka, else (an external broker) an Apache Kafka of its own, started here."""
    if kafka_broker.proxied is not None:
        yield kafka_broker
        return
    try:
        broker = start_apache_kafka()
    except (KafkaUnavailable, RuntimeError) as exc:
        pytest.fail(f"the fault proxy's tests need Apache Kafka from its jars:\n{exc}", pytrace=False)
    _broker_lines(pytestconfig).append(f"{broker.describe()} (fault proxy tests)")
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def _session_proxy(proxied_broker: Broker) -> Iterator[FaultProxy]:
    assert proxied_broker.proxied is not None
    proxy = FaultProxy(proxied_broker.proxied.upstream, listen=proxied_broker.proxied.listen).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def fault_proxy(_session_proxy: FaultProxy) -> Iterator[FaultProxy]:
    """The session's fault proxy (tests.faultproxy) in front of `proxied_broker`, with no plan, no blackhole
    and zero counts at the start of the test; clients that bootstrap with `fault_proxy.address` stay behind
    it. A failing test's report shows the proxy's plan (seed included) and its latest injections."""
    _session_proxy.reset()
    try:
        yield _session_proxy
    finally:
        _session_proxy.reset()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    proxy = getattr(item, "funcargs", {}).get("fault_proxy")
    if report.failed and call.when == "call" and isinstance(proxy, FaultProxy):
        report.sections.append(("fault proxy", proxy.describe(last=200)))
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)  # set on pytest-xdist workers only
    if output is not None:
        output[_WORKER_OUTPUT] = _broker_lines(session.config)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """pytest-xdist, on the controller: collect the broker lines a worker reported."""
    lines = getattr(node, "workeroutput", {}).get(_WORKER_OUTPUT, [])
    worker = getattr(node, "gateway", None)
    name = getattr(worker, "id", "worker")
    _broker_lines(node.config).extend(f"{line} [{name}]" for line in lines)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if getattr(config, "workeroutput", None) is not None:
        return  # an xdist worker: the controller sums up
    lines = _broker_lines(config)
    if lines:
        terminalreporter.write_line("broker: " + "; ".join(sorted(lines)))
    _slowest_files(terminalreporter)


def _slowest_files(terminalreporter: Any, shown: int = 25) -> None:
    """Test-seconds per file (setup + call + teardown), the slowest first: what LONGEST_FILES is ordered by
    (refresh it from a CI run's lines)."""
    per_file: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            nodeid, duration = getattr(report, "nodeid", None), getattr(report, "duration", None)
            if nodeid and isinstance(duration, float):
                path = nodeid.split("::", 1)[0]
                per_file[path] = per_file.get(path, 0.0) + duration
    if len(per_file) < 2:
        return
    slowest = sorted(per_file.items(), key=lambda item: -item[1])[:shown]
    total = sum(per_file.values())
    terminalreporter.write_line(f"slowest files ({total:,.0f} test-seconds in all):")
    for path, seconds in slowest:
        terminalreporter.write_line(f"  {seconds:8.1f} s  {path}")


class StoreBackend:
    """A factory of queue stores that all see the same data (same SQLite root / same broker + state_dir).

    Calling it (`make_store()`) opens a new store instance; opening several is how tests model a restart
    or a second process. `spec` is the JSON-able store spec (`queuestore.factory.open_store`) for child
    processes and `JobSpec.store`. Every store opened is closed at teardown.
    """

    def __init__(self, name: str, root: Path, bootstrap: str | None = None) -> None:
        self.name = name
        self.root = root
        self.bootstrap = bootstrap
        self._opened: list[QueueStore] = []

    @property
    def spec(self) -> dict[str, Any]:
        if self.name == "kafka":
            return {"type": "kafka", "bootstrap_servers": self.bootstrap, "state_dir": str(self.root)}
        return {"type": "sqlite", "root": str(self.root)}

    def __call__(self) -> QueueStore:
        store: QueueStore
        if self.name == "kafka":
            from queuestore.kafka import KafkaQueueStore  # optional backend: only when a test uses it

            assert self.bootstrap is not None
            store = KafkaQueueStore(self.bootstrap, self.root)
        else:
            store = SqliteQueueStore(self.root)
        self._opened.append(store)
        return store

    def topic(self, prefix: str = "t") -> str:
        """A topic name no other test (nor an earlier run against a long-lived broker) has used."""
        return f"{prefix}-{uuid.uuid4().hex[:12]}"

    def close(self) -> None:
        for store in reversed(self._opened):
            store.close()
        self._opened.clear()

    def __repr__(self) -> str:
        return f"StoreBackend({self.name!r}, root={str(self.root)!r})"


@pytest.fixture(params=BACKENDS)
def store_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreBackend]:
    name: str = request.param
    bootstrap: str | None = None
    if name == "kafka":
        # Requested dynamically so that the broker starts only when a Kafka-parametrized test runs.
        bootstrap = request.getfixturevalue("kafka_broker").bootstrap
    backend = StoreBackend(name, tmp_path / f"{name}-store", bootstrap)
    try:
        yield backend
    finally:
        backend.close()
