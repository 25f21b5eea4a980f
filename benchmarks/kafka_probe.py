"""Overhead of the Kafka queue store over raw confluent-kafka, on the same broker.

Measures, for ~200-byte records: raw produce and consume rates, `KafkaPartitionWriter.append` (with a
durable callback per record, as the operator uses it), `KafkaPartitionReader` backward scan and tail read,
and prints the ratios. Uses `KAFKA_BOOTSTRAP_SERVERS` or starts a broker like the tests do.

    PYTHONPATH=. python benchmarks/kafka_probe.py [--records 200000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from queuestore.base import RecordMeta
from queuestore.kafka import KafkaQueueStore, meta_to_headers
from tests.brokers import start_broker

__all__ = ["main"]

VALUE = b"x" * 200


def raw_produce(bootstrap: str, topic: str, n: int) -> float:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "batch.num.messages": 10_000,
        "compression.type": "lz4",
    }
    p = Producer(conf)
    headers = meta_to_headers(RecordMeta("D", 1))
    t0 = time.perf_counter()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, VALUE, partition=0, headers=headers)
                break
            except BufferError:
                p.poll(0.05)
    p.flush()
    return n / (time.perf_counter() - t0)


def raw_consume(bootstrap: str, topic: str, n: int) -> float:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": f"probe-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "fetch.wait.max.ms": 10,
        "fetch.queue.backoff.ms": 10,  # same tuning as the store's readers, for a fair ratio
    }
    c = Consumer(conf)
    c.assign([TopicPartition(topic, 0, 0)])
    got = 0
    t0 = time.perf_counter()
    done = False
    while not done:
        first = c.poll(1.0)
        if first is None:
            continue
        for m in (first, *c.consume(10_000, 0)):
            err = m.error()
            if err is not None and err.code() == KafkaError._PARTITION_EOF:
                done = True
                break
            got += 1
    rate = got / (time.perf_counter() - t0)
    c.close()
    assert got == n, (got, n)
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=200_000)
    args = ap.parse_args()
    n: int = args.records
    broker = start_broker()
    try:
        with tempfile.TemporaryDirectory() as tmp, KafkaQueueStore(broker.bootstrap, Path(tmp)) as store:
            raw_topic, cec_topic = f"raw-{uuid.uuid4().hex[:8]}", f"cec-{uuid.uuid4().hex[:8]}"
            store.create_topic(raw_topic, 1)
            store.create_topic(cec_topic, 1)
            rates: dict[str, float] = {}
            rates["raw produce"] = raw_produce(broker.bootstrap, raw_topic, n)
            rates["raw consume"] = raw_consume(broker.bootstrap, raw_topic, n)

            durable = 0

            def on_durable(offset: int | None, err: Exception | None) -> None:
                nonlocal durable
                durable += 1

            with store.writer(cec_topic, 0) as w:
                t0 = time.perf_counter()
                for i in range(n):
                    w.append(VALUE, RecordMeta("D", i), on_durable)
                w.flush()
                rates["writer append+durable"] = n / (time.perf_counter() - t0)
            assert durable == n

            with store.reader(cec_topic, 0) as r:
                t0 = time.perf_counter()
                end = r.end_offset()
                rates["end_offset (from 0), records/s"] = end / (time.perf_counter() - t0)
                t0 = time.perf_counter()
                count = sum(1 for _ in r.scan_backward(chunk=4096))
                rates["reader scan_backward"] = count / (time.perf_counter() - t0)
                assert count == n
                t0 = time.perf_counter()
                count = 0
                for batch in r.tail(0, batch=4096):
                    count += len(batch)
                    if count >= n:
                        break
                rates["reader tail"] = count / (time.perf_counter() - t0)

            print(f"broker: {broker.kind} {broker.bootstrap}; {n} records of {len(VALUE)} B")
            for name, rate in rates.items():
                print(f"  {name:34s} {rate:>12,.0f} records/s")
            print(f"  writer / raw produce  {rates['writer append+durable'] / rates['raw produce']:.2f}")
            print(
                f"  scan_backward / raw consume  {rates['reader scan_backward'] / rates['raw consume']:.2f}"
            )
            print(f"  tail / raw consume    {rates['reader tail'] / rates['raw consume']:.2f}")
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
