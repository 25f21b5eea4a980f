"""The handle of a running attached aggregation (`operators.spark.attach`): a StreamingQuery plus CEC.

`CecAggregateQuery` answers what a `pyspark.sql.streaming.StreamingQuery` answers (`id`, `runId`, `name`,
`isActive`, `status`, `lastProgress`, `recentProgress`, `exception()`, `stop()`,
`awaitTermination(timeout)`, `processAllAvailable()`, `explain()`; anything else is delegated to the
underlying query, `query.query`) and adds CEC's figures:

- `lastProgress["cec"]` and each `recentProgress[i]["cec"]`: the figures as of the end of that
  micro-batch; `status["cec"]` and `cec_progress`: the figures now. Keys:
  - `open_windows`: windows open (their latest footprint is in some output log);
  - `extent_tuples`: input tuples a recovery would replay if the driver died now (from the oldest
    footprint of an open window, `extent_start`, to the newest position written, `position`; both per
    input partition);
  - `records`: output records written since this start, by kind (R, GOPEN, GCHECK, DEAD); `gopens`,
    `gchecks`: the same two counts; `batch_records` (per-batch figures only): written in that batch;
  - `dead_letters`: input tuples and dead letters (DEAD records) of that micro-batch (`batch_tuples`,
    `batch_dead`) and of this run (`tuples`, `dead`, `share`), the run's `first_reason` and
    `all_dead_batches`; a micro-batch that dead-lettered every tuple is also logged as a warning, and a
    bounded run (`available_now=True`) that dead-lettered every tuple fails in `awaitTermination()` with
    `DeadLetteredInputError` (`operators.spark.dead_letters`); `query.dead_letters` has the figures now;
  - `checkpointing`: per state partition (a list, by `partition`), its checkpoint controller as last
    reported: `q_target`, `u_target` and `budget` (duty) in force, `gchecks` and `gcheck_seconds` made in
    this run, and `messages`: what it said once (a target it cannot meet and why, a budget above the
    usual cap); empty for G-open only. `checkpoint_controls(spark)` reads the full state (rates included);
  - `recovery`: which way this start went, `path`: "from-logs" (the eventual checkpoint read back from
    the output logs, a fresh query) or "resumed-checkpoint" (Spark's checkpoint of an earlier run, found
    to agree with the logs, `operators.spark.resume`), and `reason`: why; what this start recovered
    (`resumed`, `ec_build_s`: reading the logs back on the driver (on a resumed checkpoint: the agreement
    check),
    `ec_windows`, `ec_records_read`, `ec_load_rows`: windows and next-seq rows handed to the query as
    its initial state (none on a resumed checkpoint: Spark reloads its state store), `replay_start`
    (a resumed checkpoint: its last committed micro-batch's end offsets), `crash_point` (a resumed
    checkpoint: the input position the logs reached), `replay_tuples`: input tuples between them, and
    `replay_s`: from the query's start to the end of the first micro-batch that read past the crash point,
    None until then; the EC is loaded inside the first micro-batch, so `replay_s` includes EC load;
    `recovery_s` = `ec_build_s` + `replay_s`, the recovery time a recovery target is held to, with
    `recovery_target_s` and `recovery_target_met` (None without a target, before the replay ended, or on
    a start that resumed nothing).
- `recovery`: the `operators.spark.planning.AttachRecovery` of this start; `batches`: micro-batches done;
  `input_reader`: how the input is read ("spark-kafka" or "python", `operators.spark.kafka_input`).
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cec.config import Checkpointing
from operators.spark.checkpointing import PartitionControl, read_controls, uses_timers
from operators.spark.config_errors import cec_errors
from operators.spark.generations import Generation
from operators.spark.planning import AttachRecovery
from operators.spark.processor import STATE_NAME
from operators.spark.sink import CecSink

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from queuestore.kafka import KafkaQueueStore

__all__ = ["CecAggregateQuery"]


class CecAggregateQuery:
    """A running CEC aggregation: the StreamingQuery, its sink (the output logs' writer locks, and their
    writers with `writers="driver"`), and CEC's figures in its progress (see the module doc)."""

    def __init__(
        self,
        query: StreamingQuery,
        sink: CecSink,
        store: KafkaQueueStore,
        recovery: AttachRecovery,
        checkpointing: Checkpointing | None = None,
        stop_when_drained: bool = False,
        metrics_port: int | None = None,
        checkpoint: Path | None = None,
        input_reader: str = "python",
        bounded: bool = False,
    ):
        self.query = query
        self.input_reader = input_reader
        self.bounded = bounded  # available_now: a run whose every tuple was dead-lettered fails at its end
        self.recovery = recovery
        self.checkpointing = checkpointing or Checkpointing()
        self._sink = sink
        self.metrics_port = metrics_port  # where the driver serves cec.metrics (None: not served)
        self.checkpoint = checkpoint  # this run's Spark checkpoint directory
        self._store = store
        self._closed = False
        self._started_wall = time.time()
        self._replay_s: float | None = None if recovery.resumed else 0.0
        self._watcher: threading.Thread | None = None
        self._done = threading.Event()
        # G-check timers (`operators.spark.checkpointing.uses_timers`; not the default's in-batch G-checks).
        self._timers = uses_timers(self.checkpointing)
        if stop_when_drained and self._timers:
            # Under timeMode "ProcessingTime" Spark plans another (no-data) micro-batch after every batch
            # (TransformWithStateExec.shouldRunAnotherBatch), so a Trigger.AvailableNow query with G-check
            # timers never ends by itself: stop it after the first micro-batch that read no input (the
            # source reached its AvailableNow target; that batch also fired the timers once more).
            self._watcher = threading.Thread(target=self._stop_when_drained, name="cec-drain", daemon=True)
            self._watcher.start()

    # -- StreamingQuery ----------------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return str(self.query.id)

    @property
    def runId(self) -> str:
        return str(self.query.runId)

    @property
    def name(self) -> str | None:
        return self.query.name

    @property
    def isActive(self) -> bool:
        return bool(self.query.isActive)

    @property
    def status(self) -> dict[str, Any]:
        out = dict(self.query.status)
        out["cec"] = self.cec_progress
        return out

    @property
    def lastProgress(self) -> Any:
        """Spark's StreamingQueryProgress of the last micro-batch (None before the first), with "cec"."""
        progress = self.query.lastProgress
        return None if progress is None else self._with_cec(progress)

    @property
    def recentProgress(self) -> list[Any]:
        return [self._with_cec(p) for p in self.query.recentProgress]

    def processAllAvailable(self) -> None:
        """As StreamingQuery.processAllAvailable. With G-check timers (an explicit checkpointing policy; not
        G-open only, not the default, whose G-checks are made in the data's own micro-batches) Spark plans a
        no-data micro-batch after every batch (see `_stop_when_drained`), so its own call would never
        return: this one waits for a micro-batch planned after the call (two batch ids on: the one in
        flight may have been planned before it) that found no new input."""
        if not self._timers:
            self.query.processAllAvailable()
            return
        last = self.query.lastProgress
        after = (-1 if last is None else int(last.batchId)) + 2
        while True:
            progress = self.query.lastProgress
            if progress is not None and int(progress.batchId) >= after and _drained(progress):
                return
            if not self.query.isActive:
                error = self.query.exception()
                if error is not None:
                    raise error
                return
            self._done.wait(0.05)

    def explain(self, extended: bool = False) -> None:
        self.query.explain(extended)

    def awaitTermination(self, timeout: int | None = None) -> bool | None:
        """As StreamingQuery.awaitTermination; the output logs are closed once the query has ended.

        Ended means the query thread has finished (Spark's termination latch), which the timed wait does not
        tell: it answers `not isActive`, true as soon as some thread called `stop()`, while the micro-batch
        in flight still runs and still writes through the sink (closing the logs then failed that batch with
        "the CEC sink is closed", seen on a loaded cluster run). So a timed wait that sees the query inactive
        then waits for the thread itself, at most the rest of that batch."""
        if timeout is None:
            try:
                with cec_errors():  # a CecError raised in a Python worker: its one line, not Py4J's
                    self.query.awaitTermination()
            finally:
                self.close()  # the latch was released: the thread ended, failed or not
            if self.bounded:
                # Never a silent empty answer (`operators.spark.dead_letters`): as `cec run` refuses it.
                self._sink.dead_letters.check()
            return None
        try:
            with cec_errors():
                if not self.query.awaitTermination(timeout):
                    return False
        except Exception:
            # The query's own failure: raised only once the thread has ended. Anything else (a bad timeout,
            # a broken gateway) says nothing about the batch in flight: the logs stay open.
            if self.query.exception() is not None:
                self.close()
            raise
        self.awaitTermination()
        return True

    def stop(self) -> None:
        try:
            self.query.stop()
        finally:
            self.close()

    def exception(self) -> Any:
        return self.query.exception()

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes this class lacks: the rest of StreamingQuery's surface.
        if name.startswith("_") or name == "query":
            raise AttributeError(name)
        return getattr(self.query, name)

    # -- CEC ---------------------------------------------------------------------------------------------
    @property
    def generation(self) -> Generation:
        return self.recovery.current

    @property
    def batches(self) -> int:
        """Micro-batches the sink completed."""
        return self._sink.batches

    @property
    def cec_progress(self) -> dict[str, Any]:
        """CEC's figures now (module doc)."""
        figures = self._sink.figures()
        figures["recovery"] = self._recovery_figures()
        return figures

    @property
    def dead_letters(self) -> dict[str, Any]:
        """This run's dead-letter figures (`operators.spark.dead_letters.DeadLetterWatch.figures`)."""
        return self._sink.dead_letters.figures()

    def checkpoint_controls(self, spark: SparkSession) -> dict[int, PartitionControl]:
        """What each state partition planned, measured and said about checkpointing, as of the last
        committed micro-batch (`operators.spark.checkpointing.PartitionControl`: the (Q, U) and budget in
        force, its rates, G-checks made, and each policy refusal or note said once). Runs a Spark job
        reading the run's state; also after the query stopped. Empty for G-open only."""
        if self.checkpoint is None or not self.checkpointing.checkpoints:
            return {}
        return read_controls(spark, str(self.checkpoint), STATE_NAME)

    def _recovery_figures(self) -> dict[str, Any]:
        rec = self.recovery
        if rec.caught_up_at is not None:  # a resumed checkpoint: caught up where the logs end
            crash = list(rec.caught_up_at)
        else:
            crash = [max(c[j] for crash in rec.crash_points for c in crash) for j in range(len(rec.start))]
        if self._replay_s is None:
            self._replay_s = self._find_replay_end(crash)
        return {
            "path": rec.path,
            "reason": rec.reason,
            "resumed": rec.resumed,
            "ec_build_s": rec.seconds,
            "ec_windows": rec.ec_windows,
            "ec_records_read": rec.records_read,
            "ec_load_rows": rec.ec_windows + rec.closed_keys,
            "replay_start": list(rec.start),
            "crash_point": crash,
            "replay_tuples": sum(max(0, c - s) for s, c in zip(rec.start, crash, strict=True)),
            "replay_s": self._replay_s,
            **self._against_target(),
        }

    def _against_target(self) -> dict[str, Any]:
        """The recovery time (planning + replay) and, with a recovery target, whether this start met it."""
        target = self.checkpointing.recovery_target
        took = None if self._replay_s is None else self.recovery.seconds + self._replay_s
        met = None if took is None or target is None or not self.recovery.resumed else took <= target
        return {"recovery_s": took, "recovery_target_s": target, "recovery_target_met": met}

    def _find_replay_end(self, crash: list[int]) -> float | None:
        """From the query's start to the end of the first micro-batch whose source end offsets reached the
        crash point on every input partition (read from Spark's progress)."""
        for progress in self.query.recentProgress:
            sources = progress.sources
            if not sources or not sources[0].endOffset:
                continue
            ends = _partition_offsets(sources[0].endOffset)
            if all(int(ends.get(str(j), 0)) >= c for j, c in enumerate(crash)):
                started = datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00")).timestamp()
                return max(0.0, started + progress.batchDuration / 1000.0 - self._started_wall)
        return None

    def _stop_when_drained(self) -> None:
        while not self._done.wait(0.2):
            if not self.query.isActive:
                return
            progress = self.query.lastProgress
            if progress is not None and _drained(progress):
                self.query.stop()
                return

    def _with_cec(self, progress: Any) -> Any:
        figures = self._sink.batch_figures.get(int(progress.batchId))
        if figures is None:
            return progress
        progress["cec"] = {**figures, "recovery": self._recovery_figures()}
        _count_tuples(progress, figures["input_tuples"])
        return progress

    # -- lifetime ----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Release the output partitions (flushes what was appended). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._done.set()
        self.recovery.release()  # the initial state cached on the executors for the query's start
        try:
            self._sink.close()
        finally:
            self._store.close()

    def __enter__(self) -> CecAggregateQuery:
        return self

    def __exit__(self, *exc: object) -> None:
        # stop() also when inactive: Spark's stop waits for a batch still in flight (see awaitTermination).
        self.stop()


