"""The restore path: its own reader on the operator's output log, separate from the writer.

`RecoveryManager.recover()` rebuilds the eventual checkpoint, decodes every window state (EC-load) and
plans the replay. The runtime installs the loaded windows and seeks its input to the plan; the plan then
decides tuple by tuple until the input passes the crash point (`recovery.contract`).
"""

from __future__ import annotations

import dataclasses
import operator
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from cec.native import native
from cec.records import OutputRecord, RecordCodec
from cec.registry import OpenWindow
from queuestore.base import PartitionReader
from queuestore.ec_cache import ECCache
from recovery.cached import checkpoint_from_cache
from recovery.contract import ReplayContract
from recovery.eventual import (
    ECFootprint,
    EventualCheckpoint,
    EventualCheckpointBuilder,
    footprint_records,
    gc_paused,
)
from recovery.forward import ForwardCheckpoint
from recovery.standby import LogFollower, checkpoint_from_followed

__all__ = ["LiveStates", "LoadedWindow", "Recovery", "RecoveryManager", "RecoveryReport", "open_windows"]


class LiveStates(Protocol):
    """Window states already brought to a crash point by something that applied the input itself (a
    standby's replica, `operators.replica`): asked once a standby's checkpoint is known, instead of
    decoding the footprints and replaying from them."""

    def states_at(self, ec: EventualCheckpoint, within: int) -> Mapping[str, OpenWindow] | str:
        """key -> its open window (seq and state) of every window open at `ec.crash_pos`, the input applied
        up to it, handed over: recovery installs these objects themselves, their footprint marks set from
        the log (`open_windows`); or why not (then recovery decodes the footprints and replays, as without
        them). `within`: the tuples a replay from the footprints would read; a replica further behind the
        crash point than that says so instead of catching up (the replay is then the shorter way)."""
        ...


@dataclass(frozen=True, slots=True)
class LoadedWindow:
    key: str
    seq: int
    state: Any
    footprint: ECFootprint


@dataclass
class RecoveryReport:
    log_end: int = 0
    extent_records: int = 0
    records_read: int = 0
    ec_windows: int = 0
    corrupt_footprints: int = 0
    ec_build_seconds: float = 0.0
    ec_load_seconds: float = 0.0
    replay_start: tuple[int, ...] = ()
    crash_pos: tuple[int, ...] = ()
    replay_span: int = 0
    tuples_replayed: int = 0  # filled in by the runtime as replay proceeds
    tuples_skipped: int = 0
    catch_up_seconds: float = 0.0  # restore + replay
    # The loaded windows installed in the operator instance (`open_windows`, part of the `restore` phase):
    # the recovery-time policy plans with it as part of the EC load (`cec.rates.MeasuredRates`).
    install_seconds: float = 0.0
    # From the start of the restart (the process's, where the host knows it) to caught up: every phase of
    # `recovery.timeline`, each in `phases`; `startup_seconds` is the part before any EC work.
    recovery_seconds: float = 0.0
    startup_seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    # A fresh host: log records the index had yet to take in at the start (its rebuild deferred), and the
    # records read back on demand for the closed-window directory (`recovery.closed_directory`).
    index_deferred: int = 0
    directory_records_read: int = 0
    # Where the eventual checkpoint came from: "log" (read back), "cache" (the EC cache and the log's
    # tail, `recovery.cached`) or "standby" (what a standby followed and the tail, `recovery.standby`);
    # with a cache or a standby's checkpoint that was not used, why not.
    ec_source: str = "log"
    ec_cache_note: str = ""
    # A standby's replica (`LiveStates`): "used" when its states at the crash point replaced the EC load and
    # the replay, else why not ("" without one).
    replica: str = ""
    replica_seconds: float = (
        0.0  # the replica bringing its states to the crash point (in the `ec_load` phase)
    )
    # The log ended with the end of the input (EOS): an earlier run finished it; nothing was recovered.
    log_complete: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Recovery:
    checkpoint: EventualCheckpoint
    windows: list[LoadedWindow]  # oldest footprint first
    plan: ReplayContract
    report: RecoveryReport
    # The checkpoint as the EC cache goes on from it (`queuestore.ec_cache`), and whether the cache holds
    # it already (loaded from it with no tail); None without a cache.
    forward: ForwardCheckpoint | None = None
    forward_stored: bool = False
    # The windows' states are as of the crash point already (a standby's replica): nothing to replay.
    at_crash_point: bool = False
    # Then the replica's own windows, oldest footprint first, with `footprints` and their decoded
    # `records`, installed as they are (`open_windows`) instead of `windows` (empty): at the paper's scale,
    # making ~92k objects twice more was most of a standby's takeover after its catch-up.
    handed_over: list[OpenWindow] | None = None
    footprints: list[ECFootprint] = field(default_factory=list)
    records: list[OutputRecord] = field(default_factory=list)

    @property
    def needed(self) -> bool:
        """False on a fresh start (empty log)."""
        return self.checkpoint.crash_pos is not None

    @property
    def complete(self) -> bool:
        """The operator had already finished (its log ends with EOS)."""
        return self.checkpoint.complete


