"""Resuming an attached query's own Spark checkpoint (`cec_aggregate(resume_checkpoint=True)`, the
default), with the output logs as the source of truth.

A start that recovers from the logs (`operators.spark.planning`) pays recovery planning, a fresh query's
start and a first micro-batch that loads the eventual checkpoint before any replay. Spark's own restart
pays none of these: it reloads its state store and reruns from its last committed micro-batch. This module
decides, cheaply and before anything starts, whether the latest Spark checkpoint under
`checkpoint_location` may be resumed instead, and says why or why not (`Decision.path`, `Decision.reason`,
reported as `lastProgress["cec"]["recovery"]["path"]` / `["reason"]`).

What a run leaves in its checkpoint directory besides Spark's own (`offsets/`, `commits/`, `state/`):
- `cec/run.json` (`RunManifest`), written before the query starts: what the query is (input topic, output
  generation and its partition count, a fingerprint of the aggregate and its input) and the recovery plan
  its processor was built with (crash points, replay start, each log's crash-record marks and cut
  results). A resumed query's processor is built from it again, so that the state Spark reloads is read by
  the processor that wrote it;
- `cec/batches/<id>` (`BatchMarker`), written by the foreachBatch function once batch `id`'s records are
  durable in every output log and before Spark commits the batch (`commits/<id>`): per output partition,
  the cursor the sink continues from (pos, N, logical time, the log's next offset).

The agreement check (`decide`): with B the last batch in `commits/`, the checkpoint is resumed only if the
manifest names this query and this generation (same topic, same partition count, as Spark's own recorded
`spark.sql.shuffle.partitions`), the state directory has one store per partition, B's marker exists, and
for every output partition q, with M_q the marker's next offset and E_q the log's end:
- E_q >= M_q (else the checkpoint is *ahead* of the log: the log lost records it recorded), and the newest
  record below M_q carries the marker's pos, N and time (else the log is another run's);
- E_q == M_q, or E_q > M_q only by batch B+1's own records: Spark planned B+1 (`offsets/<B+1>` exists), so
  the restart reruns it from B's state; every record past M_q has a pos within B+1's end offsets (a record
  of a later batch carries an input position past them); and the batch's G-checks are made with its data
  (no processing-time timers), so its rerun produces the same records, and its write task finds them in
  the log and appends only the rest (`operators.spark.writer`, step 3). Otherwise the checkpoint is
  *behind* the log (an older copy, or a run the logs went past).

Anything else recovers from the logs (a fresh checkpoint), as a start always did. Which is exact: the logs
agree with the checkpoint at batch B (its state produced exactly the records below M_q), and a rerun of
B+1 appends exactly what B+1 did not manage to append.

`decide` is the one place that chooses between the two paths: before any checkpoint is read it also
answers the starts that may not resume at all (`never_resumes`: `resume_checkpoint=False`;
`writers="driver"`, whose sink appends a rerun batch's records again instead of comparing them with the
log). `run_checkpoint` then names the directory the run's query uses: the resumed one, or a new
`run-<ns>-<hex>` that `latest_checkpoint` finds at a later start.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from cec.exceptions import CodecError
from cec.records import OutputRecord, RecordCodec
from operators.spark.generations import Generation
from operators.spark.planning import AttachRecovery, LogEnd
from queuestore.base import PartitionReader
from queuestore.chunks import is_manifest, is_part, reassemble
from queuestore.exceptions import TornRecordError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from operators.spark.sink import CecSink
    from queuestore.kafka import KafkaQueueStore
    from queuestore.output import OutputQueue

__all__ = [
    "FROM_LOGS",
    "RESUMED",
    "BatchMarker",
    "Decision",
    "RunManifest",
    "decide",
    "latest_checkpoint",
    "never_resumes",
    "query_fingerprint",
    "run_checkpoint",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

RESUMED = "resumed-checkpoint"
FROM_LOGS = "from-logs"
_CEC_DIR = "cec"
_MANIFEST = "run.json"
_BATCHES = "batches"
_FORMAT = 1
_KEEP_MARKERS = 100  # batch markers kept (Spark keeps its own last 100 batches by default)
_RUN_DIR = re.compile(r"run-(\d+)-[0-9a-f]+")
_BACK = 64  # records read back per round trip while looking for a log's newest whole record


def query_fingerprint(*parts: Any) -> str:
    """A short digest of what the query computes and reads (its aggregate, its input's options): a
    checkpoint written by another query is never resumed."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunManifest:
    """What a run's checkpoint belongs to and the plan its processor was built with (module doc)."""

    input_topic: str
    fingerprint: str
    generations: list[Generation]
    input_partitions: int
    crash_points: list[list[tuple[int, ...]]]
    start: tuple[int, ...]
    ends: list[LogEnd]
    timers: bool  # G-checks made by processing-time timers (a rerun batch may make others)

    @property
    def current(self) -> Generation:
        return self.generations[-1]

    def write(self, checkpoint: Path) -> None:
        ends = [
            {"pos": list(e.pos), "n": e.n, "time": e.time, "offset": e.offset, "marks": list(e.marks),
             "results": [base64.b64encode(r).decode() for r in e.results]}
            for e in self.ends
        ]  # fmt: skip
        body = {
            "format": _FORMAT,
            "input_topic": self.input_topic,
            "fingerprint": self.fingerprint,
            "generations": [[g.index, g.topic, g.partitions] for g in self.generations],
            "input_partitions": self.input_partitions,
            "crash_points": [[list(c) for c in gen] for gen in self.crash_points],
            "start": list(self.start),
            "ends": ends,
            "timers": self.timers,
        }
        _write_atomic(checkpoint / _CEC_DIR / _MANIFEST, json.dumps(body))

    @classmethod
    def read(cls, checkpoint: Path) -> RunManifest:
        """The run's manifest; ValueError (or OSError) for a missing or damaged one."""
        body = json.loads((checkpoint / _CEC_DIR / _MANIFEST).read_text())
        if body.get("format") != _FORMAT:
            raise ValueError(f"manifest format {body.get('format')!r}")
        ends = [
            LogEnd(tuple(e["pos"]), int(e["n"]), int(e["time"]), int(e["offset"]), tuple(e["marks"]),
                   tuple(base64.b64decode(r) for r in e["results"]))
            for e in body["ends"]
        ]  # fmt: skip
        return cls(
            input_topic=str(body["input_topic"]),
            fingerprint=str(body["fingerprint"]),
            generations=[Generation(int(i), str(t), int(p)) for i, t, p in body["generations"]],
            input_partitions=int(body["input_partitions"]),
            crash_points=[[tuple(int(x) for x in c) for c in gen] for gen in body["crash_points"]],
            start=tuple(int(x) for x in body["start"]),
            ends=ends,
            timers=bool(body["timers"]),
        )


@dataclass(frozen=True)
class Cursor:
    """Where one output log stood after a committed micro-batch (what the sink continues from)."""

    pos: tuple[int, ...]
    n: int
    time: int
    next_offset: int


class BatchMarker:
    """The foreachBatch function of a run that may be resumed: the sink's, then the batch's marker
    (`cec/batches/<id>`, module doc), durable before the function returns and Spark commits the batch."""

    def __init__(self, sink: CecSink, checkpoint: Path) -> None:
        self.sink = sink
        self.directory = checkpoint / _CEC_DIR / _BATCHES

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        self.sink(batch_df, batch_id)
        cursors = []
        with self.sink.lock:
            for q, c in enumerate(self.sink.cursors):
                cursors.append([list(c.stamper.last), c.n, c.time, self.sink._durable_end(q)])
        self.directory.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.directory / str(batch_id), json.dumps({"batch": batch_id, "cursors": cursors}))
        old = self.directory / str(batch_id - _KEEP_MARKERS)
        old.unlink(missing_ok=True)


