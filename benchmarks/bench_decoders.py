"""Decode throughput of the topic formats' batch decoders (`operators.formats`), no broker, in one run.

For each format a batch of `--records` purchase records (the topic benchmark's records, `tests.topic_data`)
is decoded `--repeat` times by each contender; the best time is kept. Contenders:
- json: `JsonDecoder.decode_many` (orjson value by value, checked); the batch decoder it replaced (the
  batch joined with commas into one array for one orjson call, trusted when the element count matched,
  which can read values that are not JSON one by one as other values: kept here as the baseline only);
  `json.loads` value by value; the C scanner (`cec._native.topic_batch`, the source's path when built);
- avro: `AvroDecoder.decode_many` with the C decoder, and without it (fastavro value by value);
- csv: `CsvDecoder.decode` value by value.
Ratios are against the first contender of each format.

    .venv/bin/python benchmarks/bench_decoders.py [--records 100000] [--repeat 7]

Writes benchmarks/out/decoders.json.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: the repo's packages and tests/
    sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402
from confluent_kafka import Message  # noqa: E402

from cec.native import native  # noqa: E402
from operators.base import InputTuple  # noqa: E402
from operators.formats import AvroDecoder, CsvDecoder, JsonDecoder  # noqa: E402
from operators.topic_source import _ACCESSORS  # noqa: E402
from tests.topic_data import PURCHASE_AVSC, as_json, avro_body, make_purchases  # noqa: E402

_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")


def joined_batch_baseline(raws: Sequence[bytes]) -> list[Any]:
    """The replaced decoder's fast path (a good batch): one orjson call over `[v1,v2,...]`."""
    batch = b"[" + b",".join(raws) + b"]"
    loads = json.loads if b"0" * 19 in batch.translate(_DIGITS_AS_ZERO) else orjson.loads
    objs = loads(batch)
    assert len(objs) == len(raws)
    return [obj if type(obj) is dict else "not an object" for obj in objs]


def best_ns_per_record(decode: Callable[[], Any], records: int, repeat: int) -> float:
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        decode()
        best = min(best, time.perf_counter() - t0)
    return best * 1e9 / records


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    purchases = [rec for _, rec in make_purchases(args.records, keys=1000, partitions=1)]
    json_raws = [as_json(rec) for rec in purchases]
    avro_raws = [avro_body(rec) for rec in purchases]
    csv_raws = [f"{r['item']},{r['price']!r},{r['ts']}".encode() for r in purchases]
    json_dec, avro_dec = JsonDecoder(), AvroDecoder(PURCHASE_AVSC)
    fastavro_dec = AvroDecoder(PURCHASE_AVSC)
    fastavro_dec._program = None  # the per-record fastavro path
    csv_dec = CsvDecoder(["item", "price", "ts"])
    assert json_dec.decode_many(json_raws) == joined_batch_baseline(json_raws)

    contenders: dict[str, list[tuple[str, Callable[[], Any]]]] = {
        "json": [
            ("decode_many (orjson per value, checked)", lambda: json_dec.decode_many(json_raws)),
            ("joined batch (replaced; baseline)", lambda: joined_batch_baseline(json_raws)),
            ("json.loads per value", lambda: [json.loads(r) for r in json_raws]),
        ],
        "avro": [
            ("decode_many, C decoder", lambda: avro_dec.decode_many(avro_raws)),
            ("decode_many, fastavro per value", lambda: fastavro_dec.decode_many(avro_raws)),
        ],
        "csv": [("decode per value", lambda: [csv_dec.decode(r) for r in csv_raws])],
    }
    if native is not None:
        spec = json_dec.native_spec(["item", "price"])
        msgs = [Message(topic="t", partition=0, offset=i, value=v) for i, v in enumerate(json_raws)]

        def c_scanner() -> Any:
            return native.topic_batch(msgs, _ACCESSORS, InputTuple, [0], [math.inf], [0], spec)

        contenders["json"].append(("C scanner (topic_batch, tuples included)", c_scanner))
    results: dict[str, Any] = {}
    for fmt, entries in contenders.items():
        first = None
        print(f"{fmt}:")
        for name, decode in entries:
            ns = best_ns_per_record(decode, args.records, args.repeat)
            first = first or ns
            results[f"{fmt}: {name}"] = {
                "ns_per_record": round(ns, 1),
                "ratio_to_first": round(ns / first, 3),
            }
            print(f"  {name:48s} {ns:8.1f} ns/record  {1e3 / ns:7.2f} M records/s  x{ns / first:.2f} time")
    out = ROOT / "benchmarks" / "out" / "decoders.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"records": args.records, "repeat": args.repeat, "python": platform.python_version()}
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
