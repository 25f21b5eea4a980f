"""A standby of one operator instance on the local engine (design S1, `designs/standby.md`; `cec run
--standby`): a second process with the same job that follows the primary's output log and keeps the
eventual checkpoint current (`recovery.standby.LogFollower`), and takes over when the primary dies.

- Failure detection: the partition's writer lock. The standby tries to open the partition's writer
  (`operators.job.open_output`, `while_locked`) and, while the primary holds it, follows the log and waits
  `poll_s`. On one host the lock is an flock the kernel releases at once when the primary dies (SIGKILL
  included), so the next try gets it. Across hosts, on Kafka, the writer lease does the same
  (`queuestore.kafka.lease`, the store's `lease_timeout_s`, `cec run --lease-timeout`): a consumer group
  whose session is the lease; a refused try keeps the standby in the group, and it gets the lease once the
  primary's heartbeats stopped for the lease timeout. Without a lease, a standby on another host than its
  primary shares no lock with it and takes over (fences it) at its first try.
- Fencing: getting the writer is the fence. On SQLite the host lock keeps the old writer out; on Kafka the
  new writer's transactional producer (the same `transactional.id`, `queuestore.kafka.producer`) bumps the
  epoch, so a primary that comes back after it was fenced fails its next produce or commit and stops with
  one line (`WriterFencedError`), never writing; the old writer's open transaction is aborted.
- Replica (design S2, on unless `replica=False`, `cec run --standby-replica off`): while following, the
  standby also runs the operator on the input, its records discarded, never past the crash point of the
  newest record it followed (`operators.replica`), a bounded number of tuples between two looks at the lock.
- Takeover: the log's end is final once the writer is ours; recovery brings what was followed to that end
  (`recovery.standby.checkpoint_from_followed`); the replica applies the input up to that end's crash point
  and its states replace the EC load and the replay where they are exactly the checkpoint's windows, else
  recovery replays from the footprints; the run goes on as the primary (its report's `ec_source` is
  "standby", `replica` "used" or why not). Anything that does not check out reads the log back, as a cold
  restart does.
- Lag: every `status_every_s` the standby writes, beside the partition's stream index, how far it has
  applied the log and the log's end then (`StandbyStatus`); `cec inspect` shows it (`cec.inspection`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from operators.collector import collector_spaced
from operators.exceptions import StandbyStoppedError
from queuestore.base import PartitionReader, QueueStore
from recovery.standby import LogFollower

if TYPE_CHECKING:
    from operators.replica import StandbyReplica

__all__ = ["Standby", "StandbyStatus", "read_status", "status_path"]


def status_path(store: QueueStore, topic: str, partition: int) -> Path:
    """Where a standby of the partition writes its status (beside the stream index: local state)."""
    return store.index_path(topic, partition).with_name(f"{topic}.{partition}.standby.json")


@dataclass(frozen=True)
class StandbyStatus:
    pid: int
    state: str  # "following" or "took over"
    applied: int  # every record of the log below this offset is applied
    log_end: int  # the log's end when `applied` was measured
    updated_unix: float  # wall time of the measurement (for a reader on the same host to judge its age)
    # The replica (`operators.replica`): "off", "starting", "applying" (with the input tuples it applied), or
    # why it cannot be used.
    replica: str = "off"
    replica_applied: int = 0
    replica_behind: int | None = None  # input tuples between it and the crash point of the log it followed

    @property
    def lag_records(self) -> int:
        return max(0, self.log_end - self.applied)


def read_status(store: QueueStore, topic: str, partition: int) -> StandbyStatus | None:
    """The partition's standby status, or None if no standby wrote one (or it cannot be read)."""
    try:
        data = json.loads(status_path(store, topic, partition).read_text())
        return StandbyStatus(**data)
    except (OSError, ValueError, TypeError):
        return None


class Standby:
    """The standby loop's state (module doc). `stop()` true: give up waiting (`StandbyStoppedError`).
    `clock` (seconds) times the status writes; `wait` waits between two looks at the lock. `replica`:
    run a replica of the instance (the host attaches it, `attach_replica`); `replica_budget`: input tuples
    it applies between two looks at the lock (bounds how late a takeover starts)."""

    def __init__(
        self,
        *,
        poll_s: float = 0.01,
        status_every_s: float = 0.5,
        stop: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[float], None] = time.sleep,
        replica: bool = True,
        replica_budget: int = 2048,
    ) -> None:
        self.poll_s = poll_s
        self.status_every_s = status_every_s
        self.stop = stop or (lambda: False)
        self.clock = clock
        self.wait = wait
        self.follower = LogFollower()
        self._reader: PartitionReader | None = None
        self._status: Path | None = None
        self._written_at: float | None = None
        self._handed = False
        self.wants_replica = replica
        self.replica_budget = replica_budget
        self.replica: StandbyReplica | None = None
        # The collector spaced over the whole wait, not per look at the lock: set back to its usual thresholds
        # between two looks, its counts grown under the spaced ones, it ran a full pass over the replica's
        # windows at almost every look (~5% of the standby's CPU at 100,000 keys, measured).
        self._spaced: ExitStack | None = None

    def attach_replica(self, replica: StandbyReplica) -> None:
        """The host's replica of the instance (`operators.replica`), run while the primary holds the writer."""
        if self.replica is not None:
            self.replica.close()
        self.replica = replica

    def while_locked(self, store: QueueStore, topic: str, partition: int) -> None:
        """The primary still holds the writer: apply what the log holds now, publish the lag when due, wait."""
        if self.stop():
            self.close()
            raise StandbyStoppedError(f"the standby of {topic}[{partition}] stopped before any takeover")
        if self._reader is None:
            self._reader = store.reader(topic, partition)
            self._status = status_path(store, topic, partition)
        # As the runtime's loop does (`operators.collector`): the replica holds as many windows as the
        # primary, which the collector would otherwise walk every few hundred allocations.
        if self._spaced is None:
            self._spaced = ExitStack()
            self._spaced.enter_context(collector_spaced())
        read = self.follower.catch_up(self._reader)
        replica = self.replica
        if replica is not None:
            read += replica.advance(self.follower, self.replica_budget)
        now = self.clock()
        if self._written_at is None or now - self._written_at >= self.status_every_s:
            self._written_at = now
            self._write_status("following", self._reader.end_offset())
        if read == 0:
            self.wait(self.poll_s)

    def took_over(self) -> LogFollower | None:
        """The writer is ours: what was followed, for recovery (once; None after, or if nothing was). The
        replica, if any, stays attached for recovery (`replica`)."""
        if self._handed or self._reader is None:
            return None
        self._handed = True
        self.close()
        self._write_status("took over", self.follower.applied)
        return self.follower

    def _write_status(self, state: str, log_end: int) -> None:
        path = self._status
        if path is None:
            return
        replica, replica_state, replica_applied, behind = self.replica, "off", 0, None
        if replica is not None:
            replica_applied, behind = replica.applied, replica.behind
            if replica.unusable is not None:
                replica_state = replica.unusable
            else:
                replica_state = "applying" if replica.instance is not None else "starting"
        status = StandbyStatus(
            os.getpid(),
            state,
            self.follower.applied,
            log_end,
            time.time(),
            replica_state,
            replica_applied,
            behind,
        )
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            # A standby on another host (its own state directory) follows before it has an index there.
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(asdict(status)))
            tmp.replace(path)
        except OSError:  # the status is for people; the standby goes on without it
            pass

    def close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()
        spaced, self._spaced = self._spaced, None
        if spaced is not None:
            spaced.close()
