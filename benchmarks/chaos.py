"""The long chaos run: at least 10,000 injected wire faults and 200 SIGKILLs across the two hosts, 0 lost,
0 duplicated (issue 22). The CI-sized run is tests/chaos/test_chaos.py; this is the same harness
(tests/chaos) at length.

An Apache Kafka broker from its jars (tests/brokers.py) with its fault-proxy listener, the fault proxy
(tests/faultproxy) in front of it, then rounds until both totals are reached:
- local rounds: `cec run --input-topic` over a 4-partition JSON topic, count windows and time windows in
  turn (one input and one failure-free run of each, a new output log, results topic and store per round),
  `--results-topic`; its process SIGKILLed after a seeded number of its requests and restarted;
- Spark rounds: `cec_aggregate` in a driver process (local[2,3], writers on the executors) over another
  4-partition JSON topic, the driver's process group SIGKILLed and restarted.
Every round's results (results CSV and a read_committed consumer of the results topic for `cec run`; the
output log read_committed for `cec_aggregate`) are compared with the failure-free output, row for row.
Progress goes to stdout after every attempt (totals, rates); the figures go to `--out` (JSON) and a
Markdown section beside it (`--out` with `.md`) for benchmarks/RESULTS.md.

    nice -n 5 .venv/bin/python benchmarks/chaos.py --faults 10000 --kills 200 --out benchmarks/out/chaos.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.brokers import start_apache_kafka
from tests.chaos.harness import ChaosReport
from tests.chaos.local import LocalChaos
from tests.chaos.spark import SparkChaos
from tests.faultproxy import FaultProxy


class Totals:
    """Everything the rounds did so far, and the progress line."""

    def __init__(self, faults: int, kills: int) -> None:
        self.target_faults, self.target_kills = faults, kills
        self.started = time.monotonic()
        self.rounds: list[dict[str, Any]] = []
        self.done_faults = 0
        self.done_kills: Counter[str] = Counter()
        self.live: ChaosReport | None = None  # the round in progress

    def faults(self) -> int:
        return self.done_faults + (self.live.injected if self.live else 0)

    def kills(self) -> int:
        return sum(self.done_kills.values()) + (self.live.kills if self.live else 0)

    def progress(self, report: ChaosReport) -> None:
        self.live = report
        elapsed = time.monotonic() - self.started
        faults, kills = self.faults(), self.kills()
        lost = sum(r["lost"] for r in self.rounds)
        duplicated = sum(r["duplicated"] for r in self.rounds)
        print(
            f"[{elapsed / 60:6.1f} min] faults {faults:,}/{self.target_faults:,} ({faults / elapsed:.1f}/s)  "
            f"kills {kills}/{self.target_kills} ({kills / elapsed * 60:.1f}/min)  rounds {len(self.rounds)}  "
            f"lost {lost}  duplicated {duplicated}  | {report.host}: attempt {report.attempts}",
            flush=True,
        )

    def finish(self, report: ChaosReport, name: str) -> None:
        self.live = None
        doc = report.as_dict()
        doc["round"] = name
        self.rounds.append(doc)
        self.done_faults += report.injected
        self.done_kills[report.host.split(" ")[0]] += report.kills
        if report.lost or report.duplicated:
            print(
                f"!! {name}: lost {report.lost}, duplicated {report.duplicated}: {doc['results']}", flush=True
            )


def summary(totals: Totals, args: argparse.Namespace, broker: str) -> dict[str, Any]:
    by_kind: Counter[str] = Counter()
    by_api: Counter[str] = Counter()
    by_host: dict[str, Counter[str]] = {}
    stops: Counter[str] = Counter()
    for r in totals.rounds:
        host = by_host.setdefault(r["host"], Counter())
        host["rounds"] += 1
        host["faults"] += r["faults_total"]
        host["kills"] += r["kills"]
        host["attempts"] += r["attempts"]
        host["stops"] += sum(r["stops"].values())
        host["lost"] += r["lost"]
        host["duplicated"] += r["duplicated"]
        host["results"] += sum(c["expected"] for c in r["results"].values())
        by_kind.update(r["faults"])
        by_api.update(r["faults_by_api"])
        stops.update(r["stops"])
    return {
        "command": " ".join(sys.argv),
        "broker": broker,
        "seed": args.seed,
        "wall_s": round(time.monotonic() - totals.started, 1),
        "faults": sum(by_kind.values()),
        "faults_by_kind": dict(by_kind),
        "faults_by_api": dict(by_api),
        "kills": totals.kills(),
        "lost": sum(r["lost"] for r in totals.rounds),
        "duplicated": sum(r["duplicated"] for r in totals.rounds),
        "hosts": {h: dict(c) for h, c in by_host.items()},
        "stops": dict(stops.most_common()),
        "load_average_at_start": args.load_at_start,
        "load_average_at_end": round(os.getloadavg()[0], 1),
        "rounds": totals.rounds,
    }


def markdown(doc: dict[str, Any]) -> str:
    hours = doc["wall_s"] / 3600
    lines = [
        f"Broker {doc['broker']}; seed {doc['seed']}; wall time {hours:.2f} h; load average "
        f"{doc['load_average_at_start']} at the start, {doc['load_average_at_end']} at the end (2 cores).",
        "",
        f"**{doc['faults']:,} injected faults, {doc['kills']} SIGKILLs: {doc['lost']} lost, "
        f"{doc['duplicated']} duplicated.**",
        "",
        "| host | rounds | faults | SIGKILLs | process starts | stops (one line each) | results checked | lost | duplicated |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for host, c in doc["hosts"].items():
        lines.append(
            f"| {host} | {c['rounds']} | {c['faults']:,} | {c['kills']} | {c['attempts']} | {c['stops']} | "
            f"{c['results']:,} | {c['lost']} | {c['duplicated']} |"
        )
    kinds = ", ".join(f"{k} {n:,}" for k, n in sorted(doc["faults_by_kind"].items(), key=lambda x: -x[1]))
    apis = ", ".join(f"{k} {n:,}" for k, n in sorted(doc["faults_by_api"].items(), key=lambda x: -x[1]))
    lines += ["", f"Faults by kind: {kinds}.", "", f"Faults by request: {apis}.", ""]
    if doc["stops"]:
        lines.append("Stops (the one line each process stopped with, by count):")
        lines.append("")
        for message, n in list(doc["stops"].items())[:12]:
            lines.append(f"- {n} x `{message}`")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--faults", type=int, default=10_000, help="injected faults in all (at least)")
    parser.add_argument("--kills", type=int, default=200, help="SIGKILLs in all (at least)")
    parser.add_argument("--spark-kills", type=float, default=0.2, help="share of the kills on the Spark host")
    parser.add_argument(
        "--spark-faults", type=float, default=0.2, help="share of the faults on the Spark host"
    )
    parser.add_argument("--local-records", type=int, default=50_000)
    parser.add_argument("--spark-records", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/chaos.json"))
    parser.add_argument("--work", type=Path, default=None, help="where the runs' stores go (a temp dir)")
    args = parser.parse_args()
    args.load_at_start = round(os.getloadavg()[0], 1)

    work = args.work or Path(tempfile.mkdtemp(prefix="cec-chaos-"))
    broker = start_apache_kafka()
    assert broker.proxied is not None
    proxy = FaultProxy(broker.proxied.upstream, listen=broker.proxied.listen).start()
    print(f"broker {broker.describe()}; proxy {proxy.address}; work {work}", flush=True)
    totals = Totals(args.faults, args.kills)
    spark_kills = round(args.kills * args.spark_kills)
    spark_faults = round(args.faults * args.spark_faults)
    local_kills, local_faults = args.kills - spark_kills, args.faults - spark_faults
    try:
        inputs = {
            window: LocalChaos(
                broker,
                proxy,
                work / f"local-{window}",
                window=window,
                records=args.local_records,
                keys=500,
                seed=args.seed,
            )
            for window in ("count", "time")
        }
        done_faults = done_kills = 0
        n = 0
        while done_faults < local_faults or done_kills < local_kills:
            window = ("count", "time")[n % 2]
            name = f"local-{n}"
            seed = args.seed * 1000 + n
            report = inputs[window].round(
                name, seed=seed, faults=500, rate=0.25, kills=8, between_kills=(40, 300), reruns=3,
                on_attempt=totals.progress,
            )  # fmt: skip
            totals.finish(report, name)
            done_faults += report.injected
            done_kills += report.kills
            n += 1
        spark = SparkChaos(
            broker, proxy, work / "spark", records=args.spark_records, keys=300, seed=args.seed
        )
        done_faults = done_kills = 0
        n = 0
        while done_faults < spark_faults or done_kills < spark_kills:
            name = f"spark-{n}"
            report = spark.round(
                name, seed=args.seed * 1000 + 500 + n, faults=300, rate=0.15, kills=5, between_kills=(150, 900),
                reruns=2, on_attempt=totals.progress,
            )  # fmt: skip
            totals.finish(report, name)
            done_faults += report.injected
            done_kills += report.kills
            n += 1
    finally:
        doc = summary(totals, args, broker.describe())
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1))
        args.out.with_suffix(".md").write_text(markdown(doc))
        proxy.stop()
        broker.stop()
    print(markdown(doc))
    if doc["lost"] or doc["duplicated"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
