"""`--crash-after K` (`cec run`, `cec demo`'s local pipeline): the product's own demonstration of a crash.

The operator process is SIGKILLed right after it applied its K-th input tuple of this run (no `finally`, no
atexit, no flush: what was appended but is not durable yet is lost, as in any crash), and the CLI starts it
again to recover. It is a source in front of the job's input (`CrashAfter`): it hands the operator at most
K tuples, and when the operator asks for more it kills the process, so the operator loop and the engine
run exactly their production paths up to the crash.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from typing import Any

from cec.exceptions import ConfigError
from operators.base import InputTuple
from operators.sources import InputSource

__all__ = ["CrashAfter"]


class CrashAfter(InputSource):
    """`source`, SIGKILLing this process once `k` tuples were read from it and the operator asks for more."""

    def __init__(self, source: InputSource, k: int) -> None:
        if k < 1:
            raise ConfigError(f"crash after K >= 1 tuples, got {k}")
        self.source = source
        self.k = k
        self.delivered = 0
        self.partitions = source.partitions

    def __getattr__(self, name: str) -> Any:  # global_partitions, acknowledge, ...: the source's own
        return getattr(self.source, name)

    def poll(self, max_records: int) -> list[InputTuple] | None:
        left = self.k - self.delivered
        if left <= 0:
            os.kill(os.getpid(), signal.SIGKILL)
        batch = self.source.poll(min(max_records, left))
        if batch:
            self.delivered += len(batch)
        return batch

    def seek(self, positions: Sequence[int]) -> None:
        self.source.seek(positions)

    def close(self) -> None:
        self.source.close()

    def describe(self) -> str:
        return self.source.describe()

    def identity(self) -> dict[str, Any]:
        return self.source.identity()

    def progress_bounds(self) -> tuple[list[int], list[int]] | None:
        return self.source.progress_bounds()

    def pin(self, recorded: Mapping[str, Any]) -> None:
        self.source.pin(recorded)
