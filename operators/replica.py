"""A standby's replica of its primary's operator instance (design S2, "rebuild-ahead", `designs/standby.md`;
`cec run --standby`, `operators.standby`).

While the standby follows the primary's output log (`recovery.standby.LogFollower`), the replica runs the
same operator on the same input with its records discarded, and never past the crash point of the newest
record the standby has applied: the primary's durable cut. A tuple beyond it may never reach the log, and
whoever goes on after a crash processes it live. At the takeover, once the log's end is final, the replica
applies the input up to that end's crash point and hands its windows' states to recovery
(`recovery.manager.LiveStates`), which takes them only when they are exactly the checkpoint's windows (each
key at the same seq): the EC load and the replay from the footprints, most of a cold takeover's time, are
then skipped. Everything else (the crash point, N, the windows' footprint positions for the next G-checks and
the extent) still comes from the log.

Its start is a recovery like any other: the eventual checkpoint as followed so far, loaded, and the input
replayed from its footprints under the replay contract, then processed on. So its states at a crash point
are the ones a cold recovery at that point rebuilds, under the same assumptions (a deterministic operator;
each key's input order fixed by the input's partitions, or watermarks with order-independent aggregates:
DESIGN-NOTES section 2). A key it meets for the first time after its start takes its next window number
from the closed-window directory as of its start (`FollowedCheckpoint.closed`, copied then): later R
records are the ones it makes itself.

Derived data, never trusted blindly: an exception inside the replica, or an input that does not reach the
crash point in time, leaves it unusable with a reason (the recovery report's `replica`), and the takeover
recovers from the footprints as a standby without a replica does.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from cec.records import RecordCodec
from cec.registry import OpenWindow
from operators.base import InputTuple, Operator
from operators.engine import OperatorInstance, Phase, RunStats
from operators.engine.records import HeldRecord, Marks, Moment
from operators.sources import InputSource
from queuestore.base import RecordMeta
from recovery.eventual import EventualCheckpoint
from recovery.manager import load_checkpoint
from recovery.standby import FollowedCheckpoint, LogFollower

__all__ = ["DiscardedRecords", "StandbyReplica"]

# How long the takeover waits for the input to reach the crash point with nothing new arriving (the primary
# read every one of those tuples, so they exist; a source that stalls this long is given up on).
CATCH_UP_STALL_S = 10.0


class DiscardedRecords:
    """The replica's `RecordSink`: its records exist in the primary's log already (or will be made live by
    whoever goes on), so they go nowhere."""

    def tuple_records(self, at: Moment, tup: InputTuple, held: list[HeldRecord], marks: Marks | None) -> None:
        pass

    def gchecks(
        self, at: Moment, windows: Sequence[OpenWindow], states: list[bytes], marks: tuple[int, ...]
    ) -> None:
        pass

    def end_of_stream(self, at: Moment, marks: tuple[int, ...]) -> None:
        pass


class StandbyReplica:
    """The replica of one operator instance (module doc). `source`: its own reader of the job's input
    (never the primary's: it seeks and reads on its own). `prepare`: called once before the replica's
    first read of the input, when the log has a record (the input's recorded identity pinned). `clock`
    times a stalled catch-up at the takeover."""

    def __init__(
        self,
        operator: Operator,
        source: InputSource,
        *,
        codec: RecordCodec | None = None,
        batch_size: int = 512,
        max_held: int = 65_536,
        prepare: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.operator = operator
        self.source = source
        self.codec = codec or RecordCodec()
        self.batch_size = batch_size
        self.max_held = max_held
        self.clock = clock
        self._prepare = prepare
        self.instance: OperatorInstance | None = None
        self.unusable: str | None = None  # why its states cannot be used (then: recovery from the footprints)
        self.applied = 0  # input tuples applied
        # Per input partition, tuples read at or past the bound, in order (applied once the bound passes them).
        self._held: list[deque[InputTuple]] = [deque() for _ in range(source.partitions)]
        self._held_count = 0
        self._input_ended = False
        self._bound_offset = -1  # the log offset whose record's pos is `_bound`
        self._bound: tuple[int, ...] = ()
        self._closed = False

    # -- while following -------------------------------------------------------------------------------
    def advance(self, follower: LogFollower, budget: int) -> int:
        """Apply up to `budget` input tuples below the crash point of the newest record `follower` applied;
        the tuples applied (0 when there is nothing to do yet, or the replica is unusable)."""
        if self.unusable is not None:
            return 0
        if follower.unusable is not None:
            self._give_up(f"the standby's view of the log is unusable ({follower.unusable})")
            return 0
        try:
            if self.instance is None and not self._start(follower):
                return 0
            return self._apply_below(self._crash_pos(follower), budget)
        except Exception as exc:  # derived data: a replica that fails leaves the takeover to the footprints
            self._give_up(f"the replica failed: {type(exc).__name__}: {exc}")
            return 0

    def _start(self, follower: LogFollower) -> bool:
        """A recovery at what was followed so far: its checkpoint loaded, the input sought to its replay
        start. False while the log has no record (or what was followed does not make a checkpoint yet)."""
        forward = follower.forward
        if forward.last is None:
            return False
        ec = forward.checkpoint(self.codec, forward.next_offset)
        if ec is None:
            return False
        if ec.complete:
            self._give_up("the primary had finished its input")
            return False
        operator = self.operator
        decode = operator.decode_state if operator.stateful else (lambda _raw: None)
        recovery = load_checkpoint(
            ec,
            decode,
            self.codec,
            self.source.partitions,
            decode_states=operator.decode_states if operator.stateful else None,
        )
        closed = dict(forward.closed) if isinstance(forward, FollowedCheckpoint) else {}
        instance = OperatorInstance(
            operator,
            DiscardedRecords(),
            self.source.partitions,
            # No footprints: its G-opens and G-checks would be encoded only to be discarded (a G-open's
            # state encoding and footprint bookkeeping were ~8% of a standby's CPU at 100,000 keys), and
            # no footprint changes a window's state, which is all the replica hands over.
            footprints=False,
            closed_seq=closed.get,
            global_partitions=tuple(getattr(self.source, "global_partitions", range(self.source.partitions))),
            stats=RunStats(),
        )
        instance.restore(recovery)
        if self._prepare is not None:
            self._prepare()
        self.source.seek(instance.positions)
        self.instance = instance
        return True

    def _crash_pos(self, follower: LogFollower) -> tuple[int, ...]:
        """The `pos` of the newest record applied (decoded once per record)."""
        last = follower.forward.last
        assert last is not None
        if last[0] != self._bound_offset:
            offset, kind, t, key, seq, value = last
            record = self.codec.decode(value, RecordMeta(kind, t, key, seq), verified=True)
            self._bound_offset, self._bound = offset, tuple(record.pos)
        return self._bound

    def _apply_below(self, bound: Sequence[int], budget: int) -> int:
        """Apply the held tuples now below `bound`, then read on and apply, holding what is at or past it,
        until `budget` tuples were applied, every partition reached the bound, the input has nothing more
        now, or `max_held` tuples are held."""
        instance = self.instance
        assert instance is not None
        applied = 0
        run: list[InputTuple] = []
        for j, held in enumerate(self._held):
            limit = bound[j]
            while held and held[0].offset < limit:
                run.append(held.popleft())
        if run:
            self._held_count -= len(run)
            instance.apply_run(run)
            applied += len(run)
        while applied < budget and self._held_count < self.max_held and not self._input_ended:
            if all(p >= b for p, b in zip(instance.positions, bound, strict=True)):
                break
            batch = self.source.poll(self.batch_size)
            if batch is None:
                self._input_ended = True
                break
            if not batch:
                break
            run = []
            held_lists = self._held
            for tup in batch:
                held = held_lists[tup.partition]
                if held or tup.offset >= bound[tup.partition]:
                    held.append(tup)
                    self._held_count += 1
                else:
                    run.append(tup)
            if run:
                instance.apply_run(run)
                applied += len(run)
        self.applied += applied
        return applied

    @property
    def behind(self) -> int | None:
        """Input tuples between the replica and the crash point it follows (None before it started)."""
        instance = self.instance
        if instance is None or not self._bound:
            return None
        return sum(max(0, b - p) for p, b in zip(instance.positions, self._bound, strict=True))

    # -- at the takeover -------------------------------------------------------------------------------
    def states_at(self, ec: EventualCheckpoint, within: int) -> Mapping[str, OpenWindow] | str:
        """key -> its open window of every window open at `ec.crash_pos` (the log's final crash point), the
        input applied up to it; or why not (`recovery.manager.LiveStates`). `within`: the tuples a replay from the
        footprints would read: a replica further behind than that gives way to it (a primary that ran
        ahead of its standby). Once: the states are handed over."""
        if self.unusable is not None:
            return self.unusable
        instance = self.instance
        if instance is None:
            return self._give_up("the replica had not started")
        assert ec.crash_pos is not None
        bound = tuple(ec.crash_pos)
        try:
            behind = sum(max(0, b - p) for p, b in zip(instance.positions, bound, strict=True))
            if behind > within:
                return self._give_up(
                    f"the replica was {behind:,} tuples behind the crash point, a replay from the "
                    f"footprints {within:,}"
                )
            last_progress = self.clock()
            while not all(p >= b for p, b in zip(instance.positions, bound, strict=True)):
                if self._apply_below(bound, 1 << 30):
                    last_progress = self.clock()
                elif self._input_ended or self.clock() - last_progress > CATCH_UP_STALL_S:
                    return self._give_up(
                        f"the input did not reach the crash point {list(bound)} (replica at {list(instance.positions)})"
                    )
            if list(instance.positions) != list(bound):
                return self._give_up(
                    f"the replica passed the crash point {list(bound)}: {list(instance.positions)}"
                )
            if instance.phase is not Phase.RUNNING:
                return self._give_up("the replica was still restoring at the crash point")
        except Exception as exc:  # derived data (module doc)
            return self._give_up(f"the replica failed: {type(exc).__name__}: {exc}")
        windows = instance.registry.by_key()
        self._give_up("handed over")
        return windows

    def _give_up(self, why: str) -> str:
        self.unusable = why
        self.instance = None
        self._held = [deque() for _ in self._held]
        self._held_count = 0
        self.close()
        return why

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.source.close()
