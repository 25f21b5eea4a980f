"""The restore path: its own reader on the operator's output log, separate from the writer.

`RecoveryManager.recover()` rebuilds the eventual checkpoint, decodes every window state (EC-load) and
plans the replay. The runtime installs the loaded windows and seeks its input to the plan; the plan then
decides tuple by tuple until the input passes the crash point (`recovery.contract`).
"""

from __future__ import annotations

import dataclasses
import operator
import time
from collections.abc import Callable, Iterator, Mapping
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

__all__ = ["LiveStates", "Recovery", "RecoveryManager", "RecoveryReport"]


class LiveStates(Protocol):
    """Window states already brought to a crash point by something that applied the input itself (a
    standby's replica, `operators.replica`): asked once a standby's checkpoint is known, instead of
    decoding the footprints and replaying from them."""

    def states_at(self, ec: EventualCheckpoint, within: int) -> Mapping[str, OpenWindow] | str:
        """key -> its open window (seq and state) of every window open at `ec.crash_pos`, the input applied
        up to it, handed over: recovery installs these objects themselves, their footprint marks set from
        the log (`load_checkpoint`); or why not (then recovery decodes the footprints and replays, as without
        them). `within`: the tuples a replay from the footprints would read; a replica further behind the
        crash point than that says so instead of catching up (the replay is then the shorter way)."""
        ...


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
    # The loaded windows installed in the operator instance (`OperatorInstance.restore`, part of the `restore` phase):
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
    # The checkpoint's windows as the operator's registry holds them, oldest footprint first (the log's
    # order), each with its footprint's marks (`_marks`): decoded from the footprints, or a replica's own.
    windows: list[OpenWindow]
    plan: ReplayContract
    report: RecoveryReport
    # The checkpoint as the EC cache goes on from it (`queuestore.ec_cache`), and whether the cache holds
    # it already (loaded from it with no tail); None without a cache.
    forward: ForwardCheckpoint | None = None
    forward_stored: bool = False
    # The windows are a standby's replica's own, their states as of the crash point already: nothing to
    # replay (at the paper's scale, making ~92k objects twice more was most of a takeover after its catch-up).
    at_crash_point: bool = False

    @property
    def needed(self) -> bool:
        """False on a fresh start (empty log)."""
        return self.checkpoint.crash_pos is not None

    @property
    def complete(self) -> bool:
        """The operator had already finished (its log ends with EOS)."""
        return self.checkpoint.complete


def _marks(
    ec: EventualCheckpoint, footprints: list[ECFootprint], records: list[OutputRecord]
) -> tuple[Iterator[int], Iterator[int], Iterator[int]]:
    """The one rule for a loaded window's marks, as columns (one per footprint, in its order): its footprint's
    logical time (tau1 = tau2), its output mark relative to the log's end and its input mark relative to
    the crash point, where a recovered instance's counts start. Columns, not a Python frame per window: at
    the paper's scale (92k windows) each per-window pass is memory-bound (more so in a replica's large heap)."""
    crash_total = 0 if ec.crash_pos is None else sum(ec.crash_pos)  # None: an empty log, no footprints
    times = map(_TIME, records)
    out_marks = map((-ec.end_offset).__add__, map(_OFFSET, footprints))
    in_marks = map((-crash_total).__add__, map(sum, map(_POS, records)))
    return times, out_marks, in_marks


def _mark(
    windows: list[OpenWindow],
    footprints: list[ECFootprint],
    records: list[OutputRecord],
    ec: EventualCheckpoint,
) -> None:
    """Give a replica's windows (handed over in the footprints' order) their footprints' marks (`_marks`)."""
    for window, time_, out_mark, in_mark in zip(windows, *_marks(ec, footprints, records), strict=True):
        window.tau1 = window.tau2 = time_
        window.out_mark = out_mark
        window.in_mark = in_mark


_OFFSET = operator.attrgetter("offset")
_KEY = operator.attrgetter("key")
_POS = operator.attrgetter("pos")
_SEQ = operator.attrgetter("seq")
_TIME = operator.attrgetter("time")
_WINDOW_SLOTS = tuple(getattr(OpenWindow, f.name) for f in dataclasses.fields(OpenWindow))


def _window(key: str, seq: int, state: Any, time_: int, out_mark: int, in_mark: int) -> OpenWindow:
    """OpenWindow(key, seq, state, time_, time_, out_mark, in_mark); built by the C accelerator when there,
    because a dataclass's __init__ would be the largest cost of EC-load."""
    if native is None:
        return OpenWindow(key, seq, state, time_, time_, out_mark, in_mark)
    window: OpenWindow = native.make(
        OpenWindow, _WINDOW_SLOTS, (key, seq, state, time_, time_, out_mark, in_mark)
    )
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
        decode_states: Callable[[list[bytes]], list[Any]] | None = None,
    ) -> None:
        """`on_phase` is told "ec_build", then "ec_load", as each phase starts (metrics). `decode_states`:
        `decode_state` of a list at once, where the operator has it (`Operator.decode_states`)."""
        self.reader = reader
        self.decode_state = decode_state
        self.decode_states = decode_states
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
        recovery = load_checkpoint(
            ec,
            self.decode_state,
            self.codec,
            input_partitions,
            replica=asked,
            decode_states=self.decode_states,
        )
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
    decode_states: Callable[[list[bytes]], list[Any]] | None = None,
) -> Recovery:
    """EC-load: every footprint's record decoded, the replay planned, and each window's state decoded (by
    `decode_states` at once where given, else `decode_state` one by one) or,
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
    if handed is not None:
        windows = handed
        _mark(windows, footprints, records, ec)
    else:
        with gc_paused():
            raw = [record.state or b"" for record in records]
            states = decode_states(raw) if decode_states is not None else list(map(decode_state, raw))
            windows = list(
                map(
                    _window,
                    map(_KEY, footprints),
                    map(_SEQ, records),
                    states,
                    *_marks(ec, footprints, records),
                )
            )
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
    )
