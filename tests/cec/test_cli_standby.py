"""`cec run --standby` as a user runs it: the same command beside a running primary follows its log and,
when the primary is SIGKILLed, takes over and writes exactly the results of a failure-free run; on another
host (another --store-dir, Kafka) with `--lease-timeout` on both, while the primary runs and once its lease
lapsed. The flags' mistakes are one line each."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

from operators.standby import read_status
from queuestore.kafka import KafkaQueueStore
from queuestore.sqlite import SqliteQueueStore
from tests.brokers import Broker
from tests.cec.test_cli_topic import PARTITIONS, _new_topic, csv_reference, per_key, start_topic_run
from tests.helpers import cec, child_env, wait_for
from tests.topic_data import as_json, encoded, make_purchases, produce

TOPIC = "standby-cli"


def _input(path: Path, rows: int) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["k", "v"])
        w.writerows([f"k{(i * 7919) % 500}", i % 97] for i in range(rows))
    return path


def _args(data: Path, results: Path, store: Path) -> list[str]:
    return [
        "run", str(data), "--key", "k", "--value", "v", "--window-count", "5", "--U", "3000",
        "--results", str(results), "--store-dir", str(store), "--output-topic", TOPIC,
    ]  # fmt: skip


def _popen(*args: str) -> subprocess.Popen[str]:
    script = Path(sys.executable).parent / "cec"
    return subprocess.Popen(
        [str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env()
    )


def _rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as f:
        return sorted(csv.reader(f))


def test_a_standby_takes_over_a_killed_primary_and_writes_the_failure_free_results(tmp_path: Path) -> None:
    data = _input(tmp_path / "in.csv", 150_000)
    reference = cec(*_args(data, tmp_path / "ref.csv", tmp_path / "ref-store"))
    assert reference.returncode == 0, reference.stderr
    store_dir = tmp_path / "store"
    primary = _popen(*_args(data, tmp_path / "primary.csv", store_dir))
    store = SqliteQueueStore(store_dir)
    standby: subprocess.Popen[str] | None = None
    try:

        def logged() -> bool:
            if not store.topic_exists(TOPIC):
                return False
            with store.reader(TOPIC, 0) as reader:
                return reader.end_offset() >= 3000

        wait_for(logged, timeout=120)
        os.kill(primary.pid, signal.SIGSTOP)  # it keeps its writer: the standby follows, then waits
        standby = _popen(*_args(data, tmp_path / "standby.csv", store_dir), "--standby")
        wait_for(lambda: (s := read_status(store, TOPIC, 0)) is not None and s.applied >= 3000, timeout=120)
        os.kill(primary.pid, signal.SIGKILL)
        primary.wait(timeout=60)
        assert primary.returncode == -signal.SIGKILL
        out, err = standby.communicate(timeout=300)
        assert standby.returncode == 0, out + err
    finally:
        for proc in (primary, standby):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert "Traceback" not in err
    assert _rows(tmp_path / "standby.csv") == _rows(tmp_path / "ref.csv")
    assert not (tmp_path / "primary.csv").exists()


def test_standby_flag_mistakes_are_one_line(tmp_path: Path) -> None:
    data = _input(tmp_path / "in.csv", 10)
    out = cec("run", str(data), "--key", "k", "--value", "v", "--window-count", "5", "--results",
              str(tmp_path / "o.csv"), "--standby")  # fmt: skip
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "cec: error: --standby needs the primary's --store-dir (where it follows the output log)"
    ], out.stderr
    out = cec(*_args(data, tmp_path / "o.csv", tmp_path / "s"), "--standby", "--crash-after", "3")
    assert out.returncode == 2 and "--standby stands by a running primary" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    out = cec(*_args(data, tmp_path / "o.csv", tmp_path / "s"), "--standby-replica", "off")
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "cec: error: --standby-replica goes with --standby"
    ], out.stderr


def test_lease_timeout_mistakes_are_one_line(tmp_path: Path) -> None:
    data = _input(tmp_path / "in.csv", 10)
    out = cec(*_args(data, tmp_path / "o.csv", tmp_path / "s"), "--lease-timeout", "5")
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "cec: error: --lease-timeout needs the Kafka store: the lease is a Kafka consumer group (on one host "
        "the writer's lock already shows a dead writer at once)"
    ], out.stderr
    # Checked before any broker is asked: this address has none.
    kafka = ["--bootstrap-servers", "127.0.0.1:9"]
    for bad in ("0", "-2", "inf"):
        out = cec(*_args(data, tmp_path / "o.csv", tmp_path / "s"), *kafka, f"--lease-timeout={bad}")
        assert out.returncode == 2 and out.stderr.strip().splitlines() == [
            f"cec: error: --lease-timeout must be a positive number of seconds, got {float(bad)!r}"
        ], out.stderr
    out = cec(*_args(data, tmp_path / "o.csv", tmp_path / "s"), *kafka, "--lease-timeout", "soon")
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "cec run: error: argument --lease-timeout: invalid float value: 'soon' (see cec run --help)"
    ], out.stderr


def test_across_hosts_with_a_lease_the_standby_follows_the_running_primary_and_takes_over_exactly(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    """Two hosts (two --store-dir), a 3-partition input topic followed (`--follow`: the primary runs until
    it is killed, nothing finishes it first), `--lease-timeout` on both: the standby follows every
    partition while the primary goes on writing, and is never its fence; the primary SIGKILLed while it
    works through new input, the standby takes over once the leases lapsed: the failure-free results."""
    topic = _new_topic(kafka_broker, "lease-standby")
    first = make_purchases(900, keys=30, partitions=PARTITIONS)
    later = make_purchases(20_000, keys=30, partitions=PARTITIONS, seed=11)
    produce(kafka_broker.bootstrap, topic, encoded(first, as_json))
    (tmp_path / "ref1").mkdir()
    (tmp_path / "ref2").mkdir()
    want_first = csv_reference(tmp_path / "ref1", first)
    want_all = csv_reference(tmp_path / "ref2", first + later)
    output = f"out-{topic}"
    common = ["--follow", "--trim-every", "0", "--output-topic", output, "--lease-timeout", "3"]
    primary_csv, standby_csv = tmp_path / "primary.csv", tmp_path / "standby.csv"
    primary = start_topic_run(
        kafka_broker, topic, primary_csv, "--store-dir", str(tmp_path / "host-a"), *common
    )
    standby_host = KafkaQueueStore(kafka_broker.bootstrap, tmp_path / "host-b")  # its status files
    standby: subprocess.Popen[str] | None = None

    def states() -> list[str | None]:
        statuses = [read_status(standby_host, output, p) for p in range(PARTITIONS)]
        return [None if s is None else s.state for s in statuses]

    try:
        wait_for(
            lambda: (
                primary.poll() is not None or (primary_csv.exists() and per_key(primary_csv) == want_first)
            ),
            timeout=120,
        )
        assert primary.poll() is None, primary.communicate()
        standby = start_topic_run(
            kafka_broker, topic, standby_csv, "--store-dir", str(tmp_path / "host-b"), *common, "--standby"
        )
        wait_for(lambda: primary.poll() is not None or states() == ["following"] * PARTITIONS, timeout=120)
        assert primary.poll() is None, primary.communicate()
        produce(kafka_broker.bootstrap, topic, encoded(later, as_json))  # the primary works on, followed
        wait_for(lambda: primary.poll() is not None or per_key(primary_csv) != want_first, timeout=120)
        assert primary.poll() is None, primary.communicate()
        assert states() == ["following"] * PARTITIONS and standby.poll() is None
        os.kill(primary.pid, signal.SIGKILL)
        primary.wait(timeout=60)
        assert primary.returncode == -signal.SIGKILL  # killed, never stopped by a fence (exit 2)
        wait_for(
            lambda: (
                standby.poll() is not None
                or (states() == ["took over"] * PARTITIONS and per_key(standby_csv) == want_all)
            ),
            timeout=300,
        )
        assert standby.poll() is None, standby.communicate()
        standby.send_signal(signal.SIGTERM)
        out, err = standby.communicate(timeout=120)
    finally:
        for proc in (primary, standby):
            if proc is not None and proc.poll() is None:
                proc.kill()
        standby_host.close()
    assert standby.returncode == 0, out + err
    assert "Traceback" not in err
    assert per_key(standby_csv) == want_all
