"""The long chaos run: at least 10,000 injected wire faults and 200 SIGKILLs across the two hosts, 0 lost,
0 duplicated (issue 22). The CI-sized run is tests/chaos/test_chaos.py; this is the same harness
(tests/chaos) at length.

Lanes run side by side, each with an Apache Kafka broker of its own from its jars (tests/brokers.py)
and the fault proxy (tests/faultproxy) in front of it (a fault run is mostly waiting: on lost answers, on
delays, on restarts), each in rounds until its own share and the totals are reached:
- the local lanes (`--local-lanes`): `cec run --input-topic` over a 4-partition JSON topic, count windows and time windows
  in turn (one input and one failure-free run of each; a new output log, results topic and store per
  round), `--results-topic`; its process SIGKILLed after a seeded number of its requests and restarted;
- the Spark lane: `cec_aggregate` in a driver process (local[2,3], writers on the executors) over another
  4-partition JSON topic, the driver's process group SIGKILLed and restarted.
Every round's results (the results CSV and a read_committed consumer of the results topic for `cec run`;
the output log read_committed for `cec_aggregate`) are compared with the failure-free output, row for
row. A round that breaks an invariant of the harness (a crash loop, a stop that is not one clear line, a
hang) is counted by kind and the lane goes on. After `--minutes` no lane starts a new round: the report
says what was reached, never more.

A progress line goes to stdout after every process life (totals, rates); the figures go to `--out`
(JSON) and a Markdown section beside it (`.md`) for benchmarks/RESULTS.md.

    nice -n 10 .venv/bin/python benchmarks/chaos.py --faults 10000 --kills 200 --out benchmarks/out/chaos.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.brokers import Broker, start_apache_kafka
from tests.chaos.harness import ChaosError, ChaosReport
from tests.chaos.local import LocalChaos
from tests.chaos.spark import SparkChaos
from tests.faultproxy import FaultProxy

# What a failed round's ChaosError says, by kind (its first line).
_FAILURE_KINDS = (("crash loop", "crash loop"), ("without one clear line", "unclear stop"), ("hung", "hang"))


@dataclass
class Share:
    """A lane's own targets."""

    faults: int
    kills: int


class Totals:
    """Every lane's rounds so far, and the progress line (lanes call it from their threads)."""

    def __init__(self, faults: int, kills: int) -> None:
        self.target_faults, self.target_kills = faults, kills
        self.started = time.monotonic()
        self.rounds: list[dict[str, Any]] = []
        self.live: dict[str, ChaosReport] = {}  # each lane's round in progress
        self._lock = threading.Lock()

    def _sum(self, lane: str | None, key: str) -> int:
        return sum(r[key] for r in self.rounds if lane is None or r["lane"] == lane)

    def faults(self, lane: str | None = None) -> int:
        with self._lock:
            live = sum(r.injected for name, r in self.live.items() if lane is None or name == lane)
            return self._sum(lane, "faults_total") + live

    def kills(self, lane: str | None = None) -> int:
        with self._lock:
            live = sum(r.kills for name, r in self.live.items() if lane is None or name == lane)
            return self._sum(lane, "kills") + live

    def reached(self) -> bool:
        return self.faults() >= self.target_faults and self.kills() >= self.target_kills

    def progress(self, lane: str, round_name: str, report: ChaosReport) -> None:
        with self._lock:
            self.live[lane] = report
        elapsed = time.monotonic() - self.started
        faults, kills = self.faults(), self.kills()
        with self._lock:
            lost, duplicated = self._sum(None, "lost"), self._sum(None, "duplicated")
            failed = sum(1 for r in self.rounds if r.get("failure"))
            rounds = len(self.rounds)
        print(
            f"[{elapsed / 60:6.1f} min] faults {faults:,}/{self.target_faults:,} ({faults / elapsed:.1f}/s)  "
            f"kills {kills}/{self.target_kills} ({kills / elapsed * 60:.1f}/min)  rounds {rounds}  "
            f"lost {lost}  duplicated {duplicated}  failed rounds {failed}  | {round_name}: "
            f"life {report.attempts}, {report.injected} faults, {report.kills} kills",
            flush=True,
        )

    def finish(self, lane: str, round_name: str, report: ChaosReport, failure: str | None) -> None:
        doc = report.as_dict()
        doc.update(lane=lane, round=round_name, failure=failure)
        with self._lock:
            self.live.pop(lane, None)
            self.rounds.append(doc)
        if report.lost or report.duplicated or failure:
            print(
                f"!! {round_name}: lost {report.lost}, duplicated {report.duplicated}, {failure}", flush=True
            )


def _failure_kind(exc: ChaosError) -> str:
    first = str(exc).splitlines()[0] if str(exc) else ""
    return next((kind for text, kind in _FAILURE_KINDS if text in first), "other")


