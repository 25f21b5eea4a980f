"""`cec run --trim-every`'s results and dead-letter CSVs, written while the run goes on by a registered
consumer of the output log (`IncrementalOutputs`), so that trimming never passes a row not yet durably in
the files (docs/long-runs.md)."""

from __future__ import annotations

import csv
import json
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from cec.exceptions import CodecError, ConfigError
from cec.records import AvroCodec, Kind, RecordCodec
from cec.verified import verified_records
from operators.result_files import DEAD_LETTER_COLUMNS, Formats, format_value, partial_path
from queuestore.base import QueueStore

__all__ = ["COMMIT_EVERY", "RESULTS_CONSUMER", "IncrementalOutputs"]

# The registered consumer (`QueueStore.acknowledge`) that writes `cec run`'s results while the log is trimmed.
RESULTS_CONSUMER = "cec-run-results"
# The writer's commit interval, in offsets read past: what it may leave unacknowledged once it has read
# every partition to its end (so the least lag an operator pacing on it may allow, `TrimPace`).
COMMIT_EVERY = 10_000


class IncrementalOutputs:
    """The results and dead-letter CSVs of a trimmed run, written while the run goes on by a registered
    consumer of every output partition (`RESULTS_CONSUMER`): trimming never passes what it has not durably
    written, so no result is lost to it.

    Each commit makes the rows appended so far durable (flush + fsync of both files), then records in
    `progress_path` (atomically: temporary file, fsync, rename) the offset read up to in every partition,
    the byte length of both files at that point and the kind counts, and only then acknowledges those
    offsets to the store. A restart (after a crash or a SIGKILL of anyone) truncates both files back to the
    recorded lengths and reads on from the recorded offsets: rows written after the last commit were not
    acknowledged, so their records are still in the log and are written again exactly once. An
    acknowledgement older than the progress file (a crash between the two) only keeps more of the log.

    Rows are in log order per partition (so per key: a key lives in one partition); with several
    partitions, rows of different partitions interleave as the run produced them, not partition by
    partition as `write_outputs` orders them.

    `partial` (a bounded run): both files are written under `.partial` names (`partial_path`) and take their
    own names only in `finish`, once the run reached the end of its input, so that a stopped or killed run
    never leaves a file that reads as complete. A following run has no end: its files grow in place.
    """

    def __init__(
        self,
        store: QueueStore,
        topic: str,
        result_schema: dict[str, Any],
        dead_letter_schema: dict[str, Any],
        results: tuple[Path, list[str]],
        dead_letters: Path,
        progress_path: Path,
        formats: Formats | None = None,
        *,
        commit_every: int = COMMIT_EVERY,
        partial: bool = False,
    ) -> None:
        self.store = store
        self.topic = topic
        self.results_path, columns = results
        self.dead_path = dead_letters
        self._partial = partial  # where the files are now: under `.partial` names until `finish`
        self.progress_path = progress_path
        self.commit_every = commit_every
        self._result_columns = [(c, (formats or {}).get(c, format_value)) for c in columns]
        self._columns = columns
        self._codec = RecordCodec()
        self._decoders = {
            Kind.R.value: AvroCodec(result_schema),
            Kind.DEAD.value: AvroCodec(dead_letter_schema),
        }
        self.counts: Counter[str] = Counter()
        self.n_results = 0
        self.n_dead = 0
        self._offsets: list[int] = []
        self._acked: list[int] = []
        self._pending = 0  # offsets read past since the last commit (every partition's)
        self._files: list[TextIO] = []
        self._lock = threading.Lock()  # one drain at a time (the background thread, then the final one)

    # -- start / resume ----------------------------------------------------------------------------------
    @staticmethod
    def resumable(progress_path: Path) -> bool:
        """Whether an earlier run left a results writer to resume (it must then be resumed, trimming on or
        not: its log may be trimmed already)."""
        return progress_path.exists()

    def open(self) -> IncrementalOutputs:
        """Resume from the progress file, or start both files (headers only); then register as a consumer
        of every partition at the offset read up to, before the run may trim anything."""
        partitions = self.store.partitions(self.topic)
        kept = self._load_progress()
        if kept is None:
            starts = []
            for p in range(partitions):
                with self.store.reader(self.topic, p) as reader:
                    starts.append(reader.start_offset())
            if any(starts):
                raise ConfigError(
                    f"the output log {self.topic!r} was trimmed by an earlier run whose results writer "
                    f"progress ({self.progress_path}) is gone: its results cannot be rebuilt; use a new "
                    "--store-dir"
                )
            self._offsets = [0] * partitions
            results_path, dead_path = self._paths()
            self._files = [
                self._start(results_path, self._columns),
                self._start(dead_path, DEAD_LETTER_COLUMNS),
            ]
        else:
            if len(kept["offsets"]) != partitions:
                raise ConfigError(f"{self.progress_path} is for another log; use a new --store-dir")
            self._offsets = [int(o) for o in kept["offsets"]]
            self.counts.update(kept["counts"])
            self.n_results, self.n_dead = int(kept["n_results"]), int(kept["n_dead"])
            self._partial = bool(kept.get("partial"))
            if self._partial:
                for path in (self.results_path, self.dead_path):
                    if not partial_path(path).exists() and path.exists():
                        path.replace(partial_path(path))  # a `finish` cut short before its progress record
            results_path, dead_path = self._paths()
            self._files = [
                self._resume(results_path, int(kept["results_bytes"])),
                self._resume(dead_path, int(kept["dead_bytes"])),
            ]
        self._commit()
        return self

    def _paths(self) -> tuple[Path, Path]:
        if self._partial:
            return partial_path(self.results_path), partial_path(self.dead_path)
        return self.results_path, self.dead_path

    @property
    def partial_results(self) -> str | None:
        """The results file's name while it is incomplete (None once `finish` gave it its own name)."""
        return str(partial_path(self.results_path)) if self._partial else None

    def finish(self) -> None:
        """The run reached the end of its input (after the final drain): both files take their own names
        (durably: the rename, then the progress record that says so)."""
        if not self._partial:
            return
        with self._lock:
            for f in self._files:
                f.flush()
                os.fsync(f.fileno())
            for path in (self.dead_path, self.results_path):
                partial_path(path).replace(path)
            self._partial = False
            self._commit()

    def _load_progress(self) -> dict[str, Any] | None:
        try:
            kept: dict[str, Any] = json.loads(self.progress_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            raise ConfigError(f"{self.progress_path} is damaged; use a new --store-dir") from None
        where = {"topic": self.topic, "results": str(self.results_path.resolve())}
        if {k: kept.get(k) for k in where} != where:
            raise ConfigError(
                f"this store dir's trimmed run wrote its results to {kept.get('results')} (output log "
                f"{kept.get('topic')}); give that --results, or use a new --store-dir"
            )
        return kept

    @staticmethod
    def _start(path: Path, columns: list[str]) -> TextIO:
        f = path.open("w", newline="", encoding="utf-8")
        csv.writer(f, lineterminator="\n").writerow(columns)
        return f

    @staticmethod
    def _resume(path: Path, length: int) -> TextIO:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = -1
        if size < length:
            raise ConfigError(
                f"{path} holds less than the {length:,} bytes this run had durably written to it (removed "
                "or edited since?); its results cannot be rebuilt from the trimmed log: use a new --store-dir"
            )
        f = path.open("r+", newline="", encoding="utf-8")
        f.truncate(length)  # rows written after the last commit: their records are read again
        f.seek(length)
        return f

    # -- the pass ------------------------------------------------------------------------------------------
    def drain(self, *, final: bool = False) -> int:
        """Append the results and dead letters of every partition from the offset read up to to its end as
        it is now, committing every `commit_every` offsets read past (records; on Kafka, with the
        transaction markers among them); `final`: commit at the end as well. Returns how
        many records were read."""
        with self._lock:
            read = 0
            results_out, dead_out = (csv.writer(f, lineterminator="\n") for f in self._files)
            wanted = tuple(self._decoders)
            for p in range(len(self._offsets)):
                with self.store.reader(self.topic, p) as reader:
                    for verified in verified_records(
                        reader, self._offsets[p], codec=self._codec, decode=wanted
                    ):
                        kind = verified.meta.kind
                        self.counts[kind] += 1
                        if kind in self._decoders:
                            record = verified.record
                            assert record is not None
                            if record.payload is None:
                                if kind != Kind.R.value or record.key is None:
                                    raise CodecError(
                                        f"{reader.where(verified.offset)}: a {kind} record without payload"
                                    )
                                # A window's R without a result (OperatorContext.close_window): no row.
                            elif kind == Kind.R.value:
                                row = self._decoders[kind].decode(record.payload)
                                results_out.writerow([fmt(row[c]) for c, fmt in self._result_columns])
                                self.n_results += 1
                            else:
                                row = self._decoders[kind].decode(record.payload)
                                dead_out.writerow([format_value(row[c]) for c in DEAD_LETTER_COLUMNS])
                                self.n_dead += 1
                        # Offsets, not records: on Kafka transaction markers take offsets too, and the
                        # lag the operator waits on (`TrimPace`) is counted in offsets.
                        self._pending += verified.offset + 1 - self._offsets[p]
                        self._offsets[p] = verified.offset + 1
                        read += 1
                        if self._pending >= self.commit_every:
                            self._commit()
            if final:
                self._commit()
            elif read:
                for f in self._files:  # readable at once (a following run's files are its current results)
                    f.flush()
            return read

    def _commit(self) -> None:
        """Rows durable, then the progress that covers them, then the acknowledgement (in that order: see
        the class doc)."""
        lengths = []
        for f in self._files:
            f.flush()
            os.fsync(f.fileno())
            lengths.append(os.fstat(f.fileno()).st_size)
        progress = {
            "topic": self.topic,
            "results": str(self.results_path.resolve()),
            "offsets": self._offsets,
            "results_bytes": lengths[0],
            "dead_bytes": lengths[1],
            "n_results": self.n_results,
            "n_dead": self.n_dead,
            "counts": dict(self.counts),
            "partial": self._partial,
        }
        tmp = self.progress_path.with_name(f".{self.progress_path.name}.{os.getpid()}.tmp")
        with tmp.open("w", encoding="utf-8") as f:
            json.dump(progress, f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.progress_path)
        directory = os.open(self.progress_path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a power loss
        finally:
            os.close(directory)
        for p, offset in enumerate(self._offsets):
            if p >= len(self._acked) or self._acked[p] != offset:
                self.store.acknowledge(self.topic, p, RESULTS_CONSUMER, offset)
        self._acked = list(self._offsets)
        self._pending = 0

    @contextmanager
    def running(
        self, period_s: float = 0.05, on_error: Callable[[], object] | None = None
    ) -> Iterator[IncrementalOutputs]:
        """Drain in a background thread every `period_s` while the body runs the job, then drain to the end
        (after a body that returned normally) and commit. An error of the background pass is raised here;
        `on_error` is called when it happens (to stop the job: an operator that paces its trimming on
        this writer would otherwise wait for it for ever)."""
        stop = threading.Event()
        errors: list[BaseException] = []

        def loop() -> None:
            try:
                while not stop.wait(period_s):
                    self.drain()
            except BaseException as exc:  # raised by the caller's thread
                errors.append(exc)
                if on_error is not None:
                    on_error()

        thread = threading.Thread(target=loop, name="cec-run-results", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
        if errors:
            raise errors[0]
        self.drain(final=True)

    def close(self) -> None:
        for f in self._files:
            f.close()
        self._files = []
