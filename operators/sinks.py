"""Read an operator's output queue as its consumers see it: results only, control tuples dropped by kind,
every record's checksum checked first (`cec.verified`); and the results files of a run from one pass over
its log (`write_outputs`).

The results files themselves (columns, formats, whole-file writes) are `operators.result_files`; the
files a trimmed run writes as it goes, `operators.incremental_outputs`; results published to a topic,
`operators.results_topic`. Their names are importable from here as before.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cec.exceptions import CodecError
from cec.records import AvroCodec, Kind, RecordCodec
from cec.verified import verified_records
from operators.incremental_outputs import RESULTS_CONSUMER, IncrementalOutputs
from operators.result_files import (
    RESULT_COLUMNS,
    Formats,
    partial_path,
    result_formats,
    write_dead_letter_csv,
    write_results_csv,
)
from operators.results_topic import RESULTS_TOPIC, ResultsTopicOutput
from queuestore.base import QueueStore

__all__ = [
    "RESULTS_CONSUMER",
    "RESULTS_TOPIC",
    "RESULT_COLUMNS",
    "IncrementalOutputs",
    "ResultsTopicOutput",
    "count_kinds",
    "iter_payloads",
    "partial_path",
    "result_formats",
    "write_dead_letter_csv",
    "write_outputs",
    "write_results_csv",
]


def iter_payloads(
    store: QueueStore, topic: str, schema: dict[str, Any], kind: Kind = Kind.R
) -> Iterator[dict[str, Any]]:
    """Decoded payloads of every `kind` record of every partition, partition by partition in log order.

    Every record is checked before it is filtered by kind: a damaged or missing record of any kind raises
    `DamagedLogError`, so results are never silently dropped or used.
    """
    codec, payloads = RecordCodec(), AvroCodec(schema)
    wanted = kind.value
    for p in range(store.partitions(topic)):
        with store.reader(topic, p) as reader:
            for verified in verified_records(reader, codec=codec, decode=(wanted,)):
                if verified.meta.kind != wanted:
                    continue
                record = verified.record
                assert record is not None
                if record.payload is None:
                    if kind is Kind.R and record.key is not None:
                        continue  # a window's R without a result (OperatorContext.close_window)
                    raise CodecError(f"{reader.where(verified.offset)}: a {wanted} record without payload")
                yield payloads.decode(record.payload)


def count_kinds(store: QueueStore, topic: str, partition: int | None = None) -> Counter[str]:
    """How many records of each kind a topic (or one of its partitions) holds, every one checked."""
    counts: Counter[str] = Counter()
    codec = RecordCodec()
    partitions = range(store.partitions(topic)) if partition is None else [partition]
    for p in partitions:
        with store.reader(topic, p) as reader:
            counts.update(v.meta.kind for v in verified_records(reader, codec=codec))
    return counts


def write_outputs(
    store: QueueStore,
    topic: str,
    result_schema: dict[str, Any],
    dead_letter_schema: dict[str, Any],
    results: tuple[Path, list[str]],
    dead_letters: Path,
    formats: Formats | None = None,
) -> tuple[int, int, Counter[str]]:
    """What a run hands its user, from ONE checked pass over the log (results and dead letters are few
        next to the footprints, so they are held until the pass is done): the results CSV (path, columns),
        the dead-letter CSV, and the count of every kind. A damaged log writes neither file. `formats`: how
    result columns print (`result_formats`)."""
    codec = RecordCodec()
    found: dict[str, list[dict[str, Any]]] = {Kind.R.value: [], Kind.DEAD.value: []}
    decoders = {Kind.R.value: AvroCodec(result_schema), Kind.DEAD.value: AvroCodec(dead_letter_schema)}
    counts: Counter[str] = Counter()
    for p in range(store.partitions(topic)):
        with store.reader(topic, p) as reader:
            for verified in verified_records(reader, codec=codec, decode=tuple(found)):
                kind = verified.meta.kind
                counts[kind] += 1
                rows = found.get(kind)
                if rows is None:
                    continue
                record = verified.record
                assert record is not None
                if record.payload is None:
                    if kind == Kind.R.value and record.key is not None:
                        continue  # a window's R without a result (OperatorContext.close_window)
                    raise CodecError(f"{reader.where(verified.offset)}: a {kind} record without payload")
                rows.append(decoders[kind].decode(record.payload))
    path, columns = results
    n_results = write_results_csv(iter(found[Kind.R.value]), path, columns, formats)
    n_dead = write_dead_letter_csv(iter(found[Kind.DEAD.value]), dead_letters)
    return n_results, n_dead, counts
