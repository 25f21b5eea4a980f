"""A standby of one operator instance on the local engine (design S1, `designs/standby.md`; `cec run
--standby`): a second process with the same job that follows the primary's output log and keeps the
eventual checkpoint current (`recovery.standby.LogFollower`), and takes over when the primary dies.

- Failure detection: the partition's writer lock. The standby tries to open the partition's writer
  (`operators.job.open_output`, `while_locked`) and, while the primary holds it, follows the log and waits
  `poll_s`. On one host the lock is an flock the kernel releases at once when the primary dies (SIGKILL
  included), so the next try gets it. There is no lease or heartbeat across hosts (yet): a standby on
  another host than its primary takes over only where the store's lock is shared.
- Fencing: getting the writer is the fence. On SQLite the host lock keeps the old writer out; on Kafka the
  new writer's transactional producer (the same `transactional.id`, `queuestore.kafka.producer`) bumps the
  epoch, so a primary that comes back after it was fenced fails its next produce or commit and stops with
  one line (`WriterFencedError`), never writing; the old writer's open transaction is aborted.
- Takeover: the log's end is final once the writer is ours; recovery brings what was followed to that end
  (`recovery.standby.checkpoint_from_followed`), replays from the footprints and the run goes on as the
  primary (its report's `ec_source` is "standby"). Anything that does not check out reads the log back, as
  a cold restart does.
- Lag: every `status_every_s` the standby writes, beside the partition's stream index, how far it has
  applied the log and the log's end then (`StandbyStatus`); `cec inspect` shows it (`cec.inspection`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from operators.exceptions import StandbyStoppedError
from queuestore.base import PartitionReader, QueueStore
from recovery.standby import LogFollower

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
    `clock` (seconds) times the status writes; `wait` waits between two looks at the lock."""

    def __init__(
        self,
        *,
        poll_s: float = 0.01,
        status_every_s: float = 0.5,
        stop: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[float], None] = time.sleep,
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

    def while_locked(self, store: QueueStore, topic: str, partition: int) -> None:
        """The primary still holds the writer: apply what the log holds now, publish the lag when due, wait."""
        if self.stop():
            self.close()
            raise StandbyStoppedError(f"the standby of {topic}[{partition}] stopped before any takeover")
        if self._reader is None:
            self._reader = store.reader(topic, partition)
            self._status = status_path(store, topic, partition)
        read = self.follower.catch_up(self._reader)
        now = self.clock()
        if self._written_at is None or now - self._written_at >= self.status_every_s:
            self._written_at = now
            self._write_status("following", self._reader.end_offset())
        if read == 0:
            self.wait(self.poll_s)

    def took_over(self) -> LogFollower | None:
        """The writer is ours: what was followed, for recovery (once; None after, or if nothing was)."""
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
        status = StandbyStatus(os.getpid(), state, self.follower.applied, log_end, time.time())
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(asdict(status)))
            tmp.replace(path)
        except OSError:  # the status is for people; the standby goes on without it
            pass

    def close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()