def _drained(progress: Any) -> bool:
    """A micro-batch that read no input: its source had nothing beyond what was processed when it was planned."""
    if not progress.sources:
        return False
    source = progress.sources[0]
    return bool(progress.numInputRows == 0 and source.startOffset == source.endOffset)


def _partition_offsets(text: str) -> dict[str, Any]:
    """A source's offsets in Spark's progress, per input partition: {"<j>": offset} as the cec sources
    write them, or Spark's Kafka source's {"<topic>": {"<j>": offset}} (one topic)."""
    offsets = json.loads(text)
    inner = next(iter(offsets.values()), None) if len(offsets) == 1 else None
    return inner if isinstance(inner, dict) else offsets


def _count_tuples(progress: Any, tuples: int) -> None:
    """Spark counts the rows its source produced, which are packed (`operators.spark.packing`: a few rows
    per state partition and chunk): the input figures a user reads are in tuples, as the state partitions
    counted them (their rates scaled alike). `progress.json` stays Spark's own."""
    rows = progress["numInputRows"]
    scale = tuples / rows if rows else 0.0
    for entry in (progress, *progress["sources"]):
        for name in ("inputRowsPerSecond", "processedRowsPerSecond"):
            if entry.get(name) is not None:
                entry[name] = entry[name] * scale
        entry["numInputRows"] = tuples
