"""Hopping windows of several aggregates over composite keys: `cec run --window-time 1h --slide 15m`.

As Spark's `window(ts, size, slide)`: windows [start, start + size) with start a multiple of the slide
(which must divide the size); a tuple is in each of the k = size / slide windows that contain its time.
Results: one row per (key, window) that holds a tuple, with the columns of `operators.multi_aggregate`
(`window` is start / slide) and the same aggregate rules (SQL nulls, exact order-independent sums).

Why panes, in parts of one period. Keeping each window as a part of its own (design A of the hopping
design notes) writes a G-open per window: k footprints per key where tumbling windows write one, and k
updates per tuple. Here a key's state is kept per pane [p, p + slide): a tuple updates one pane, and a
window's result combines the k panes it covers. The panes of a key are grouped into one part per period
[e, e + size) (e a multiple of the size): the part (key, e) opens with its first tuple (one G-open, whose
state is that tuple's pane, as small as a tumbling window's) and closes once the last window that covers
one of its panes has its result. So per key and period there is one G-open and one R, as with tumbling
windows of the size; only the results themselves are k per period. A window spans at most two periods,
so a result combines the panes of at most two parts of its key.

What each record is under the EC rule (DESIGN-NOTES section 2, `recovery.eventual`), unchanged:
- G-open, G-check: a footprint of the part (key, e), identified by (part id, seq) as every window; its
  state is the part's panes.
- R with the part's id: the result of the part's last window; it closes the part (its older footprints
  are skipped). Every other window's result is a result record without a window identity (as a stateless
  operator's): no part of any checkpoint. A tuple replayed below the crash point (REBUILD) makes it again
  only in memory; the engine drops it (`OperatorInstance.emit`), since the first one is in the log.
A window is emitted by the part that holds its first non-empty pane (its owner); the owner's R is thus
always the result of a window it owns, and no window is emitted twice. An older part may close (its R)
at the very end at which its younger part asks whether the older one owns that window: the older part
notes that end for the younger one (`_closed_at`).
The tuple a crash cut (some of its records are in the log, the last one, which claims it, is not) is
applied again from the EC, which no longer holds the parts its logged R's closed: it would make again
the results already logged before the cut, and a younger part could take a window that an older part,
now closed, had emitted. So a window's result is identified by its key and start (`unique_results`): the
runtime reads the results at the log's end that carry the crash point's `pos` and the engine does not
make them again.

When windows close, as tumbling time windows close:
- without a watermark, a key's windows whose end is at or before its next tuple's time close (their
  results go out) before that tuple goes in. A tuple is late (dead letter) when the earliest window that
  holds it has closed: its pane ends at or before the latest time of its part's tuples (or, when its part is
  not open, of its key's). So a tuple goes into all of its windows or into none;
- with `--allowed-lateness`, the watermark closes windows in (end, part, seq) order
  (`OperatorInstance._expire` asks `close_expired` once per window end), never a key's own next tuple. A
  tuple goes into those of its windows that are still open (end past the watermark) and is late only when
  every one has closed: its pane's start + size is at or before the watermark (Flink's rule for sliding
  windows). Which windows a tuple joins then depends only on the watermark when it comes, as the
  tumbling windows' late rule does, not on how the input partitions carrying a key interleave otherwise.
Why these late rules, and not one rule for both: replaying below the crash point (REBUILD), the watermark
is the crash point's, later than when the tuple first came. A tuple refused then by the watermark rule
went only into windows that had all closed before the crash point, whose results are in the log; its
pane changes no window still to come, so the part's results after recovery are the failure-free ones (an
"earliest window closed" rule would refuse tuples that windows still open hold). Without a watermark the
rule reads only the tuple's own part, whose state in the replay is exactly what it was at that tuple; a
younger part of the same key may already hold later tuples there (loaded from its footprint), so a rule
that read it could refuse in the replay a tuple the first run took. Per key in time order (what per-key
closing assumes) the per-key rule is the key's "earliest window closed". As for tumbling windows,
results without a watermark follow each key's input order: a key's tuples should come from one input
partition (`cec run --input-topic` runs one instance per input partition).

The EC rule in `recovery/` is unchanged: parts are windows to it, and it reads past results without a
window identity. The pane design of the notes (B) closes a pane with a partial record kept in the EC until
the windows using it are done, which needs a new record kind and EC rule; grouping panes per period keeps
them in open parts instead, at the cost of a window's result reading the part of the period before.

A part's state (its panes, their combination into a window's state, its bytes) is `operators.hopping_state`;
this module decides which panes a tuple and a window touch, and when windows close.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from cec.exceptions import BadTupleError
from cec.registry import OpenWindow, WindowRegistry
from operators import exact_sum
from operators.aggregate import canonical_key
from operators.base import InputTuple, OperatorContext
from operators.hopping_state import ONE_PANE as ONE_PANE  # this module's names before the split
from operators.hopping_state import VERSION as VERSION
from operators.hopping_state import (
    PaneRun,
    combine_panes,
    decode_panes,
    encode_panes,
    merge_column,
)
from operators.multi_aggregate import MultiAggregate
from operators.multi_state import ColumnState, MultiState, empty_column
from operators.windows import HoppingTimeWindows, hopping_windows

__all__ = ["HoppingAggregate", "PaneRun", "decode_panes", "encode_panes"]


class HoppingAggregate(MultiAggregate):
    """Several aggregates per composite key over hopping time windows (module doc)."""

    def __init__(
        self,
        *,
        key_fields: Sequence[str],
        aggs: Sequence[tuple[str, str]],
        window_ms: int | None,
        slide_ms: int,
        time_field: str | None,
        allowed_lateness: int | None = None,
    ) -> None:
        self.hopping: HoppingTimeWindows = hopping_windows(
            window_ms=window_ms, slide_ms=slide_ms, time_field=time_field, allowed_lateness=allowed_lateness
        )
        super().__init__(
            key_fields=key_fields,
            aggs=aggs,
            window_ms=window_ms,
            time_field=time_field,
            allowed_lateness=allowed_lateness,
        )
        self.slide_ms = slide_ms
        fields = dict(self.state_schema or {})
        self.state_schema = {
            **fields,
            "name": "HoppingAggregateStateFields",
            "fields": [{"name": "panes", "type": "long"}, *fields["fields"]],
        }
        # Without a watermark, the open parts of each key (its JSON key -> period starts), which its next
        # tuple may close. Built from the registry the first time it is needed (after a recovery loaded
        # the EC into it), then kept as parts open and close.
        self._parts: dict[str, set[int]] = {}
        self._indexed: WindowRegistry | None = None
        # Parts the watermark closed whose younger part is open: at which end (`close_expired`). Only read
        # in the same sweep; a crash between the two leaves the R in the log, whose window the engine then
        # does not make again (`unique_results`).
        self._closed_at: dict[str, int] = {}

    unique_results = True  # one result per (key, window): see the module doc on the tuple a crash cuts

    def result_identity(self, result: Mapping[str, Any]) -> object:
        names = ["key"] if len(self.key_fields) == 1 else self.key_fields
        return (*(result[name] for name in names), result["start"])

    def describe(self) -> str:
        aggs = ", ".join(f"{a.func}({a.column})" for a in self.aggregates)
        return f"{aggs} by {','.join(self.key_fields)}, {self.hopping.describe()}"

    # -- ids ---------------------------------------------------------------------------------------------
    def _key_json(self, value: Mapping[str, Any]) -> str:
        return self._key(value)[0]

    def _key(self, value: Mapping[str, Any]) -> tuple[str, list[str]]:
        """The key's fields as one JSON array, and the fields themselves (what `json.loads` of that array
        gives back: a result's key columns without parsing it again)."""
        parts: list[str] = []
        plain = True
        for field in self.key_fields:
            part = canonical_key(value.get(field), field)
            if part is None:
                raise BadTupleError(f"missing key {field!r}")
            parts.append(part)
            # What json.dumps writes unchanged: printable ASCII without a quote or a backslash.
            plain = plain and part.isascii() and part.isprintable() and '"' not in part and "\\" not in part
        if plain:  # the common key: json.dumps's bytes without its per-call cost
            return '["' + '","'.join(parts) + '"]', parts
        return json.dumps(parts, ensure_ascii=False, separators=(",", ":")), parts

    def _part_id(self, key_json: str, period: int) -> str:
        """The key's fields and the period's number (start / size), one JSON array: `["AA","JFK",12]`."""
        return f"{key_json[:-1]},{period // self.hopping.size_ms}]"

    def _split(self, part_id: str) -> tuple[str, int]:
        parts = json.loads(part_id)
        key_json = json.dumps(parts[:-1], ensure_ascii=False, separators=(",", ":"))
        return key_json, int(parts[-1]) * self.hopping.size_ms

    def key_of(self, value: Mapping[str, Any]) -> str | None:
        """The part the tuple goes to: its key's fields and its period (`_part_id`), as a JSON array."""
        key_json = self._key_json(value)
        t = self.event_time(value)
        assert t is not None
        return self._part_id(key_json, self.hopping.period_of(t))

    def _index(self, registry: WindowRegistry) -> dict[str, set[int]]:
        if self._indexed is not registry:
            self._parts = {}
            for part_id in registry.open_keys():  # not iterated: a lazy registry lists what it has not loaded
                key_json, period = self._split(part_id)
                self._parts.setdefault(key_json, set()).add(period)
            self._indexed = registry
        return self._parts

    def _forget(self, key_json: str, period: int) -> None:
        periods = self._parts.get(key_json)
        if periods is not None:
            periods.discard(period)
            if not periods:
                del self._parts[key_json]

    # -- windows -------------------------------------------------------------------------------------------
    def _window(self, runs: Sequence[PaneRun], start: int) -> MultiState | None:
        """The window [start, start + size) of a key combined from its parts' panes; None if it holds none."""
        end = start + self.hopping.size_ms
        return combine_panes([pane for run in runs for pane in run.panes if start <= pane.start < end], start)

    def _key_values(self, key_json: str, parts: Sequence[str] | None = None) -> dict[str, Any]:
        """A result's key columns: `key`, or one per key field (`parts`: the fields, when the caller has
        them: `_key`)."""
        names = ["key"] if len(self.key_fields) == 1 else self.key_fields
        return dict(zip(names, json.loads(key_json) if parts is None else parts, strict=True))

    def _window_result(
        self, key_json: str, state: MultiState, key_values: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        out = dict(key_values) if key_values is not None else self._key_values(key_json)
        out["window"] = state.start // self.slide_ms
        for agg in self.aggregates:
            out[agg.name] = self._aggregate(agg, state)
        out["count"] = state.count
        out["start"] = state.start
        out["end"] = state.start + self.hopping.size_ms
        return out

    def _owns(self, run: PaneRun, older: PaneRun | None, start: int) -> bool:
        """Whether `run` emits window `start`: it holds the window's first non-empty pane (`older`, the
        part of the period before, holds none in it)."""
        end = start + self.hopping.size_ms
        if not any(start <= pane.start < end for pane in run.panes):
            return False
        return older is None or all(pane.start < start for pane in older.panes)

    # -- tuples ----------------------------------------------------------------------------------------------
    def process(self, tup: InputTuple, ctx: OperatorContext) -> None:
        value = tup.value
        assert value is not None
        key_json, key_parts = self._key(value)
        xs = self._values(value)
        t = self.event_time(value)
        assert t is not None
        hop = self.hopping
        size, slide = hop.size_ms, hop.slide_ms
        pane_start, period = hop.pane_of(t), hop.period_of(t)
        part_id = self._part_id(key_json, period)
        registry = ctx.registry
        runs: dict[int, OpenWindow] = {}
        if self.by_window:
            own = registry.get(part_id)
            # The parts whose windows can hold this time: its own and its neighbours.
            for p in (period - size, period + size):
                window = registry.get(self._part_id(key_json, p))
                if window is not None:
                    runs[p] = window
            if own is not None:
                runs[period] = own
        else:
            periods = self._index(registry).get(key_json)
            if periods:
                for p in sorted(periods) if len(periods) > 1 else periods:
                    window = registry.get(self._part_id(key_json, p))
                    assert window is not None, "the parts index and the registry disagree"
                    runs[p] = window
            own = runs.get(period)  # every open part of the key is indexed
        if self.by_window:
            watermark: int | None = getattr(ctx, "watermark", None)
            if watermark is not None and pane_start + size <= watermark:
                raise BadTupleError(
                    f"late: every window of time {t} closed at watermark {watermark} (the last one "
                    f"[{pane_start}, {pane_start + size}))"
                )
            latest = None
        else:
            # The latest time of the key's open parts, and of this tuple's own part (its late rule).
            latest = seen = None
            for p, w in runs.items():
                part_latest = w.state.latest
                if latest is None or part_latest > latest:
                    latest = part_latest
                if p == period:
                    seen = part_latest
            if own is None:
                seen = latest
            if seen is not None and pane_start + slide <= seen:
                raise BadTupleError(
                    f"late tuple: time {t} is in window [{pane_start - size + slide}, {pane_start + slide}) "
                    f"of its key, closed at {seen}"
                )
        scaled = [None if x is None else exact_sum.exact(x) for x in xs]
        # A window's sum is at most the sum of the magnitudes of the panes it covers (k of its key's).
        limit = exact_sum.OVERFLOW
        near = [
            pane.columns
            for w in runs.values()
            for pane in w.state.panes
            if pane_start - size < pane.start < pane_start + size
        ]
        for i, si in enumerate(scaled):
            if si is None:
                continue
            total = abs(si)
            for columns in near:
                total += abs(columns[i].total)
            if total >= limit:
                raise BadTupleError(f"value {self.value_fields[i]!r} would overflow its window's sum")
        # Every check is done: from here on the tuple changes state and cannot fail.
        if latest is not None and t > latest:
            self._close_until(key_json, key_parts, runs, latest, t, ctx)
            own = runs.get(period)  # `runs` loses the parts that closed (never this tuple's own)
        if own is None and not self.by_window:
            own = registry.get(part_id)  # None, as the index follows the registry: asked only to open
        if own is None:
            column_states = [
                empty_column() if x is None or si is None else ColumnState(1, si, x, x)
                for x, si in zip(xs, scaled, strict=True)
            ]
            ctx.open_window(part_id, PaneRun([MultiState(1, pane_start, t, column_states)]))
            if not self.by_window:
                self._parts.setdefault(key_json, set()).add(period)
            return
        panes = own.state.panes
        at = next((i for i, pane in enumerate(panes) if pane.start >= pane_start), len(panes))
        if at < len(panes) and panes[at].start == pane_start:
            pane = panes[at]
            pane.count += 1
            if t > pane.last:
                pane.last = t
            for x, si, col in zip(xs, scaled, pane.columns, strict=True):
                if x is not None and si is not None:
                    col.add(x, si)
        else:
            column_states = [
                empty_column() if x is None or si is None else ColumnState(1, si, x, x)
                for x, si in zip(xs, scaled, strict=True)
            ]
            panes.insert(at, MultiState(1, pane_start, t, column_states))

    def _close_until(
        self,
        key_json: str,
        key_parts: Sequence[str],
        runs: dict[int, OpenWindow],
        latest: int,
        t: int,
        ctx: OperatorContext,
    ) -> None:
        """Per-key closing: the key's windows whose end lies in (latest, t] close, each emitted by its
        owner; a part whose last window that is closes with it (its R)."""
        size, slide = self.hopping.size_ms, self.hopping.slide_ms
        end = latest - latest % slide + slide  # the first window end past `latest`
        if end > t or not runs:
            return  # no window ends in (latest, t]: most tuples of a key come within its pane
        last_end = max(w.state.panes[-1].start for w in runs.values()) + size
        periods = sorted(runs)
        key_values: dict[str, Any] | None = None
        while end <= t and end <= last_end:
            start = end - size
            # The window's panes in time order (the parts' periods are disjoint and sorted, and so are
            # each part's panes): the first is the window's first non-empty pane, whose part owns it
            # (`_owns`: a part of an earlier period holds no pane at or past `start`).
            inside = [
                (p, pane)
                for p in periods
                if p in runs
                for pane in runs[p].state.panes
                if start <= pane.start < end
            ]
            if inside:
                owner = inside[0][0]
                if key_values is None:
                    key_values = self._key_values(key_json, key_parts)
                combined = combine_panes([pane for _, pane in inside], start)
                assert combined is not None
                result = self._window_result(key_json, combined, key_values)
                window = runs[owner]
                if window.state.panes[-1].start + size == end:
                    ctx.close_window(window.key, result)
                    del runs[owner]
                    self._forget(key_json, owner)
                else:
                    ctx.emit(result)
            end += slide

    # -- the watermark -------------------------------------------------------------------------------------
    def window_end(self, state: PaneRun) -> int | None:  # type: ignore[override]
        if not self.by_window:
            return None
        # The earliest end of a window holding any pane of its period: a pane earlier than its first one
        # may still come.
        return self.hopping.period_of(state.panes[0].start) + self.hopping.slide_ms

    def window_end_after(self, state: PaneRun, watermark: int | None) -> int | None:
        first = self.window_end(state)
        if first is None or watermark is None:
            return first
        slide = self.hopping.slide_ms
        return max(first, watermark - watermark % slide + slide)

    def close_expired(self, window: OpenWindow, end: int, ctx: OperatorContext) -> int | None:
        """The watermark passed `end`: the result of the window [end - size, end) if this part owns it;
        the part closes (with that result as its R) at its last window's end, else the watermark acts on
        it again one slide later."""
        result, later = self._expire_at(window.key, window.state, end, ctx)
        if later is None:
            assert result is not None
            ctx.close_window(window.key, result)
        elif result is not None:
            ctx.emit(result)
        return later

    def _expire_at(
        self, key: str, state: PaneRun, end: int, ctx: OperatorContext
    ) -> tuple[dict[str, Any] | None, int | None]:
        key_json, period = self._split(key)
        size = self.hopping.size_ms
        start = end - size
        registry = ctx.registry
        older_id = self._part_id(key_json, period - size)
        older = registry.get(older_id)
        closed_at = self._closed_at.pop(older_id, None) if older is None else None
        result = None
        # An older part that closed at this very end (earlier in this sweep) owned this window: its R.
        if closed_at != end and self._owns(state, None if older is None else older.state, start):
            newer = registry.get(self._part_id(key_json, period + size))
            runs = [w.state for w in (older, newer) if w is not None]
            combined = self._window([state, *runs], start)
            assert combined is not None
            result = self._window_result(key_json, combined)
        if end >= state.panes[-1].start + size:
            assert result is not None  # its last window's first pane is its own last pane
            if registry.get(self._part_id(key_json, period + size)) is not None:
                self._closed_at[key] = end
            return result, None
        return result, end + self.hopping.slide_ms

    def expire(self, key: str, seq: int, state: PaneRun) -> dict[str, Any]:  # type: ignore[override]
        raise NotImplementedError("hopping windows close through close_expired")

    # -- state ---------------------------------------------------------------------------------------------
    def state_fields(self, state: PaneRun) -> dict[str, Any]:  # type: ignore[override]
        """A part's state as flat named fields (`cec state --as-of`): its panes, and the fields of
        `MultiAggregate.state_fields` over all of them (`start` the first pane's, `last` the latest time)."""
        combined = MultiState(
            0, state.panes[0].start, state.latest, [empty_column() for _ in self.value_fields]
        )
        for pane in state.panes:
            combined.count += pane.count
            for into, col in zip(combined.columns, pane.columns, strict=True):
                merge_column(into, col)
        return {"panes": len(state.panes), **super().state_fields(combined)}

    def encode_state(self, state: PaneRun) -> bytes:  # type: ignore[override]
        return encode_panes(state)

    def decode_state(self, data: bytes) -> PaneRun:  # type: ignore[override]
        return decode_panes(data, len(self.value_fields))
