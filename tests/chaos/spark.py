"""Chaos of `cec_aggregate` (the Spark host): a JSON topic of 4 partitions, a count-window average, the
driver (`tests.chaos.spark_driver`: local[2,3], writers on the executors) and every Kafka client of it
and of its Python workers behind the fault proxy; the driver's whole process group SIGKILLed between
commits and started again until the query completes. The results in the output log, read as a
read_committed consumer reads them, must equal the failure-free output: the same aggregation in plain
Python over the records as produced (`tests/operators/spark/test_attach_topic.py` holds cec_aggregate to it)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cec.records import Kind
from operators.aggregate import RESULT_SCHEMA
from operators.sinks import iter_payloads
from operators.spark.generations import list_generations
from queuestore.kafka import KafkaQueueStore
from tests.brokers import Broker
from tests.chaos.harness import (
    CHAOS_MIX,
    ChaosError,
    ChaosReport,
    committed_ends,
    compare,
    kill_process_group,
    run_under_chaos,
)
from tests.faultproxy import Chaos, FaultProxy
from tests.helpers import child_env
from tests.topic_data import as_json, create_topic, encoded, make_purchases, produce

__all__ = ["SparkChaos"]

PARTITIONS = 4
WINDOW = 7
# As for the local host (tests.chaos.local): lost answers are asked again after 2 s.
CLIENT_CONFIG = {"socket.timeout.ms": "2000", "reconnect.backoff.max.ms": "1000"}

Row = tuple[str, int, str, int, int, int]


@dataclass
class SparkChaos:
    """One input topic and its failure-free results; `round()` runs the chaos over a new output."""

    broker: Broker
    proxy: FaultProxy
    work: Path
    records: int
    keys: int
    seed: int
    trigger_rows: int = 2000

    def __post_init__(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.topic = f"chaos-spark-in-{uuid.uuid4().hex[:10]}"
        create_topic(self.broker.bootstrap, self.topic, PARTITIONS)
        purchases = make_purchases(self.records, keys=self.keys, partitions=PARTITIONS, seed=self.seed)
        produce(self.broker.bootstrap, self.topic, encoded(purchases, as_json))
        self.reference = _reference(purchases)
        if len(self.reference) < 50:
            raise ChaosError(f"the input gives only {len(self.reference)} results")

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
        """The chaos run of one new output (generations, state dir, checkpoints) over the input."""
        out = self.work / name
        out.mkdir(parents=True, exist_ok=True)
        output = f"chaos-spark-out-{name}-{uuid.uuid4().hex[:8]}"
        args: dict[str, Any] = {
            "input_topic": self.topic,
            "input_format": "json",
            "bootstrap_servers": self.proxy.address,
            "kafka_config": CLIENT_CONFIG,
            "output_topic": output,
            "key": "item",
            "value": "price",
            "agg": "avg",
            "window_count": WINDOW,
            "partitions": PARTITIONS,
            "state_dir": str(out / "state"),
            "checkpoint_location": str(out / "checkpoints"),
            "max_records_per_trigger": self.trigger_rows,
        }
        spec = out / "args.json"
        spec.write_text(json.dumps(args))
        report = ChaosReport(host="cec_aggregate (Spark, count windows)", seed=seed)

        def start() -> subprocess.Popen[str]:
            return subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.spark_driver", str(spec)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                env=child_env(), start_new_session=True,
            )  # fmt: skip

        def progress() -> tuple[int, ...]:
            store = KafkaQueueStore(self.broker.bootstrap, out / "probe")
            try:
                topics = [g.topic for g in list_generations(store, output)]
            finally:
                store.close()
            return committed_ends(self.broker.bootstrap, topics)

        run_under_chaos(
            report,
            self.proxy,
            start=start,
            kill=kill_process_group,
            progress=progress,
            chaos=Chaos(rate, mix=CHAOS_MIX, delay_s=delay_s, times=faults),
            kills=kills,
            requests_between_kills=between_kills,
            reruns=reruns,
            on_attempt=on_attempt,
            logs=out / "attempts",
            stop_line=_driver_stop,
        )
        report.results["output log (read_committed)"] = compare(self._results(output, out), self.reference)
        return report

    def _results(self, output: str, out: Path) -> list[Row]:
        store = KafkaQueueStore(self.broker.bootstrap, out / "probe")
        try:
            rows: list[Row] = []
            for generation in list_generations(store, output):
                rows.extend(_row(r) for r in iter_payloads(store, generation.topic, RESULT_SCHEMA, Kind.R))
            return rows
        finally:
            store.close()


def _row(result: dict[str, Any]) -> Row:
    return (
        str(result["key"]),
        int(result["window"]),
        f"{float(result['value']):.9g}",
        int(result["count"]),
        int(result["start"]),
        int(result["end"]),
    )


def _reference(purchases: list[tuple[int, dict[str, Any]]]) -> list[Row]:
    """Per key, in offset order (one producer, no transactions: offsets are dense per partition), count
    windows of WINDOW tuples: mean price, count, first and last offset, as cec_aggregate gives them."""
    offsets = [0] * PARTITIONS
    per_key: dict[str, list[tuple[int, float]]] = {}
    for p, rec in purchases:
        per_key.setdefault(str(rec["item"]), []).append((offsets[p], float(rec["price"])))
        offsets[p] += 1
    rows: list[Row] = []
    for key, tuples in per_key.items():
        for w in range(len(tuples) // WINDOW):
            chunk = tuples[w * WINDOW : (w + 1) * WINDOW]
            mean = sum(x for _, x in chunk) / WINDOW
            rows.append(
                _row(
                    {
                        "key": key,
                        "window": w,
                        "value": mean,
                        "count": WINDOW,
                        "start": chunk[0][0],
                        "end": chunk[-1][0],
                    }
                )
            )
    return rows


def _driver_stop(stderr: str) -> str | None:
    """The driver's one error line (Spark's own log lines around it are Spark's), or None if it did not
    say exactly one."""
    lines = [line for line in stderr.splitlines() if line.startswith("chaos-driver: error: ")]
    return lines[0] if len(lines) == 1 else None
