"""A state partition of the attached query as an engine instance (`operators.engine`), for one call.

Spark keeps a state partition's whole state in one ValueState (`PartitionState`, pickled): every key's
facts as plain tuples (so the pickle stays one C-level pass), the engine state the instance needs between
calls (`operators.engine.instance.HostState`: positions applied, marks, window ends, tuples held back,
whether it is still restoring), its checkpoint controls, and `stamp`, the pos of the last record its rows
made (`operators.spark.stamping`). A call (`PartitionCall`) turns that into an `OperatorInstance` whose
registry loads a key's open window only when the key is met (`PartitionWindows`), and whose records become
the rows the sink stamps (`PartitionRows`, the Spark host's `RecordSink`); at its end the touched keys are
written back.

Per key (`KeyFacts`): its next window seq; its open window's generation of the latest footprint (`fp_gen`:
N counts the windows whose latest footprint is in this generation's log, `operators.spark.generations`);
`pos_w` for a window loaded from the EC (the input below which it holds every tuple; the contract's
window position); `live`: its last tuple was processed past the key's crash point, so its state holds
every tuple of the key so far and a G-check may claim them; `fp_clock`, `fp_out`: the input position and
the partition's records emitted in this run when its latest footprint was made (the controller's u and
q); `fp_time`: the logical time that footprint has in its log (`operators.spark.stamping.log_time`: what
trimming finds its offset by); (`last_j`, `last_o`): the key's last applied tuple, which its G-check
claims.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

from cec.records import Kind
from cec.registry import OpenWindow, WindowRegistry
from operators.aggregate import AggState
from operators.base import InputTuple, Operator
from operators.engine.instance import HostState, OperatorInstance
from operators.engine.records import HeldRecord, Marks, Moment
from operators.hopping import PaneRun
from operators.multi_state import ColumnState, MultiState
from operators.spark.checkpointing import PartitionControl
from operators.spark.stamping import GCHECK_ORDER  # a timer's G-check row (the sink writes it after the rest)
from recovery.contract import ReplayContract

__all__ = [
    "GCHECK_ORDER",
    "KeyFacts",
    "PartitionCall",
    "PartitionRows",
    "PartitionState",
    "PartitionWindows",
    "flat_state",
    "state_of",
]

_NO_TIME = -(1 << 62)  # below every logical time: the stream index answers the log start for it
_R, _GOPEN, _GCHECK, _DEAD = Kind.R, Kind.GOPEN, Kind.GCHECK, Kind.DEAD
_KIND_NAME = {kind: kind.value for kind in Kind}  # Enum.value is a descriptor call: too slow per record
_MULTI_FIELDS = 4  # len(flat_state(MultiState)); a single aggregate's has 6
_PANES_FIELDS = 2  # len(flat_state(PaneRun))
_PANES = "panes"


class KeyFacts:
    """One key's facts in a state partition (module doc). The defaults are class attributes: a call makes
    one per key it meets, and most keep most of them (a new one costs no Python-level call this way)."""

    next_seq = 0
    window: OpenWindow | None = None
    fp_gen = -1
    pos_w: tuple[int, ...] | None = None
    live = False
    fp_clock: tuple[int, ...] | None = None
    fp_out = 0  # the partition's records emitted in this run when its latest footprint was made
    fp_time: int | None = None  # the latest footprint's logical time in its log
    last_j = -1
    last_o = -1


# A key as saved in the partition's state: (next_seq, open seq or -1, `flat_state` or None, fp_gen,
# pos_w, live, fp_clock, last_j, last_o, fp_out, fp_time). Plain tuples: the pickle of a partition stays one
# C-level pass.
Saved = tuple[int, int, tuple[Any, ...] | None, int, Any, bool, Any, int, int, int, int | None]


def flat_state(state: AggState | MultiState | PaneRun) -> tuple[Any, ...]:
    """A window's state as plain values (`Saved`): a single aggregate's six fields, several aggregates'
    (count, start, last, per value column (n, exact total as `_split`'s odd part and shift, min, max)), or a
    hopping part's panes
    (`_PANES` and each pane's several-aggregate fields)."""
    if type(state) is AggState:
        return (state.count, state.total, state.lo, state.hi, state.start, state.last)
    if type(state) is PaneRun:
        return (_PANES, tuple(_flat_multi(pane) for pane in state.panes))
    assert isinstance(state, MultiState)
    return _flat_multi(state)


def _flat_multi(state: MultiState) -> tuple[Any, ...]:
    columns = tuple((c.n, *_split(c.total), c.lo, c.hi) for c in state.columns)
    return (state.count, state.start, state.last, columns)


def _split(total: int) -> tuple[int, int]:
    """An exact sum as (odd part, shift), total = odd << shift. The sums count units of 2^-1074
    (`operators.exact_sum`), so a sum of ordinary values ends in some thousand zero bits, which pickle
    writes out whole (~140 B a column, most of a session's or a pane's saved state)."""
    if not total:
        return (0, 0)
    shift = (total & -total).bit_length() - 1
    return (total >> shift, shift)


def _column(fields: tuple[Any, ...]) -> ColumnState:
    if len(fields) == 5:
        n, odd, shift, lo, hi = fields
        return ColumnState(n, odd << shift, lo, hi)
    return ColumnState(*fields)  # (n, total, lo, hi): saved before the sums were split


def _multi(fields: tuple[Any, ...]) -> MultiState:
    count, start, last, columns = fields
    return MultiState(count, start, last, [_column(c) for c in columns])


def state_of(fields: tuple[Any, ...]) -> AggState | MultiState | PaneRun:
    """`flat_state`'s inverse (the three forms differ in length)."""
    if len(fields) == _MULTI_FIELDS:
        return _multi(fields)
    if len(fields) == _PANES_FIELDS:
        return PaneRun([_multi(pane) for pane in fields[1]])
    return AggState(*fields)


def save_key(k: KeyFacts, next_seq: int) -> Saved:
    w = k.window
    if w is None:
        return (next_seq, -1, None, -1, None, False, None, k.last_j, k.last_o, 0, None)
    s = w.state
    return (
        next_seq,
        w.seq,
        # `flat_state` of a single aggregate's, inline: one call fewer per key stored.
        (s.count, s.total, s.lo, s.hi, s.start, s.last) if type(s) is AggState else flat_state(s),
        k.fp_gen,
        k.pos_w,
        k.live,
        k.fp_clock,
        k.last_j,
        k.last_o,
        k.fp_out,
        k.fp_time,
    )


def load_key(key: str | None, saved: Saved | None) -> KeyFacts:
    k = KeyFacts()
    if saved is None:
        return k
    next_seq, seq, state, fp_gen, pos_w, live, fp_clock, last_j, last_o, fp_out, fp_time = saved
    k.next_seq, k.last_j, k.last_o = next_seq, last_j, last_o
    if seq >= 0 and state is not None and key is not None:
        k.window = OpenWindow(key, seq, state_of(state), 0, 0, 0, 0)
        k.fp_gen, k.pos_w, k.live, k.fp_clock, k.fp_out = fp_gen, pos_w, live, fp_clock, fp_out
        k.fp_time = fp_time
    return k


def fresh_engine(width: int, marks: Sequence[int] | None) -> HostState:
    """The engine state of a partition before its first call: nothing applied, restoring (the contract
    says at once whether there is anything to replay), the crash record's marks if the log had any."""
    return ([0] * width, 0, None if marks is None else list(marks), [], [], True)


class PartitionState:
    """A state partition's keys (as `Saved` tuples), its output partition q, its timer (-1: none), its
    checkpointing measurements (`PartitionControl`), `stamp` and `stamp_time` (the pos and logical time of
    the last record its rows made; the log's crash record's before any) and the engine state between calls
    (module doc)."""

    __slots__ = ("control", "engine", "keys", "q", "stamp", "stamp_time", "timer")

    def __init__(
        self,
        q: int,
        stamp: tuple[int, ...],
        engine: HostState,
        keys: dict[str | None, Saved] | None = None,
        timer: int = -1,
        control: PartitionControl | None = None,
        stamp_time: int = 0,
    ) -> None:
        self.q = q
        self.stamp = stamp
        self.stamp_time = stamp_time
        self.engine = engine
        self.keys: dict[str | None, Saved] = keys if keys is not None else {}
        self.timer = timer
        self.control = control if control is not None else PartitionControl()

    def dump(self) -> tuple[bytes]:
        state = (self.q, self.timer, self.keys, self.control, self.stamp, self.engine, self.stamp_time)
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        # No memo: the state is a tree of plain values (no object reached twice matters: a shared tuple
        # comes back as two equal ones; a cycle would be refused, not looped over), and a memo entry per
        # key's tuples was most of the time of a dump (~6x at 100,000 keys).
        pickler.fast = True
        pickler.dump(state)
        return (buffer.getvalue(),)

    @classmethod
    def load(cls, row: Any) -> PartitionState:
        q, timer, keys, control, stamp, engine, stamp_time = pickle.loads(bytes(row[0]))
        return cls(q, stamp, engine, keys, timer, control, stamp_time)

    def live_windows(self) -> list[str | None]:
        """The keys whose open window may be G-checked (module doc: `live`)."""
        return [k for k, saved in self.keys.items() if saved[1] >= 0 and saved[5]]

    def open_count(self) -> int:
        return sum(1 for saved in self.keys.values() if saved[1] >= 0)

    def oldest_footprint_time(self, generation: int) -> int | None:
        """The lowest logical time among the latest footprints of the open windows whose footprint is in
        `generation`'s log (None: no such window): the engine's trim rule finds the offset by it."""
        times = [saved[10] for saved in self.keys.values() if saved[1] >= 0 and saved[3] == generation]
        if not times:
            return None
        # A footprint of unknown time (never expected) holds the whole log.
        return _NO_TIME if None in times else min(cast(list[int], times))


class PartitionWindows(WindowRegistry):
    """The instance's registry over a partition's saved keys: a key's open window is installed the first
    time the key is met (`get`, `open`, `close`), so a call touches only the keys of its rows."""

    def __init__(
        self,
        touch: Callable[[str | None], KeyFacts],
        touched: Mapping[str | None, KeyFacts],
        saved: Mapping[str | None, Saved] | None = None,
    ) -> None:
        super().__init__()
        self._touch = touch
        self._touched = touched
        self._saved: Mapping[str | None, Saved] = saved if saved is not None else {}

    def open_keys(self) -> list[str]:
        """Every open window's key: those met in this call as they stand now, and the saved open ones
        not met (without loading their states)."""
        keys = list(self._windows)
        touched = self._touched
        keys += [
            k for k, saved in self._saved.items() if saved[1] >= 0 and k is not None and k not in touched
        ]
        return keys

    @property
    def open_windows(self) -> Mapping[str, OpenWindow]:
        """The open windows of the keys touched in this call, by key (the keys not touched are not here)."""
        return self._windows

    def get(self, key: str) -> OpenWindow | None:
        window = self._windows.get(key)
        if window is None and key not in self._touched:
            self._touch(key)  # installs its saved open window; from then on this registry is the truth
            window = self._windows.get(key)
        return window

    def open(self, window: OpenWindow) -> None:
        key = window.key
        if key not in self._touched:  # as a rule `get` touched it just before
            self._touch(key)
        windows = self._windows  # `WindowRegistry.open`, inline (a call per window opened)
        if key in windows:
            raise KeyError(f"key {key!r} already has open window {windows[key].seq}")
        windows[key] = window

    def close(self, key: str) -> OpenWindow:
        self._touch(key)
        return super().close(key)


class _WindowPositions(Mapping[str, tuple[int, ...]]):
    """The replay contract's window positions: each key's EC window `pos_w`, read from its facts."""

    def __init__(self, touch: Callable[[str | None], KeyFacts]) -> None:
        self._touch = touch

    def get(self, key: str, default: Any = None) -> Any:
        pos = self._touch(key).pos_w
        return default if pos is None else pos

    def __getitem__(self, key: str) -> tuple[int, ...]:
        pos = self._touch(key).pos_w
        if pos is None:
            raise KeyError(key)
        return pos

    def __iter__(self) -> Iterator[str]:  # pragma: no cover - the contract only looks keys up
        raise TypeError("a partition's window positions are looked up, never listed")

    def __len__(self) -> int:  # pragma: no cover
        raise TypeError("a partition's window positions are looked up, never counted")


class PartitionRows:
    """The Spark host's `RecordSink`: the instance's records as rows in `processor.EMIT_COLUMNS` order,
    (q, j, o, emission index, kind, key, seq, state, payload, event time, N delta, marks, live position);
    the sink stamps them later (`operators.spark.stamping`). The emission index is the order the instance
    made them (the order it applied its tuples); a G-check row claims its key's last applied tuple. N delta:
    +1 on a G-open, -1 on the R of a window whose latest footprint is in this generation's log, +1 on a
    G-check that moves a footprint into it. `facts`: the call's touched keys; `touch` adds one."""

    def __init__(
        self,
        q: int,
        generation: int,
        touch: Callable[[str | None], KeyFacts],
        facts: Mapping[str | None, KeyFacts],
        out_base: int,
    ) -> None:
        self.q = q
        self.generation = generation
        self.touch = touch
        self.facts = facts
        self.out_base = out_base  # the partition's records emitted in this run before this call
        self.rows: list[tuple[Any, ...]] = []
        self.produced = 0  # the records tuples made so far (a timer's G-checks are not among them)

    def tuple_records(self, at: Moment, tup: InputTuple, held: list[HeldRecord], marks: Marks | None) -> None:
        rows, generation, q = self.rows, self.generation, self.q
        t = at.tuple_event_time
        if t is None:
            t = -1
        positions = list(at.positions)  # the instance's, as it is now: it moves with the next tuple
        j, o = tup.partition, tup.offset
        produced = self.produced
        self.produced = produced + len(held)
        for i, (kind, key, seq, state, payload, _n) in enumerate(held, produced):
            dn = 0
            if key is not None and kind is not _DEAD:
                k = self.facts.get(key) or self.touch(key)
                if kind is _GOPEN:
                    dn = 1
                    k.fp_gen, k.pos_w = generation, None
                    k.fp_out = self.out_base + len(rows) + 1
                elif kind is _R:
                    dn = -1 if k.fp_gen == generation else 0
                    k.fp_gen, k.pos_w, k.live, k.fp_clock, k.fp_time = -1, None, False, None, None
                elif kind is _GCHECK:  # one a tuple made (a session's fold): its footprint moves here
                    dn = 0 if k.fp_gen == generation else 1
                    k.fp_gen = generation
                    k.fp_out = self.out_base + len(rows) + 1
            record_marks = None if marks is None else list(marks[i - produced])
            rows.append((q, j, o, i, _KIND_NAME[kind], key, seq, state, payload, t, dn, record_marks,
                         positions))  # fmt: skip

    def gchecks(
        self, at: Moment, windows: Sequence[OpenWindow], states: list[bytes], marks: tuple[int, ...]
    ) -> None:
        rows, generation = self.rows, self.generation
        record_marks = list(marks) if marks else None
        positions = list(at.positions)
        for window, state in zip(windows, states, strict=True):
            k = self.touch(window.key)
            dn = 0 if k.fp_gen == generation else 1  # its latest footprint moves into this log
            k.fp_gen = generation
            rows.append((self.q, k.last_j, k.last_o, GCHECK_ORDER, _GCHECK.value, window.key, window.seq, state,
                         None, -1, dn, record_marks, positions))  # fmt: skip
            k.fp_out = self.out_base + len(rows)

    def end_of_stream(self, at: Moment, marks: tuple[int, ...]) -> None:
        raise RuntimeError("an attached query's input has no end: its logs have no EOS")


class PartitionCall:
    """One call of a state partition (module doc): its keys as they are touched, the instance over them,
    and the rows it made. `crash_pos` is the partition's crash point (with several generations, the bound
    of every key's own, `key_crash` filled by the caller as rows come). `forget_closed`: parts that never
    open again once closed (several aggregates under watermarks: a part per (key, window start), which the
    watermark closes, after which its tuples are late) are not kept after they close, so a partition's
    state holds its open windows, not every window it ever had."""

    def __init__(
        self,
        operator: Operator,
        part: PartitionState,
        generation: int,
        crash_pos: Sequence[int],
        *,
        per_key_crash: bool = False,
        forget_closed: bool = False,
        logged_results: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self.part = part
        self.forget_closed = forget_closed
        self.keys: dict[str | None, KeyFacts] = {}  # touched in this call
        self.key_crash: dict[str | None, Sequence[int]] | None = {} if per_key_crash else None
        self.rows = PartitionRows(part.q, generation, self.touch, self.keys, part.control.out)
        self.windows = PartitionWindows(self.touch, self.keys, part.keys)
        width = len(crash_pos)
        self.instance = OperatorInstance(
            operator, self.rows, width, registry=self.windows, closed_seq=self._closed_seq
        )
        engine = part.engine
        contract = None
        if engine[5]:  # still restoring
            contract = ReplayContract(
                (0,) * width, tuple(crash_pos), _WindowPositions(self.touch), self.key_crash
            )
        self.instance.resume(engine, contract, logged_results=logged_results)

    def touch(self, key: str | None) -> KeyFacts:
        k = self.keys.get(key)
        if k is None:
            saved = self.part.keys.get(key)
            k = self.keys[key] = KeyFacts() if saved is None else load_key(key, saved)
            if key is not None:
                # The key's next seq, known here: the instance need not ask `closed_seq` when it opens one.
                self.instance.next_seq.setdefault(key, k.next_seq)
                if k.window is not None:
                    self.windows._windows[key] = k.window
        return k

    def _closed_seq(self, key: str) -> int | None:
        return self.touch(key).next_seq - 1

    def store(self) -> None:
        """Write the touched keys and the engine state back into the partition's saved state."""
        keys, next_seq = self.part.keys, self.instance.next_seq
        for key, k in self.keys.items():
            k.window = self.windows._windows.get(key) if key is not None else None
            if self.forget_closed and k.window is None:
                keys.pop(key, None)  # a part that never opens again: nothing of it is needed (class doc)
                continue
            keys[key] = save_key(k, next_seq.get(key, k.next_seq) if key is not None else k.next_seq)
        self.part.engine = self.instance.save()

    def release(self) -> None:
        """Drop the call's per-key objects now, by reference count. The call and its registry reference each
        other (`touch`), so otherwise every key's facts, window and state wait for a full pass of the cyclic
        collector, which at 100,000 keys costs more than the call (`operators.collector`)."""
        self.keys.clear()
        self.windows._windows.clear()
