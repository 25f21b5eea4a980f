"""The replay contract: the one owner of DESIGN-NOTES section 2. Every host (the operator runtime, the
Spark attach path) asks this module what to do with a replayed tuple and what `pos` a record carries.

Positions. Every input tuple has a position (input partition j, offset o). Every output record carries
`pos`: for each input partition, the next offset the operator would read (everything below has been
applied, and every output it produced is in the log before that record).

Crash point t_c: the `pos` of the newest intact record of the log (records produced after it never reached
the log, so they do not exist). N and the logical time come from the same record.

Replay start on partition j: T[j] = min over the EC windows of pos_w[j]; t_c[j] when the EC is empty.

The fate of a replayed tuple (j, o) of key k (`ReplayContract.fate`, `tuple_fate`):
- k has a window w in the EC: SKIP it if o < pos_w[j] (w already holds it); else REBUILD if o < t_c[j]
  (apply it to rebuild w's state; whatever it produced the first time is in the log, so it produces
  nothing now, not even a dead letter); else PROCESS;
- k has no EC window: SKIP it if o < t_c[j] (it belonged to a window that closed, whose R is in the log,
  or it was dead-lettered already); else PROCESS.
Recovery stops being special on partition j once o >= t_c[j]; it ends when every partition has reached
its crash point (`caught_up`).

Per-key crash points (`ReplayContract.key_crash`, `key_crash_point`). A host whose keys moved between
logs (the Spark attach path restarted with another partition count: each output topic generation's logs
hold the outputs of the keys that were theirs then) has no single crash point: key k's is C_k = the
component-wise maximum over generations g of t_c[g][q_g(k)], the crash point of the log that held k in g
(every tuple of k below C_k has its outputs in some log, none at or above has). The fate rule above holds
with C_k in place of t_c for k's tuples; `crash_pos` is then an upper bound of every C_k, below which the
host's tuples are still checked.

`pos` while replaying (`PositionStamper`). With several input partitions, partition j can pass its crash
point (and produce records) while partition k is still replaying below its own. Stamping such a record
with the live position vector would give pos[k] < t_c[k]; if the log then ends on that record (any prefix
of what the writer produced can be the durable log), the next recovery takes the lower crash point and
re-applies tuples of k whose results are already in the log. So a record's `pos` is the component-wise
maximum of the live vector (with the producing tuple claimed, below) and the `pos` of the previous
record, which starts at the crash point: while any partition is still replaying below its crash point,
every record's pos[k] is at least t_c[k]. That is still a crash point the next recovery can trust: the
tuples of k between the live position and t_c[k] only rebuild EC windows, whose footprints are older
than t_c and stay in the extent, and produce nothing.

Invariant kept: `pos` never decreases along the log, component-wise, across any number of crashes, so
every prefix of the log, including one cut inside a recovering run, yields an exact recovery.

N while replaying: a record carries the number of windows open at it, counting every EC window as open
from the start of the replay (each was open at t_c, and a tuple below t_c can neither close it, whose R
would then be in the log, nor open another), plus the windows opened and minus those closed by tuples
past the crash point. So the next recovery, reading back from any record, finds exactly N footprints: the
EC windows' own (older than t_c, still in the extent) and those written since.

Claiming a tuple: a tuple can produce several records (a time window's R, then the next window's
G-open). Only its last record claims it (pos[j] = o + 1); the ones before carry pos[j] = o. Had the R
claimed the tuple and the log ended between the two, recovery would skip the tuple as belonging to a
closed window and the new window would lose it; unclaimed, it is replayed and opens that window again.

Watermarks (`Watermark`). With event-time watermarks a time window closes when the watermark W passes its
end, whether or not its key comes back: W = min over input partitions j of m[j] - L, where m[j] is the
largest event time of the tuples of j applied so far and L the allowed lateness (no W until every
partition has had one). A tuple whose window ends at or before W is late: dead-lettered. Rules:
- a tuple first raises m[j], then every open window whose end <= W closes, in (end, key, seq) order
  (a total order: both a failure-free run and a recovered one close the same windows in the same order),
  then the tuple is applied. Its own window cannot close there (its end is past its own time). An
  operator may close windows together at one's turn (`Operator.close_expired`: a session's gap-wide
  slices close as one run, `operators.sessions`); what it closes depends only on the open windows'
  states and W, so both runs still close the same windows in the same order;
- every record carries `marks`: m over the tuples below its `pos`. A record that does not claim its
  tuple (see "claiming") carries m[j] from before that tuple, so at every record all windows whose end
  <= W(marks) are closed and their R is in the log before it;
- recovery restores m from the crash record: m over offsets below T (the replay start) cannot be derived
  from the replay, and max is idempotent, so replayed tuples below t_c change nothing. W then is W(t_c),
  which every EC window's end exceeds: a REBUILD tuple is judged late exactly as it was the first time;
- no tuple past a crash point is applied until every partition has reached its own (`caught_up`): such
  tuples are held back (the runtime keeps them in order). Otherwise partition k, past its crash point, could raise W
  past the end of a window of partition j whose state is still being rebuilt from j's replay, and close
  it with a partial result. Held back, the operator resumes from exactly its state at t_c.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from operator import itemgetter

from cec.exceptions import ConfigError
from recovery.exceptions import RecoveryError

__all__ = [
    "NO_MARK",
    "PositionStamper",
    "ReplayContract",
    "TupleFate",
    "Watermark",
    "key_crash_point",
    "tuple_fate",
]

NO_MARK = -(1 << 63)  # m[j] before partition j's first event time (the smallest Avro long)


class TupleFate(Enum):
    SKIP = "skip"  # already reflected in the log (or in the window's loaded state): not applied
    REBUILD = "rebuild"  # applied to rebuild window state; produces nothing (its outputs are in the log)
    PROCESS = "process"  # past the crash point: processed normally


def tuple_fate(offset: int, crash_offset: int, window_offset: int | None) -> TupleFate:
    """The fate of a replayed tuple at `offset` on one input partition, given the crash point's offset
    there and, if the tuple's key has a window in the EC, that window's footprint offset there."""
    if window_offset is not None:
        if offset < window_offset:
            return TupleFate.SKIP
        return TupleFate.REBUILD if offset < crash_offset else TupleFate.PROCESS
    return TupleFate.SKIP if offset < crash_offset else TupleFate.PROCESS


def key_crash_point(crash_points: Sequence[Sequence[Sequence[int]]], partitions: Sequence[int]) -> list[int]:
    """C_k (module doc, "per-key crash points"): `crash_points[g][q]` is the crash point of generation g's
    log q, `partitions[g]` the log that holds key k in generation g."""
    vectors = [crash_points[g][int(q)] for g, q in enumerate(partitions)]
    return [max(v[j] for v in vectors) for j in range(len(vectors[0]))]


@dataclass(frozen=True)
class ReplayContract:
    """The replay of one operator instance: where it starts, where it stops, and what each tuple does.
    `key_crash`: per-key crash points where keys moved between logs (module doc), else None."""

    start: tuple[int, ...]
    crash_pos: tuple[int, ...]
    window_pos: Mapping[str, tuple[int, ...]]
    key_crash: Mapping[str | None, Sequence[int]] | None = None

    @classmethod
    def fresh(cls, partitions: int) -> ReplayContract:
        zeros = (0,) * partitions
        return cls(zeros, zeros, {})

    @classmethod
    def build(
        cls, crash_pos: Sequence[int] | None, window_pos: Mapping[str, Sequence[int]], partitions: int
    ) -> ReplayContract:
        """From the EC: its crash point (None for an empty log) and each window's footprint `pos`."""
        if crash_pos is None:
            return cls.fresh(partitions)
        if len(crash_pos) != partitions:
            raise RecoveryError(
                f"the log was written reading {len(crash_pos)} input partitions, the input now has {partitions}"
            )
        crash = tuple(crash_pos)
        start = list(crash)
        positions = list(window_pos.values())
        # Column by column (one C-level min/max per input partition, not a Python loop per window: EC-load
        # at the paper's scale plans for ~92k windows; an item getter, not zip(*positions), which builds
        # a 92k-argument call and its columns: twice the time); a bad window is looked for only once one is
        # seen.
        bad = set(map(len, positions)) - {partitions}
        if not bad and positions:
            for j in range(partitions):
                column = itemgetter(j)
                if max(map(column, positions)) > crash[j]:
                    bad.add(-1)
                    break
                start[j] = min(start[j], min(map(column, positions)))
        if bad:
            for key, pos in window_pos.items():
                if len(pos) != partitions or any(p > c for p, c in zip(pos, crash, strict=True)):
                    # pos never decreases along the log, so a footprint's pos is at most the crash point.
                    raise RecoveryError(
                        f"the footprint of {key!r} has pos {list(pos)} beyond the crash point {list(crash)}"
                    )
        copied: dict[str, tuple[int, ...]]
        if set(map(type, positions)) <= {tuple}:
            copied = dict(window_pos)  # type: ignore[arg-type]  # checked just above: all tuples
        else:
            copied = {k: tuple(v) for k, v in window_pos.items()}
        return cls(tuple(start), crash, copied)

    def fate(self, partition: int, offset: int, key: str | None) -> TupleFate:
        pos = self.window_pos.get(key) if key is not None else None
        crash = self.crash_pos if self.key_crash is None else self.key_crash.get(key, self.crash_pos)
        return tuple_fate(offset, crash[partition], None if pos is None else pos[partition])

    def replaying(self, partition: int, offset: int) -> bool:
        """Is (partition, offset) below the crash point, where tuples are SKIPped or REBUILT?"""
        return offset < self.crash_pos[partition]

    def caught_up(self, positions: Sequence[int]) -> bool:
        return all(p >= c for p, c in zip(positions, self.crash_pos, strict=True))

    def stamper(self) -> PositionStamper:
        return PositionStamper(self.crash_pos)

    @property
    def replay_span(self) -> int:
        """Input tuples (by offset) between the replay start and the crash point, over all partitions."""
        return sum(c - s for s, c in zip(self.start, self.crash_pos, strict=True))


