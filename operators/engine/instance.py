"""One operator instance under CEC, host-neutral: it neither loops nor does I/O (`operators.engine`).

`OperatorInstance` is the `OperatorContext` an operator acts through (`operators.engine.context`: window
identity, the records a tuple makes, dead letters, watermarks, G-checks) plus how tuples are applied. The
host hands it input tuples (`apply_run`, `apply`) and receives records through its `RecordSink`. Here:
- the replay contract while RESTORING (`recovery.contract`, asked through `operators.engine.phase`):
  SKIP, REBUILD (state only: whatever such a tuple produced the first time is in the log, so producing a
  record there means the log and the replay disagree) or PROCESS;
- with watermarks, windows whose end the watermark passed close in (end, key, seq) order before the tuple
  that moved it is applied, and while RESTORING the tuples past a partition's crash point are held back
  until every partition reached its own;
- restoring from an eventual checkpoint, and what a host keeps of the instance between calls (`save`,
  `resume`); the EOS record.

Logical time is the largest event time seen when the operator has one, else the number of input offsets
consumed (sum of positions): either way it never decreases along the log and is restored from the crash
point.

Three ways through a tuple, the same effects: `_apply` (every rule), `_plain_run` (RUNNING without a
watermark: no replay or watermark rule can apply) and `_replay_run` (RESTORING without a watermark, a run
of tuples below their crash points: no record can be produced). `apply_run` picks them; the fast ones are
the ones production runs, and the crash tests run them too (their kills come from outside the process or
from test-side wrappers, never from a branch in here).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from cec.exceptions import BadTupleError
from cec.registry import WindowRegistry
from operators.base import InputTuple, Operator
from operators.engine.context import InstanceContext, loaded_window_ends
from operators.engine.phase import Lifecycle, Phase
from operators.engine.records import RecordSink
from operators.engine.stats import RunStats
from recovery.contract import ReplayContract, TupleFate
from recovery.exceptions import RecoveryError

if TYPE_CHECKING:
    from recovery.manager import Recovery, RecoveryReport

__all__ = ["HostState", "OperatorInstance", "loaded_window_ends"]

_KEY, _SEQ = attrgetter("key"), attrgetter("seq")
_AFTER = (1).__add__  # a window's seq -> the next window's

# What a host that keeps an instance between calls (the Spark state partition) saves of it besides its
# windows: the input positions applied, logical time, event-time marks, the open windows' ends (for the
# watermark), the tuples held back while restoring, and whether it is still restoring.
HostState = tuple[list[int], int, list[int] | None, list[tuple[int, str, int]], list[InputTuple], bool]


class OperatorInstance(InstanceContext):
    """The `OperatorContext` of one operator instance and how its tuples are applied (module doc).

    `closed_seq(key)`: the last closed window seq of a key this instance has not met yet (the stream index
    of the output log locally; the state partition's saved keys on Spark), None if none; a host that knows
    a key's next seq may put it in `next_seq` before the key's tuple is applied instead. `registry`: a
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
        super().__init__(
            operator,
            sink,
            partitions,
            footprints=footprints,
            closed_seq=closed_seq,
            registry=registry,
            global_partitions=global_partitions,
            stats=stats,
        )
        self.lifecycle = Lifecycle()
        self._held_back: list[InputTuple] = []  # past a crash point while another partition replays

    # -- what the host reads ---------------------------------------------------------------------------
    @property
    def phase(self) -> Phase:
        return self.lifecycle.phase

    @property
    def contract(self) -> ReplayContract | None:
        """The replay contract while RESTORING, else None."""
        return self.lifecycle.contract

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

    def end_of_input(self) -> None:
        """The input ended: recovery (if it had not) ends, the tuples held back are applied, and the EOS
        record closes the log; DONE."""
        self._advance(input_ended=True)
        self._out_count += 1
        self.stats.outputs += 1
        marks = () if self._wm is None else self._wm.stamp()
        self.sink.end_of_stream(self, marks)
        self.lifecycle.finish()

    # -- recovery --------------------------------------------------------------------------------------
    def restore(
        self, recovery: Recovery, *, where: str = "", logged_results: Sequence[Mapping[str, Any]] = ()
    ) -> None:
        """Load the eventual checkpoint of a non-empty log and start RESTORING under its replay contract
        (`phase`); the input is then to be read from `recovery.plan.start` (this instance's positions), or
        from the crash point when the states are as of it already (`recovery.at_crash_point`: RUNNING).
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
        # Oldest footprint first, so the registry order is the log order; installed in one call.
        install_started = time.perf_counter()
        loaded = recovery.windows
        self.registry.load(loaded)
        if self._wm is not None:
            for window in loaded:
                self._track_end(window)
        # C-level columns (no Python frame per window: ~0.05 s at 90k windows in a large heap).
        self.next_seq.update(zip(map(_KEY, loaded), map(_AFTER, map(_SEQ, loaded)), strict=True))
        recovery.report.install_seconds = time.perf_counter() - install_started
        self.time = ec.time
        # Input counts are relative to the crash point, where the loaded windows' marks are taken.
        self._in_count = 0 if recovery.at_crash_point else -recovery.plan.replay_span
        if recovery.complete:
            self.positions = list(ec.crash_pos)
            self.lifecycle.finish()
            return
        # States already at the crash point (a standby's replica applied the input): nothing to replay.
        self.positions = list(ec.crash_pos if recovery.at_crash_point else recovery.plan.start)
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
        self.positions = list(pos)
        self.time = time_
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
        return (list(self.positions), self.time, marks, list(self._ends), list(self._held_back), restoring)

    def _advance(self, *, input_ended: bool = False) -> bool:
        """RESTORING -> RUNNING if the phase rule holds now (`Lifecycle.advance`); then the tuples held
        back are applied, in their order."""
        if not self.lifecycle.advance(self.positions, input_ended=input_ended):
            return False
        held, self._held_back = self._held_back, []
        for tup in held:
            self._apply(tup)
        return True

    # -- applying tuples -------------------------------------------------------------------------------
    def apply_run(self, tuples: Sequence[InputTuple]) -> None:
        """Apply `tuples` in order, each through the fastest path whose rules are the ones that apply
        (module doc); the phase may change inside the run."""
        i, count = 0, len(tuples)
        while i < count:
            if self.lifecycle.contract is None:
                if self._wm is None:
                    self._plain_run(tuples, i)
                    return
                for k in range(i, count):
                    self._apply(tuples[k])
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

    def _plain_run(self, tuples: Sequence[InputTuple], first: int) -> None:
        """`_apply` of `tuples[first:]` when the instance is RUNNING and keeps no watermark, the steady
        state of most runs: the same steps in the same order, in one loop, without the checks of the
        replay and watermark rules, which cannot apply (the per-tuple path of throughput)."""
        operator = self.operator
        event_time_of, process = operator.event_time, operator.process
        pos = self.positions
        offsets = sum(pos)  # sum(pos), kept as pos moves: the logical time of an operator without event time
        opens, tuple_records = self._pending_opens, self.sink.tuple_records
        idx, count = first, len(tuples)
        try:
            while idx < count:
                tup = tuples[idx]
                idx += 1
                j, o = tup.partition, tup.offset
                offsets += o + 1 - pos[j]
                pos[j] = o + 1
                self._in_count += 1
                self._current = tup
                event_time = None
                value = tup.value
                if value is None:
                    self._dead_letter(tup, tup.error or "undecodable input")
                else:
                    try:
                        event_time = event_time_of(value)
                        t = offsets if event_time is None else event_time
                        if t > self.time:
                            self.time = t
                        process(tup, self)
                    except BadTupleError as exc:
                        self._dead_letter(tup, exc.reason)
                if opens:
                    self._gopens()
                held = self._held
                if held:  # `_release` without watermark marks
                    self._held = []
                    self.tuple_event_time = event_time
                    tuple_records(self, tup, held, None)
        finally:
            self._current = None
            self.stats.inputs += idx - first

    def _apply(self, tup: InputTuple) -> TupleFate | None:
        j, o = tup.partition, tup.offset
        contract = self.lifecycle.contract
        replaying = contract is not None and o < contract.crash_pos[j]
        if contract is not None and not replaying and self._wm is not None:
            # A tuple at or past its partition's crash point shows that partition reached it: every tuple of
            # it below has been applied (locally its position is there already; a Spark state partition,
            # which sees only its own keys' tuples, learns it here).
            if self.positions[j] < contract.crash_pos[j]:
                self.positions[j] = contract.crash_pos[j]
            if not self._advance():
                # Past its partition's crash point while another partition still replays: held back
                # until every partition reached its own (recovery.contract, "watermarks").
                self._held_back.append(tup)
                return None
            contract = None  # recovery ended just now: this tuple is the first of RUNNING
        self.positions[j] = o + 1
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
        self._current = tup
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
                    self.time = max(self.time, event_time if event_time is not None else sum(self.positions))
                    if wm is not None and event_time is not None:
                        wm.observe(j, event_time)
                        if self.lifecycle.contract is None:  # below the crash point W stays W(t_c)
                            self._expire()
                    self.operator.process(tup, self)
                except BadTupleError as exc:
                    self._dead_letter(tup, exc.reason)
            if self._pending_opens:
                self._gopens()
        finally:
            self._current = None
            self._rebuilding = False  # only ever for the one replayed tuple
        if self._held:
            self._release(tup, event_time)
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
        pos = self.positions
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
                                if t > self.time:
                                    self.time = t
                                process(tup, self)
                            except BadTupleError:
                                pass  # its dead letter is in the log already
                        if self._pending_opens:
                            self._gopens()  # raises: see _emit
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
