"""Input rate of the Kafka topic source against raw confluent-kafka consume of the same topic, in one run.

On the broker from tests/brokers.py (or KAFKA_BOOTSTRAP_SERVERS), one topic per format (JSON, schemaless
Avro), 3 partitions, written once by a plain producer. For each format, alternating, `--repeat` times:
- raw: a group-less confluent-kafka Consumer assigned to every partition at offset 0, `poll` + `consume(n,
  0)` until every partition reported EOF, values touched (len) but not decoded;
- raw + decode: the same, each value decoded as a hand-written consumer would (json.loads /
  fastavro.schemaless_reader), fields checked like the source does;
- source: `KafkaTopicSource` (pinned bounds, read_committed) polled in batches of 10,000 until it ends:
  decoding, key/value checks, InputTuples.
Timing starts once the clients exist (consumer built; for the source, its constructor's metadata call)
and includes the assign / seek (the source's seek asks for the log starts: its retention check).
The ratio source / raw is the figure the issue targets (>= 0.7); source / (raw + decode) shows what the
source adds over decoding itself. Medians of the repeats.

    .venv/bin/python benchmarks/bench_topic_source.py [--records 300000] [--repeat 3] [--profile]

`--profile`: after the repeats, one more source run per format under cProfile (top 12 by own time).

Writes benchmarks/out/topic_source.json.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: the repo's packages and tests/
    sys.path.insert(0, str(ROOT))

import fastavro  # noqa: E402
from confluent_kafka import Consumer, KafkaError, TopicPartition  # noqa: E402

from operators.topic_source import KafkaTopicSource, resolve_bounds  # noqa: E402
from tests.brokers import start_broker  # noqa: E402
from tests.topic_data import (  # noqa: E402
    PURCHASE_AVSC,
    as_json,
    avro_body,
    create_topic,
    encoded,
    make_purchases,
    produce,
)

PARTITIONS = 3
_PARSED = fastavro.parse_schema(PURCHASE_AVSC)


def _json(raw: bytes) -> Any:
    return json.loads(raw)


def _avro(raw: bytes) -> Any:
    return fastavro.schemaless_reader(io.BytesIO(raw), _PARSED, None)


def raw_consume(bootstrap: str, topic: str, decode: Callable[[bytes], Any] | None) -> tuple[int, float]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
            "fetch.queue.backoff.ms": 10,
            "logger": logging.getLogger("bench.librdkafka"),
        }
    )
    n, eofs = 0, set()
    started = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    try:
        while len(eofs) < PARTITIONS:
            first = consumer.poll(0.05)
            if first is None:
                continue
            for msg in (first, *consumer.consume(10_000, 0)):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eofs.add(msg.partition())
                    continue
                value = msg.value()
                if decode is None:
                    n += 1 if value is not None and len(value) else 0
                else:
                    record = decode(value)  # type: ignore[arg-type]
                    if record.get("item") is not None and record.get("price") is not None:
                        n += 1
        return n, time.perf_counter() - started
    finally:
        consumer.close()


def source_consume(bootstrap: str, topic: str, fmt: str, bounds: dict[str, list[int]]) -> tuple[int, float]:
    source = KafkaTopicSource(
        bootstrap, topic, fmt=fmt, key_field="item", value_field="price", schema=PURCHASE_AVSC, **bounds
    )
    n = 0
    started = time.perf_counter()  # clients built on both sides; the source's seek (log-start check) counts
    try:
        source.seek([0] * source.partitions)
        while (batch := source.poll(10_000)) is not None:
            n += len(batch)
    finally:
        source.close()
    return n, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="profile one more source run per format")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    broker = start_broker()
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "broker": broker.kind,
        "records": args.records,
        "partitions": PARTITIONS,
        "load_average_at_start": os.getloadavg()[0],
        "python": platform.python_version(),
        "formats": {},
    }
    try:
        purchases = make_purchases(args.records, keys=10_000, partitions=PARTITIONS)
        for fmt, encode, decode in (("json", as_json, _json), ("avro", avro_body, _avro)):
            topic = f"bench-{fmt}-{uuid.uuid4().hex[:8]}"
            create_topic(broker.bootstrap, topic, PARTITIONS)
            produce(broker.bootstrap, topic, encoded(purchases, encode))
            bounds = resolve_bounds(broker.bootstrap, topic).as_dict()
            rates: dict[str, list[float]] = {"raw": [], "raw_decode": [], "source": []}
            for _ in range(args.repeat):
                for name, run in (
                    ("raw", lambda t=topic: raw_consume(broker.bootstrap, t, None)),
                    ("raw_decode", lambda t=topic, d=decode: raw_consume(broker.bootstrap, t, d)),  # type: ignore[misc]
                    ("source", lambda t=topic, f=fmt, b=bounds: source_consume(broker.bootstrap, t, f, b)),  # type: ignore[misc]
                ):
                    n, seconds = run()
                    assert n == args.records, f"{name} read {n} of {args.records} records"
                    rates[name].append(n / seconds)
            med = {k: statistics.median(v) for k, v in rates.items()}
            out["formats"][fmt] = {
                "rates_per_s": rates,
                "median_per_s": med,
                "source_over_raw": med["source"] / med["raw"],
                "source_over_raw_decode": med["source"] / med["raw_decode"],
            }
            if args.profile:
                import cProfile
                import pstats

                profiler = cProfile.Profile()
                profiler.runcall(source_consume, broker.bootstrap, topic, fmt, bounds)
                pstats.Stats(profiler).sort_stats("tottime").print_stats(12)
            print(
                f"{fmt}: raw {med['raw']:,.0f}/s, raw+decode {med['raw_decode']:,.0f}/s, source "
                f"{med['source']:,.0f}/s -> source/raw {med['source'] / med['raw']:.2f}, "
                f"source/(raw+decode) {med['source'] / med['raw_decode']:.2f}",
                flush=True,
            )
    finally:
        broker.stop()
    path = ROOT / "benchmarks" / "out" / "topic_source.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