def _write_atomic(path: Path, text: str) -> None:
    """Write, fsync, rename: a reader sees the whole file or none (a SIGKILL leaves at most a .tmp)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def _read_marker(checkpoint: Path, batch: int) -> list[Cursor]:
    body = json.loads((checkpoint / _CEC_DIR / _BATCHES / str(batch)).read_text())
    if int(body["batch"]) != batch:
        raise ValueError(f"marker of batch {body['batch']} under {batch}")
    return [Cursor(tuple(int(x) for x in pos), int(n), int(t), int(o)) for pos, n, t, o in body["cursors"]]


def latest_checkpoint(location: Path) -> Path | None:
    """The newest run directory under `checkpoint_location` (run ids sort by their start time)."""
    if not location.is_dir():
        return None
    runs = [(int(m.group(1)), p) for p in location.iterdir() if (m := _RUN_DIR.fullmatch(p.name))]
    return max(runs)[1] if runs else None


def _batch_ids(directory: Path) -> list[int]:
    """Spark's batch files in offsets/ or commits/ (plain integers; .crc and temporary files are not)."""
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _offsets_file(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """Spark's offsets/<id>: its metadata (conf included) and the one source's end offsets per input
    partition (the cec sources' {"<j>": o} or Spark's Kafka source's {"<topic>": {"<j>": o}})."""
    lines = path.read_text().splitlines()
    if len(lines) != 3 or not lines[0].startswith("v"):
        raise ValueError(f"{path}: not one source's offsets")
    metadata = json.loads(lines[1])
    offsets = json.loads(lines[2])
    inner = next(iter(offsets.values()), None) if len(offsets) == 1 else None
    flat = inner if isinstance(inner, dict) else offsets
    return metadata, {str(j): int(o) for j, o in flat.items()}


def newest_record(
    reader: PartitionReader, before: int, codec: RecordCodec
) -> tuple[int, OutputRecord | None] | None:
    """The newest record below offset `before` and its offset (a chunked value's parts skipped, its manifest
    joined), the record None if it fails its checksum; None if there is no record below `before` (offsets
    that only transaction markers take hold none)."""
    while before > 0:
        stored = reader.read_backward(before, _BACK)
        if not stored:
            return None
        for record in stored:  # newest first
            if is_part(record):
                continue
            try:
                if is_manifest(record):
                    record = record._replace(value=reassemble(reader, record))
                return record.offset, codec.decode(record.value, record.meta)
            except (CodecError, TornRecordError):
                return record.offset, None
        before = stored[-1].offset
    return None


@dataclass
class Decision:
    """Which way a start goes, and why; with `recovery` (the resumed run's plan) on the resume path."""

    path: str
    reason: str
    checkpoint: Path | None = None
    recovery: AttachRecovery | None = None
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)


