"""Chaos of `cec run --input-topic` (the local host): a JSON topic of 4 partitions, a count-window or a
time-window aggregate with `--results-topic`, every Kafka client of the run behind the fault proxy, the
process SIGKILLed between commits and restarted until it completes. Its results CSV and a read_committed
consumer of its results topic must equal those of the same command run without faults or kills."""

from __future__ import annotations

import csv
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.brokers import Broker
from tests.chaos.harness import (
    CHAOS_MIX,
    ChaosError,
    ChaosReport,
    Compared,
    committed_ends,
    compare,
    read_topic_rows,
    run_under_chaos,
)
from tests.faultproxy import Chaos, FaultProxy
from tests.helpers import child_env
from tests.topic_data import as_json, create_topic, encoded, make_purchases, produce

__all__ = ["WINDOWS", "LocalChaos"]

PARTITIONS = 4
# The two window kinds of the issue: 10 tuples per key; 1 s of event time (the records' ts, ms).
WINDOWS: dict[str, list[str]] = {
    "count": ["--window-count", "10"],
    "time": ["--window-time", "1s", "--time", "ts"],
}
# The run's clients ask a lost answer again after 2 s (the store gives an operation 30 s): faults cost
# seconds, not minutes. The same file goes to the failure-free reference run.
CLIENT_PROPERTIES = "socket.timeout.ms=2000\nreconnect.backoff.max.ms=1000\n"


@dataclass
class LocalChaos:
    """One input topic and its failure-free results; `round()` runs the chaos over a new output."""

    broker: Broker
    proxy: FaultProxy
    work: Path
    window: str
    records: int
    keys: int
    seed: int

    def __post_init__(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.properties = self.work / "client.properties"
        self.properties.write_text(CLIENT_PROPERTIES)
        self.topic = f"chaos-in-{uuid.uuid4().hex[:10]}"
        create_topic(self.broker.bootstrap, self.topic, PARTITIONS)
        purchases = make_purchases(self.records, keys=self.keys, partitions=PARTITIONS, seed=self.seed)
        produce(self.broker.bootstrap, self.topic, encoded(purchases, as_json))
        self.reference = self._run_clean()

    def command(self, bootstrap: str, name: str) -> tuple[list[str], Path, str]:
        """The `cec run` command of output `name` through `bootstrap`: (argv, results CSV, results topic)."""
        out = self.work / name
        out.mkdir(parents=True, exist_ok=True)
        results, results_topic = out / "results.csv", f"chaos-res-{name}-{uuid.uuid4().hex[:8]}"
        script = Path(sys.executable).parent / "cec"
        command = [
            str(script), "run", "--input-topic", self.topic, "--bootstrap-servers", bootstrap,
            "--kafka-config", str(self.properties), "--key", "item", "--value", "price", "--agg", "avg",
            *WINDOWS[self.window], "--results", str(results), "--results-topic", results_topic,
            "--output-topic", f"chaos-out-{name}-{uuid.uuid4().hex[:8]}", "--store-dir", str(out / "store"),
        ]  # fmt: skip
        return command, results, results_topic

    def check(self, results: Path, results_topic: str) -> dict[str, Compared]:
        """A completed run's results CSV and results topic against the failure-free ones."""
        want_rows, want_topic = self.reference
        return {
            "results CSV": compare(_csv_rows(results), want_rows),
            "results topic": compare(read_topic_rows(self.broker.bootstrap, results_topic), want_topic),
        }

    def _run_clean(self) -> tuple[list[tuple[str, ...]], list[tuple[str, str]]]:
        """The failure-free output: the same command straight to the broker."""
        command, results, results_topic = self.command(self.broker.bootstrap, f"clean-{self.window}")
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=child_env())
        if done.returncode != 0:
            raise ChaosError(f"the failure-free run failed:\n{done.stderr[-3000:]}")
        rows = _csv_rows(results)
        if len(rows) < 50:
            raise ChaosError(f"the failure-free run gave only {len(rows)} results")
        return rows, read_topic_rows(self.broker.bootstrap, results_topic)

    def round(
        self,
        name: str,
        *,
        seed: int,
        faults: int,
        rate: float,
        kills: int,
        between_kills: tuple[int, int],
        reruns: int = 0,
        on_attempt: Callable[[ChaosReport], None] | None = None,
        delay_s: tuple[float, float] = (0.01, 3.0),
    ) -> ChaosReport:
        """The chaos run of one new output (log, results topic, store dir) over the input."""
        command, results, results_topic = self.command(self.proxy.address, name)
        output = command[command.index("--output-topic") + 1]
        report = ChaosReport(host=f"cec run ({self.window} windows)", seed=seed)

        def start() -> subprocess.Popen[str]:
            return subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                text=True, env=child_env(),
            )  # fmt: skip

        def kill(proc: subprocess.Popen[str]) -> None:
            proc.kill()
            proc.wait()

        run_under_chaos(
            report,
            self.proxy,
            start=start,
            kill=kill,
            progress=lambda: committed_ends(self.broker.bootstrap, [output, results_topic]),
            chaos=Chaos(rate, mix=CHAOS_MIX, delay_s=delay_s, times=faults),
            kills=kills,
            requests_between_kills=between_kills,
            reruns=reruns,
            on_attempt=on_attempt,
            logs=self.work / name / "attempts",
        )
        report.results.update(self.check(results, results_topic))
        return report


def _csv_rows(path: Path) -> list[tuple[str, ...]]:
    with path.open(newline="") as f:
        return [tuple(row) for row in csv.reader(f)][1:]
