"""Session windows of the aggregates: `cec run --session-gap 30m --time ts` (as Spark's `session_window`).

Per key, tuples less than the gap apart share a session `[first, last + gap)`: `first` and `last` are the
smallest and largest event time of its tuples. A key has at most one open session. A tuple of the key at
time `t` whose open session is `[first, last + gap)`:
- `t >= last + gap`: the session closes (its result, R), and the tuple opens the key's next session;
- `first - gap < t < last + gap`: the tuple joins the session (`first` and `last` stretch to take it);
- `t <= first - gap`: late, a dead letter (its own session would lie wholly before the open one, which
  was already closed or never existed in this key's input order).
Each session's result is one row per (key, session) with every aggregate of `operators.multi_aggregate`
(composite keys, SQL's null rule, exact order-independent sums), `window` the key's session number and
`start`/`end` the session's bounds. The key's last session stays open at the end of the input, as a
time window does without watermarks. Sessions closed by event-time watermarks (`--allowed-lateness`,
where a tuple between two open sessions merges them) are not built yet: the flags refuse that pairing.

Why recovery is exact (DESIGN-NOTES section 2). A session is a window part identified by (key, seq), the
key's per-key sequence, exactly as a per-key tumbling time window is; only the rule that says when the
key's next tuple closes it differs. Its records:
- G-open (after the opening tuple) and G-checks carry the session's state: the count, `first`, `last`
  and per value column the exact sum, min and max (`operators.multi_state`); the EC rule takes the first
  footprint met reading back as the session's latest;
- R (the result) is the session's last footprint: a session whose R is met is closed and its older
  footprints are skipped. The tuple that closes a session opens the next one; its R does not claim the
  tuple and its G-open does (`recovery.contract`, "claiming"), so a log that ends between them replays
  that tuple, which opens the next session again.
A replayed tuple below the crash point goes to the part of its key (`key_of` is the key alone, as for any
per-key window): if the key has a session in the EC, the tuple is in its loaded state (below its footprint's
`pos`: SKIP) or rebuilds it (REBUILD); a tuple of a key with no session in the EC belonged to a session
whose R is in the log, or was a dead letter: SKIP. Replay applies a key's tuples in the key's input order,
so it reaches the same `first`/`last` and closes nothing before the crash point (every close there has its
R in the log, before the EC footprint of the key's next session).

Not built yet: sessions closed by the watermark, where a key's tuples come from several partitions and a
tuple between two open sessions merges them. The design this module is to grow into, and why it is exact:
- Parts are (key, slice), slice = floor(t / gap), not sessions: a tuple's part follows from the tuple alone,
  so a replayed tuple below t_c goes to its own EC part by the unchanged skip rule, whether a merge that
  involved it happened before the crash point or after it. A merge moves no state and writes no record: a
  session is a run of consecutive open slices, two neighbours joined when the later one's first tuple is
  less than the gap after the earlier one's last (slices with an empty one between are a gap or more
  apart), read from the slices' states when the run closes. G-open and G-check stay per slice.
- A run of consecutive open slices closes once W >= (its last slice + 2) * gap: each of its sessions' result
  rides on the R of the session's first slice, every other slice ends with an R that carries no result
  (its footprint is gone; the EC rule needs the R). A tuple is late when its slice is not open and ends at
  or before W: then no accepted tuple can reach a closed session (the slices beside it are past W too),
  and a REBUILD tuple, whose slice is open in the EC, is accepted as it was the first time.
- What that needs besides this module: a closing record without a result that every results reader skips
  (today every R's payload is a result row, in the log format, the EC scan of `cec._native` and each reader)
  and a watermark expiry that lets the operator defer a slice whose run is not due yet (the engine's
  `_expire` closes every window whose end the watermark passed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cec.exceptions import BadTupleError, ConfigError
from operators import exact_sum
from operators.base import InputTuple, OperatorContext
from operators.multi_aggregate import MultiAggregate
from operators.multi_state import ColumnState, MultiState, empty_column
from operators.windows import Windows

__all__ = ["SessionAggregate", "SessionWindows"]


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
    """`MultiAggregate` (several aggregates, composite keys) over session windows of `gap_ms`."""

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
        if allowed_lateness is not None:
            raise ConfigError(
                "session windows close by their key's next tuple; event-time watermarks "
                "(an allowed lateness) do not close them yet"
            )
        # The tumbling window given here only runs MultiAggregate's checks of keys and aggregates; the
        # windows are the sessions below.
        super().__init__(key_fields=key_fields, aggs=aggs, window_ms=gap_ms, time_field=time_field)
        self.windows: SessionWindows = SessionWindows(gap_ms, time_field)  # type: ignore[assignment]
        self.window_ms = None
        self.session_gap_ms = gap_ms

    def process(self, tup: InputTuple, ctx: OperatorContext) -> None:
        assert tup.value is not None
        key = self.key_of(tup.value)
        if key is None:
            raise BadTupleError(f"missing key {self.key_fields[0]!r}")
        xs = self._values(tup.value)
        t = self.event_time(tup.value)
        assert t is not None
        window = ctx.registry.get(key)
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

    def window_end(self, state: MultiState) -> int | None:
        return None  # only the key's next tuple closes a session

    def expire(self, key: str, seq: int, state: MultiState) -> dict[str, Any]:
        raise NotImplementedError("the watermark does not close sessions")
