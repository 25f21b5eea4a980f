"""Queue-store throughput against the raw client underneath, measured in one run on one broker / disk.

Kafka (confluent-kafka on the broker from tests/brokers.py, or KAFKA_BOOTSTRAP_SERVERS):
- raw produce (idempotent, acks=all, same batching as the store) and raw consume of the same records;
- raw transactional produce, committed at the store writer's cadence, against raw idempotent produce: the
  cost of transactions (fencing, read_committed), interleaved runs, ratio in one run;
- KafkaQueueStore append until durable (one durable callback per record, as OutputQueue appends), backward
  scan of the whole partition (what EC reconstruction reads), tail read; each as a ratio to the raw rate;
- EC reconstruction: `EventualCheckpointBuilder.build()` over the log of a real aggregate job (generator
  source, count windows, G-open only) written by `run_job`; records read per second.
SQLite: the same figures for SqliteQueueStore against raw sqlite3 inserts/selects on the same schema.

Records are real output tuples: a mix of R and G-open records of the aggregate, encoded with RecordCodec,
written with the same RecordMeta (Kafka headers / SQLite columns) for the raw and the store paths, so a
ratio measures only what the store adds.

    .venv/bin/python benchmarks/bench_store.py [--records 200000] [--quick]

Writes benchmarks/out/store.json and benchmarks/store.png.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: the repo's packages and tests/brokers.py
    sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402

from cec.records import AvroCodec, Kind, OutputRecord, RecordCodec  # noqa: E402
from operators.aggregate import RESULT_SCHEMA, STATE_SCHEMA  # noqa: E402
from operators.job import JobSpec, run_job  # noqa: E402
from queuestore.base import QueueStore, RecordMeta  # noqa: E402
from queuestore.factory import open_store  # noqa: E402
from queuestore.index import StreamIndex  # noqa: E402
from queuestore.kafka import KafkaQueueStore, meta_to_headers, meta_to_key  # noqa: E402
from queuestore.sqlite import SqliteQueueStore  # noqa: E402
from recovery.eventual import EventualCheckpointBuilder  # noqa: E402

__all__ = ["main", "sample_records"]

OUT_JSON = ROOT / "benchmarks" / "out" / "store.json"
OUT_PNG = ROOT / "benchmarks" / "store.png"
SCAN_CHUNK = 8192  # EventualCheckpointBuilder's default chunk
DRAIN = 10_000


def say(message: str) -> None:
    print(message, flush=True)


# -- records --------------------------------------------------------------------------------------------


def sample_records(count: int = 16) -> list[tuple[bytes, RecordMeta]]:
    """Encoded output tuples of the aggregate: results (R) and G-opens alternating, realistic field values."""
    codec = RecordCodec()
    results, states = AvroCodec(RESULT_SCHEMA), AvroCodec(STATE_SCHEMA)
    out: list[tuple[bytes, RecordMeta]] = []
    for i in range(count):
        key = f"{1000 + 613 * i % 20_000}"
        t = 1_700_000_000_000 + 37 * i
        if i % 2:
            payload = results.encode(
                {"key": key, "window": 3 + i, "value": 512.25 + i, "count": 10, "start": t - 900, "end": t}
            )
            rec = OutputRecord(Kind.R, t, (123_456 + i,), 18_000 + i, key, 3 + i, None, payload)
        else:
            state = states.encode(
                {"count": 1, "total": 77.5 + i, "lo": 77.5, "hi": 77.5 + i, "start": t, "last": t}
            )
            rec = OutputRecord(Kind.GOPEN, t, (123_456 + i,), 18_000 + i, key, 4 + i, state, None)
        out.append((codec.encode(rec), rec.meta()))
    return out


def header_bytes(meta: RecordMeta) -> int:
    """What travels beside the value on Kafka: the cec.* headers and the message key."""
    return sum(len(k) + len(v or b"") for k, v in meta_to_headers(meta)) + len(meta_to_key(meta))


def timed(label: str, n: int, fn: Callable[[int], int], repeats: int) -> float:
    """Best records/s of `repeats` runs of `fn(run)` (which returns how many records it handled).

    Best, not mean: the machine is shared with the broker and other jobs, and the least disturbed run is
    the one that measures the code rather than the neighbours.
    """
    rates = []
    for run in range(repeats):
        t0 = time.perf_counter()
        done = fn(run)
        elapsed = time.perf_counter() - t0
        if done != n:
            raise AssertionError(f"{label}: expected {n} records, handled {done}")
        rates.append(done / elapsed)
    say(f"  {label:34s} {max(rates):>12,.0f} records/s  (runs: {', '.join(f'{r:,.0f}' for r in rates)})")
    return max(rates)


def timed_interleaved(
    n: int, entries: list[tuple[str, Callable[[int], int]]], repeats: int
) -> list[list[float]]:
    """`timed` for measurements meant as a ratio: their runs alternate, so that a neighbour's burst of
    load hits them alike rather than one of them, and the order rotates (A B C, B C A, C A B, ...) so that
    none always runs first; records/s of every run of each."""
    rates: list[list[float]] = [[] for _ in entries]
    for run in range(repeats):
        for step in range(len(entries)):
            k = (run + step) % len(entries)
            label, fn = entries[k]
            t0 = time.perf_counter()
            done = fn(run)
            elapsed = time.perf_counter() - t0
            if done != n:
                raise AssertionError(f"{label}: expected {n} records, handled {done}")
            rates[k].append(done / elapsed)
    for (label, _), runs in zip(entries, rates, strict=True):
        say(f"  {label:34s} {max(runs):>12,.0f} records/s  (runs: {', '.join(f'{r:,.0f}' for r in runs)})")
    return rates


def paired_ratio(runs: list[float], baseline: list[float]) -> float:
    """Median over runs of run k's rate / the baseline's run k (neighbours in time, loaded alike)."""
    return statistics.median(a / b for a, b in zip(runs, baseline, strict=True))


# -- Kafka ----------------------------------------------------------------------------------------------


def raw_produce(
    bootstrap: str,
    topic: str,
    samples: list[tuple[bytes, RecordMeta]],
    n: int,
    commit_interval: float | None = None,
) -> int:
    """Idempotent produce until delivered; with `commit_interval`, transactional produce committed as the
    store's writer commits (checked every 512 records, as the operator loop polls; every `interval`
    seconds and at the end), so that the two rates isolate what transactions cost."""
    # The store's producer settings (queuestore/kafka.py), so the ratio isolates the store's own cost.
    transactional = {} if commit_interval is None else {"transactional.id": f"bench-{uuid.uuid4().hex}"}
    producer = Producer(
        {
            **transactional,
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "batch.num.messages": 10_000,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 100_000,
        }
    )
    wire = [(value, meta_to_key(meta), meta_to_headers(meta)) for value, meta in samples]
    delivered = 0

    def report(err: KafkaError | None, _msg: Any) -> None:
        nonlocal delivered
        if err is None:
            delivered += 1

    k = len(wire)
    if commit_interval is not None:
        producer.init_transactions(30)
        producer.begin_transaction()
        started = time.monotonic()
    for i in range(n):
        value, key, headers = wire[i % k]
        while True:
            try:
                producer.produce(topic, value, key, partition=0, headers=headers, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.05)
        if commit_interval is not None and i % 512 == 511 and time.monotonic() - started >= commit_interval:
            producer.commit_transaction(30)
            producer.begin_transaction()
            started = time.monotonic()
    producer.flush()
    if commit_interval is not None:
        producer.commit_transaction(30)
    return delivered


def raw_consume(bootstrap: str, topic: str, n: int) -> int:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,  # the store readers' tuning, for a fair ratio
            "fetch.queue.backoff.ms": 10,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = 0
    try:
        while got < n:
            first = consumer.poll(1.0)
            if first is None:
                continue
            for msg in (first, *consumer.consume(DRAIN, 0)):
                if msg.error() is None:
                    msg.value()
                    msg.headers()
                    got += 1
    finally:
        consumer.close()
    return got


def store_append(store: QueueStore, topic: str, samples: list[tuple[bytes, RecordMeta]], n: int) -> int:
    durable = 0

    def on_durable(offset: int | None, err: Exception | None) -> None:
        nonlocal durable
        if err is None:
            durable += 1

    k = len(samples)
    with store.writer(topic, 0) as w:
        for i in range(n):
            value, meta = samples[i % k]
            w.append(value, meta, on_durable)
            if i % 512 == 511:  # the operator loop serves completions once per input batch
                w.poll(0)
        w.flush()
    return durable


def store_scan_backward(store: QueueStore, topic: str) -> int:
    with store.reader(topic, 0) as r:
        return sum(1 for _ in r.scan_backward(chunk=SCAN_CHUNK))


def store_tail(store: QueueStore, topic: str, n: int) -> int:
    got = 0
    with store.reader(topic, 0) as r:
        for batch in r.tail(0, batch=SCAN_CHUNK, idle_timeout=30.0):
            got += len(batch)
            if got >= n:
                break
    return got


# -- EC reconstruction ----------------------------------------------------------------------------------


def ec_job(store_cfg: dict[str, Any], topic: str, tuples: int, keys: int) -> JobSpec:
    return JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "avg",
            "window_count": 10,
        },
        source={"type": "generator", "count": tuples, "keys": keys, "seed": 1, "partitions": 1},
        store=store_cfg,
        output_topic=topic,
        batch_size=512,  # q_target/u_target None: G-open only
    )


def ec_build(store_cfg: dict[str, Any], topic: str, repeats: int) -> dict[str, Any]:
    """Best of `repeats` builds (the machine is shared: the best run is the least disturbed one)."""
    store = open_store(store_cfg)
    try:
        best: dict[str, Any] | None = None
        for _ in range(repeats):
            with store.reader(topic, 0) as reader:
                t0 = time.perf_counter()
                # As recovery does: the stream index (reconciled when the output queue opened) tells the
                # reader where the log ends at least, so finding the end reads only what lies past it.
                with StreamIndex(store.index_path(topic, 0), f"{topic}/0", read_only=True) as index:
                    reader.hint_end(index.next_offset)
                ec = EventualCheckpointBuilder(reader).build()
                seconds = time.perf_counter() - t0
            row = {
                "records_read": ec.records_read,
                "extent_records": ec.extent_size,
                "log_records": ec.end_offset,
                "open_windows": ec.n,
                "seconds": seconds,
                "rate": ec.records_read / seconds,
            }
            if best is None or row["rate"] > best["rate"]:
                best = row
        assert best is not None
        return best
    finally:
        store.close()


def run_ec(store_cfg: dict[str, Any], label: str, tuples: int, keys: int, repeats: int) -> dict[str, Any]:
    topic = f"ec-{uuid.uuid4().hex[:8]}"
    say(f"[{label}] EC: writing the log of an aggregate job ({tuples:,} tuples, {keys:,} keys, window 10)")
    t0 = time.perf_counter()
    stats = run_job(ec_job(store_cfg, topic, tuples, keys))
    say(f"[{label}]   job: {stats.outputs:,} records in {time.perf_counter() - t0:.1f} s")
    row = ec_build(store_cfg, topic, repeats)
    say(
        f"[{label}]   EC build: {row['records_read']:,} records read (extent {row['extent_records']:,}, "
        f"N={row['open_windows']:,}) in {row['seconds'] * 1000:.0f} ms = {row['rate']:,.0f} records/s"
    )
    return row


# -- SQLite raw -----------------------------------------------------------------------------------------

_SCHEMA = (
    "CREATE TABLE log (offset INTEGER PRIMARY KEY, kind TEXT NOT NULL, time INTEGER NOT NULL, key TEXT,"
    " seq INTEGER NOT NULL, value BLOB NOT NULL)"
)


def raw_sqlite_insert(path: Path, samples: list[tuple[bytes, RecordMeta]], n: int, batch: int = 4096) -> int:
    # Same schema, journal and sync level as SqliteQueueStore, one transaction per batch of 4096.
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(_SCHEMA)
    rows = [(meta.kind, meta.time, meta.key, meta.seq, value) for value, meta in samples]
    k = len(rows)
    done = 0
    while done < n:
        m = min(batch, n - done)
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO log VALUES (?,?,?,?,?,?)", ((done + j, *rows[(done + j) % k]) for j in range(m))
        )
        conn.execute("COMMIT")
        done += m
    conn.close()
    return done


def raw_sqlite_select(path: Path) -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    got = 0
    for _ in conn.execute("SELECT offset, kind, time, key, seq, value FROM log ORDER BY offset DESC"):
        got += 1
    conn.close()
    return got


# -- main -----------------------------------------------------------------------------------------------


def bench_kafka(
    bootstrap: str,
    tmp: Path,
    samples: list[tuple[bytes, RecordMeta]],
    n: int,
    ec_tuples: int,
    ec_keys: int,
    repeats: int,
) -> dict[str, Any]:
    rates: dict[str, float] = {}
    store = KafkaQueueStore(bootstrap, tmp / "kafka-state")
    raw_topics = [f"raw-{uuid.uuid4().hex[:8]}" for _ in range(repeats)]
    txn_topics = [f"txn-{uuid.uuid4().hex[:8]}" for _ in range(repeats)]
    topics = [f"store-{uuid.uuid4().hex[:8]}" for _ in range(repeats)]
    interval = store.commit_interval
    try:
        for topic in raw_topics + txn_topics + topics:
            store.create_topic(topic, 1)
        say(f"[kafka] {n:,} records per run, best of {repeats}")
        warm = f"warm-{uuid.uuid4().hex[:8]}"
        store.create_topic(warm, 1)
        raw_produce(bootstrap, warm, samples, min(n, 50_000))  # connections, metadata, broker warm-up
        # Writes go to a fresh topic per run; reads re-read the last one. The idempotent producer (what
        # the store's writer was before it became transactional), the same producer in transactions
        # committed at the writer's cadence, and the store's transactional writer: interleaved runs.
        idempotent, transactional, appends = timed_interleaved(
            n,
            [
                (
                    "raw idempotent produce (delivered)",
                    lambda r: raw_produce(bootstrap, raw_topics[r], samples, n),
                ),
                (
                    f"raw transactional produce ({interval * 1000:.0f} ms)",
                    lambda r: raw_produce(bootstrap, txn_topics[r], samples, n, interval),
                ),
                ("store append (until committed)", lambda r: store_append(store, topics[r], samples, n)),
            ],
            repeats,
        )
        rates["raw_produce"], rates["raw_produce_txn"], rates["append"] = (
            max(idempotent),
            max(transactional),
            max(appends),
        )
        paired = {
            "raw_produce_txn/raw_produce": paired_ratio(transactional, idempotent),
            "append/raw_produce": paired_ratio(appends, idempotent),
        }
        say(
            "  paired (median of run-by-run ratios): transactional/idempotent "
            f"{paired['raw_produce_txn/raw_produce']:.2f}, store append/idempotent {paired['append/raw_produce']:.2f}"
        )
        rates["raw_consume"] = timed(
            "raw consume", n, lambda r: raw_consume(bootstrap, raw_topics[-1], n), repeats
        )
        rates["scan_backward"] = timed(
            "store scan_backward", n, lambda r: store_scan_backward(store, topics[-1]), repeats
        )
        rates["tail"] = timed("store tail", n, lambda r: store_tail(store, topics[-1], n), repeats)
    finally:
        store.close()
    spec = {"type": "kafka", "bootstrap_servers": bootstrap, "state_dir": str(tmp / "kafka-ec")}
    ec = run_ec(spec, "kafka", ec_tuples, ec_keys, repeats)
    rates["ec_build"] = ec["rate"]
    ratios = {
        "append/raw_produce": rates["append"] / rates["raw_produce"],
        # What transactions cost on their own: the same producer, transactional vs idempotent.
        "raw_produce_txn/raw_produce": rates["raw_produce_txn"] / rates["raw_produce"],
        "scan_backward/raw_consume": rates["scan_backward"] / rates["raw_consume"],
        "tail/raw_consume": rates["tail"] / rates["raw_consume"],
        "ec_build/raw_consume": rates["ec_build"] / rates["raw_consume"],
    }
    return {"rates": rates, "ratios": ratios, "paired_ratios": paired, "commit_interval": interval, "ec": ec}


def bench_sqlite(
    tmp: Path, samples: list[tuple[bytes, RecordMeta]], n: int, ec_tuples: int, ec_keys: int, repeats: int
) -> dict[str, Any]:
    rates: dict[str, float] = {}
    raw_paths = [tmp / f"raw-{r}.sqlite" for r in range(repeats)]
    say(f"[sqlite] {n:,} records per run, best of {repeats}")
    rates["raw_insert"] = timed(
        "raw sqlite3 insert (committed)", n, lambda r: raw_sqlite_insert(raw_paths[r], samples, n), repeats
    )
    rates["raw_select"] = timed("raw sqlite3 select", n, lambda r: raw_sqlite_select(raw_paths[-1]), repeats)
    store = SqliteQueueStore(tmp / "sqlite-store")
    topics = [f"store-{r}" for r in range(repeats)]
    for topic in topics:
        store.create_topic(topic, 1)
    rates["append"] = timed(
        "store append (until durable)", n, lambda r: store_append(store, topics[r], samples, n), repeats
    )
    rates["scan_backward"] = timed(
        "store scan_backward", n, lambda r: store_scan_backward(store, topics[-1]), repeats
    )
    rates["tail"] = timed("store tail", n, lambda r: store_tail(store, topics[-1], n), repeats)
    ec = run_ec({"type": "sqlite", "root": str(tmp / "sqlite-ec")}, "sqlite", ec_tuples, ec_keys, repeats)
    rates["ec_build"] = ec["rate"]
    ratios = {
        "append/raw_insert": rates["append"] / rates["raw_insert"],
        "scan_backward/raw_select": rates["scan_backward"] / rates["raw_select"],
        "tail/raw_select": rates["tail"] / rates["raw_select"],
        "ec_build/raw_select": rates["ec_build"] / rates["raw_select"],
    }
    return {"rates": rates, "ratios": ratios, "ec": ec}


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display here
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, backend in zip(axes, ("kafka", "sqlite"), strict=True):
        rates: dict[str, float] = results[backend]["rates"]
        names = list(rates)
        values = [rates[k] / 1000 for k in names]
        colors = ["#888888" if k.startswith("raw") else "#1f77b4" for k in names]
        colors = [("#d62728" if k == "ec_build" else c) for k, c in zip(names, colors, strict=True)]
        bars = ax.bar(names, values, color=colors)
        for bar, value in zip(bars, values, strict=True):
            ax.annotate(
                f"{value:,.0f}k",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_title(f"{backend}: records/s (thousands); raw client in grey")
        ax.tick_params(axis="x", rotation=30, labelsize=8)
        ax.set_ylabel("k records/s")
        # The target for EC reconstruction (records of extent per second), in the EC bar's colour.
        ax.axhline(500, color="#d62728", linestyle="--", linewidth=0.8)
        ax.annotate("EC target 500k/s", (0, 500), fontsize=7, color="#d62728", va="bottom")
    meta = results["meta"]
    fig.suptitle(
        f"Queue store vs raw client ({meta['records']:,} records: ~{meta['value_bytes']:.0f} B value "
        f"+ ~{meta['header_bytes']:.0f} B meta; broker {meta['broker']}; best of {meta['repeats']})",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000, help="records per throughput test")
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke test of the script")
    ap.add_argument("--ec-tuples", type=int, default=200_000, help="input tuples of the EC job")
    ap.add_argument("--ec-keys", type=int, default=20_000, help="keys of the EC job")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each measurement (the best is reported)")
    args = ap.parse_args(argv)
    # librdkafka's configuration warnings (enable.gapless.guarantee is "experimental") would interleave
    # with the progress lines; errors still show.
    logging.getLogger("queuestore.kafka.librdkafka").setLevel(logging.ERROR)
    n, ec_tuples, ec_keys, repeats = args.records, args.ec_tuples, args.ec_keys, args.repeats
    if args.quick:
        n, ec_tuples, ec_keys, repeats = min(n, 20_000), min(ec_tuples, 20_000), min(ec_keys, 2_000), 1

    samples = sample_records()
    value_bytes = sum(len(v) for v, _ in samples) / len(samples)
    meta_bytes = sum(header_bytes(m) for _, m in samples) / len(samples)
    say(
        f"records: {len(samples)} representative R/G-open tuples, value {value_bytes:.0f} B on average "
        f"(+{meta_bytes:.0f} B of cec.* headers on Kafka)"
    )

    from tests.brokers import start_broker

    broker = start_broker()
    say(f"broker: {broker.kind} at {broker.bootstrap}")
    results: dict[str, Any] = {
        "meta": {
            "records": n,
            "value_bytes": value_bytes,
            "header_bytes": meta_bytes,
            "ec_job": {"tuples": ec_tuples, "keys": ec_keys, "window_count": 10, "policy": "G-open only"},
            "broker": broker.kind,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "repeats": repeats,
            "quick": args.quick,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
    }
    try:
        with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
            results["kafka"] = bench_kafka(
                broker.bootstrap, Path(tmp), samples, n, ec_tuples, ec_keys, repeats
            )
            results["sqlite"] = bench_sqlite(Path(tmp), samples, n, ec_tuples, ec_keys, repeats)
    finally:
        broker.stop()

    say("")
    say(f"{'backend':8s} {'measure':28s} {'records/s':>12s}")
    for backend in ("kafka", "sqlite"):
        for name, rate in results[backend]["rates"].items():
            say(f"{backend:8s} {name:28s} {rate:>12,.0f}")
        for name, ratio in results[backend]["ratios"].items():
            say(f"{backend:8s} {name:28s} {ratio:>12.2f}")
    OUT_JSON.parent.mkdir(parents=True, exist_ok=True)
    OUT_JSON.write_text(json.dumps(results, indent=2))
    plot(results, OUT_PNG)
    say(f"wrote {OUT_JSON.relative_to(ROOT)} and {OUT_PNG.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
