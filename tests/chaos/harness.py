"""What the chaos runs share: the report, the comparison with the failure-free output, reading a results
topic the way a consumer that knows nothing of cec does, and the loop that restarts a host's process
under injected faults and SIGKILLs until it completes.

A chaos run of one host (`cec run --input-topic`, or `cec_aggregate` in a Spark driver) goes: start the
process, its Kafka clients behind the fault proxy whose seeded `Chaos` rule injects faults into their
requests; SIGKILL it after a seeded number of its requests (of the APIs faults go to), or let it stop
by itself when a fault is one its client cannot resolve (its stderr must then be exactly one clear line);
start it again; and so on until it exits 0. Waits are on conditions (the
proxy's counts, the process's exit), each bounded by a deadline. A host that stops by itself `crash_loop`
times with no progress in between (its output log's committed ends unchanged; the lives the harness
SIGKILLed do not count) is a crash loop: the run fails.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from queuestore.kafka.errors import settles_if_asked_again
from tests.faultproxy import FAULT_APIS, Chaos, Fault, FaultPlan, FaultProxy
from tests.faultproxy.frames import api_name
from tests.helpers import wait_for

__all__ = [
    "ATTEMPT_DEADLINE_S",
    "Attempt",
    "ChaosError",
    "ChaosReport",
    "Compared",
    "committed_ends",
    "compare",
    "kill_process_group",
    "one_stop_line",
    "read_topic_rows",
    "run_under_chaos",
]

ATTEMPT_DEADLINE_S = 900.0  # one process's life, faults and a loaded machine included: a hang guard
_POLL_S = 0.02


class ChaosError(AssertionError):
    """A chaos run broke an invariant (lost or duplicated results, a stop that is not one clear line, a
    crash loop, a hang); the message carries the seed and the proxy's latest injections."""


@dataclass
class Compared:
    """Results against the failure-free output, as multisets of rows."""

    expected: int
    got: int
    lost: int  # rows of the failure-free output missing
    duplicated: int  # rows beyond the failure-free output (a row twice, or a row it does not have)

    @property
    def exact(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.got == self.expected


def compare(got: Iterable[tuple[Any, ...]], want: Iterable[tuple[Any, ...]]) -> Compared:
    have, need = Counter(got), Counter(want)
    return Compared(
        expected=sum(need.values()),
        got=sum(have.values()),
        lost=sum((need - have).values()),
        duplicated=sum((have - need).values()),
    )


@dataclass
class ChaosReport:
    """One host's chaos run."""

    host: str
    seed: int
    faults: dict[str, int] = field(default_factory=dict)  # by kind
    faults_by_api: dict[str, int] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)  # requests the proxy read, by API
    kills: int = 0
    stops: Counter[str] = field(default_factory=Counter)  # one-line errors the host stopped with
    attempts: int = 0
    attempt_s: list[float] = field(default_factory=list)  # each process's life, in order
    wall_s: float = 0.0
    results: dict[str, Compared] = field(default_factory=dict)  # per output checked (CSV, topic, log)

    @property
    def injected(self) -> int:
        return sum(self.faults.values())

    @property
    def lost(self) -> int:
        return sum(c.lost for c in self.results.values())

    @property
    def duplicated(self) -> int:
        return sum(c.duplicated for c in self.results.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "seed": self.seed,
            "faults": self.faults,
            "faults_total": self.injected,
            "faults_by_api": self.faults_by_api,
            "requests": self.requests,
            "kills": self.kills,
            "stops": dict(self.stops),
            "attempts": self.attempts,
            "attempt_s": [round(t, 1) for t in self.attempt_s],
            "wall_s": round(self.wall_s, 1),
            "lost": self.lost,
            "duplicated": self.duplicated,
            "results": {name: vars(c) for name, c in self.results.items()},
        }


@dataclass
class Attempt:
    """One life of a host's process: how it ended."""

    returncode: int
    killed: bool
    stderr: str


