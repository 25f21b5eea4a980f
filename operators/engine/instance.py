"""One operator instance under CEC, host-neutral: it neither loops nor does I/O (`operators.engine`).

`OperatorInstance` is the `OperatorContext` an operator acts through. The host hands it input tuples
(`apply_run`, `apply`) and receives records through its `RecordSink`; everything CEC adds to the operator
happens here, once for every host:
- window identity: per-key window sequences (`open_window`), N, the input position vector, logical time;
- the replay contract while RESTORING (`recovery.contract`, asked through `operators.engine.phase`):
  SKIP, REBUILD (state only: whatever such a tuple produced the first time is in the log, so producing a
  record there means the log and the replay disagree) or PROCESS;
- the records of a tuple held until it is fully applied, then handed over with their claim (the last one
  claims the tuple) and marks; G-open of a window still open after its opening tuple;
- dead letters (`operators.engine.records.DeadLetters`);
- event-time watermarks (`recovery.contract.Watermark`): windows whose end the watermark passed close in
  (end, key, seq) order before the tuple that moved it is applied, and while RESTORING the tuples past a
  partition's crash point are held back until every partition reached its own;
- G-checks of the windows a host's controller chose (`gcheck_run`), and the EOS record.

Logical time is the largest event time seen when the operator has one, else the number of input offsets
consumed (sum of positions): either way it never decreases along the log and is restored from the crash
point.

Three ways through a tuple, the same effects: `_apply` (every rule), `_apply_plain` (RUNNING without a
watermark: no replay or watermark rule can apply) and `_replay_run` (RESTORING without a watermark, a run
of tuples below their crash points: no record can be produced). `apply_run` picks them; the fast ones are
the ones production runs, and the crash tests run them too (their kills come from outside the process or
from test-side wrappers, never from a branch in here).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from cec.exceptions import BadTupleError
from cec.records import AvroCodec, Kind
from cec.registry import OpenWindow, WindowRegistry
from operators.base import InputTuple, Operator
from operators.engine.phase import Lifecycle, Phase
from operators.engine.records import DeadLetters, HeldRecord, RecordSink
from operators.engine.stats import RunStats
from operators.exceptions import EngineStateError
from recovery.contract import ReplayContract, TupleFate, Watermark
from recovery.exceptions import RecoveryError, ReplayDivergenceError

if TYPE_CHECKING:
    from recovery.manager import Recovery, RecoveryReport

__all__ = ["HostState", "OperatorInstance", "loaded_window_ends"]

_STATE = attrgetter("state")

# What a host that keeps an instance between calls (the Spark state partition) saves of it besides its
# windows: the input positions applied, logical time, event-time marks, the open windows' ends (for the
# watermark), the tuples held back while restoring, and whether it is still restoring.
HostState = tuple[list[int], int, list[int] | None, list[tuple[int, str, int]], list[InputTuple], bool]


def loaded_window_ends(
    operator: Operator, windows: Sequence[tuple[str, int, Any]], marks: Sequence[int] | None
) -> list[tuple[int, str, int]]:
    """The watermark's heap of open windows (key, seq, state) loaded from an EC, with the crash record's
    `marks` (None: none yet): each at the first end past the watermark where it acts
    (`Operator.window_end_after`), as the instance tracks the windows it opens. For a host that installs
    loaded windows itself (the Spark state partition's initial state) rather than through `restore`."""
    watermark = None
    lateness = operator.allowed_lateness
    if lateness is not None and marks is not None:
        wm = Watermark(len(marks), lateness)
        wm.marks = [int(m) for m in marks]
        watermark = wm.value
    ends: list[tuple[int, str, int]] = []
    for key, seq, state in windows:
        end = operator.window_end_after(state, watermark)
        if end is not None:
            ends.append((end, key, seq))
    heapq.heapify(ends)
    return ends


class OperatorInstance:
    """The `OperatorContext` of one operator instance (module doc).

    `closed_seq(key)`: the last closed window seq of a key this instance has not met yet (the stream index
    of the output log locally; the state partition's saved keys on Spark), None if none. `registry`: a
    host's own window registry (one that loads windows lazily). `global_partitions`: the stream partition
    of each input partition, for dead letters. `footprints=False`: results only, no G-open (the baseline
    the cost of CEC is measured against)."""

    def __init__(
        self,
        operator: Operator,
        sink: RecordSink,
        partitions: int,
        *,
        footprints: bool = True,
        closed_seq: Callable[[str], int | None] | None = None,
        registry: WindowRegistry | None = None,
        global_partitions: Sequence[int] | None = None,
        stats: RunStats | None = None,
    ) -> None:
        self.operator = operator
        self.sink = sink
        self.footprints = footprints
        self.stats = stats if stats is not None else RunStats()
        self.lifecycle = Lifecycle()
        self._closed_seq = closed_seq
        self._registry = registry if registry is not None else WindowRegistry()
        self._result_codec = AvroCodec(operator.result_schema)
        self._dead = DeadLetters(global_partitions)
        self._pos = [0] * partitions
        self._time = 0
        self.next_seq: dict[str, int] = {}  # the next window seq of the keys met (open or closed)
        self._pending_opens: list[OpenWindow] = []
        self._in_count = 0
        self._out_count = 0
        self._rebuilding = False  # applying a replayed tuple below the crash point (REBUILD)
        self._current: tuple[int, int] | None = None  # the tuple being applied, whose records are held
        self._held: list[HeldRecord] = []
        self._event_time: int | None = None  # the event time of the tuple being applied, if it has one
        lateness = operator.allowed_lateness
        self._wm: Watermark | None = None if lateness is None else Watermark(partitions, lateness)
        self._ends: list[tuple[int, str, int]] = []  # open windows by (end, key, seq), for the watermark
        self._held_back: list[InputTuple] = []  # past a crash point while another partition replays
        self._logged_results: set[object] = set()  # identities of the results at the log's end (restore)

    # -- what the host reads ---------------------------------------------------------------------------
    @property
    def phase(self) -> Phase:
        return self.lifecycle.phase

    @property
    def contract(self) -> ReplayContract | None:
        """The replay contract while RESTORING, else None."""
        return self.lifecycle.contract

    @property
    def positions(self) -> list[int]:
        """The input position vector: the next offset per input partition (everything below is applied)."""
        return self._pos

    @property
    def in_count(self) -> int:
        """Input tuples applied (relative to the crash point after a recovery)."""
        return self._in_count

    @property
    def out_count(self) -> int:
        """Records produced (relative to the log end after a recovery)."""
        return self._out_count

    @property
    def report(self) -> RecoveryReport | None:
        return self.stats.recovery

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
        seq = self.next_seq.get(key)
        if seq is None:
            last = None if self._closed_seq is None else self._closed_seq(key)
            seq = 0 if last is None else last + 1
        window = OpenWindow(key, seq, state, self._time, self._time, self._out_count, self._in_count)
        self._registry.open(window)
        if self._wm is not None:
            self._track_end(window)
        self.next_seq[key] = seq + 1
        self._pending_opens.append(window)
        return window

    def close_window(self, key: str, result: Mapping[str, Any] | None) -> None:
        window = self._registry.close(key)
        if result is None:  # an R without a result (OperatorContext.close_window)
            self._emit(Kind.R, window.key, window.seq, None, None)
            return
        self._emit(Kind.R, window.key, window.seq, None, self._result_codec.encode(result))
        self.stats.results += 1

    def checkpoint_window(self, key: str) -> None:
        window = self._registry.get(key)
        if window is None:
            raise EngineStateError(f"no open window {key!r} to checkpoint")
        if not self.footprints:
            return
        self._registry.footprint(key, time=self._time, out_mark=self._out_count, in_mark=self._in_count)
        self._emit(Kind.GCHECK, key, window.seq, self.operator.encode_footprint(window.state), None)
        self.stats.gchecks += 1

    def emit(self, result: Mapping[str, Any]) -> None:
        if self._rebuilding:
            # A result that closes no window (`operators.hopping`: one window of several a part serves),
            # made again by a tuple replayed below the crash point: the first one is in the log. No
            # window state depends on it, so unlike an R or a G-open it is no sign of divergence.
            return
        if self._logged_results and self.operator.result_identity(result) in self._logged_results:
            # Made again by the tuple the crash cut (only some of its records reached the log, so it is
            # applied again): the one in the log stands (`Operator.unique_results`).
            return
        self._emit(Kind.R, None, -1, None, self._result_codec.encode(result))
        self.stats.results += 1

    # -- records ---------------------------------------------------------------------------------------
    def _emit(
        self, kind: Kind, key: str | None, seq: int, state: bytes | None, payload: bytes | None
    ) -> None:
        if self._rebuilding:
            # A tuple replayed below the crash point only rebuilds window state: whatever it produced the
            # first time is already in the log. Only a dead letter can come out of it again; a result or a
            # window opening would mean the log and the replay disagree, and writing it would corrupt output.
            if kind is not Kind.DEAD:
                raise ReplayDivergenceError(
                    f"replay below the crash point produced a {kind.value} record for {key!r} (window "
                    f"{seq}): the log and the replay disagree"
                )
            return
        if self._current is None:
            raise EngineStateError("an operator makes records only while a tuple is applied")
        self._out_count += 1
        self.stats.outputs += 1
        # Records of the tuple being applied are held until it is done; see _release.
        self._held.append((kind, key, seq, state, payload, self._registry.n))

    def _release(self, partition: int, offset: int) -> None:
        """Hand the records of tuple (partition, offset) to the sink now that it is fully applied: the last
        one claims it, each carries its marks (recovery.contract: "claiming", "watermarks")."""
        held, self._held = self._held, []
        wm = self._wm
        marks = None
        if wm is not None:
            last = len(held) - 1
            marks = [wm.stamp(partition, claims=i == last) for i in range(len(held))]
        self.sink.tuple_records(partition, offset, held, self._time, self._pos, marks, self._event_time)

    def _gopen(self, window: OpenWindow) -> None:
        if not self.footprints:
            return
        self._registry.footprint(
            window.key, time=self._time, out_mark=self._out_count, in_mark=self._in_count
        )
        self._emit(Kind.GOPEN, window.key, window.seq, self.operator.encode_footprint(window.state), None)
        self.stats.gopens += 1

    def _dead_letter(self, tup: InputTuple, reason: str) -> None:
        if self._rebuilding:
            return  # its dead letter is already in the log (see _emit)
        self._emit(Kind.DEAD, None, -1, None, self._dead.payload(tup, reason))
        self.stats.dead_letters += 1

    def gcheck_run(self, windows: list[OpenWindow]) -> None:
        """G-checks of `windows` (open ones, the oldest first as the controller chose them), all taken at
        this moment: one record each, with the same time, pos, N and marks, each its own out_mark."""
        count = len(windows)
        time_ = self._time
        marks = () if self._wm is None else self._wm.stamp()
        n = self._registry.n
        states = self.operator.encode_footprints(list(map(_STATE, windows)))
        self._registry.footprint_run(windows, time=time_, out_mark=self._out_count, in_mark=self._in_count)
        self._out_count += count
        self.stats.outputs += count
        self.stats.gchecks += count
        self.sink.gchecks(windows, states, time_, self._pos, n, marks)

    def end_of_input(self) -> None:
        """The input ended: recovery (if it had not) ends, the tuples held back are applied, and the EOS
        record closes the log; DONE."""
        self._advance(input_ended=True)
        self._out_count += 1
        self.stats.outputs += 1
        marks = () if self._wm is None else self._wm.stamp()
        self.sink.end_of_stream(self._time, self._pos, self._registry.n, marks)
        self.lifecycle.finish()

    # -- recovery --------------------------------------------------------------------------------------
    def restore(
        self, recovery: Recovery, *, where: str = "", logged_results: Sequence[Mapping[str, Any]] = ()
    ) -> None:
        """Load the eventual checkpoint of a non-empty log and start RESTORING under its replay contract
        (`phase`); the input is then to be read from `recovery.plan.start` (this instance's positions).
        A log that ends with EOS leaves the instance DONE at its crash point. `logged_results`: results at
        the log's end (at least those with the crash point's `pos`) of an operator with
        `unique_results`, which `emit` does not make again."""
        if logged_results and self.operator.unique_results:
            self._logged_results = {self.operator.result_identity(r) for r in logged_results}
        ec = recovery.checkpoint
        assert ec.crash_pos is not None
        self.stats.resumed = True
        self.stats.recovery = recovery.report
        if self._wm is not None:
            try:
                self._wm.restore(ec.marks)
            except RecoveryError as exc:
                raise RecoveryError(f"{where}: {exc}" if where else str(exc)) from None
        # Oldest footprint first, so the registry order is the log order. Built in one pass and installed
        # in one call: at the paper's scale (92k windows) a per-window open() was ~0.3 s of the recovery.
        end = ec.end_offset
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
        self.next_seq.update([(window.key, window.seq + 1) for window in loaded])
        self._time = ec.time
        # Input counts are relative to the crash point, where the loaded windows' marks are taken.
        self._in_count = -recovery.plan.replay_span
        if recovery.complete:
            self._pos = list(ec.crash_pos)
            self.lifecycle.finish()
            return
        self._pos = list(recovery.plan.start)
        self.lifecycle.restore(recovery.plan)
        self._advance()  # nothing to replay: RUNNING at once

    def resume(
        self,
        state: HostState,
        contract: ReplayContract | None,
        *,
        logged_results: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """Install what a host kept of this instance between calls (`save`), with the replay contract
        when it is still restoring (rebuilt by the host: its windows' footprint positions live there).
        `logged_results`: as for `restore` (the results at the log's end, of the tuple the crash cut)."""
        if logged_results and self.operator.unique_results:
            self._logged_results = {self.operator.result_identity(r) for r in logged_results}
        pos, time_, marks, ends, held_back, restoring = state
        self._pos = list(pos)
        self._time = time_
        if self._wm is not None and marks is not None:
            self._wm.marks = list(marks)
        self._ends = list(ends)
        self._held_back = list(held_back)
        if restoring:
            assert contract is not None
            self.lifecycle.restore(contract)

    def save(self) -> HostState:
        """What `resume` installs again (the windows are the host's own)."""
        marks = None if self._wm is None else list(self._wm.marks)
        restoring = self.lifecycle.phase is Phase.RESTORING
        return (list(self._pos), self._time, marks, list(self._ends), list(self._held_back), restoring)

    def _advance(self, *, input_ended: bool = False) -> bool:
        """RESTORING -> RUNNING if the phase rule holds now (`Lifecycle.advance`); then the tuples held
        back are applied, in their order."""
        if not self.lifecycle.advance(self._pos, input_ended=input_ended):
            return False
        held, self._held_back = self._held_back, []
        for tup in held:
            self._apply(tup)
        return True

    # -- watermarks ------------------------------------------------------------------------------------
    def _track_end(self, window: OpenWindow) -> None:
        end = self.operator.window_end_after(window.state, self.watermark)
        if end is not None:
            heapq.heappush(self._ends, (end, window.key, window.seq))

    def _expire(self) -> None:
        """Close every open window whose end the watermark has passed, in (end, key, seq) order (the
        operator's `close_expired`: one that closes windows together may take others along, or leave one
        for a later one's close)."""
        assert self._wm is not None
        w = self._wm.value
        ends = self._ends
        if w is None:
            return
        registry = self._registry
        while ends and ends[0][0] <= w:
            end, key, seq = heapq.heappop(ends)
            window = registry.get(key)
            if window is None or window.seq != seq:
                continue  # closed already by its own input
            later = self.operator.close_expired(window, end, self)
            if later is not None:
                heapq.heappush(ends, (later, key, seq))

    # -- applying tuples -------------------------------------------------------------------------------
    def apply_run(self, tuples: Sequence[InputTuple]) -> None:
        """Apply `tuples` in order, each through the fastest path whose rules are the ones that apply
        (module doc); the phase may change inside the run."""
        i, count = 0, len(tuples)
        while i < count:
            if self.lifecycle.contract is None:
                apply = self._apply_plain if self._wm is None else self._apply
                for k in range(i, count):
                    apply(tuples[k])
                return
            if self._wm is None:
                i = self._replay_run(tuples, i)
                if i >= count or self.lifecycle.contract is None:
                    continue
            # A tuple past its partition's crash point while another partition still replays, or any tuple
            # under a watermark: every rule applies.
            self._apply(tuples[i])
            i += 1

    def apply(self, tup: InputTuple) -> TupleFate | None:
        """Apply one tuple through every rule; its fate under the replay contract (PROCESS when not
        restoring), or None if it was held back (a watermark while another partition replays)."""
        return self._apply(tup)

    def _apply_plain(self, tup: InputTuple) -> None:
        """`_apply` when the instance is RUNNING and keeps no watermark, the steady state of most runs: the
        same steps in the same order, without the checks of the replay and watermark rules, which cannot
        apply (the per-tuple path of throughput)."""
        j, o = tup.partition, tup.offset
        pos = self._pos
        pos[j] = o + 1
        self._in_count += 1
        self.stats.inputs += 1
        self._current = (j, o)
        operator = self.operator
        event_time = None
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
                        self._gopen(window)
                opens.clear()
        finally:
            self._current = None
        if self._held:
            self._event_time = event_time
            self._release(j, o)

    def _apply(self, tup: InputTuple) -> TupleFate | None:
        j, o = tup.partition, tup.offset
        contract = self.lifecycle.contract
        replaying = contract is not None and o < contract.crash_pos[j]
        if contract is not None and not replaying and self._wm is not None:
            # A tuple at or past its partition's crash point shows that partition reached it: every tuple of
            # it below has been applied (locally its position is there already; a Spark state partition,
            # which sees only its own keys' tuples, learns it here).
            if self._pos[j] < contract.crash_pos[j]:
                self._pos[j] = contract.crash_pos[j]
            if not self._advance():
                # Past its partition's crash point while another partition still replays: held back
                # until every partition reached its own (recovery.contract, "watermarks").
                self._held_back.append(tup)
                return None
            contract = None  # recovery ended just now: this tuple is the first of RUNNING
        self._pos[j] = o + 1
        self._in_count += 1
        self.stats.inputs += 1
        fate = TupleFate.PROCESS
        if replaying:
            assert contract is not None
            key = None
            if tup.value is not None:
                try:
                    key = self.operator.key_of(tup.value)
                except BadTupleError:
                    key = None
            report = self.stats.recovery
            if report is not None:
                report.tuples_replayed += 1
            fate = contract.fate(j, o, key)
            if fate is TupleFate.SKIP:
                if report is not None:
                    report.tuples_skipped += 1
                if o + 1 >= contract.crash_pos[j]:
                    self._advance()  # the last replayed tuple of its partition
                return fate
            self._rebuilding = fate is TupleFate.REBUILD
        elif contract is not None:
            self._advance()  # past the crash point: recovery may be over with this tuple
        self._current = (j, o)
        wm = self._wm
        if wm is not None:
            wm.forget_tuple(j)  # until its event time is known, its records carry m as it is
        event_time = None
        try:
            if tup.value is None:
                self._dead_letter(tup, tup.error or "undecodable input")
            else:
                try:
                    event_time = self.operator.event_time(tup.value)
                    self._time = max(self._time, event_time if event_time is not None else sum(self._pos))
                    if wm is not None and event_time is not None:
                        wm.observe(j, event_time)
                        if self.lifecycle.contract is None:  # below the crash point W stays W(t_c)
                            self._expire()
                    self.operator.process(tup, self)
                except BadTupleError as exc:
                    self._dead_letter(tup, exc.reason)
            for window in self._pending_opens:
                if self._registry.get(window.key) is window:  # still open: not opened-and-closed by one tuple
                    self._gopen(window)
            self._pending_opens.clear()
        finally:
            self._current = None
            self._rebuilding = False  # only ever for the one replayed tuple
        if self._held:
            self._event_time = event_time
            self._release(j, o)
        if replaying and contract is not None and o + 1 >= contract.crash_pos[j]:
            self._advance()  # the last replayed tuple of its partition
        return fate

    def _replay_run(self, tuples: Sequence[InputTuple], first: int) -> int:
        """`_apply` of the tuples below their partition's crash point, from `tuples[first]` on, in one loop
        (RESTORING without a watermark): the same fates (`ReplayContract.fate`) and the same effects,
        without the per-tuple work that cannot apply there (no record is produced). Stops at the first
        tuple at or past its partition's crash point, or when recovery is over; returns where it stopped."""
        contract = self.lifecycle.contract
        assert contract is not None and self._wm is None
        report = self.stats.recovery
        crash = contract.crash_pos
        fate = contract.fate  # the contract's rule; below the crash point it is SKIP or REBUILD
        operator = self.operator
        key_of, event_time, process = operator.key_of, operator.event_time, operator.process
        pos = self._pos
        i, count = first, len(tuples)
        skipped = 0
        try:
            while i < count:
                tup = tuples[i]
                j, o = tup.partition, tup.offset
                if o >= crash[j]:
                    break
                i += 1
                pos[j] = o + 1
                self._in_count += 1
                value = tup.value
                key = None
                if value is not None:
                    try:
                        key = key_of(value)
                    except BadTupleError:
                        key = None
                tuple_fate = fate(j, o, key)
                if tuple_fate is TupleFate.SKIP:
                    # In the loaded state of its window, or of a window whose R is in the log.
                    skipped += 1
                elif tuple_fate is TupleFate.REBUILD:
                    # Only window state; whatever it produced the first time is in the log (_emit).
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
                                    self._gopen(window_opened)  # raises: see _emit
                            opens.clear()
                    finally:
                        self._rebuilding = False
                else:
                    # PROCESS below the partition's crash point: a key whose own crash point is lower
                    # (several generations on Spark); every rule applies.
                    pos[j] = o
                    self._in_count -= 1
                    i -= 1
                    break
                if o + 1 >= crash[j] and self._advance():
                    break  # recovery is over: the rest goes through the RUNNING paths
        finally:
            done = i - first
            self.stats.inputs += done
            if report is not None:
                report.tuples_replayed += done
                report.tuples_skipped += skipped
        return i
