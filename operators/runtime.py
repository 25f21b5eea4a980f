"""The operator runtime: input -> operator -> output queue (-> index), with CEC's three paths.

- foreground: consume input in batches, apply each tuple, emit R / G-open / DEAD records in order;
- background: every `check_every` tuples (inside batches too) and between batches, spend the checkpoint
  budget (CI ms of operator time in every CP ms, `cec.schedule`) on G-checks of the windows with the oldest
  footprints while the policy asks for them (paper III.A); all in the operator's thread, as in the paper,
  so no locking. Every time decision reads the injected `clock`; the duty really spent is measured and
  reported (`RunStats.checkpoint_duty`), and targets the budget cannot meet are said once, in the log;
- recovery: before the first tuple, rebuild the eventual checkpoint from the output log, load it, seek the
  input to the replay start and let the replay plan admit or skip each tuple until the crash point.

Every record carries the logical time, the input position vector and N. Logical time is the largest event
time seen when the operator has one, else the number of input offsets consumed (sum of positions): either
way it never decreases along the log and is restored from the crash point.
"""

from __future__ import annotations

import heapq
import json
import logging
import re
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from itertools import islice
from operator import attrgetter
from typing import Any

from cec import progress as progress_tasks
from cec.exceptions import BadTupleError, CodecError
from cec.metrics import OperatorMetrics
from cec.policy import CheckpointPolicy, GOpenOnly, WindowView
from cec.rates import MeasuredRates
from cec.records import AvroCodec, Kind, OutputRecord, RecordCodec
from cec.registry import OpenWindow, WindowRegistry
from cec.schedule import CheckpointSchedule
from operators.base import DEAD_LETTER_SCHEMA, InputTuple, Operator
from operators.sources import InputSource
from queuestore import faults
from queuestore.base import RecordMeta
from queuestore.output import OutputQueue
from recovery.contract import PositionStamper, ReplayContract, TupleFate, Watermark
from recovery.exceptions import RecoveryError
from recovery.manager import RecoveryManager, RecoveryReport

__all__ = ["OperatorRuntime", "Progress", "RunStats"]

log = logging.getLogger(__name__)

_MEASURE_S = 0.25  # measurement interval: rates, the policy's choices, the check that targets are met
_OVER_INTERVALS = 4  # consecutive intervals a target must be missed, budget spent, before saying so

_PLAIN_ENCODE = RecordCodec.encode
_STATE, _KEY, _SEQ = attrgetter("state"), attrgetter("key"), attrgetter("seq")  # a run of windows' fields
_KIND_NAME = {kind: kind.value for kind in Kind}  # Enum.value is a descriptor call: too slow per record


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
    max_replay: int = 0  # largest replay size u seen after any batch
    trimmed_offsets: int = 0  # offsets trimmed from the head of the output log in this run
    retained_samples: list[tuple[int, int]] = field(default_factory=list)  # (inputs, retained) per trim
    checkpoint_policy: str = ""
    checkpoint_budget: float = 0.0  # the duty allowed at the end (CI/CP, or what the policy picked)
    checkpoint_seconds: float = 0.0  # operator time spent producing G-checks
    checkpoint_duty: float = 0.0  # checkpoint_seconds / run time since G-checks were allowed (after recovery)
    checkpoint_duty_wanted: float = 0.0  # checkpoint_seconds / run time in which the policy wanted G-checks
    checkpoint_refusal: str | None = None  # why the targets could not be met, if they could not
    q_target: int | None = None  # targets in force at the end (picked by the policy with a recovery target)
    u_target: int | None = None
    rates: dict[str, Any] | None = None  # what the policy planned with (cec.rates.MeasuredRates)
    checkpoint_note: str | None = None  # what the policy said once about its plan (e.g. a budget above 50%)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["recovery"] = self.recovery.as_dict() if self.recovery else None
        return d


def _raw_text(tup: InputTuple) -> str:
    """A dead letter's `raw`: the input as read when the source kept it (a CSV line without its line end,
    a topic record's value; bytes that are not UTF-8 shown as \\x escapes), else the decoded tuple as JSON."""
    raw = tup.raw
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "backslashreplace")
    if isinstance(raw, str):
        if raw.endswith("\n"):
            raw = raw[:-2] if raw.endswith("\r\n") else raw[:-1]
        # Undecodable bytes are kept by the CSV source as lone surrogates, which cannot be written as is.
        return raw.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return "" if tup.value is None else json.dumps(dict(tup.value), default=str)