class _Refused(Exception):
    """The checkpoint is not resumed: the reason, one line."""


def never_resumes(*, resume_checkpoint: bool, writers: str) -> str | None:
    """Why a start with these settings (`cec_aggregate`'s) never resumes a checkpoint, None if it may. Only
    the executors' write tasks find a rerun micro-batch's records already in the log and append the rest
    (`operators.spark.writer`, step 3); the driver's sink would append them again. A run that may not be
    resumed keeps nothing for a later start to resume (no manifest, no batch markers: `run_checkpoint`)."""
    if not resume_checkpoint:
        return "resume_checkpoint=False"
    if writers != "executors":
        return f"writers={writers!r} (a rerun micro-batch would append its records again)"
    return None


def decide(
    location: Path,
    *,
    store: KafkaQueueStore,
    generations: list[Generation],
    outputs: Sequence[OutputQueue],
    input_topic: str,
    input_partitions: int,
    fingerprint: str,
    timers: bool,
    resume_checkpoint: bool = True,
    writers: str = "executors",
    clock: Callable[[], float] = time.perf_counter,
) -> Decision:
    """Whether a start resumes the latest checkpoint under `location` or recovers from the logs, and why
    (module doc): `resume_checkpoint` and `writers` are `cec_aggregate`'s (`never_resumes`)."""
    never = never_resumes(resume_checkpoint=resume_checkpoint, writers=writers)
    if never is not None:
        return Decision(FROM_LOGS, never)
    started = clock()
    checkpoint = latest_checkpoint(location)
    if checkpoint is None:
        return Decision(FROM_LOGS, "no earlier checkpoint", seconds=clock() - started)
    try:
        recovery = _check(
            checkpoint, store, generations, outputs, input_topic, input_partitions, fingerprint, timers
        )
    except _Refused as refused:
        log.info("not resuming %s: %s", checkpoint, refused)
        return Decision(FROM_LOGS, str(refused), seconds=clock() - started)
    recovery.seconds = clock() - started
    return Decision(
        RESUMED, "the checkpoint agrees with every output log", checkpoint, recovery, recovery.seconds
    )


