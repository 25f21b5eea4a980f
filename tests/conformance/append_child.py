"""Child process of the conformance suite: append records numbered start..start+count-1 to one partition.

    python -m tests.conformance.append_child SPEC_JSON TOPIC PARTITION START COUNT [--poll-every K]
        [--flush-every K] [--continue-log] [--pause-at K --gate PATH]

`SPEC_JSON` is a store spec for `queuestore.factory.open_store`. Record i is `record(i)` encoded with
`RecordCodec`, so the parent knows byte for byte what the child would have written and can check that
the log after a SIGKILL is an exact prefix of it. The tests kill this process (a kill plan in the child's
environment, tests/killpoints, or SIGKILL from outside) or let it finish (exit code 0).

`--continue-log` starts at the number of records the partition holds once the writer has taken it, as a
recovering operator continues its log (START is then ignored). `--pause-at K --gate PATH` stops after
appending record K (before serving its completion), creates PATH.paused and waits until PATH exists. A
store error (a fenced writer, above all) ends the child with exit code 3 and its one-line message
(followed by the error's class name).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cec.records import Kind, OutputRecord, RecordCodec
from queuestore.exceptions import QueueStoreError
from queuestore.factory import open_store

__all__ = ["KEYS", "main", "record"]

KEYS = 13


def record(i: int) -> OutputRecord:
    """The i-th record: deterministic, shaped like an aggregate's output (footprints and results).

    Logical time advances every third record (non-decreasing with repeats, as an operator's time does);
    key k{i % KEYS} gets window sequence i // KEYS, every fifth record is a G-open, the rest results.
    """
    return OutputRecord(
        kind=Kind.GOPEN if i % 5 == 0 else Kind.R,
        time=i // 3,
        pos=(i + 1,),
        n=i % 17,
        key=f"k{i % KEYS}",
        seq=i // KEYS,
        state=b"s%08d" % i if i % 5 == 0 else None,
        payload=None if i % 5 == 0 else b"p%08d" % i + b"." * 40,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("spec")
    ap.add_argument("topic")
    ap.add_argument("partition", type=int)
    ap.add_argument("start", type=int)
    ap.add_argument("count", type=int)
    ap.add_argument("--poll-every", type=int, default=0, help="serve completions every K appends")
    ap.add_argument("--flush-every", type=int, default=0, help="wait until durable every K appends")
    ap.add_argument("--continue-log", action="store_true", help="start after what the partition holds")
    ap.add_argument("--pause-at", type=int, default=-1, help="after appending record K, wait for --gate")
    ap.add_argument("--gate", type=Path, help="the file whose creation lets a paused child go on")
    args = ap.parse_args(argv)
    codec = RecordCodec()
    store = open_store(json.loads(args.spec))
    try:
        with store.writer(args.topic, args.partition) as writer:
            start = args.start
            if args.continue_log:  # read only now: taking the partition may change where the log ends
                with store.reader(args.topic, args.partition) as reader:
                    start = sum(1 for _ in reader.scan_forward())
            for i in range(start, start + args.count):
                rec = record(i)
                writer.append(codec.encode(rec), rec.meta())
                if i == args.pause_at:
                    _wait_for_gate(args.gate)
                done = i + 1 - start
                if args.flush_every and done % args.flush_every == 0:
                    writer.flush(60.0)
                elif args.poll_every and done % args.poll_every == 0:
                    writer.poll(0)
    except QueueStoreError as exc:
        print(f"append_child: {exc} ({type(exc).__name__})", file=sys.stderr)
        return 3
    finally:
        store.close()
    return 0


def _wait_for_gate(gate: Path) -> None:
    gate.with_name(gate.name + ".paused").touch()
    while not gate.exists():
        time.sleep(0.01)  # pacing of the wait on the gate file, which the parent creates


if __name__ == "__main__":
    sys.exit(main())