class Progress:
    """Rate-limited progress messages for long work (runs, recovery scans, replays), logged at INFO;
    the live bars (total, rate, ETA) are `cec.progress` tasks, shown by the reporter the CLI installs."""

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
            log.info("[%s +%6.1fs] %s", self.label, now - self._started, message)


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
        clock: Callable[[], float] | None = None,
        check_every: int = 32,
        rates: MeasuredRates | None = None,
        trim_every: int | None = None,
        metrics: OperatorMetrics | None = None,
        gcheck_batch: int = 256,
    ) -> None:
        """`footprints=False` writes results only: no fault tolerance, the baseline CEC's cost is measured
        against (the paper's "native" runs). Such a log cannot be recovered from.

        `trim_every`: trim the output log (DESIGN-NOTES section 3) each time this many more records are
        durable: below min(the extent start, every registered consumer's acknowledged position), keeping
        the newest record (the crash point). None: never trim.

        `clock` (seconds, monotonic) drives every checkpoint decision (default: the schedule's, else
        `time.monotonic`); `check_every` is how many tuples may pass between two looks at the budget,
        which bounds how far u can pass U; `rates` are the measured rates the policies plan with.

        `gcheck_batch`: at most this many G-checks are produced in one go (their states and records
        encoded in one call each, appended in one store call: the same records as one at a time, for a
        fraction of the per-G-check cost); 1 produces them one at a time."""
        self.operator = operator
        self.source = source
        self.output = output
        self.policy = policy or GOpenOnly()
        if clock is None:
            clock = schedule.clock if schedule is not None else time.monotonic
        self.clock = clock
        self.schedule = schedule or CheckpointSchedule(clock=clock)
        self.schedule.clock = clock
        if check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}")
        self.check_every = check_every
        if gcheck_batch < 1:
            raise ValueError(f"gcheck_batch must be >= 1, got {gcheck_batch}")
        self.gcheck_batch = gcheck_batch
        self._gcheck_cost: float | None = None  # measured seconds per batched G-check (sizes the batches)
        self.rates = rates or MeasuredRates()
        self.metrics = metrics  # Prometheus (cec.metrics): sampled after each batch, recovery phases
        self.batch_size = batch_size
        self.progress = progress or Progress(operator.name, enabled=False)
        self.codec = codec or RecordCodec()
        # A codec that overrides `encode` (a test's timed codec) is called with whole records.
        self._encode_fields = self.codec.encode_fields if type(self.codec).encode is _PLAIN_ENCODE else None
        self.idle_wait_s = idle_wait_s
        self.footprints = footprints
        self._result_codec = AvroCodec(operator.result_schema)
        self._dead_codec = AvroCodec(DEAD_LETTER_SCHEMA)
        self._registry = WindowRegistry()
        self._pos = [0] * source.partitions
        # Dead letters name the stream's own partition, not the instance's local index of it.
        self._global_partitions: tuple[int, ...] = tuple(
            getattr(source, "global_partitions", range(source.partitions))
        )
        self._time = 0
        self._next_seq: dict[str, int] = {}
        self._pending_opens: list[OpenWindow] = []
        self._in_count = 0
        self._out_count = 0
        self._plan: ReplayContract | None = None  # while replaying below the crash point
        self._replay_task: progress_tasks.Task | None = None  # shows the replay while it runs
        self._stamper = PositionStamper(self._pos)  # the pos records carry (recovery.contract)
        self._rebuilding = False  # applying a replayed tuple below the crash point
        self._current: tuple[int, int] | None = None  # the tuple being applied, whose records are held
        self._held: list[tuple[Kind, str | None, int, bytes | None, bytes | None, int]] = []
        # Event-time watermarks (recovery.contract, "watermarks"): per-partition maxima, the open windows
        # by (end, key, seq), and the tuples past a crash point held back until every partition reached its own.
        lateness = operator.allowed_lateness
        self._wm: Watermark | None = None if lateness is None else Watermark(source.partitions, lateness)
        self._ends: list[tuple[int, str, int]] = []
        self._held_back: list[InputTuple] = []
        self.trim_every = trim_every
        self._trim_pending: tuple[int, int] | None = None  # (bound, records appended when it was taken)
        self._trim_looked = 0  # durable end when the bound was last taken
        self.stats = RunStats()
        # Checkpoint bookkeeping (see _background / _measure).
        self._busy = 0.0  # time in this interval spent reading and applying input (not waiting, not G-checks)
        self._last_look = 0.0
        self._interval: tuple[float, int, int, int, float, int, int] | None = None
        self._budget_short = False  # the budget ran out while the policy still wanted G-checks
        self._over = 0  # consecutive intervals with a target missed and the budget spent
        self._said: set[str] = set()

    # -- OperatorContext -------------------------------------------------------------------------------
    @property
    def registry(self) -> WindowRegistry:
        return self._registry

    @property
    def time(self) -> int:
        return self._time

    @property
    def watermark(self) -> int | None:
        """The event-time watermark W (recovery.contract), or None: none kept, or not yet known."""
        return None if self._wm is None else self._wm.value

    def open_window(self, key: str, state: Any) -> OpenWindow:
        seq = self._next_seq.get(key)
        if seq is None:
            last = self.output.index.last_closed_seq(key)
            seq = 0 if last is None else last + 1
        window = OpenWindow(key, seq, state, self._time, self._time, self._out_count, self._in_count)
        self._registry.open(window)
        self._track_end(window)
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
                () if self._wm is None else self._wm.stamp(),
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
        wm = self._wm
        time_ = self._time
        encode = self._encode_fields
        append = self.output.append
        armed = faults.armed()
        for i, (kind, key, seq, state, payload, n) in enumerate(held):
            claims = i == last
            pos = stamp(self._pos, partition, offset, claims=claims)
            marks = () if wm is None else wm.stamp(partition, claims=claims)
            # The record's fields straight to its bytes (no OutputRecord per record: the per-tuple path).
            if encode is None:
                value = self.codec.encode(OutputRecord(kind, time_, pos, n, key, seq, state, payload, marks))
            else:
                value = encode(kind, time_, pos, n, key, seq, state, payload, marks)
            if armed:
                faults.hit("runtime.before_append")
            append(value, RecordMeta(_KIND_NAME[kind], time_, key, seq))
            if armed:
                faults.hit("runtime.after_append")

    def _footprint(self, kind: Kind, window: OpenWindow) -> None:
        if not self.footprints:
            return
        self._registry.footprint(
            window.key, time=self._time, out_mark=self._out_count, in_mark=self._in_count
        )
        self._emit(kind, window.key, window.seq, self.operator.encode_footprint(window.state), None)
        if kind is Kind.GOPEN:
            self.stats.gopens += 1
        else:
            self.stats.gchecks += 1

    def _dead_letter(self, tup: InputTuple, reason: str) -> None:
        if self._rebuilding:
            return  # its dead letter is already in the log (see _emit)
        raw = _raw_text(tup)
        payload = self._dead_codec.encode(
            {
                "partition": self._global_partitions[tup.partition],
                "offset": tup.offset,
                "reason": reason,
                "raw": raw,
            }
        )
        self._emit(Kind.DEAD, None, -1, None, payload)
        self.stats.dead_letters += 1

    # -- recovery --------------------------------------------------------------------------------------
    def _recover(self) -> bool:
        """Load the eventual checkpoint; returns False if the operator had already finished."""
        label = f"{self.operator.name} recovery"
        progress = Progress(label, enabled=self.progress.enabled)
        scan: progress_tasks.Task | None = None

        def scanned(read: int, found: int, n: int) -> None:
            nonlocal scan
            progress(f"EC scan: {read:,} records read, {found:,}/{n:,} windows")
            if scan is None:
                scan = progress_tasks.task(f"{self.progress.label} EC scan", n, "windows")
            scan.update(found, total=n)

        with self.output.store.reader(self.output.topic, self.output.partition) as reader:
            reader.hint_end(self.output.index.next_offset)  # the index was just reconciled with the log
            manager = RecoveryManager(
                reader,
                self.operator.decode_state if self.operator.stateful else (lambda b: None),
                codec=self.codec,
                progress=scanned,
                on_phase=None if self.metrics is None else self.metrics.phase,
            )
            try:
                recovery = manager.recover(self.source.partitions)
            finally:
                if scan is not None:
                    scan.close()
        if self.metrics is not None:
            self.metrics.phase("replay" if recovery.needed and not recovery.complete else "idle")
        if not recovery.needed:
            self.progress("empty log: nothing to recover, starting from the input's start", force=True)
            self._plan = None
            self.source.seek(self._pos)
            return True
        self.stats.resumed = True
        self.stats.recovery = recovery.report
        ec = recovery.checkpoint
        assert ec.crash_pos is not None
        end = ec.end_offset
        if self._wm is not None:
            try:
                self._wm.restore(ec.marks)
            except RecoveryError as exc:
                raise RecoveryError(f"{self.output.topic}[{self.output.partition}]: {exc}") from None
        # Oldest footprint first, so the registry order is the log order. Built in one pass and installed
        # in one call: at the paper's scale (92k windows) a per-window open() was ~0.3 s of the recovery.
        crash_total = sum(ec.crash_pos)
        loaded = [
            OpenWindow(
                lw.key,
                lw.seq,
                lw.state,
                record.time,
                record.time,
                lw.footprint.offset - end,
                sum(record.pos) - crash_total,
            )
            for lw in recovery.windows
            for record in (lw.footprint.record,)
        ]
        self._registry.load(loaded)
        if self._wm is not None:
            for window in loaded:
                self._track_end(window)
        self._next_seq.update([(window.key, window.seq + 1) for window in loaded])
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
        if recovery.plan.replay_span > 0:
            self._replay_task = progress_tasks.task(
                f"{self.progress.label} replay", recovery.plan.replay_span, "tuples"
            )
        self._pos = list(recovery.plan.start)
        self.source.seek(recovery.plan.start)
        return True

    # -- watermarks ------------------------------------------------------------------------------------
    def _track_end(self, window: OpenWindow) -> None:
        if self._wm is not None:
            end = self.operator.window_end(window.state)
            if end is not None:
                heapq.heappush(self._ends, (end, window.key, window.seq))

    def _expire(self) -> None:
        """Close every open window whose end the watermark has passed, in (end, key, seq) order."""
        assert self._wm is not None
        w = self._wm.value
        ends = self._ends
        if w is None:
            return
        registry = self._registry
        while ends and ends[0][0] <= w:
            _, key, seq = heapq.heappop(ends)
            window = registry.get(key)
            if window is None or window.seq != seq:
                continue  # closed already by its own input
            self.close_window(key, self.operator.expire(key, seq, window.state))

    def _hold_back(self, tup: InputTuple) -> bool:
        """With watermarks, a tuple past its partition's crash point waits until every partition has
        reached its own (recovery.contract, "watermarks"); True if `tup` was held back."""
        plan = self._plan
        if plan is None or self._wm is None or plan.replaying(tup.partition, tup.offset):
            return False
        if plan.caught_up(self._pos):
            # Every partition reached its crash point without the check at the end of `_apply` running
            # (the last replayed tuple was skipped): what was held back comes before this tuple.
            self._catch_up()
            return False
        self._held_back.append(tup)
        return True

    def _catch_up(self) -> None:
        """Recovery is over: leave replay, then apply the tuples held back, in their order."""
        self._caught_up()
        self._release_held_back()

    def _release_held_back(self) -> None:
        held, self._held_back = self._held_back, []
        for tup in held:
            self._apply(tup)

    # -- trimming --------------------------------------------------------------------------------------
    def _trim(self) -> None:
        """Trim the output log below what recovery and the registered consumers still need.

        The bound is taken at one moment: the offset of an indexed record older than the oldest open
        window's last footprint (times never decrease along the log). It is applied only once everything
        appended by then is durable: until then a window's newest footprint may not be in the log, and a
        crash would need its older one, which the bound may have passed. Footprints only move forward, so
        a bound stays safe for ever after it was taken.
        """
        if self.trim_every is None or self._plan is not None or not self.footprints:
            return
        output, index = self.output, self.output.index
        pending = self._trim_pending
        if pending is not None:
            bound, appended = pending
            if output.durable_count < appended:
                return
            self._trim_pending = None
            self._trim_to(bound)
            # Take the next bound at once when it is due: waiting for another batch would let the
            # durable end run further ahead of the log start.
        durable = index.next_offset
        if durable - self._trim_looked < self.trim_every:
            return
        self._trim_looked = durable
        self._trim_pending = (self._trim_bound(), output.appended)

    def _trim_bound(self) -> int:
        """The lowest offset recovery still needs: the oldest open window's last footprint (found through
        the index by its time), and at least the newest record, the crash point."""
        index = self.output.index
        durable = index.next_offset
        oldest = self._registry.oldest()
        return durable - 1 if oldest is None else min(durable - 1, index.offset_for_time(oldest.tau2))

    def _trim_to(self, bound: int) -> None:
        """Trim below `bound`, capped by what every registered consumer acknowledged."""
        output, index = self.output, self.output.index
        acks = output.store.acknowledged(output.topic, output.partition)
        bound = min(bound, *acks.values()) if acks else bound
        if bound > index.start_offset:
            trimmed = output.writer.trim(bound)
            index.prune(bound)
            self.stats.trimmed_offsets += trimmed
            if self.metrics is not None:
                self.metrics.trimmed(trimmed)
            self.stats.retained_samples.append((self._in_count, index.next_offset - bound))
            self._acknowledge_input(bound)

    def _trim_at_rest(self) -> None:
        """At the end of a run, with everything appended durable: trim to the bound of now. During a run
        a bound waits for durability (`_trim`), so under load the writer's pace, not `trim_every`, sets how
        far behind trimming is; a run that stops leaves its log trimmed to what recovery needs."""
        if self.trim_every is None or self._plan is not None or not self.footprints:
            return
        self._trim_pending = None
        self._trim_to(self._trim_bound())

    def _acknowledge_input(self, bound: int | None) -> None:
        """An input that is a registered consumer's queue (`acknowledge`): everything below the `pos` of
        the record at `bound` (the oldest one kept, older than every footprint a recovery needs, so at
        most any replay start) is never read again. None: register at the current positions."""
        acknowledge = getattr(self.source, "acknowledge", None)
        if acknowledge is None:
            return
        if bound is None:
            acknowledge(self._consumer_name(), list(self._pos))
            return
        with self.output.store.reader(self.output.topic, self.output.partition) as reader:
            records = reader.read_forward(bound, 1)
        try:
            pos = self.codec.decode(records[0].value, records[0].meta).pos if records else None
        except CodecError:  # a part of a chunked value: acknowledge at the next trim
            return
        if pos is not None:
            acknowledge(self._consumer_name(), list(pos))

    def _consumer_name(self) -> str:
        """This instance as a consumer of its input queue: its output topic and partition."""
        name = re.sub(r"[^a-z0-9-]+", "-", self.output.topic.lower()).strip("-")[:48]
        digest = zlib.crc32(self.output.topic.encode()) & 0xFFFF
        return f"{name or 'op'}-{digest:04x}-{self.output.partition}"

    # -- foreground ------------------------------------------------------------------------------------
    def _apply_plain(self, tup: InputTuple) -> None:
        """`_apply` when there is neither a replay plan (no recovery below the crash point) nor a
        watermark, the steady state of most runs: the same steps in the same order, without the checks
        of the replay and watermark rules, which cannot apply (the per-tuple path of throughput)."""
        j, o = tup.partition, tup.offset
        pos = self._pos
        pos[j] = o + 1
        self._in_count += 1
        self.stats.inputs += 1
        armed = faults.armed()
        if armed:
            faults.hit("runtime.before_process")
        self._current = (j, o)
        operator = self.operator
        try:
            value = tup.value
            if value is None:
                self._dead_letter(tup, tup.error or "undecodable input")
            else:
                try:
                    event_time = operator.event_time(value)
                    t = event_time if event_time is not None else sum(pos)
                    if t > self._time:
                        self._time = t
                    operator.process(tup, self)
                except BadTupleError as exc:
                    self._dead_letter(tup, exc.reason)
            opens = self._pending_opens
            if opens:
                get = self._registry.get
                for window in opens:
                    if get(window.key) is window:  # still open: not opened-and-closed by one tuple
                        self._footprint(Kind.GOPEN, window)
                opens.clear()
        finally:
            self._current = None
        if self._held:
            self._release(j, o)
        if armed:
            faults.hit("runtime.after_input")

    def _apply(self, tup: InputTuple) -> None:
        j, o = tup.partition, tup.offset
        if self._wm is not None and self._plan is not None and self._hold_back(tup):
            return
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
                    if plan.caught_up(self._pos):
                        self._catch_up()  # the last replayed tuple: release what was held back now
                    return
                self._rebuilding = True  # TupleFate.REBUILD: below the crash point, only state
            elif plan.caught_up(self._pos):
                self._caught_up()
        faults.hit("runtime.before_process")
        self._current = (j, o)
        if self._wm is not None:
            self._wm.forget_tuple(j)  # until its event time is known, its records carry m as it is
        try:
            if tup.value is None:
                self._dead_letter(tup, tup.error or "undecodable input")
            else:
                try:
                    event_time = self.operator.event_time(tup.value)
                    self._time = max(self._time, event_time if event_time is not None else sum(self._pos))
                    if self._wm is not None and event_time is not None:
                        self._wm.observe(j, event_time)
                        if self._plan is None:  # below the crash point W stays W(t_c): nothing closes
                            self._expire()
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
        if self._held_back and plan is not None and plan.caught_up(self._pos):
            self._catch_up()

    def _replay_chunk(self, tuples: list[InputTuple]) -> int:
        """`_apply` of the tuples below the crash point, from the first of `tuples` on, in one loop: the
        same fates (`ReplayContract.fate`) and the same effects, without the per-tuple
        work that cannot apply there (no record is written, no fault is armed, no watermark is kept).
        Returns how many tuples it applied; the caller applies the rest (from the first one at or past its
        partition's crash point) through `_apply`, which ends the recovery."""
        plan = self._plan
        assert plan is not None and self._wm is None
        report = self.stats.recovery
        assert report is not None
        crash = plan.crash_pos
        fate = plan.fate  # the contract's rule; below the crash point it is SKIP or REBUILD
        operator = self.operator
        key_of, event_time, process = operator.key_of, operator.event_time, operator.process
        pos = self._pos
        done = skipped = 0
        try:
            for tup in tuples:
                j, o = tup.partition, tup.offset
                if o >= crash[j]:
                    break
                done += 1
                pos[j] = o + 1
                self._in_count += 1
                value = tup.value
                key = None
                if value is not None:
                    try:
                        key = key_of(value)
                    except BadTupleError:
                        key = None
                if fate(j, o, key) is TupleFate.SKIP:
                    # In the loaded state of its window, or of a window whose R is in the log.
                    skipped += 1
                    if o + 1 >= crash[j] and plan.caught_up(pos):
                        self._catch_up()  # the last replayed tuple: release what was held back now
                        break
                    continue
                # REBUILD: only window state; whatever it produced the first time is in the log (_emit).
                self._rebuilding = True
                try:
                    if value is not None:
                        try:
                            t = event_time(value)
                            if t is None:
                                t = sum(pos)
                            if t > self._time:
                                self._time = t
                            process(tup, self)
                        except BadTupleError:
                            pass  # its dead letter is in the log already
                    opens = self._pending_opens
                    if opens:
                        get = self._registry.get
                        for window_opened in opens:
                            if get(window_opened.key) is window_opened:
                                self._footprint(Kind.GOPEN, window_opened)  # raises: see _emit
                        opens.clear()
                finally:
                    self._rebuilding = False
        finally:
            self.stats.inputs += done
            report.tuples_replayed += done
            report.tuples_skipped += skipped
        return done

    def _caught_up(self) -> None:
        if self.metrics is not None:
            self.metrics.phase("idle")
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
        if self._replay_task is not None:
            self._replay_task.update(self._replay_task.total or 0)
            self._replay_task.close()
            self._replay_task = None
        self._plan = None

    # -- background ------------------------------------------------------------------------------------
    def _oldest_view(self, oldest: OpenWindow) -> WindowView:
        it = iter(self._registry)
        next(it)
        after = next(it, None)
        return WindowView(
            self._out_count - oldest.out_mark,
            self._in_count - oldest.in_mark,
            self._registry.n,
            (self._in_count if after is None else after.in_mark) - oldest.in_mark,
            (self._out_count if after is None else after.out_mark) - oldest.out_mark,
        )

    def _background(self, idle: bool = False) -> None:
        """Spend the checkpoint budget on G-checks of the oldest windows while the policy wants them.

        Called every `check_every` tuples and between batches (`idle`: after waiting for input, which is
        not operator work). Spending stops when the credit is used up, when the policy is satisfied, or
        after one G-check per open window (an unattainable target cannot spin).
        """
        if self._plan is not None or not self.footprints or not self.policy.checkpoints:
            return  # no G-checks while replaying below the crash point: windows are not yet consistent
        clock = self.clock
        if not self.schedule.started:
            self._start_checkpointing()
        now = clock()
        if not idle:
            self._busy += now - self._last_look
        self._last_look = now
        assert self._interval is not None
        if now - self._interval[0] >= _MEASURE_S:
            self._measure(now)
        oldest = self._registry.oldest()
        wants = oldest is not None and self.policy.wants_oldest(self._oldest_view(oldest))
        self.schedule.note_wanting(wants)
        if not wants:
            return
        credit = self.schedule.credit()
        if credit <= 0:
            self._budget_short = True
            return
        started = now
        done = 0
        polling = 0.0  # time in output.poll(), which is not G-check work (see below)
        polled_at = 0
        limit = len(self._registry)
        batched = self.gcheck_batch > 1 and self._encode_fields is not None
        while oldest is not None and done < limit and wants:
            if batched:
                # Most of a G-check's cost is per call, not per window: take the next oldest windows the
                # policy wants (as many as the credit left should pay for) and write them in one go.
                cost = self._gcheck_cost
                if cost is None:
                    most = 8  # until one run is measured
                elif credit == float("inf") or cost <= 0:
                    most = self.gcheck_batch
                else:
                    most = int((credit - (now - started - polling)) / cost) + 1
                windows = self._oldest_wanted(min(most, self.gcheck_batch, limit - done))
                run_started = now
                self._gcheck_run(windows)
                done += len(windows)
                now = clock()
                self._gcheck_cost = (now - run_started) / len(windows)
            else:
                self._footprint(Kind.GCHECK, oldest)
                done += 1
            if done - polled_at >= 32:
                # Serving completions may commit the output's transaction (Kafka: a flush and a round
                # trip, tens of ms on a loaded machine), which the batch's own poll would have done
                # anyway. Charged to the G-checks, it made one measure ~7.5 ms instead of ~0.1 ms under
                # load: the RTO controller then asked for more than its 50% cap and the budget ran out
                # with u far above U (13-15k tuples replayed for U = 4k, benchmarks/RESULTS.md).
                polled_at = done
                polled = clock()
                self.output.poll()
                polling += clock() - polled
            now = clock()
            if now - started - polling >= credit:
                self._budget_short = True  # it may be satisfied now; the next look finds out cheaply
                break
            oldest = self._registry.oldest()
            wants = oldest is not None and self.policy.wants_oldest(self._oldest_view(oldest))
        now = clock()
        spent = now - started - polling
        self.schedule.spend(spent, done)
        self.schedule.note_wanting(wants)  # satisfied (or not) as of the end of this spending
        self.rates.observe_gchecks(spent, done)
        self._last_look = now  # G-check time is not input work

    def _oldest_wanted(self, most: int) -> list[OpenWindow]:
        """The oldest windows, up to `most`, that one-at-a-time G-checks from now would take in a row: the
        policy sees, for each, the view it would see once the ones before it were G-checked (the oldest
        is wanted already). Pure reads: the registry is not changed."""
        registry = self._registry
        in_count, out_count, n = self._in_count, self._out_count, registry.n
        windows = list(islice(registry, most + 1))  # one more: the one behind the last, for its gap
        thresholds = self.policy.thresholds()
        if thresholds is not None:  # q > Q or u > U: no view needed
            q_target, u_target = thresholds
            q_on, u_on = q_target is not None, u_target is not None  # a None is not checked
            q_max, u_max = q_target or 0, u_target or 0
            for i in range(1, min(most, len(windows))):
                window = windows[i]
                if not (
                    (q_on and out_count + i - window.out_mark > q_max)
                    or (u_on and in_count - window.in_mark > u_max)
                ):
                    return windows[:i]
            return windows[:most]
        wants_oldest = self.policy.wants_oldest
        for i in range(1, min(most, len(windows))):
            window = windows[i]
            if i + 1 < len(windows):
                after_in, after_out = windows[i + 1].in_mark, windows[i + 1].out_mark
            elif len(windows) <= most:  # behind the last window comes the first one G-checked in this run
                after_in, after_out = in_count, out_count
            else:  # pragma: no cover - windows holds one more than `most`
                break
            view = WindowView(
                out_count + i - window.out_mark,
                in_count - window.in_mark,
                n,
                after_in - window.in_mark,
                after_out - window.out_mark,
            )
            if not wants_oldest(view):
                return windows[:i]
        return windows[:most]

    def _gcheck_run(self, windows: list[OpenWindow]) -> None:
        """G-checks of `windows` (the oldest, in registry order), all taken at this moment: the records
        one-at-a-time G-checks would write (same time, pos, N and marks; each its own out_mark), with the
        states and records encoded in one call each and appended in one store call."""
        count = len(windows)
        time_ = self._time
        pos = self._stamper.stamp_current(self._pos)
        marks = () if self._wm is None else self._wm.stamp()
        n = self._registry.n
        states = self.operator.encode_footprints(list(map(_STATE, windows)))
        keys = list(map(_KEY, windows))
        seqs = list(map(_SEQ, windows))
        values = self.codec.encode_run(Kind.GCHECK, time_, pos, n, marks, keys, seqs, states)
        self._registry.footprint_run(windows, time=time_, out_mark=self._out_count, in_mark=self._in_count)
        self._out_count += count
        self.stats.outputs += count
        self.stats.gchecks += count
        if faults.armed():
            # Crash sites stay per record (tests count their hits).
            for key, seq, value in zip(keys, seqs, values, strict=True):
                faults.hit("runtime.before_append")
                self.output.append(value, RecordMeta("GCHECK", time_, key, seq))
                faults.hit("runtime.after_append")
            return
        self.output.append_run("GCHECK", time_, keys, seqs, values)

    def _start_checkpointing(self) -> None:
        """G-checks become possible (fresh start, or recovery caught up): start the budget and the
        measurements; a recovery this run began with is the best measure of the next one."""
        self.schedule.start()
        now = self.clock()
        self._last_look = now
        self._interval = (now, self._in_count, self._out_count, self.stats.gchecks, 0.0, 0, 0)
        if self.stats.recovery is not None:
            self.rates.observe_recovery(self.stats.recovery)
        self._replan()
        oldest = self._registry.oldest()
        self._interval = self._interval[:5] + (
            (oldest.in_mark, oldest.out_mark) if oldest is not None else (self._in_count, self._out_count)
        )

    def _replan(self) -> None:
        self.policy.observe(self.rates, self._registry.n)
        duty = self.policy.budget()
        if duty is not None:
            self.schedule.set_duty(duty)

    def _measure(self, now: float) -> None:
        """End of a measurement interval: update the rates, let the policy re-plan, check the targets."""
        assert self._interval is not None
        t0, in0, out0, g0, spent0, front_in0, front_out0 = self._interval
        seconds = now - t0
        inputs, outputs = self._in_count - in0, self._out_count - out0
        gchecks = self.stats.gchecks - g0
        spent = self.schedule.spent_seconds - spent0
        self.rates.observe_run(
            seconds=seconds, busy_seconds=self._busy, inputs=inputs, outputs=outputs, gchecks=gchecks
        )
        self._replan()
        oldest = self._registry.oldest()
        front_in = self._in_count if oldest is None else oldest.in_mark
        front_out = self._out_count if oldest is None else oldest.out_mark
        self._check_targets(
            duty=spent / seconds if seconds > 0 else 0.0,
            needed_in=inputs / (front_in - front_in0) if front_in > front_in0 else None,
            needed_out=outputs / (front_out - front_out0) if front_out > front_out0 else None,
        )
        self._interval = (
            now, self._in_count, self._out_count, self.stats.gchecks, self.schedule.spent_seconds,
            front_in, front_out,
        )  # fmt: skip
        self._busy = 0.0
        self._budget_short = False

    def _say_once(self, topic: str, message: str) -> None:
        if topic not in self._said:
            self._said.add(topic)
            log.warning("%s: %s", self.operator.name, message)
            if self.stats.checkpoint_refusal is None:
                self.stats.checkpoint_refusal = message

    def _check_targets(self, *, duty: float, needed_in: float | None, needed_out: float | None) -> None:
        """Say once if the targets cannot be met: whatever the budget, or within this budget (then with
        the duty that would meet them).

        The duty that would meet U: with the budget spent, u settles where G-checks free the oldest
        windows as fast as input arrives, and u scales as 1/(G-checks per tuple); so G-check time per
        unit of other work must grow by u/U, times the factor by which the oldest footprint still lags
        the input (`needed_in`: input tuples per tuple of footprint advance, 1 once settled). Likewise
        for Q with q - N and the output count."""
        problem = self.policy.problem()
        if problem:
            self._say_once("problem", problem)
        note = self.policy.note()
        if note and "note" not in self._said:
            self._said.add("note")
            log.warning("%s: %s", self.operator.name, note)
            self.stats.checkpoint_note = note
        q_target, u_target = self.policy.targets()
        n = self._registry.n
        if q_target is not None and q_target < n:
            self._say_once(
                "q-below-n",
                f"Q={q_target:,} is below the {n:,} open windows: an extent holds a footprint of every open "
                f"window, so q <= Q cannot hold at any checkpoint budget (Q must be >= N)",
            )
        q = self._registry.extent_size(self._out_count)
        u = self._registry.replay_size(self._in_count)
        slack = self.check_every + self.batch_size
        missed_u = u_target is not None and u > u_target * 1.05 + slack
        missed_q = q_target is not None and q_target > n and q > q_target * 1.05 + slack
        if not ((missed_u or missed_q) and self._budget_short and not self.schedule.unlimited):
            self._over = 0
            return
        self._over += 1
        if self._over < _OVER_INTERVALS:
            return
        factors: list[float | None] = []
        if missed_u and u_target is not None:
            factors.append(None if needed_in is None else u / u_target * max(needed_in, 1.0))
        if missed_q and q_target is not None:
            factors.append(None if needed_out is None else (q - n) / (q_target - n) * max(needed_out, 1.0))
        if any(f is None for f in factors) or duty >= 1.0:
            need = "more than the whole operator's time would (the oldest footprint does not advance)"
        else:
            ratio = duty / (1.0 - duty) * max(f for f in factors if f is not None)
            needed = ratio / (1.0 + ratio)
            cp_ms = self.schedule.cp * 1000
            need = (
                f"about {needed:.0%} of operator time (CI={needed * cp_ms:.0f} ms every CP={cp_ms:g} ms) "
                "would meet them"
            )
        measured = f"u={u:,}, q={q:,} with {n:,} open windows"
        # The policy's own model may already have said why (its budget is capped below what U needs); it
        # is said only now, with the measured u and q behind it: a model alone predicted misses that
        # a quiet run never had.
        shortfall = self.policy.shortfall()
        self._say_once(
            "budget",
            f"{shortfall} (measured: {measured})"
            if shortfall
            else f"checkpoint targets Q={q_target} U={u_target} cannot be met within "
            f"{self.schedule.describe()}: {measured}; {need}",
        )

    def _report_checkpointing(self) -> None:
        stats = self.stats
        stats.checkpoint_policy = self.policy.describe()
        stats.checkpoint_budget = self.schedule.duty if self.policy.checkpoints else 0.0
        stats.checkpoint_seconds = self.schedule.spent_seconds
        stats.checkpoint_duty = self.schedule.real_duty()
        stats.checkpoint_duty_wanted = self.schedule.wanted_duty()
        stats.q_target, stats.u_target = self.policy.targets()
        stats.rates = self.rates.as_dict()

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
        self._calibrate()
        if self.trim_every is not None:
            self._acknowledge_input(None)  # a queue input: register as its consumer from the replay start
        last_sample = self.clock()
        # Only when shown: a CSV's total costs a pass over the file.
        bounds = self.source.progress_bounds() if progress_tasks.active() else None
        inputs = progress_tasks.task(
            f"{self.progress.label} input",
            None if bounds is None else sum(e - s for s, e in zip(*bounds, strict=True)),
            "tuples",
        )
        try:
            return self._run(stop, max_inputs, last_sample, bounds, inputs)
        finally:
            inputs.close()
            if self._replay_task is not None:
                self._replay_task.close()

    def _run(
        self,
        stop: Callable[[], bool] | None,
        max_inputs: int | None,
        last_sample: float,
        bounds: tuple[list[int], list[int]] | None,
        inputs: progress_tasks.Task,
    ) -> RunStats:
        while (stop is None or not stop()) and (max_inputs is None or self.stats.inputs < max_inputs):
            batch = self.source.poll(self.batch_size)
            if batch is None:
                break
            if not batch:  # live end of the input: serve completions while waiting
                self.output.poll(self.idle_wait_s)
                self._background(idle=True)
                continue
            k = self.check_every
            for first in range(0, len(batch), k):  # the checkpoint budget is looked at inside batches too
                # Recovery ends (the plan goes) inside a batch: the plain path takes over at the next chunk.
                chunk = batch[first : first + k]
                if self._plan is not None and self._wm is None and not faults.armed():
                    # Below the crash point: the replay loop; the tuples from the crash point on go on below.
                    chunk = chunk[self._replay_chunk(chunk) :]
                apply = self._apply_plain if self._plan is None and self._wm is None else self._apply
                for tup in chunk:
                    apply(tup)
                self._background()
            self.output.poll()
            self._trim()
            extent = self._registry.extent_size(self._out_count)
            self.stats.max_extent = max(self.stats.max_extent, extent)
            self.stats.max_replay = max(self.stats.max_replay, self._registry.replay_size(self._in_count))
            now = self.clock()
            if now - last_sample >= 1.0:
                last_sample = now
                self.stats.extent_samples.append((self._in_count, extent))
            if self.metrics is not None:
                self._sample_metrics(extent)
            self.progress(
                f"{self.stats.inputs:,} tuples in, {self.stats.outputs:,} records out, N={self._registry.n:,}, "
                f"extent {extent:,}"
            )
            if bounds is None:
                inputs.update(self.stats.inputs)
            else:
                inputs.update(sum(max(0, min(p, e) - s) for p, s, e in zip(self._pos, *bounds, strict=True)))
            if self._replay_task is not None and self._plan is not None:
                self._replay_task.update(sum(self._pos) - sum(self._plan.start))
        else:
            self._finish(complete=False)
            return self.stats
        if self._plan is not None:
            self._caught_up()
        self._release_held_back()
        self._emit(Kind.EOS, None, -1, None, None)
        self._finish(complete=True)
        return self.stats

    def _calibrate(self) -> None:
        """Measure the EC build and load rates at startup when a policy will plan with them and no
        recovery of this run measures them (`recovery.calibrate`): a fresh start, or an extent too short
        to time. A recovery's own figures (`MeasuredRates.observe_recovery`) replace these."""
        if not self.footprints or not self.policy.checkpoints or self.rates.calibrated:
            return
        report = self.stats.recovery
        if report is not None and report.ec_build_seconds >= 0.02 and report.ec_load_seconds >= 0.02:
            return
        from recovery.calibrate import calibrate_ec_rates

        name = type(self.output.store).__name__.lower()
        backend = "sqlite" if "sqlite" in name else "kafka" if "kafka" in name else None
        build, load = calibrate_ec_rates(backend=backend, codec=self.codec)
        self.rates.calibrate(build, load)
        self.progress(
            f"EC rates calibrated at startup: build {build:,.0f} records/s, load {load:,.0f} windows/s"
        )

    def _sample_metrics(self, extent: int) -> None:
        assert self.metrics is not None
        stats = self.stats
        self.metrics.sample(
            open_windows=self._registry.n,
            extent=extent,
            replay=self._registry.replay_size(self._in_count),
            inputs=stats.inputs,
            outputs=stats.outputs,
            gopens=stats.gopens,
            gchecks=stats.gchecks,
            duty=self.schedule.real_duty(),
        )

    def _finish(self, *, complete: bool) -> None:
        self.output.flush()  # fail-stop: raises WriterFailedError if any append failed
        self._trim_at_rest()
        if self.metrics is not None:
            self._sample_metrics(self._registry.extent_size(self._out_count))
        self.stats.open_windows = self._registry.n
        self._report_checkpointing()
        self.stats.completed = complete
        self.stats.seconds = time.perf_counter() - self._started
