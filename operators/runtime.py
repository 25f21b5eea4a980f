"""The operator runtime: input -> operator -> output queue (-> index), with CEC's three paths.

- foreground: consume input in batches, apply each tuple, emit R / G-open / DEAD records in order;
- background: between batches, inside checkpoint slots (CI of every CP ms), emit G-checks for the windows
  with the oldest footprints while the policy asks for them (paper III.A); all in the operator's thread,
  as in the paper, so no locking;
- recovery: before the first tuple, rebuild the eventual checkpoint from the output log, load it, seek the
  input to the replay start and let the replay plan admit or skip each tuple until the crash point.

Every record carries the logical time, the input position vector and N. Logical time is the largest event
time seen when the operator has one, else the number of input offsets consumed (sum of positions): either
way it never decreases along the log and is restored from the crash point.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from cec.exceptions import BadTupleError
from cec.policy import CheckpointPolicy, CheckpointSchedule, GOpenOnly
from cec.records import AvroCodec, Kind, OutputRecord, RecordCodec
from cec.registry import OpenWindow, WindowRegistry
from operators.base import InputTuple, Operator
from operators.sources import InputSource
from queuestore import faults
from queuestore.output import OutputQueue
from recovery.contract import PositionStamper, ReplayContract, TupleFate
from recovery.manager import RecoveryManager, RecoveryReport

__all__ = ["DEAD_LETTER_SCHEMA", "OperatorRuntime", "Progress", "RunStats"]

DEAD_LETTER_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "DeadLetter",
    "namespace": "cec",
    "fields": [
        {"name": "partition", "type": "long"},
        {"name": "offset", "type": "long"},
        {"name": "reason", "type": "string"},
        {"name": "raw", "type": "string"},
    ],
}


@dataclass
class RunStats:
    inputs: int = 0  # tuples read in this run, replayed ones included
    outputs: int = 0
    results: int = 0
    gopens: int = 0
    gchecks: int = 0
    dead_letters: int = 0
    open_windows: int = 0
    seconds: float = 0.0
    completed: bool = False
    resumed: bool = False
    recovery: RecoveryReport | None = None
    max_extent: int = 0  # largest extent size q seen after any batch
    extent_samples: list[tuple[int, int]] = field(default_factory=list)  # (inputs, extent) every 1 s

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["recovery"] = self.recovery.as_dict() if self.recovery else None
        return d


class Progress:
    """Rate-limited progress lines on stderr for long work (runs, recovery scans, replays)."""

    def __init__(self, label: str, *, enabled: bool = True, every_s: float = 2.0) -> None:
        self.label = label
        self.enabled = enabled
        self.every_s = every_s
        self._last = time.monotonic()
        self._started = self._last

    def __call__(self, message: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.enabled and (force or now - self._last >= self.every_s):
            self._last = now
            print(f"[{self.label} +{now - self._started:6.1f}s] {message}", file=sys.stderr, flush=True)


class OperatorRuntime:
    def __init__(
        self,
        operator: Operator,
        source: InputSource,
        output: OutputQueue,
        *,
        policy: CheckpointPolicy | None = None,
        schedule: CheckpointSchedule | None = None,
        batch_size: int = 512,
        progress: Progress | None = None,
        codec: RecordCodec | None = None,
        idle_wait_s: float = 0.005,
        footprints: bool = True,
    ) -> None:
        """`footprints=False` writes results only: no fault tolerance, the baseline CEC's cost is measured
        against (the paper's "native" runs). Such a log cannot be recovered from."""
        self.operator = operator
        self.source = source
        self.output = output
        self.policy = policy or GOpenOnly()
        self.schedule = schedule or CheckpointSchedule()
        self.batch_size = batch_size
        self.progress = progress or Progress(operator.name, enabled=False)
        self.codec = codec or RecordCodec()
        self.idle_wait_s = idle_wait_s
        self.footprints = footprints
        self._result_codec = AvroCodec(operator.result_schema)
        self._dead_codec = AvroCodec(DEAD_LETTER_SCHEMA)
        self._registry = WindowRegistry()
        self._pos = [0] * source.partitions
        self._time = 0
        self._next_seq: dict[str, int] = {}
        self._pending_opens: list[OpenWindow] = []
        self._in_count = 0
        self._out_count = 0
        self._plan: ReplayContract | None = None  # while replaying below the crash point
        self._stamper = PositionStamper(self._pos)  # the pos records carry (recovery.contract)
        self._rebuilding = False  # applying a replayed tuple below the crash point
        self._current: tuple[int, int] | None = None  # the tuple being applied, whose records are held
        self._held: list[tuple[Kind, str | None, int, bytes | None, bytes | None, int]] = []
        self.stats = RunStats()

    # -- OperatorContext -------------------------------------------------------------------------------
    @property
    def registry(self) -> WindowRegistry:
        return self._registry

    @property
    def time(self) -> int:
        return self._time

    def open_window(self, key: str, state: Any) -> OpenWindow:
        seq = self._next_seq.get(key)
        if seq is None:
            last = self.output.index.last_closed_seq(key)
            seq = 0 if last is None else last + 1
        window = OpenWindow(key, seq, state, self._time, self._time, self._out_count, self._in_count)
        self._registry.open(window)
        self._next_seq[key] = seq + 1
        self._pending_opens.append(window)
        return window

    def close_window(self, key: str, result: Mapping[str, Any]) -> None:
        window = self._registry.close(key)
        self._emit(Kind.R, window.key, window.seq, None, self._result_codec.encode(result))
        self.stats.results += 1

    def emit(self, result: Mapping[str, Any]) -> None:
        self._emit(Kind.R, None, -1, None, self._result_codec.encode(result))
        self.stats.results += 1

    # -- output ----------------------------------------------------------------------------------------
    def _emit(
        self, kind: Kind, key: str | None, seq: int, state: bytes | None, payload: bytes | None
    ) -> None:
        if self._rebuilding:
            # A tuple replayed below the crash point only rebuilds window state: whatever it produced the
            # first time is already in the log. Only a dead letter can come out of it again; a result or a
            # window opening would mean the log and the replay disagree, and writing it would corrupt output.
            if kind is not Kind.DEAD:
                raise RuntimeError(f"replay below the crash point produced a {kind.value} record for {key!r}")
            return
        self._out_count += 1
        self.stats.outputs += 1
        if self._current is not None:
            # Records of the tuple being applied are held until it is done; see _release.
            self._held.append((kind, key, seq, state, payload, self._registry.n))
            return
        self._append(
            OutputRecord(
                kind,
                self._time,
                self._stamper.stamp_current(self._pos),
                self._registry.n,
                key,
                seq,
                state,
                payload,
            )
        )

    def _append(self, record: OutputRecord) -> None:
        value = self.codec.encode(record)
        faults.hit("runtime.before_append")
        self.output.append(value, record.meta())
        faults.hit("runtime.after_append")

    def _release(self, partition: int, offset: int) -> None:
        """Append the records of tuple (partition, offset) now that it is fully applied.

        Only the last one claims the tuple; their pos is stamped by the replay contract's rules
        (`recovery.contract`: claiming, and pos while replaying).
        """
        held, self._held = self._held, []
        last = len(held) - 1
        stamp = self._stamper.stamp
        for i, (kind, key, seq, state, payload, n) in enumerate(held):
            pos = stamp(self._pos, partition, offset, claims=i == last)
            self._append(OutputRecord(kind, self._time, pos, n, key, seq, state, payload))

    def _footprint(self, kind: Kind, window: OpenWindow) -> None:
        if not self.footprints:
            return
        self._registry.footprint(
            window.key, time=self._time, out_mark=self._out_count, in_mark=self._in_count
        )
        self._emit(kind, window.key, window.seq, self.operator.encode_state(window.state), None)
        if kind is Kind.GOPEN:
            self.stats.gopens += 1
        else:
            self.stats.gchecks += 1

    def _dead_letter(self, tup: InputTuple, reason: str) -> None:
        if self._rebuilding:
            return  # its dead letter is already in the log (see _emit)
        raw = "" if tup.value is None else json.dumps(dict(tup.value), default=str, sort_keys=True)
        payload = self._dead_codec.encode(
            {"partition": tup.partition, "offset": tup.offset, "reason": reason, "raw": raw}
        )
        self._emit(Kind.DEAD, None, -1, None, payload)
        self.stats.dead_letters += 1

    # -- recovery --------------------------------------------------------------------------------------
    def _recover(self) -> bool:
        """Load the eventual checkpoint; returns False if the operator had already finished."""
        label = f"{self.operator.name} recovery"
        progress = Progress(label, enabled=self.progress.enabled)
        with self.output.store.reader(self.output.topic, self.output.partition) as reader:
            reader.hint_end(self.output.index.next_offset)  # the index was just reconciled with the log
            manager = RecoveryManager(
                reader,
                self.operator.decode_state if self.operator.stateful else (lambda b: None),
                codec=self.codec,
                progress=lambda read, found, n: progress(
                    f"EC scan: {read:,} records read, {found:,}/{n:,} windows"
                ),
            )
            recovery = manager.recover(self.source.partitions)
        if not recovery.needed:
            self._plan = None
            self.source.seek(self._pos)
            return True
        self.stats.resumed = True
        self.stats.recovery = recovery.report
        ec = recovery.checkpoint
        assert ec.crash_pos is not None
        end = ec.end_offset
        for lw in recovery.windows:  # oldest footprint first, so the registry order is the log order
            fp = lw.footprint
            self._registry.open(
                OpenWindow(
                    lw.key,
                    lw.seq,
                    lw.state,
                    fp.record.time,
                    fp.record.time,
                    fp.offset - end,
                    -(sum(ec.crash_pos) - sum(fp.record.pos)),
                )
            )
            self._next_seq[lw.key] = lw.seq + 1
        self._pos = list(ec.crash_pos)
        self._time = ec.time
        self._plan = recovery.plan
        self._stamper = recovery.plan.stamper()
        # Input counts are relative to the crash point, where the loaded windows' marks are taken.
        self._in_count = -recovery.plan.replay_span
        self.progress(
            f"recovered: extent {ec.extent_size:,} records, {len(recovery.windows):,} windows "
            f"(EC build {ec.build_seconds * 1000:.1f} ms, load {recovery.report.ec_load_seconds * 1000:.1f} ms), "
            f"replay from {list(recovery.plan.start)} to crash point {list(ec.crash_pos)}",
            force=True,
        )
        if recovery.complete:
            return False
        self._pos = list(recovery.plan.start)
        self.source.seek(recovery.plan.start)
        return True

    # -- foreground ------------------------------------------------------------------------------------
    def _apply(self, tup: InputTuple) -> None:
        j, o = tup.partition, tup.offset
        self._pos[j] = o + 1
        self._in_count += 1
        self.stats.inputs += 1
        plan = self._plan
        if plan is not None:
            if plan.replaying(j, o):
                key = None
                if tup.value is not None:
                    try:
                        key = self.operator.key_of(tup.value)
                    except BadTupleError:
                        key = None
                assert self.stats.recovery is not None
                self.stats.recovery.tuples_replayed += 1
                faults.hit("runtime.replaying")
                if plan.fate(j, o, key) is TupleFate.SKIP:
                    self.stats.recovery.tuples_skipped += 1
                    return
                self._rebuilding = True  # TupleFate.REBUILD: below the crash point, only state
            elif plan.caught_up(self._pos):
                self._caught_up()
        faults.hit("runtime.before_process")
        self._current = (j, o)
        try:
            if tup.value is None:
                self._dead_letter(tup, tup.error or "undecodable input")
            else:
                try:
                    event_time = self.operator.event_time(tup.value)
                    self._time = max(self._time, event_time if event_time is not None else sum(self._pos))
                    self.operator.process(tup, self)
                except BadTupleError as exc:
                    self._dead_letter(tup, exc.reason)
            for window in self._pending_opens:
                if self._registry.get(window.key) is window:  # still open: not opened-and-closed by one tuple
                    self._footprint(Kind.GOPEN, window)
            self._pending_opens.clear()
        finally:
            self._current = None
            self._rebuilding = False  # only ever for the one replayed tuple
        self._release(j, o)
        faults.hit("runtime.after_input")

    def _caught_up(self) -> None:
        if self.stats.recovery is not None and self._plan is not None:
            report = self.stats.recovery
            report.recovery_seconds = time.perf_counter() - self._started
            report.catch_up_seconds = (
                report.recovery_seconds - report.ec_build_seconds - report.ec_load_seconds
            )
            self.progress(
                f"caught up with the crash point: {report.tuples_replayed:,} tuples replayed, "
                f"{report.tuples_skipped:,} skipped",
                force=True,
            )
        self._plan = None

    # -- background ------------------------------------------------------------------------------------
    def _background(self) -> None:
        if self._plan is not None or not self._registry or isinstance(self.policy, GOpenOnly):
            return  # no G-checks while replaying below the crash point: windows are not yet consistent
        remaining = self.schedule.slot_remaining()
        if remaining <= 0:
            return
        deadline = time.monotonic() + remaining
        budget = len(self._registry)  # each window at most once per slot: an unattainable Q cannot spin
        while budget and self.policy.wants_checkpoint(
            self._registry.extent_size(self._out_count), self._registry.replay_size(self._in_count)
        ):
            oldest = self._registry.oldest()
            assert oldest is not None
            self._footprint(Kind.GCHECK, oldest)
            budget -= 1
            if budget % 32 == 0:
                if time.monotonic() >= deadline:
                    break
                self.output.poll()

    # -- main loop -------------------------------------------------------------------------------------
    def run(self, stop: Callable[[], bool] | None = None, *, max_inputs: int | None = None) -> RunStats:
        """Recover, then process until the input ends (EOS), `stop()` is true or `max_inputs` tuples were
        read in this run; the last two leave everything produced so far durable and no EOS, exactly the log
        a crash at that point would leave (checked between batches: use batch_size=1 for an exact count)."""
        self._started = time.perf_counter()
        if not self._recover():
            self.stats.completed = True
            self.stats.seconds = time.perf_counter() - self._started
            return self.stats
        if self._plan is not None and self._plan.caught_up(self._pos):
            self._caught_up()
        last_sample = time.monotonic()
        while (stop is None or not stop()) and (max_inputs is None or self.stats.inputs < max_inputs):
            batch = self.source.poll(self.batch_size)
            if batch is None:
                break
            if not batch:  # live end of the input: serve completions while waiting
                self.output.poll(self.idle_wait_s)
                self._background()
                continue
            for tup in batch:
                self._apply(tup)
            self.output.poll()
            self._background()
            extent = self._registry.extent_size(self._out_count)
            self.stats.max_extent = max(self.stats.max_extent, extent)
            now = time.monotonic()
            if now - last_sample >= 1.0:
                last_sample = now
                self.stats.extent_samples.append((self._in_count, extent))
            self.progress(
                f"{self.stats.inputs:,} tuples in, {self.stats.outputs:,} records out, N={self._registry.n:,}, "
                f"extent {extent:,}"
            )
        else:
            self._finish(complete=False)
            return self.stats
        if self._plan is not None:
            self._caught_up()
        self._emit(Kind.EOS, None, -1, None, None)
        self._finish(complete=True)
        return self.stats

    def _finish(self, *, complete: bool) -> None:
        self.output.flush()
        if self.output.failures:
            raise RuntimeError(f"{len(self.output.failures)} appends failed: {self.output.failures[0]!r}")
        self.stats.open_windows = self._registry.n
        self.stats.completed = complete
        self.stats.seconds = time.perf_counter() - self._started