def run_lane(
    lane: str,
    totals: Totals,
    share: Share,
    deadline: float,
    play: Callable[[int, Callable[[ChaosReport], None]], tuple[str, ChaosReport]],
) -> None:
    """Rounds (`play(n, on_attempt)`) until the lane's share and the totals are reached, or the deadline
    passed; a round's ChaosError is counted and the lane goes on."""
    n = 0
    while not (
        totals.faults(lane) >= share.faults and totals.kills(lane) >= share.kills and totals.reached()
    ):
        if time.monotonic() >= deadline:
            print(f"{lane}: the deadline passed: no new round", flush=True)
            return
        holder: dict[str, ChaosReport] = {}

        def on_attempt(report: ChaosReport, n: int = n, holder: dict[str, ChaosReport] = holder) -> None:
            holder["report"] = report
            totals.progress(lane, f"{lane}-{n}", report)

        try:
            name, report = play(n, on_attempt)
            totals.finish(lane, name, report, None)
        except ChaosError as exc:
            report = holder.get("report") or ChaosReport(host=lane, seed=-1)
            totals.finish(lane, f"{lane}-{n}", report, f"{_failure_kind(exc)}: {str(exc)[:2000]}")
        n += 1


def summary(totals: Totals, args: argparse.Namespace, brokers: list[str]) -> dict[str, Any]:
    by_kind: Counter[str] = Counter()
    by_api: Counter[str] = Counter()
    by_host: dict[str, Counter[str]] = {}
    stops: Counter[str] = Counter()
    failures: Counter[str] = Counter()
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
        if r["failure"]:
            failures[r["failure"].split(":")[0]] += 1
            host["failed rounds"] += 1
    return {
        "command": " ".join(["nice", "-n", "10", ".venv/bin/python", *sys.argv]),
        "date": args.date,
        "brokers": brokers,
        "seed": args.seed,
        "wall_s": round(time.monotonic() - totals.started, 1),
        "faults": sum(by_kind.values()),
        "faults_by_kind": dict(by_kind),
        "faults_by_api": dict(by_api),
        "kills": sum(r["kills"] for r in totals.rounds),
        "lost": sum(r["lost"] for r in totals.rounds),
        "duplicated": sum(r["duplicated"] for r in totals.rounds),
        "failed_rounds": dict(failures),
        # A failed round's results were not checked (it ended at the broken invariant): its faults apart.
        "checked_faults": sum(r["faults_total"] for r in totals.rounds if not r["failure"]),
        "checked_kills": sum(r["kills"] for r in totals.rounds if not r["failure"]),
        "crash_loops": failures["crash loop"],
        "hosts": {h: dict(c) for h, c in by_host.items()},
        "stops": dict(stops.most_common()),
        "load_average_at_start": args.load_at_start,
        "load_average_at_end": round(os.getloadavg()[0], 1),
        "rounds": totals.rounds,
    }