def committed_ends(bootstrap: str, topics: Iterable[str]) -> tuple[int, ...]:
    """The read_committed ends (last stable offsets) of every partition of `topics` (missing topics: none):
    a host made progress between two calls iff this grew."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    md = admin.list_topics(timeout=30)
    request = {
        TopicPartition(t, p): OffsetSpec.latest()
        for t in topics
        if t in md.topics and md.topics[t].error is None
        for p in md.topics[t].partitions
    }
    if not request:
        return ()
    answers: list[tuple[int, ...]] = []

    def answered() -> bool:
        # Asked again while a leadership settles (a topic the host just created): says nothing of progress.
        futures = admin.list_offsets(
            request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=30
        )
        try:
            ordered = sorted(request, key=lambda tp: (tp.topic, tp.partition))
            answers.append(tuple(futures[tp].result().offset for tp in ordered))
        except KafkaException as exc:
            if settles_if_asked_again(exc):
                return False
            raise
        return True

    wait_for(answered, timeout=120, interval=0.1)
    return answers[0]


def read_topic_rows(bootstrap: str, topic: str) -> list[tuple[str, str]]:
    """Every committed record of a plain results topic, (key, value with sorted JSON fields), as a
    read_committed consumer that knows nothing of cec reads it, to the end of every partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"chaos-reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    try:
        meta = consumer.list_topics(timeout=30).topics.get(topic)
        if meta is None or not meta.partitions:
            return []
        count = len(meta.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(count)])
        rows: list[tuple[str, str]] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + 120
        while len(at_end) < count:
            if time.monotonic() > deadline:
                raise ChaosError(f"no end of {topic} within 120 s")
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise ChaosError(f"reading {topic}: {err}")
                at_end.add(int(msg.partition() or 0))
                continue
            at_end.discard(int(msg.partition() or 0))
            key = (msg.key() or b"").decode()
            rows.append((key, json.dumps(json.loads(msg.value() or b"null"), sort_keys=True)))
        return rows
    finally:
        consumer.close()


# What a stop may print besides its one line: cec's own progress lines and warnings about faults it
# resolved earlier in the same life (a commit in doubt recovered in the process), never a traceback nor
# a line of librdkafka's.
_OWN_WARNING = re.compile(r"^\d\d:\d\d:\d\d (WARNING|INFO) (cec|operators|queuestore|recovery)\.[\w.]+: ")
_STOP_LINE = ("cec: error: ", "chaos-driver: error: ")


