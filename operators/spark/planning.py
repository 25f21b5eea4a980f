"""Recovery planning of an attached aggregation, on the driver (`operators.spark.attach`).

On every start (the Spark checkpoint is never reused: each start is a fresh query):
- per output partition of every generation (`operators.spark.generations`): `EventualCheckpointBuilder`
  over its log -> EC windows and crash point t_c (the zero vector for an empty log), checked by
  `recovery.contract.ReplayContract.build` (one input width, no footprint beyond its crash point); per
  key, the last closed window sequence from the partition's stream index;
- per key, its crash point C_k = max over generations g of t_c[g][q_g(k)] (component-wise): every tuple of
  k below C_k has its outputs in some log, none at or above has. The open window of k is the EC window with
  the highest seq, unless a closed seq >= it exists (it closed in a later generation);
- initialState of the fresh query: open windows (seq, state, pos_w, generation of the footprint) and, for
  keys without one, the next window seq (last closed seq + 1);
- the input restarts at T[j] = min(min over EC windows of pos_w[j], max_g min_q t_c[g][q][j]), a lower
  bound of every C_k[j]. With one generation and one output partition this is exactly the contract's
  replay start (`ReplayContract.start`); with several, each log's contract start is combined so that T is
  below every key's own C_k. The per-tuple rule itself (`tuple_fate` with C_k) is applied by the processor.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cec.exceptions import ConfigError
from operators.spark.generations import Generation
from queuestore.index import StreamIndex
from queuestore.output import OutputQueue
from recovery.contract import ReplayContract
from recovery.eventual import EventualCheckpointBuilder
from recovery.exceptions import RecoveryError

if TYPE_CHECKING:
    from queuestore.kafka import KafkaQueueStore

__all__ = ["AttachRecovery", "LoadedWindow", "LogEnd", "plan_recovery"]


@dataclass(frozen=True)
class LogEnd:
    """Where one output log of the current generation stands: the sink continues from here."""

    pos: tuple[int, ...]
    n: int
    time: int
    offset: int = 0  # the log's end offset (where the next record goes; transaction markers included)


@dataclass(frozen=True)
class LoadedWindow:
    seq: int
    state: bytes
    pos_w: tuple[int, ...]
    generation: int


@dataclass
class AttachRecovery:
    """What a start found in the output logs and how it resumes (all zero on a fresh start)."""

    generations: list[Generation]
    current: Generation
    resumed: bool = False
    crash_points: list[list[tuple[int, ...]]] = field(default_factory=list)  # per generation, per partition
    start: tuple[int, ...] = ()  # replay start T per input partition
    ec_windows: int = 0  # open windows loaded from the logs
    closed_keys: int = 0  # keys whose next window seq was loaded
    records_read: int = 0  # records the EC scans read
    seconds: float = 0.0
    ends: list[LogEnd] = field(default_factory=list, repr=False)
    windows: dict[str | None, LoadedWindow] = field(default_factory=dict, repr=False)
    next_seq: dict[str | None, int] = field(default_factory=dict, repr=False)


def plan_recovery(
    store: KafkaQueueStore,
    generations: list[Generation],
    outputs: Sequence[OutputQueue],
    input_partitions: int,
) -> AttachRecovery:
    """Read every generation's logs back: EC windows, crash points, closed-window directory, replay start."""
    started = time.perf_counter()
    current = generations[-1]
    plan = AttachRecovery(generations, current)
    open_found: dict[str | None, LoadedWindow] = {}
    closed: dict[str | None, int] = {}
    for gen in generations:
        crash: list[tuple[int, ...]] = []
        for q in range(gen.partitions):
            with store.reader(gen.topic, q) as reader:
                ec = EventualCheckpointBuilder(reader).build()
                end_offset = reader.end_offset() if gen is current else 0
            plan.records_read += ec.records_read
            if ec.crash_pos is not None:
                plan.resumed = True
            try:
                # The contract checks the log against the input (width, footprints below the crash point).
                contract = ReplayContract.build(
                    ec.crash_pos, {k: fp.record.pos for k, fp in ec.windows.items()}, input_partitions
                )
            except RecoveryError as exc:
                raise ConfigError(f"{gen.topic}[{q}]: {exc}") from None
            crash.append(contract.crash_pos)
            if gen is current:
                plan.ends.append(LogEnd(contract.crash_pos, ec.n, ec.time, end_offset))
            for key, fp in ec.windows.items():
                record = fp.record
                have = open_found.get(key)
                # The highest seq is the key's latest window; on a tie the later generation's footprint is
                # the newer one.
                if have is None or record.seq >= have.seq:
                    open_found[key] = LoadedWindow(record.seq, record.state or b"", record.pos, gen.index)
            if gen is current:
                for key, seq in outputs[q].index.closed_windows():
                    closed[key] = max(seq, closed.get(key, -1))
            else:
                with StreamIndex(store.index_path(gen.topic, q), identity=f"{gen.topic}/{q}") as index:
                    with store.reader(gen.topic, q) as reader:
                        index.reconcile(reader)
                    for key, seq in index.closed_windows():
                        closed[key] = max(seq, closed.get(key, -1))
        plan.crash_points.append(crash)
    for wkey, loaded in open_found.items():
        if closed.get(wkey, -1) < loaded.seq:
            plan.windows[wkey] = loaded
    plan.next_seq = {k: s + 1 for k, s in closed.items() if k not in plan.windows}
    # T[j]: C_k[j] = max_g t_c[g][q_g(k)][j] >= max_g min_q t_c[g][q][j] for every key k.
    start = [max(min(c[j] for c in crash) for crash in plan.crash_points) for j in range(input_partitions)]
    for loaded in plan.windows.values():
        start = [min(s, p) for s, p in zip(start, loaded.pos_w, strict=True)]
    plan.start = tuple(start)
    plan.ec_windows = len(plan.windows)
    plan.closed_keys = len(plan.next_seq)
    plan.seconds = time.perf_counter() - started
    return plan
