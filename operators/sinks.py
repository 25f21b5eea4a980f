"""Read an operator's output queue as its consumers see it: results only, control tuples dropped by kind."""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cec.exceptions import CodecError
from cec.records import AvroCodec, Kind, RecordCodec
from queuestore.base import QueueStore
from queuestore.chunks import is_manifest, reassemble
from queuestore.exceptions import TornRecordError

__all__ = ["count_kinds", "iter_payloads", "write_dead_letter_csv", "write_results_csv"]


def iter_payloads(
    store: QueueStore, topic: str, schema: dict[str, Any], kind: Kind = Kind.R
) -> Iterator[dict[str, Any]]:
    """Decoded payloads of every `kind` record of every partition, partition by partition in log order.

    A record that fails its checksum raises `CodecError`: results are never silently dropped or used.
    """
    codec, payloads = RecordCodec(), AvroCodec(schema)
    for p in range(store.partitions(topic)):
        with store.reader(topic, p) as reader:
            for stored in reader.scan_forward(0):
                if stored.meta.kind != kind.value:
                    continue  # other kinds, and parts of chunked values (their manifest is the record)
                try:
                    value = reassemble(reader, stored) if is_manifest(stored) else stored.value
                    record = codec.decode(value)  # checks the CRC over the body and its own metadata
                    if record.meta() != stored.meta:  # ...which must be what the store kept beside it
                        raise CodecError("the metadata kept beside the record does not match it")
                except (CodecError, TornRecordError) as exc:
                    raise CodecError(f"{topic}[{p}] offset {stored.offset}: {exc}") from None
                assert record.payload is not None
                yield payloads.decode(record.payload)


def count_kinds(store: QueueStore, topic: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for p in range(store.partitions(topic)):
        with store.reader(topic, p) as reader:
            counts.update(r.meta.kind for r in reader.scan_forward(0))
    return counts


def _fmt(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def write_results_csv(rows: Iterator[dict[str, Any]], path: Path, columns: list[str]) -> int:
    n = 0
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_fmt(row[c]) for c in columns])
            n += 1
    tmp.replace(path)
    return n


def write_dead_letter_csv(rows: Iterator[dict[str, Any]], path: Path) -> int:
    return write_results_csv(rows, path, ["partition", "offset", "reason", "raw"])