def one_stop_line(stderr: str) -> str | None:
    """A stop's one clear line: the last line of its stderr, when it is the error line and nothing else is
    there but cec's own progress and warnings; else None."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    if not lines or "Traceback" in stderr or not lines[-1].startswith(_STOP_LINE):
        return None
    if not all(_OWN_WARNING.match(line) and "librdkafka" not in line for line in lines[:-1]):
        return None
    return lines[-1]


def run_under_chaos(
    report: ChaosReport,
    proxy: FaultProxy,
    *,
    start: Callable[[], subprocess.Popen[str]],
    kill: Callable[[subprocess.Popen[str]], None],
    progress: Callable[[], tuple[int, ...]],
    chaos: Chaos,
    kills: int,
    requests_between_kills: tuple[int, int],
    crash_loop: int = 8,
    reruns: int = 0,
    on_attempt: Callable[[ChaosReport], None] | None = None,
    logs: Path | None = None,
    stop_line: Callable[[str], str | None] | None = None,
) -> None:
    """Restart the host's process (`start`) under `chaos` (its `times` caps the faults) and at most `kills`
    SIGKILLs (`kill`, each after a seeded number of the host's requests) until it exits 0; stops (a
    non-zero exit of its own) must be one clear line each. While budgets are left, a completed job is
    started again, at most `reruns` times: a restart after the end must find the job done (its recovery
    reads the log under the same faults and kills). Fills `report` as it goes."""
    rng = random.Random(report.seed)
    plan = FaultPlan(chaos, seed=report.seed)
    proxy.reset()
    proxy.plan = plan
    started = time.monotonic()
    stalled = 0
    last = progress()
    kill_at: int | None = None  # the count of the host's requests to SIGKILL it at
    try:
        while True:
            report.attempts += 1
            if kill_at is None and report.kills < kills:
                # Counted across attempts: an attempt that ends first carries it to the next (a rerun of
                # a completed job is short), so every kill happens whatever the machine's pace.
                kill_at = _faultable(proxy) + rng.randint(*requests_between_kills)
            proc = start()
            born = time.monotonic()
            deadline = born + ATTEMPT_DEADLINE_S
            killed = False
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    kill(proc)
                    raise ChaosError(
                        f"{report.host}: attempt {report.attempts} hung for {ATTEMPT_DEADLINE_S} s"
                    )
                if kill_at is not None and _faultable(proxy) >= kill_at:
                    kill(proc)
                    killed = True
                    kill_at = None
                    report.kills += 1
                    break
                time.sleep(_POLL_S)  # pacing of the watch over the process and the proxy's counts
            _, err = proc.communicate(timeout=120)
            report.attempt_s.append(time.monotonic() - born)
            attempt = Attempt(proc.returncode, killed, err)
            if logs is not None:
                logs.mkdir(parents=True, exist_ok=True)
                (logs / f"attempt-{report.attempts}.stderr").write_text(err)
            _record(report, proxy)
            if on_attempt is not None:
                on_attempt(report)
            if attempt.returncode == 0 and not killed:
                left = not plan.exhausted() or report.kills < kills
                if not left or reruns <= 0:
                    break  # completed: what is left of the budgets is for the next round (a new input)
                reruns -= 1
                stalled, last = 0, progress()
                continue
            if not killed:
                line = (stop_line or one_stop_line)(err)
                if line is None:
                    shown = err if len(err) < 6000 else f"{err[:3000]}\n[...]\n{err[-3000:]}"
                    raise ChaosError(
                        f"{report.host} stopped (exit {attempt.returncode}) without one clear line:\n{shown}"
                    )
                report.stops[line[:160]] += 1
            now = progress()
            if now != last:
                stalled = 0
            elif not killed:  # a life the harness cut short says nothing of the host's own progress
                stalled += 1
            last = now
            if stalled >= crash_loop:
                raise ChaosError(f"{report.host}: {stalled} stops in a row made no progress (a crash loop)")
    except ChaosError as exc:
        raise ChaosError(f"{exc}\nseed {report.seed}\n{proxy.describe(last=60)}") from None
    finally:
        proxy.plan = None
        report.wall_s = time.monotonic() - started
        _record(report, proxy)


def _faultable(proxy: FaultProxy) -> int:
    """Requests of the APIs faults go to, so far: the clock the kills are scheduled by (the host's own
    pace: its fetches, produces and commits, its recovery's reads)."""
    requests = proxy.requests()
    return sum(requests[api_name(key)] for key in FAULT_APIS)


def _record(report: ChaosReport, proxy: FaultProxy) -> None:
    by_kind: Counter[str] = Counter()
    by_api: Counter[str] = Counter()
    for (fault, api), n in proxy.injected().items():
        by_kind[fault] += n
        by_api[api] += n
    report.faults = dict(by_kind)
    report.faults_by_api = dict(by_api)
    report.requests = dict(proxy.requests())


def kill_process_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL a process started in its own session, with everything it started (a Spark driver's JVM
    and Python workers), and wait until the group is gone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    proc.wait()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(_POLL_S)  # pacing of the wait for the group's last process
    raise ChaosError(f"process group {proc.pid} outlived its SIGKILL by 120 s")


CHAOS_MIX = {
    Fault.DELAY: 0.45,
    Fault.DISCONNECT_BEFORE: 0.2,
    Fault.DISCONNECT_AFTER: 0.25,
    Fault.DROP: 0.1,
}