class PositionStamper:
    """The `pos` each output record carries (module doc, "pos while replaying"): the component-wise
    maximum of the producing tuple's live position and the previous record's pos, which starts at the
    log's crash point (zeros for a new log). Never decreases along the log, by construction."""

    __slots__ = ("_last",)

    def __init__(self, floor: Sequence[int]) -> None:
        self._last = tuple(int(p) for p in floor)

    @property
    def last(self) -> tuple[int, ...]:
        """The pos of the last record stamped (the floor before any)."""
        return self._last

    def stamp(
        self, live: Sequence[int] | None, partition: int, offset: int, *, claims: bool
    ) -> tuple[int, ...]:
        """The pos of a record produced by tuple (partition, offset); `claims`: it is that tuple's last
        record. `live`: the operator's live position vector, or None for a host that only knows the
        records it writes (then the previous record's pos stands for it)."""
        last = self._last
        pos = list(last if live is None else live)
        pos[partition] = offset + 1 if claims else offset
        if len(pos) != len(last):
            raise ValueError(f"a live position of {len(pos)} partitions against a pos of {len(last)}")
        # Component-wise max (max(p, q) is p unless q > p), in C: this runs once per output record.
        out = tuple(map(max, pos, last))
        self._last = out
        return out

    def stamp_current(self, live: Sequence[int]) -> tuple[int, ...]:
        """The pos of a record no input tuple produced (a G-check, EOS): the live vector, floored."""
        out = tuple(p if p >= q else q for p, q in zip(live, self._last, strict=True))
        self._last = out
        return out