def markdown(doc: dict[str, Any]) -> str:
    minutes = doc["wall_s"] / 60
    lines = [
        f"Run {doc['date']}; {'; '.join(doc['brokers'])}; seed {doc['seed']}; wall time {minutes:.0f} min; "
        f"load average {doc['load_average_at_start']} at the start, {doc['load_average_at_end']} at the "
        "end (2 cores, shared).",
        "",
        f"**{doc['faults']:,} injected wire faults, {doc['kills']} SIGKILLs: {doc['lost']} lost, "
        f"{doc['duplicated']} duplicated, {doc['crash_loops']} crash loops.**",
        "",
        "| host | rounds | faults | SIGKILLs | process lives | stops (one line each) | results checked "
        "| lost | duplicated | failed rounds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for host, c in doc["hosts"].items():
        lines.append(
            f"| {host} | {c['rounds']} | {c['faults']:,} | {c['kills']} | {c['attempts']} | {c['stops']} | "
            f"{c['results']:,} | {c['lost']} | {c['duplicated']} | {c.get('failed rounds', 0)} |"
        )
    kinds = ", ".join(f"{k} {n:,}" for k, n in sorted(doc["faults_by_kind"].items(), key=lambda x: -x[1]))
    apis = ", ".join(f"{k} {n:,}" for k, n in sorted(doc["faults_by_api"].items(), key=lambda x: -x[1]))
    lines += ["", f"Faults by kind: {kinds}.", "", f"Faults by request: {apis}.", ""]
    if doc["failed_rounds"]:
        failed = ", ".join(f"{k} {n}" for k, n in doc["failed_rounds"].items())
        lines += [
            f"Rounds that broke a harness invariant: {failed}; the rounds whose results were checked hold "
            f"{doc['checked_faults']:,} of the faults and {doc['checked_kills']} of the SIGKILLs.",
            "",
        ]
    if doc["stops"]:
        lines += ["Stops (the one line a process stopped with, by count):", ""]
        lines += [f"- {n} x `{message}`" for message, n in list(doc["stops"].items())[:12]]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--faults", type=int, default=10_000, help="injected faults in all (at least)")
    parser.add_argument("--kills", type=int, default=200, help="SIGKILLs in all (at least)")
    parser.add_argument(
        "--spark-faults", type=int, default=1_500, help="the Spark lane's own share of faults"
    )
    parser.add_argument("--spark-kills", type=int, default=40, help="the Spark lane's own share of kills")
    parser.add_argument("--local-records", type=int, default=30_000)
    parser.add_argument("--spark-records", type=int, default=6_000)
    parser.add_argument("--local-lanes", type=int, default=2, help="`cec run` lanes, each on its own broker")
    parser.add_argument(
        "--rate", type=float, default=0.5, help="the share of faultable requests given a fault"
    )
    parser.add_argument("--max-delay", type=float, default=1.5, help="the longest injected delay (seconds)")
    parser.add_argument("--minutes", type=float, default=120.0, help="no new round after this")
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/chaos.json"))
    parser.add_argument("--work", type=Path, default=None, help="where the runs' stores go (a temp dir)")
    args = parser.parse_args()
    args.load_at_start = round(os.getloadavg()[0], 1)
    args.date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")

    work = args.work or Path(tempfile.mkdtemp(prefix="cec-chaos-"))
    totals = Totals(args.faults, args.kills)
    deadline = totals.started + args.minutes * 60
    started: list[tuple[Broker, FaultProxy]] = []

    def proxied() -> tuple[Broker, FaultProxy]:
        broker = start_apache_kafka()
        assert broker.proxied is not None
        proxy = FaultProxy(broker.proxied.upstream, listen=broker.proxied.listen).start()
        started.append((broker, proxy))
        print(f"broker {broker.describe()}; proxy {proxy.address}; work {work}", flush=True)
        return broker, proxy

    lanes_n = max(1, args.local_lanes)
    local_share = Share(
        (args.faults - args.spark_faults + lanes_n - 1) // lanes_n,
        (args.kills - args.spark_kills + lanes_n - 1) // lanes_n,
    )

    def local_lane(lane: str, lane_seed: int) -> None:
        broker, proxy = proxied()
        inputs = {
            window: LocalChaos(
                broker, proxy, work / f"{lane}-{window}", window=window, records=args.local_records, keys=400,
                seed=lane_seed,
            )
            for window in ("count", "time")
        }  # fmt: skip

        def play(n: int, on_attempt: Callable[[ChaosReport], None]) -> tuple[str, ChaosReport]:
            window = ("count", "time")[n % 2]
            name = f"{lane}-{n}"
            report = inputs[window].round(
                name, seed=lane_seed * 1000 + n, faults=600, rate=args.rate, kills=10, between_kills=(30, 220),
                reruns=4, on_attempt=on_attempt, delay_s=(0.01, args.max_delay),
            )  # fmt: skip
            return name, report

        run_lane(lane, totals, local_share, deadline, play)

    def spark_lane() -> None:
        broker, proxy = proxied()
        spark = SparkChaos(
            broker, proxy, work / "spark", records=args.spark_records, keys=200, seed=args.seed
        )

        def play(n: int, on_attempt: Callable[[ChaosReport], None]) -> tuple[str, ChaosReport]:
            name = f"spark-{n}"
            report = spark.round(
                name, seed=args.seed * 1000 + 500 + n, faults=300, rate=args.rate, kills=5,
                between_kills=(60, 200), reruns=2, on_attempt=on_attempt, delay_s=(0.01, args.max_delay),
            )  # fmt: skip
            return name, report

        run_lane("spark", totals, Share(args.spark_faults, args.spark_kills), deadline, play)

    def guarded(lane: Callable[[], None], name: str) -> Callable[[], None]:
        def run() -> None:
            try:
                lane()
            except BaseException:  # a lane's own breakage (a broker that did not start): said, not hidden
                print(f"!! the {name} lane stopped:\n{traceback.format_exc()}", flush=True)

        return run

    def local_lane_at(i: int) -> Callable[[], None]:
        return lambda: local_lane(f"local{i}", args.seed + 100 * i)

    lanes = [
        threading.Thread(target=guarded(local_lane_at(i), f"local{i}"), name=f"local{i}")
        for i in range(lanes_n)
    ]
    lanes.append(threading.Thread(target=guarded(spark_lane, "spark"), name="spark"))
    try:
        for lane in lanes:
            lane.start()
        for lane in lanes:
            lane.join()
    finally:
        doc = summary(totals, args, sorted({b.describe().split(" at ")[0] for b, _ in started}))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1))
        args.out.with_suffix(".md").write_text(markdown(doc))
        for broker, proxy in started:
            proxy.stop()
            broker.stop()
    print(markdown(doc))
    if doc["lost"] or doc["duplicated"] or doc["failed_rounds"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