def open_windows(recovery: Recovery) -> list[OpenWindow]:
    """The loaded windows as an operator's registry holds them, oldest footprint first (the log's order):
    each at its footprint's logical time, its output mark relative to the log's end and its input mark
    relative to the crash point (where a recovered instance's counts start). Built in one pass: at the
    paper's scale (92k windows) a per-window open() was ~0.3 s of a recovery. A replica's windows handed
    over (`Recovery.handed_over`) get the same marks in place."""
    ec = recovery.checkpoint
    assert ec.crash_pos is not None
    end = ec.end_offset
    crash_total = sum(ec.crash_pos)
    handed = recovery.handed_over
    if handed is not None:
        # Column by column where C can do it (the windows live in a large heap after a replica's run: each
        # pass over them is memory-bound, and a Python property per window added ~0.05 s at 90k).
        records = recovery.records
        marks = zip(
            handed,
            map(_TIME, records),
            map(_OFFSET, recovery.footprints),
            map(sum, map(_POS, records)),
            strict=True,
        )
        for window, time_, offset, pos_total in marks:
            window.tau1 = window.tau2 = time_
            window.out_mark = offset - end
            window.in_mark = pos_total - crash_total
        return handed
    return [
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


_OFFSET = operator.attrgetter("offset")
_KEY = operator.attrgetter("key")
_POS = operator.attrgetter("pos")
_SEQ = operator.attrgetter("seq")
_TIME = operator.attrgetter("time")
_LOADED_SLOTS = tuple(getattr(LoadedWindow, f.name) for f in dataclasses.fields(LoadedWindow))


def _loaded(key: str, seq: int, state: Any, footprint: ECFootprint) -> LoadedWindow:
    """LoadedWindow(key, seq, state, footprint); built by the C accelerator when there, because a frozen
    dataclass's __init__ would be the largest cost of EC-load."""
    if native is None:
        return LoadedWindow(key, seq, state, footprint)
    window: LoadedWindow = native.make(LoadedWindow, _LOADED_SLOTS, (key, seq, state, footprint))
    return window


class RecoveryManager:
    def __init__(
        self,
        reader: PartitionReader,
        decode_state: Callable[[bytes], Any],
        *,
        codec: RecordCodec | None = None,
        progress: Callable[[int, int, int], None] | None = None,
        on_phase: Callable[[str], None] | None = None,
    ) -> None:
        """`on_phase` is told "ec_build", then "ec_load", as each phase starts (metrics)."""
        self.reader = reader
        self.decode_state = decode_state
        self.codec = codec or RecordCodec()
        self.progress = progress
        self.on_phase = on_phase or (lambda phase: None)

    def recover(
        self,
        input_partitions: int,
        cache: ECCache | None = None,
        followed: LogFollower | None = None,
        replica: LiveStates | None = None,
    ) -> Recovery:
        """`cache`: the partition's EC cache (`recovery.cached`): used when it checks out against the log,
        else the log is read back and the cache is cleared, to be written again from the checkpoint.
        `followed`: what a standby followed of this log before it took over (`recovery.standby`): used
        first, when it checks out; the cache is then written again from it. `replica`: with `followed`,
        the states its replica holds at the crash point (`LiveStates`), used when they are those of exactly
        the checkpoint's windows: then no state is decoded and nothing is replayed."""
        started = time.perf_counter()
        self.on_phase("ec_build")
        source, note = "log", ""
        forward: ForwardCheckpoint | None = None
        forward_stored = False
        ec: EventualCheckpoint | None = None
        if followed is not None:
            taken = checkpoint_from_followed(self.reader, followed)
            if isinstance(taken, str):
                note = taken
            else:
                ec, forward = taken
                source = "standby"
                ec.build_seconds = time.perf_counter() - started
                if cache is not None:
                    cache.clear()  # written again whole from the standby's checkpoint (`adopt`)
        if ec is None and cache is not None:
            cached = checkpoint_from_cache(self.reader, cache, self.codec)
            if isinstance(cached, str):
                note = f"{note}; {cached}" if note else cached
                cache.clear()
            else:
                ec, forward = cached
                source, forward_stored = "cache", ec.records_read == 0
                ec.build_seconds = time.perf_counter() - started
        if ec is None:
            ec = EventualCheckpointBuilder(self.reader, self.codec, progress=self.progress).build()
            if cache is not None:
                parts = {fp.key: fp.row for fp in ec.windows.values()}
                forward = ForwardCheckpoint(parts, ec.crash_row, ec.end_offset)
        asked: LiveStates | str | None = replica
        if replica is not None and source != "standby":
            asked = "the standby's checkpoint was not used"
        elif replica is not None and ec.complete:
            asked = "the log is complete"
        self.on_phase("ec_load")
        recovery = load_checkpoint(ec, self.decode_state, self.codec, input_partitions, replica=asked)
        report = recovery.report
        report.ec_build_seconds = ec.build_seconds
        report.recovery_seconds = time.perf_counter() - started
        report.ec_source, report.ec_cache_note = source, note
        recovery.forward, recovery.forward_stored = forward, forward_stored
        return recovery


def _live_windows(
    footprints: list[ECFootprint], records: list[OutputRecord], live: Mapping[str, OpenWindow] | str
) -> tuple[list[OpenWindow] | None, str]:
    """The live window of each footprint's key (`records`: the footprints' records, in their order), when
    `live` holds exactly those windows (each key at the same seq; windows it holds beyond them closed in the
    log, by the tuple the crash cut); else None and why not."""
    if isinstance(live, str):
        return None, live
    held = list(map(live.get, map(_KEY, footprints)))  # C-level: one lookup per window, no Python frame
    try:
        # (Not `None in held`: that calls the windows' dataclass __eq__ once per window, in Python.)
        if list(map(_SEQ, held)) == list(map(_SEQ, records)):
            return held, "used"  # type: ignore[return-value]  # no None in it: each has a seq
    except AttributeError:  # a key the replica holds no window of (None): said below
        pass
    for fp, window, record in zip(footprints, held, records, strict=True):
        if window is None or window.seq != record.seq:
            got = "none" if window is None else f"window {window.seq}"
            return (
                None,
                f"the replica's windows differ from the log's (key {fp.key!r}: log window {record.seq}, "
                f"replica {got})",
            )
    raise AssertionError("unreachable: a difference was found above")


def load_checkpoint(
    ec: EventualCheckpoint,
    decode_state: Callable[[bytes], Any],
    codec: RecordCodec,
    input_partitions: int,
    *,
    replica: LiveStates | str | None = None,
) -> Recovery:
    """EC-load: every footprint's record decoded, the replay planned, and each window's state decoded or,
    where `replica` holds exactly the checkpoint's windows at the crash point (`LiveStates`), taken from it
    (then nothing is replayed). `replica` as a string: why none was asked (the report's `replica`). The
    report's `ec_load_seconds` leaves out the replica's catch-up, its `replica_seconds` (a restart's
    timeline counts it in its `ec_load` phase)."""
    load_started = time.perf_counter()
    # The scan met the footprints newest first: reversed, they are (almost always) in offset order
    # already, which sorted() then confirms in one pass.
    footprints = sorted(reversed(ec.windows.values()), key=_OFFSET)
    with gc_paused():
        records = footprint_records(footprints, codec)
    plan = ReplayContract.build(
        ec.crash_pos, dict(zip(map(_KEY, footprints), map(_POS, records), strict=True)), input_partitions
    )
    handed: list[OpenWindow] | None = None
    replica_note, replica_seconds = "", 0.0
    if isinstance(replica, str):
        replica_note = replica
    elif replica is not None:
        replica_started = time.perf_counter()
        handed, replica_note = _live_windows(footprints, records, replica.states_at(ec, plan.replay_span))
        replica_seconds = time.perf_counter() - replica_started
    windows: list[LoadedWindow] = []
    if handed is None:
        with gc_paused():
            windows = [
                _loaded(fp.key, record.seq, decode_state(record.state or b""), fp)
                for fp, record in zip(footprints, records, strict=True)
            ]
    load_seconds = time.perf_counter() - load_started - replica_seconds
    report = RecoveryReport(
        log_end=ec.end_offset,
        extent_records=ec.extent_size,
        records_read=ec.records_read,
        ec_windows=len(footprints),
        corrupt_footprints=ec.corrupt_skipped,
        ec_build_seconds=ec.build_seconds,
        ec_load_seconds=load_seconds,
        replay_start=plan.start,
        crash_pos=plan.crash_pos,
        replay_span=0 if handed is not None else plan.replay_span,
        log_complete=ec.complete,
        replica=replica_note,
        replica_seconds=replica_seconds,
    )
    return Recovery(
        ec,
        windows,
        plan,
        report,
        at_crash_point=handed is not None,
        handed_over=handed,
        footprints=footprints if handed is not None else [],
        records=records if handed is not None else [],
    )
