"""Soak of a topic input's ends under wire faults: `resolve_bounds` (what `cec run --input-topic` asks first,
through `queuestore.kafka.ends.find_ends`) through the fault proxy (tests/faultproxy) in front of Apache
Kafka from its jars (tests/brokers.py), one seeded chaos plan per round, each round bounded by a deadline.

A round either returns the true ends of the 4-partition topic or fails with the source's one-line error;
each round runs in a process of its own (librdkafka's assign and unassign hold the GIL while they wait: a
round that hangs there freezes its process, and no deadline inside it can fire). A round that does not
return within `--deadline` is a hang: its seed, the proxy's latest injections and the child's stacks
(py-spy, when installed) are printed, and the soak stops. `--strategy rebootstrap` sets librdkafka's
`metadata.recovery.strategy` as it was before cec set it to `none` (queuestore.kafka.config): with it, 2 of
47 rounds hung for good in find_ends' unassign (2026-11-29); without, none.

    nice -n 5 .venv/bin/python benchmarks/soak_ends.py --rounds 200 [--strategy rebootstrap]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from operators.topic_bounds import resolve_bounds  # noqa: E402
from tests.brokers import start_apache_kafka  # noqa: E402
from tests.chaos.harness import CHAOS_MIX  # noqa: E402
from tests.faultproxy import Chaos, FaultPlan, FaultProxy  # noqa: E402
from tests.topic_data import create_topic, produce  # noqa: E402

# One round, in its own process: the topic's bounds as JSON, or the source's one-line error.
ROUND = """
import json, sys
from operators.exceptions import TopicSourceError
from operators.topic_bounds import resolve_bounds
config = json.loads(sys.argv[3])
try:
    b = resolve_bounds(sys.argv[1], sys.argv[2], config=config)
    print(json.dumps({"starts": list(b.starts), "ends": list(b.ends)}))
except TopicSourceError as exc:
    print(json.dumps({"error": str(exc)}))
"""


def stacks(pid: int) -> str:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        return "(py-spy not installed: no stacks)"
    dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
    return dump.stdout or dump.stderr


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--strategy", choices=("none", "rebootstrap"), help="metadata.recovery.strategy")
    parser.add_argument("--deadline", type=float, default=90.0, help="seconds a round may take")
    parser.add_argument("--max-delay", type=float, default=1.5, help="longest injected delay, seconds")
    args = parser.parse_args()
    config = {} if args.strategy is None else {"metadata.recovery.strategy": args.strategy}
    broker = start_apache_kafka()
    assert broker.proxied is not None
    proxy = FaultProxy(broker.proxied.upstream, listen=broker.proxied.listen).start()
    try:
        topic = "soak-ends"
        create_topic(broker.bootstrap, topic, 4)
        produce(broker.bootstrap, topic, [(i % 4, b"k%d" % (i % 97), b"{}") for i in range(20_000)])
        truth = resolve_bounds(broker.bootstrap, topic)
        print(f"{broker.describe()}; proxy {proxy.address}; ends {list(truth.ends)}", flush=True)
        started = time.monotonic()
        errors = 0
        for n, seed in enumerate(range(args.first_seed, args.first_seed + args.rounds), 1):
            proxy.reset()
            proxy.plan = FaultPlan(
                Chaos(0.3, mix=CHAOS_MIX, delay_s=(0.01, args.max_delay), times=200), seed=seed
            )
            t0 = time.monotonic()
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
            child = subprocess.Popen(
                [sys.executable, "-c", ROUND, proxy.address, topic, json.dumps(config)],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=env,
            )
            try:
                out, _ = child.communicate(timeout=args.deadline)
            except subprocess.TimeoutExpired:
                print(
                    f"round {n} (seed {seed}) HUNG for {args.deadline:.0f} s\n{proxy.describe()}", flush=True
                )
                print(stacks(child.pid), flush=True)
                child.kill()
                child.wait()
                return 1
            outcome = json.loads(out.splitlines()[-1])
            if "ends" in outcome and (tuple(outcome["starts"]), tuple(outcome["ends"])) != (
                truth.starts,
                truth.ends,
            ):
                print(f"round {n} (seed {seed}): WRONG bounds {outcome} (true {truth})", flush=True)
                return 1
            errors += "error" in outcome
            elapsed = time.monotonic() - started
            print(
                f"round {n}/{args.rounds} (seed {seed}) {time.monotonic() - t0:5.1f} s "
                f"{'error: ' + str(outcome['error']) if 'error' in outcome else 'ends right'}; "
                f"{n / elapsed:.2f} rounds/s, {errors} clear errors, 0 hangs",
                flush=True,
            )
        return 0
    finally:
        proxy.stop()
        broker.stop()


if __name__ == "__main__":
    raise SystemExit(main())
