"""docker-compose.yml, checked structurally (no Docker engine here to run it; DESIGN-NOTES section 4).

What matters for the demo to work: a single-node KRaft Kafka whose listeners and controller quorum agree,
a healthcheck that gates the demo, and a demo that actually points at the broker's in-network listener.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

__all__: list[str] = []

COMPOSE = Path(__file__).resolve().parent.parent / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the "KEY=value" list form is valid compose too
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _listeners(spec: str) -> dict[str, tuple[str, int]]:
    """'NAME://host:port,...' -> {NAME: (host, port)}."""
    out: dict[str, tuple[str, int]] = {}
    for item in spec.split(","):
        name, _, address = item.strip().partition("://")
        host, _, port = address.rpartition(":")
        out[name] = (host, int(port))
    return out


def test_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"kafka", "cec-demo"}
    assert compose["services"]["kafka"]["image"].startswith("apache/kafka:")


def test_kafka_is_single_node_kraft(compose: dict[str, Any]) -> None:
    env = _env(compose["services"]["kafka"])
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert not any("ZOOKEEPER" in k for k in env)
    node_id = env["KAFKA_NODE_ID"]
    listeners = _listeners(env["KAFKA_LISTENERS"])
    advertised = _listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    protocols = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]

    # The quorum is this node alone, reached on its own controller listener.
    (voter,) = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
    voter_id, _, voter_address = voter.partition("@")
    assert voter_id == node_id
    assert int(voter_address.rpartition(":")[2]) == listeners[controller][1]
    # Every listener has a protocol; clients are never sent to the controller listener.
    assert set(listeners) <= set(protocols)
    assert controller not in advertised
    assert set(advertised) <= set(listeners)
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in advertised
    for name, (_, port) in advertised.items():
        assert listeners[name][1] == port, name
    # One broker: internal topics cannot have more replicas than that.
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "1"
    # KRaft formats its storage with CLUSTER_ID, which must be a base64url UUID.
    assert len(base64.urlsafe_b64decode(env["CLUSTER_ID"] + "==")) == 16


def test_kafka_healthcheck(compose: dict[str, Any]) -> None:
    check = compose["services"]["kafka"]["healthcheck"]
    test = check["test"]
    assert test[0] in ("CMD", "CMD-SHELL")
    assert "kafka-broker-api-versions" in " ".join(test)
    assert int(check["retries"]) >= 1
    assert check["interval"].endswith("s")


def test_demo_waits_for_healthy_kafka_and_uses_it(compose: dict[str, Any]) -> None:
    demo = compose["services"]["cec-demo"]
    kafka_env = _env(compose["services"]["kafka"])
    assert demo["image"].startswith("python:3.11")
    assert demo["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert any(v.split(":")[0] == "." for v in demo["volumes"])  # the repo is mounted
    command = demo["command"]
    line = command if isinstance(command, str) else " ".join(command)
    assert "pip install" in line and "-e ." in line
    assert "cec demo" in line
    words = line.replace("=", " ").split()
    bootstrap = words[words.index("--bootstrap-servers") + 1]
    # The demo must be sent to an address the broker advertises on the compose network.
    advertised = {f"{h}:{p}" for h, p in _listeners(kafka_env["KAFKA_ADVERTISED_LISTENERS"]).values()}
    assert bootstrap in advertised
    assert bootstrap.split(":")[0] == "kafka"


def _compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_docker_compose_config_accepts_the_file() -> None:
    cli = _compose_cli()
    if cli is None:
        pytest.skip("no `docker compose` / `docker-compose` client installed (structure checked above)")
    proc = subprocess.run([*cli, "-f", str(COMPOSE), "config", "--quiet"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
