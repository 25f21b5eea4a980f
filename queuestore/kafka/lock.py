"""The same-host guard of a partition's writer (across hosts, transactional ids fence writers:
`queuestore.kafka.producer`)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from queuestore.exceptions import PartitionLockedError

__all__ = ["PartitionLock"]


class PartitionLock:
    """Best-effort single-host exclusivity of a partition's writer.

    An flock on `state_dir/locks/<topic>.<partition>.lock` is released by the kernel when the holder dies,
    so a crashed writer never blocks its successor. It protects only writers sharing this host and state
    directory; across hosts, the writers' transactional ids fence each other (see `KafkaPartitionWriter`):
    this lock only turns a same-host second writer into a clear error before it fences the first. The file
    is never deleted: removing it would let two processes lock two different inodes.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        fh: IO[bytes] = open(path, "a+b")  # noqa: SIM115 - held open for the lock's lifetime
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            fh.close()
            raise PartitionLockedError(f"another writer holds {path}") from exc
        except BaseException:
            fh.close()
            raise
        # The holder's pid helps an operator find who owns the partition; not used for correctness.
        fh.truncate(0)
        fh.write(str(os.getpid()).encode())
        fh.flush()
        self._fh: IO[bytes] | None = fh

    def release(self) -> None:
        if self._fh is not None:
            try:
                fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            finally:
                self._fh.close()
                self._fh = None
