"""The Kafka EC build over a log an operator wrote, by the bulk reader's fetch.wait.max.ms, on a starved CPU.

Why this exists: the restarted `cec run --input-topic` of `bench_quix.py` spent 44 s building the EC of a
63k-record extent at load ~29, while `bench_ec.py` read a similar extent at 128k-263k records/s. The two
logs differ in their batches: bench_ec copies its log into the broker with large batches, an operator's
writer lingers 5 ms and commits every 100 ms, leaving batches of 30-100 records. Tansu answers a fetch with
the batches it gathers within the consumer's fetch.wait.max.ms, so a short wait on a starved CPU brings one
small batch per round trip.

What it does: starts a broker (`tests.brokers`), writes the paper's purchases to an input topic, runs
`cec run --input-topic ... --recovery-target T` until it SIGKILLs itself at half the input (the log a
crash leaves), then, for each fetch wait and in interleaved repeats, builds the EC of that log in a child
process with a fresh reader and counts: records read, extent, fetch answers that carried records
(librdkafka's "fetch" debug lines) and seconds. With `--starve PCT`, the child and the broker are held to
PCT% of the time (SIGSTOP/SIGCONT every 40 ms) to reproduce a loaded machine on a quiet one.

    .venv/bin/python benchmarks/bench_ec_fetch_wait.py --keys 100000 --count 200000 --starve 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from tests.helpers import child_env  # noqa: E402 - the kill plan of the first run (tests/killpoints)

__all__ = ["main"]

_ENQUEUE = re.compile(r"Enqueue (\d+) message\(s\)")


def _child(bootstrap: str, topic: str, wait_ms: int, out: str) -> int:
    """One EC build with a fresh reader whose consumers wait `wait_ms` per fetch."""
    import queuestore.kafka as kafka
    from recovery.eventual import EventualCheckpointBuilder

    answers = [0]

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            found = _ENQUEUE.search(record.getMessage())
            if found and int(found.group(1)) > 0:
                answers[0] += 1

    rdkafka = logging.getLogger("bench-rdkafka")
    rdkafka.setLevel(logging.DEBUG)
    rdkafka.addHandler(Count())
    rdkafka.propagate = False
    config = {"fetch.wait.max.ms": wait_ms, "debug": "fetch", "logger": rdkafka, "log.queue": False}
    with tempfile.TemporaryDirectory() as tmp:
        store = kafka.KafkaQueueStore(bootstrap, tmp, config=config)
        try:
            with store.reader(topic, 0) as reader:
                end = reader.end_offset()  # a reader that knows the end, as the runtime's after reconcile
                answers[0] = 0
                started = time.perf_counter()
                reader.hint_end(end)
                ec = EventualCheckpointBuilder(reader).build()
                seconds = time.perf_counter() - started
        finally:
            store.close()
    figures = {
        "seconds": seconds,
        "records_read": ec.records_read,
        "extent": ec.extent_size,
        "windows": len(ec.windows),
        "fetch_answers": answers[0],
    }
    Path(out).write_text(json.dumps(figures))
    return 0


def _starve(pids: list[int], share: float, stop: threading.Event, period: float = 0.04) -> None:
    on = period * share
    try:
        while not stop.is_set():
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
            time.sleep(on)
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            time.sleep(period - on)
    except ProcessLookupError:
        pass
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def build(bootstrap: str, topic: str, wait_ms: int, starve: float | None, broker_pid: int | None) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, __file__, "_child", bootstrap, topic, str(wait_ms), out.name]
        proc = subprocess.Popen(cmd, cwd=ROOT)
        stop = threading.Event()
        starver = None
        if starve is not None:
            pids = [proc.pid] + ([broker_pid] if broker_pid is not None else [])
            starver = threading.Thread(target=_starve, args=(pids, starve / 100, stop), daemon=True)
            starver.start()
        rc = proc.wait()
        stop.set()
        if starver is not None:
            starver.join()
        if rc != 0:
            raise RuntimeError(f"EC build child exited {rc}")
        return json.loads(Path(out.name).read_text())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_child":
        return _child(argv[1], argv[2], int(argv[3]), argv[4])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--recovery-target", default="5s", help="of the run that writes the log")
    parser.add_argument("--waits", default="2,10", help="fetch.wait.max.ms values, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--starve", type=float, help="percent of the time the reader and broker may run")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    import bench_quix

    from tests.brokers import start_broker

    broker = start_broker()
    try:
        broker_pid = broker.pid
        with tempfile.TemporaryDirectory(prefix="bench-ec-wait-") as tmp:
            inp = f"ecwait-{args.keys}-{args.count}-{os.getpid()}"
            bench_quix.produce_input(broker.bootstrap, inp, args.count, args.keys)
            out_topic = f"{inp}-out"
            cmd = bench_quix._cec_cmd(
                broker.bootstrap,
                inp,
                out_topic,
                Path(tmp) / "store",
                ["--recovery-target", args.recovery_target],
            )
            env = child_env(f"runtime.after_input:{args.count // 2}")  # tests/killpoints
            rc = subprocess.run(
                cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            ).returncode
            if rc != -signal.SIGKILL:
                raise RuntimeError(f"cec was to be SIGKILLed at {args.count // 2} inputs, exited {rc}")
            waits = [int(w) for w in args.waits.split(",")]
            rows: dict[int, list[dict]] = {w: [] for w in waits}
            for rep in range(args.repeats):
                for wait in waits if rep % 2 == 0 else waits[::-1]:
                    fig = build(broker.bootstrap, out_topic, wait, args.starve, broker_pid)
                    rows[wait].append(fig)
                    print(
                        f"[{rep}] wait {wait:>3} ms: EC build {fig['seconds']:.3f} s, {fig['records_read']:,} records "
                        f"read, extent {fig['extent']:,}, {fig['windows']:,} windows, "
                        f"{fig['fetch_answers']:,} fetch answers",
                        flush=True,
                    )
    finally:
        broker.stop()
    summary = {
        w: {
            "seconds_median": statistics.median(f["seconds"] for f in figs),
            "fetch_answers_median": statistics.median(f["fetch_answers"] for f in figs),
            "records_per_s_median": statistics.median(f["records_read"] / f["seconds"] for f in figs),
        }
        for w, figs in rows.items()
    }
    for w, s in summary.items():
        print(
            f"wait {w} ms: median {s['seconds_median']:.3f} s ({s['records_per_s_median']:,.0f} records/s), "
            f"{s['fetch_answers_median']:,.0f} fetch answers"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {"args": vars(args) | {"out": str(args.out)}, "rows": rows, "summary": summary}, indent=2
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
