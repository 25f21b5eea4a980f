"""Record codec cost, version 3 (Avro) against version 4 (compact), for the paper's aggregate's records.

Per record, process time, best of 5 rounds of 100,000 calls, in one process (ratios, not absolute claims):
`RecordCodec.encode` and `decode` (with the checksum), `decode(verified=True)` (EC-load's path), and the
aggregate's footprint state (`encode_state` vs `encode_footprint`, `decode_state` of each).

    .venv/bin/python benchmarks/bench_codec.py
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cec.records import SCHEMAS, AvroCodec, Kind, OutputRecord, RecordCodec
from operators.aggregate import RESULT_SCHEMA, AggState, KeyedAggregate


def per_call_us(f: Callable[[], Any], n: int = 100_000) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.process_time()
        for _ in range(n):
            f()
        best = min(best, time.process_time() - started)
    return best / n * 1e6


def main() -> int:
    v3, v4 = RecordCodec({v: SCHEMAS[v] for v in (1, 2, 3)}), RecordCodec()
    op = KeyedAggregate(key_field="item_id", value_field="item_price", window_count=10)
    result = AvroCodec(RESULT_SCHEMA).encode(
        {"key": "417", "window": 52, "value": 12.5, "count": 10, "start": 91_000, "end": 91_990}
    )
    state = AggState(1, 12.5, 12.5, 12.5, 91_000, 91_000)
    records = [
        OutputRecord(Kind.R, 92_001, (92_001,), 1000, "417", 52, None, result),
        OutputRecord(Kind.GOPEN, 92_001, (92_001,), 1000, "417", 53, op.encode_state(state), None),
    ]
    for r in records:
        g = dataclasses_replace(r, op.encode_footprint(state)) if r.kind is Kind.GOPEN else r
        _compare(v3, v4, r, g)
    full, first = op.encode_state(state), op.encode_footprint(state)
    a, b = per_call_us(lambda: op.encode_state(state)), per_call_us(lambda: op.encode_footprint(state))
    c, d = per_call_us(lambda: op.decode_state(full)), per_call_us(lambda: op.decode_state(first))
    print(f"G-open state: {len(full)} B full, {len(first)} B first-tuple form")
    print(f"  encode           full {a:5.2f} us   first {b:5.2f} us   {b / a:.2f}")
    print(f"  decode_state     full {c:5.2f} us   first {d:5.2f} us   {d / c:.2f}")
    return 0


def _compare(v3: RecordCodec, v4: RecordCodec, r: OutputRecord, g: OutputRecord) -> None:
    """`r` as version 3 against `g` (the same record, with the footprint state this release writes) as 4."""
    meta, d3, d4 = r.meta(), v3.encode(r), v4.encode(g)
    rows = [
        ("encode", per_call_us(lambda: v3.encode(r)), per_call_us(lambda: v4.encode(g))),
        ("decode", per_call_us(lambda: v3.decode(d3, meta)), per_call_us(lambda: v4.decode(d4, meta))),
        (
            "decode verified",
            per_call_us(lambda: v3.decode(d3, meta, verified=True)),
            per_call_us(lambda: v4.decode(d4, meta, verified=True)),
        ),
    ]
    print(f"{r.kind.value}: {len(d3)} B as version 3, {len(d4)} B as version 4")
    for name, a, b in rows:
        print(f"  {name:<16} v3 {a:5.2f} us   v4 {b:5.2f} us   v4/v3 {b / a:.2f}")


def dataclasses_replace(record: OutputRecord, state: bytes) -> OutputRecord:
    import dataclasses

    return dataclasses.replace(record, state=state)


if __name__ == "__main__":
    raise SystemExit(main())
