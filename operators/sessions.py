"""Session windows of the aggregates: `cec run --session-gap 30m --time ts` (as Spark's `session_window`).

Per key, tuples less than the gap apart share a session `[first, last + gap)`: `first` and `last` are the
smallest and largest event time of its tuples. Each session's result is one row per (key, session) with
every aggregate of `operators.multi_aggregate` (composite keys, SQL's null rule, exact order-independent
sums) and `start`/`end` the session's bounds. Two ways to close sessions:

Per key, without watermarks (`window` = the key's session number). A key has at most one open session. A
tuple of the key at time `t` whose open session is `[first, last + gap)`:
- `t >= last + gap`: the session closes (its result, R), and the tuple opens the key's next session;
- `first - gap < t < last + gap`: the tuple joins the session (`first` and `last` stretch to take it);
- `t <= first - gap`: late, a dead letter (its own session would lie wholly before the open one, which
  was already closed or never existed in this key's input order).
The key's last session stays open at the end of the input, as a time window does without watermarks.

With watermarks (`--allowed-lateness`; `window` = first // gap), for keys whose tuples come from several
input partitions: a tuple between two open sessions merges them, and the sessions do not depend on how
the partitions interleave. The window parts are gap-wide slices: (key, slice), slice = t // gap. A session
is a run of consecutive open slices, two neighbours joined when the later one's first tuple is less than
the gap after the earlier one's last (two tuples of one slice are less than the gap apart, so a slice
lies in one session; slices with an empty one between are the gap or more apart), read from the slices'
states. As Spark's `session_window`, each session closes once the watermark W is at or past its own end
(`last + gap` of its last slice), whatever its neighbouring slices hold: a slice's watermark turn comes at
its own last tuple's end (`window_end`, never past its session's); `close_expired` then reads the session
from the open slices around it and closes it if W has passed its end, else leaves the turn to the
session's last slice at that end. Each session is folded into its last slice, one slice at a time: the
receiving slice's G-check with both states, then the giving slice's R without a result; the last slice's
R carries the session's result. A tuple whose slice is not open is late (a dead letter) once W is at or
past the slice's end; so no tuple accepted later can reach a closed session (its slices all end at or
before its end, which W has passed). Only a tuple more than the allowed lateness behind its partition's
largest time can be behind W; such a tuple, less than the gap after a closed session, opens a new session
(Spark's `session_window` also starts a new one there, or drops the tuple when W is a gap past it).

Why the sessions stay in gap-wide slices, closed one session at a time, rather than one part per session:
a part's id must follow from the tuple alone (`key_of`), so that a replayed tuple below the crash point
finds its part in the EC (skip rule, below), while a session's bounds depend on the tuples that came
before it, in any partition order (a merge joins two). The slice is the widest id that needs no other
tuple, and a session is a run of them; closing each session at its own end keeps every part a slice:
the records are the same G-checks and R's as for a run's close, only written per session.

Why recovery is exact (DESIGN-NOTES section 2). Per key, a session is a window part identified by (key,
seq) exactly as a per-key tumbling time window is; with watermarks each slice is one, (key+slice, seq).
- G-open (after the opening tuple) and G-checks carry the part's state: the count, `first`, `last` and per
  value column the exact sum, min and max (`operators.multi_state`); the EC rule takes the first footprint
  met reading back as the part's latest.
- R is the part's last footprint, with a result or, for a slice folded into a later one, without one (its
  state is in that one's footprint, which comes first; every results reader skips it): a part whose R is
  met is closed and its older footprints are skipped. Per key, the tuple that closes a session opens the
  next one; its R does not claim the tuple and its G-open does (`recovery.contract`, "claiming"), so a log
  that ends between them replays that tuple, which opens the next session again.
- With watermarks a session's records come from the engine's expiry before the tuple that moved W is
  applied and carry the marks from before it (`recovery.contract`, "watermarks"): a log that ends among
  them replays that tuple, and W passes the same sessions again (those whose R is in the log are
  closed). Every prefix of a fold holds each tuple once: cut after a receiver's G-check, the EC holds the receiver with both states and the giver still open with
  its own; the receiver's state then begins before its own slice, which says the giver is in it, and the
  close closes the giver without a result instead of folding it in again. Cut after the giver's R, the
  giver is closed and its state is in the receiver. A part whose R is in the log is never closed twice.
- A replayed tuple below the crash point goes to its part by the tuple alone (`key_of`: the key, or the
  key and the tuple's slice), so the skip rule holds unchanged: in an EC part, SKIP below its footprint's
  `pos`, else REBUILD; in no EC part, it belonged to a part whose R is in the log, or was a dead letter:
  SKIP. A merge moves no state and writes no record: whether the merge happened before the crash point or
  after it, each tuple is in its own slice's state, and the session is read from the slices at close.
  Replay closes nothing below the crash point (W stays W(t_c) while restoring). A REBUILD tuple's slice is
  open in the EC, so it is not late now, as it was not the first time; a tuple that was late had no open
  slice, and its slice never opened after (W passed its end), so it has no EC part: SKIP.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from cec.exceptions import BadTupleError, ConfigError
from cec.registry import OpenWindow
from operators import exact_sum
from operators.aggregate import canonical_key
from operators.base import InputTuple, OperatorContext
from operators.multi_aggregate import AggregateColumn, MultiAggregate
from operators.multi_state import ColumnState, MultiState, decode_state, empty_column
from operators.windows import Windows

__all__ = ["SessionAggregate", "SessionWindows", "merged"]


class SessionWindows(Windows):
    """Per-key sessions of tuples less than `gap_ms` apart (module doc). Only the key's own tuples close
    a session (no watermark)."""

    __slots__ = ("gap_ms",)

    def __init__(self, gap_ms: int, time_field: str) -> None:
        super().__init__(time_field, None)
        self.gap_ms = gap_ms

    def describe(self) -> str:
        return f"session gap={self.gap_ms}ms"

    @property
    def margin(self) -> int:
        return self.gap_ms  # a session's end lies `gap` past its last tuple

    def start_of(self, t: int) -> int:
        return t  # a session starts at its first tuple

    def closes_before(self, t: int, open_start: int | None, watermark: int | None) -> bool:
        raise NotImplementedError("a session's close depends on its last tuple: use `admits`")

    def admits(self, t: int, first: int, last: int) -> bool:
        """Whether a tuple at `t` joins the open session `[first, last + gap)`; False when it closes it
        (t at or past the end). BadTupleError (a dead letter, nothing changed) for a late tuple."""
        if t >= last + self.gap_ms:
            return False
        if t <= first - self.gap_ms:
            raise BadTupleError(
                f"late tuple: time {t} is a gap or more before its key's open session [{first}, "
                f"{last + self.gap_ms})"
            )
        return True

    def is_full(self, count: int) -> bool:
        return False

    def end_of(self, start: int, last: int) -> int:
        return last + self.gap_ms


class SessionAggregate(MultiAggregate):
    """`MultiAggregate` (several aggregates, composite keys) over session windows of `gap_ms`: closed by
    the key's next tuple, or with `allowed_lateness` by the event-time watermark over slices (module doc)."""

    def __init__(
        self,
        *,
        key_fields: Sequence[str],
        aggs: Sequence[tuple[str, str]],
        gap_ms: int,
        time_field: str | None,
        allowed_lateness: int | None = None,
    ) -> None:
        if isinstance(gap_ms, bool) or not isinstance(gap_ms, int) or gap_ms < 1:
            raise ConfigError(f"a session gap needs at least 1 ms, got {gap_ms!r}")
        if time_field is None:
            raise ConfigError("a session window needs a time field")
        # The tumbling window given here only runs MultiAggregate's checks of keys, aggregates and the
        # lateness; the windows are the sessions below.
        super().__init__(
            key_fields=key_fields,
            aggs=aggs,
            window_ms=gap_ms,
            time_field=time_field,
            allowed_lateness=allowed_lateness,
        )
        self.windows: SessionWindows = SessionWindows(gap_ms, time_field)  # type: ignore[assignment]
        self.window_ms = None
        self.session_gap_ms = gap_ms
        self.by_window = False  # MultiAggregate's parts per (key, window start): not these
        # With watermarks a window part is (key, slice) with slice = t // gap (module doc).
        self.by_slice = allowed_lateness is not None

    def describe(self) -> str:
        text = super().describe()
        if self.allowed_lateness is not None:
            text += f", watermark lateness {self.allowed_lateness}ms"
        return text

    # -- parts -----------------------------------------------------------------------------------------
    def _key_parts(self, value: Mapping[str, Any]) -> list[str | int]:
        parts: list[str | int] = []
        for field in self.key_fields:
            part = canonical_key(value.get(field), field)
            if part is None:
                raise BadTupleError(f"missing key {field!r}")
            parts.append(part)
        return parts

    @staticmethod
    def _part(parts: Sequence[str | int]) -> str:
        return json.dumps(list(parts), ensure_ascii=False, separators=(",", ":"))

    def key_of(self, value: Mapping[str, Any]) -> str | None:
        """The id of the tuple's window part: its key (as `MultiAggregate` makes it) per key; with
        watermarks the JSON array of the key's fields and the tuple's slice (t // gap)."""
        if not self.by_slice:
            return super().key_of(value)
        parts = self._key_parts(value)
        t = self.event_time(value)
        assert t is not None
        parts.append(t // self.session_gap_ms)
        return self._part(parts)

    # -- tuples ----------------------------------------------------------------------------------------
    def process(self, tup: InputTuple, ctx: OperatorContext) -> None:
        assert tup.value is not None
        key = self.key_of(tup.value)
        if key is None:
            raise BadTupleError(f"missing key {self.key_fields[0]!r}")
        xs = self._values(tup.value)
        t = self.event_time(tup.value)
        assert t is not None
        window = ctx.registry.get(key)
        if self.by_slice:
            joins = window is not None
            if window is None:
                self._check_not_late(t, getattr(ctx, "watermark", None))
        else:
            joins = window is not None and self.windows.admits(t, window.state.start, window.state.last)
        exact = exact_sum.exact
        scaled = [None if x is None else exact(x) for x in xs]
        if window is not None and joins:
            limit = exact_sum.OVERFLOW
            for i, col in enumerate(window.state.columns):
                si = scaled[i]
                if si is not None and abs(col.total + si) >= limit:
                    raise BadTupleError(f"value {self.value_fields[i]!r} would overflow its session's sum")
        # Every check is done: from here on the tuple changes state and cannot fail.
        if window is not None and joins:
            state: MultiState = window.state
            state.count += 1
            if t < state.start:
                state.start = t
            if t > state.last:
                state.last = t
            for x, si, col in zip(xs, scaled, state.columns, strict=True):
                if x is not None and si is not None:
                    col.add(x, si)
            return
        if window is not None:
            ctx.close_window(key, self._result(key, window.seq, window.state))
        columns = [
            empty_column() if x is None or si is None else ColumnState(1, si, x, x)
            for x, si in zip(xs, scaled, strict=True)
        ]
        ctx.open_window(key, MultiState(1, t, t, columns))

    def _check_not_late(self, t: int, watermark: int | None) -> None:
        """A tuple whose slice has no open part is late once the watermark is at or past the slice's end."""
        gap = self.session_gap_ms
        low = t - t % gap
        if watermark is not None and low + gap <= watermark:
            raise BadTupleError(
                f"late: time {t} is in [{low}, {low + gap}), which holds no open session and which the "
                f"watermark {watermark} has passed"
            )

    # -- closing by the watermark ----------------------------------------------------------------------
    def window_end(self, state: MultiState) -> int | None:
        if not self.by_slice:
            return None  # only the key's next tuple closes a session
        # The slice's own last tuple's end: no later than its session's end (`last + gap` of the session's
        # last slice), which `close_expired` reads when the watermark gets here.
        return state.last + self.session_gap_ms

    def close_expired(self, window: OpenWindow, end: int, ctx: OperatorContext) -> int | None:
        """The watermark passed `end` of slice `window`: close the slice's session if the watermark has
        passed the session's own end too; else return that end if the slice is the session's last one
        (only the last slice's turn closes a session: the others' turns go) (module doc)."""
        parts = json.loads(window.key)
        prefix, own = parts[:-1], parts[-1]
        registry = ctx.registry
        gap = self.session_gap_ms
        # The session is the slices joined to this one: neighbours (open, consecutive) whose later one's
        # first tuple is less than the gap after the earlier one's last.
        first_slice, first = own, window
        while (before := registry.get(self._part([*prefix, first_slice - 1]))) is not None:
            if first.state.start - before.state.last >= gap:
                break
            first_slice, first = first_slice - 1, before
        last_slice, last = own, window
        while (after := registry.get(self._part([*prefix, last_slice + 1]))) is not None:
            if after.state.start - last.state.last >= gap:
                break
            last_slice, last = last_slice + 1, after
        session_end = last.state.last + gap
        watermark = getattr(ctx, "watermark", None)
        if session_end > (end if watermark is None else watermark):
            return session_end if last is window else None
        live: list[tuple[int, OpenWindow]] = []
        for slice_ in range(first_slice, last_slice + 1):
            part = registry.get(self._part([*prefix, slice_]))
            assert part is not None
            took_from = part.state.start // gap
            # A slice whose state begins before its own slice took in the earlier slices of its session
            # at a close the log holds only part of: those, still open here, are in it already.
            while live and live[-1][0] >= took_from:
                ctx.close_window(live.pop()[1].key, None)
            live.append((slice_, part))
        # Fold the session into its last slice, one slice at a time: footprint the receiver, then close
        # the giver without a result; the last slice's R carries the session's result.
        for (_, giver), (_, receiver) in itertools.pairwise(live):
            receiver.state = merged([giver.state, receiver.state])
            ctx.checkpoint_window(receiver.key)
            ctx.close_window(giver.key, None)
        ctx.close_window(last.key, self._session_result(prefix, last.state))
        return None

    def expire(self, key: str, seq: int, state: MultiState) -> dict[str, Any]:
        raise NotImplementedError("sessions close through close_expired")

    def decode_state(self, data: bytes) -> MultiState:
        # A slice that took in its session's earlier slices (a fold the log holds only part of) may hold
        # a sum past the largest double: each slice's own is below it, so k slices' is below k times it.
        return decode_state(data, len(self.value_fields), sum_limit=exact_sum.OVERFLOW << 64)

    # -- results ---------------------------------------------------------------------------------------
    def _session_result(self, prefix: Sequence[str | int], state: MultiState) -> dict[str, Any]:
        names = ["key"] if len(self.key_fields) == 1 else self.key_fields
        out: dict[str, Any] = dict(zip(names, prefix, strict=True))
        out["window"] = state.start // self.session_gap_ms  # the slice of its first tuple
        for agg in self.aggregates:
            out[agg.name] = self._aggregate(agg, state)
        out["count"] = state.count
        out["start"] = state.start
        out["end"] = state.last + self.session_gap_ms
        return out

    def _aggregate(self, agg: AggregateColumn, state: MultiState) -> float | int | None:
        if agg.func in ("sum", "avg"):
            col = state.columns[self._column_at[agg.column]]
            if col.n and abs(col.total) >= exact_sum.OVERFLOW:
                # Slices merged past the largest double: the correctly rounded sum is infinite.
                return math.copysign(math.inf, col.total)
        return super()._aggregate(agg, state)


def merged(states: Sequence[MultiState]) -> MultiState:
    """One state of a session's slices' states (in slice order): counts and exact sums added, the first
    tuple's time of the first slice, the last one's of the last, min and max over all (-0.0 below 0.0)."""
    first = states[0]
    columns = [ColumnState(c.n, c.total, c.lo, c.hi) for c in first.columns]
    for state in states[1:]:
        for col, other in zip(columns, state.columns, strict=True):
            if other.n:
                col.n += other.n
                col.total += other.total
                below = math.copysign(1.0, other.lo) < math.copysign(1.0, col.lo)
                if other.lo < col.lo or (other.lo == col.lo and below):
                    col.lo = other.lo
                above = math.copysign(1.0, other.hi) > math.copysign(1.0, col.hi)
                if other.hi > col.hi or (other.hi == col.hi and above):
                    col.hi = other.hi
    count = sum(state.count for state in states)
    return MultiState(count, min(s.start for s in states), max(s.last for s in states), columns)