def _check(
    checkpoint: Path,
    store: KafkaQueueStore,
    generations: list[Generation],
    outputs: Sequence[OutputQueue],
    input_topic: str,
    input_partitions: int,
    fingerprint: str,
    timers: bool,
) -> AttachRecovery:
    current = generations[-1]
    manifest = _parsed("the checkpoint's cec manifest", lambda: RunManifest.read(checkpoint))
    if manifest.input_topic != input_topic or manifest.fingerprint != fingerprint:
        raise _Refused("the checkpoint is another query's (input or aggregate differs)")
    if manifest.current.topic != current.topic or manifest.current.partitions != current.partitions:
        raise _Refused(
            f"the checkpoint is of {manifest.current.topic} with {manifest.current.partitions} partitions, "
            f"this start writes {current.topic} with {current.partitions}"
        )
    if [(g.index, g.topic, g.partitions) for g in manifest.generations] != [
        (g.index, g.topic, g.partitions) for g in generations
    ] or manifest.input_partitions != input_partitions:
        raise _Refused("the checkpoint was written over other generations or input partitions")
    commits = _batch_ids(checkpoint / "commits")
    if not commits:
        raise _Refused("the checkpoint has no committed micro-batch")
    batch = commits[-1]
    metadata, committed = _parsed(
        f"batch {batch}'s offsets", lambda: _offsets_file(checkpoint / "offsets" / str(batch))
    )
    cursors = _parsed(f"batch {batch}'s cec marker", lambda: _read_marker(checkpoint, batch))
    shuffle = _parsed(f"batch {batch}'s offsets", lambda: _shuffle_partitions(metadata))
    if shuffle is not None and shuffle != current.partitions:
        raise _Refused(f"the checkpoint's state has {shuffle} partitions, this start {current.partitions}")
    stores = checkpoint / "state" / "0"
    if not all((stores / str(q)).is_dir() for q in range(current.partitions)):
        raise _Refused("the checkpoint's state store is incomplete")
    if len(cursors) != current.partitions or any(len(c.pos) != input_partitions for c in cursors):
        raise _Refused(f"batch {batch}'s marker is not of {current.partitions} partitions over this input")
    pending: dict[str, int] | None = None
    if (checkpoint / "offsets" / str(batch + 1)).exists():
        pending = _parsed(
            f"batch {batch + 1}'s offsets", lambda: _offsets_file(checkpoint / "offsets" / str(batch + 1))[1]
        )
    codec = RecordCodec()
    caught_up = [0] * input_partitions
    for q, cursor in enumerate(cursors):
        where = f"{current.topic}[{q}]"
        with store.reader(current.topic, q) as reader:
            reader.hint_end(outputs[q].log_end)  # the index may only have noted the end (`open_outputs`)
            end = reader.end_offset()
            if end < cursor.next_offset:
                raise _Refused(
                    f"the checkpoint is ahead of the logs: {where} ends at offset {end}, batch {batch} "
                    f"wrote it up to {cursor.next_offset}"
                )
            # The cursor is one past the batch's last record: its transaction's commit marker (and any
            # aborted attempt's) may take offsets after it, records may not. The newest record below the
            # log's end is also the newest below the cursor when it lies below the cursor: one read back.
            at_end = newest_record(reader, end, codec) if end > cursor.next_offset else None
            past = at_end if at_end is not None and at_end[0] >= cursor.next_offset else None
            if cursor.next_offset:
                below = at_end is not None and past is None
                found = at_end if below else newest_record(reader, cursor.next_offset, codec)
                last = None if found is None else found[1]
                if last is None or (tuple(last.pos), last.n, last.time) != (
                    cursor.pos,
                    cursor.n,
                    cursor.time,
                ):
                    raise _Refused(
                        f"{where} below offset {cursor.next_offset} is not what batch {batch} wrote"
                    )
            newest = cursor.pos
            if past is not None:
                if pending is None:
                    raise _Refused(
                        f"the checkpoint is behind the logs: {where} ends at offset {end}, its last "
                        f"committed batch {batch} wrote it up to {cursor.next_offset}"
                    )
                if timers:
                    raise _Refused(
                        f"{where} holds part of batch {batch + 1}, whose timer G-checks a rerun may make "
                        "otherwise"
                    )
                tail = past[1]
                limit = [pending.get(str(j), -1) for j in range(input_partitions)]
                if tail is None or any(p > lim for p, lim in zip(tail.pos, limit, strict=True)):
                    raise _Refused(
                        f"the checkpoint is behind the logs: {where} holds records past batch {batch + 1}"
                    )
                newest = tuple(tail.pos)
            caught_up = [max(a, b) for a, b in zip(caught_up, newest, strict=True)]
    ends = [
        LogEnd(c.pos, c.n, c.time, c.next_offset, m.marks, m.results)
        for c, m in zip(cursors, manifest.ends, strict=True)
    ]
    return AttachRecovery(
        generations,
        current,
        resumed=True,
        crash_points=manifest.crash_points,
        start=tuple(committed.get(str(j), 0) for j in range(input_partitions)),
        ends=ends,
        partition_windows=[(0, None)] * current.partitions,
        path=RESUMED,
        reason="the checkpoint agrees with every output log",
        caught_up_at=tuple(caught_up),
        checkpoint_batch=batch,
    )