class Watermark:
    """Per-partition event-time maxima and the watermark they give (module doc, "watermarks")."""

    __slots__ = ("_before", "lateness", "marks")

    def __init__(self, partitions: int, lateness: int) -> None:
        if lateness < 0:
            raise ConfigError(f"allowed lateness must be >= 0, got {lateness}")
        self.lateness = lateness
        self.marks = [NO_MARK] * partitions
        self._before = NO_MARK

    def restore(self, marks: Sequence[int]) -> None:
        """m at the crash point, from the crash record's `marks`."""
        if len(marks) != len(self.marks):
            raise RecoveryError(
                f"the log's crash record carries event-time marks for {len(marks)} input partitions, "
                f"this run has {len(self.marks)} (was it written with another --allowed-lateness setting?)"
            )
        self.marks = [int(m) for m in marks]

    def observe(self, partition: int, event_time: int) -> None:
        """Tuple of `partition` with `event_time` is being applied (m[j] before it is kept for
        the records that do not claim it)."""
        before = self.marks[partition]
        self._before = before
        if event_time > before:
            self.marks[partition] = event_time

    def forget_tuple(self, partition: int) -> None:
        """The tuple being applied had no event time: its records carry m as it is."""
        self._before = self.marks[partition]

    @property
    def value(self) -> int | None:
        """W, or None while some partition has had no event time yet."""
        low = min(self.marks)
        return None if low == NO_MARK else low - self.lateness

    def stamp(self, partition: int | None = None, *, claims: bool = True) -> tuple[int, ...]:
        """The `marks` of a record: m; for a record of the tuple being applied on `partition` that
        does not claim it, m[j] from before that tuple."""
        if claims or partition is None:
            return tuple(self.marks)
        marks = list(self.marks)
        marks[partition] = self._before
        return tuple(marks)
