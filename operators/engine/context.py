"""The `OperatorContext` an operator acts through, and the records its calls make (`operators.engine`).

`InstanceContext` is the part of an operator instance the operator sees and the records that come out of it;
`operators.engine.instance.OperatorInstance` adds how tuples are applied (the replay contract, the phase,
the fast paths). Here, once for every host:
- window identity: per-key window sequences (`open_window`), N, the input position vector, logical time;
- the records of a tuple held until it is fully applied, then handed to the host's sink
  (`operators.engine.records.RecordSink`) with their marks, the last one claiming the tuple; G-open of a
  window still open after its opening tuple; dead letters (`operators.engine.records.DeadLetters`);
- while a tuple is REBUILT below the crash point no record may come out (a result or a window opening
  there means the log and the replay disagree: `ReplayDivergenceError`);
- event-time watermarks (`recovery.contract.Watermark`): open windows by the end where the watermark acts
  on them, closed in (end, key, seq) order;
- G-checks of the windows a host's controller chose (`gcheck_run`).

The sink reads the moment of a handover from the context itself (`operators.engine.records.Moment`):
`time`, `positions` and `tuple_event_time` are plain attributes, read per record.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any

from cec.records import AvroCodec, Kind
from cec.registry import OpenWindow, WindowRegistry
from operators.base import InputTuple, Operator
from operators.engine.records import DeadLetters, HeldRecord, RecordSink
from operators.engine.stats import RunStats
from operators.exceptions import EngineStateError
from recovery.contract import Watermark
from recovery.exceptions import ReplayDivergenceError

__all__ = ["InstanceContext", "loaded_window_ends"]

_STATE = attrgetter("state")
_GOPEN = Kind.GOPEN


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


class InstanceContext:
    """The `OperatorContext` of one operator instance and the records it makes (module doc); the
    constructor's arguments are `OperatorInstance`'s."""

    def __init__(
        self,
        operator: Operator,
        sink: RecordSink,
        partitions: int,
        *,
        footprints: bool,
        closed_seq: Any,
        registry: WindowRegistry | None,
        global_partitions: Sequence[int] | None,
        stats: RunStats | None,
    ) -> None:
        self.operator = operator
        self.sink = sink
        self.footprints = footprints
        self.stats = stats if stats is not None else RunStats()
        self._closed_seq = closed_seq
        self.registry = registry if registry is not None else WindowRegistry()
        self._result_codec = AvroCodec(operator.result_schema)
        self._dead = DeadLetters(global_partitions)
        # The input position vector: the next offset per input partition (everything below is applied).
        self.positions = [0] * partitions
        self.time = 0  # logical time (OperatorContext.time; `operators.engine.instance` module doc)
        self.tuple_event_time: int | None = None  # the event time of the tuple whose records are handed over
        self.next_seq: dict[str, int] = {}  # the next window seq of the keys met (open or closed)
        # Windows opened by the tuple being applied and not closed since: each gets its G-open at its end.
        self._pending_opens: list[OpenWindow] = []
        self._in_count = 0
        self._out_count = 0
        self._rebuilding = False  # applying a replayed tuple below the crash point (REBUILD)
        self._current: InputTuple | None = None  # the tuple being applied, whose records are held
        self._held: list[HeldRecord] = []
        lateness = operator.allowed_lateness
        self._wm: Watermark | None = None if lateness is None else Watermark(partitions, lateness)
        self._ends: list[tuple[int, str, int]] = []  # open windows by (end, key, seq), for the watermark
        self._logged_results: set[object] = set()  # identities of the results at the log's end (restore)

    # -- OperatorContext -------------------------------------------------------------------------------
    @property
    def watermark(self) -> int | None:
        """The event-time watermark W (recovery.contract), or None: none kept, or not yet known."""
        return None if self._wm is None else self._wm.value

    def open_window(self, key: str, state: Any) -> OpenWindow:
        seq = self.next_seq.get(key)
        if seq is None:
            last = None if self._closed_seq is None else self._closed_seq(key)
            seq = 0 if last is None else last + 1
        time_ = self.time
        window = OpenWindow(key, seq, state, time_, time_, self._out_count, self._in_count)
        self.registry.open(window)
        if self._wm is not None:
            self._track_end(window)
        self.next_seq[key] = seq + 1
        self._pending_opens.append(window)
        return window

    def close_window(self, key: str, result: Mapping[str, Any] | None) -> None:
        window = self.registry.close(key)
        pending = self._pending_opens
        if pending:  # opened and closed by one tuple: no G-open (every close comes through here)
            for i, opened in enumerate(pending):
                if opened is window:
                    del pending[i]
                    break
        if result is None:  # an R without a result (OperatorContext.close_window)
            self._emit(Kind.R, window.key, window.seq, None, None)
            return
        self._emit(Kind.R, window.key, window.seq, None, self._result_codec.encode(result))
        self.stats.results += 1

    def checkpoint_window(self, key: str) -> None:
        window = self.registry.get(key)
        if window is None:
            raise EngineStateError(f"no open window {key!r} to checkpoint")
        if not self.footprints:
            return
        self.registry.footprint(key, time=self.time, out_mark=self._out_count, in_mark=self._in_count)
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
        self._held.append((kind, key, seq, state, payload, self.registry.n))

    def _gopens(self) -> None:
        """The G-open of each window the tuple being applied opened and left open, in the order they
        opened (after the tuple's other records)."""
        opens = self._pending_opens
        if not self.footprints:
            opens.clear()
            return
        if self._rebuilding:
            window = opens[0]
            self._emit(_GOPEN, window.key, window.seq, None, None)  # raises: see _emit
        registry, held = self.registry, self._held
        encode, footprint = self.operator.encode_footprint, registry.footprint
        time_, in_count = self.time, self._in_count
        for window in opens:
            footprint(window.key, time=time_, out_mark=self._out_count, in_mark=in_count)
            self._out_count += 1
            held.append((_GOPEN, window.key, window.seq, encode(window.state), None, registry.n))
        count = len(opens)
        self.stats.outputs += count
        self.stats.gopens += count
        opens.clear()

    def _release(self, tup: InputTuple, event_time: int | None) -> None:
        """Hand the records of `tup` to the sink now that it is fully applied: the last one claims it, each
        carries its marks (recovery.contract: "claiming", "watermarks")."""
        held, self._held = self._held, []
        wm = self._wm
        marks = None
        if wm is not None:
            last = len(held) - 1
            marks = [wm.stamp(tup.partition, claims=i == last) for i in range(len(held))]
        self.tuple_event_time = event_time
        self.sink.tuple_records(self, tup, held, marks)

    def _dead_letter(self, tup: InputTuple, reason: str) -> None:
        if self._rebuilding:
            return  # its dead letter is already in the log (see _emit)
        self._emit(Kind.DEAD, None, -1, None, self._dead.payload(tup, reason))
        self.stats.dead_letters += 1

    def gcheck_run(self, windows: list[OpenWindow]) -> None:
        """G-checks of `windows` (open ones, the oldest first as the controller chose them), all taken at
        this moment: one record each, with the same time, pos, N and marks, each its own out_mark."""
        count = len(windows)
        marks = () if self._wm is None else self._wm.stamp()
        states = self.operator.encode_footprints(list(map(_STATE, windows)))
        self.registry.footprint_run(windows, time=self.time, out_mark=self._out_count, in_mark=self._in_count)
        self._out_count += count
        self.stats.outputs += count
        self.stats.gchecks += count
        self.sink.gchecks(self, windows, states, marks)

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
        registry = self.registry
        while ends and ends[0][0] <= w:
            end, key, seq = heapq.heappop(ends)
            window = registry.get(key)
            if window is None or window.seq != seq:
                continue  # closed already by its own input
            later = self.operator.close_expired(window, end, self)
            if later is not None:
                heapq.heappush(ends, (later, key, seq))