def _parsed(what: str, read: Callable[[], _T]) -> _T:
    """`read()`, or the refusal for a file that is missing or not what a run writes (any damage: the
    checkpoint is then not trusted, never an error of the start)."""
    try:
        return read()
    except Exception as exc:
        raise _Refused(f"{what}: missing or damaged ({type(exc).__name__})") from None


def _shuffle_partitions(metadata: Any) -> int | None:
    """The shuffle partitions (state partitions) Spark recorded with a batch's offsets; None if absent."""
    conf = metadata.get("conf") or {}
    value = conf.get("spark.sql.shuffle.partitions")
    return None if value is None else int(value)


def run_checkpoint(
    decision: Decision,
    recovery: AttachRecovery,
    location: Path,
    *,
    resumable: bool,
    input_topic: str,
    input_partitions: int,
    fingerprint: str,
    timers: bool,
) -> Path:
    """The Spark checkpoint directory of this run: the resumed one, or a new run directory under `location`
    (if the run is `resumable`, a later start may resume it: it holds the manifest that start checks it
    against)."""
    if decision.checkpoint is not None and recovery.path == RESUMED:
        return decision.checkpoint
    checkpoint = location / f"run-{_run_id()}"
    if resumable:
        manifest_of(recovery, input_topic, input_partitions, fingerprint, timers).write(checkpoint)
    return checkpoint


def _run_id() -> str:
    """A sortable unique name for a run's Spark checkpoint directory (what `_RUN_DIR` matches)."""
    return f"{time.time_ns()}-{uuid.uuid4().hex[:8]}"


def manifest_of(
    recovery: AttachRecovery, input_topic: str, input_partitions: int, fingerprint: str, timers: bool
) -> RunManifest:
    """The manifest of a run that recovered from the logs (what its processor is built with)."""
    return RunManifest(
        input_topic=input_topic,
        fingerprint=fingerprint,
        generations=list(recovery.generations),
        input_partitions=input_partitions,
        crash_points=[list(c) for c in recovery.crash_points],
        start=tuple(recovery.start),
        ends=list(recovery.ends),
        timers=timers,
    )


def options_fingerprint(options: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The input options in a stable order, for `query_fingerprint`."""
    return tuple(sorted((str(k), str(v)) for k, v in options.items()))
