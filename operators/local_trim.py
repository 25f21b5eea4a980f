"""Trimming of the local host's output log (DESIGN-NOTES section 3): the I/O around the engine's rule
(`operators.engine.trimming`), and the acknowledgements of an input that is a cec queue.

`LogTrimmer` trims at every due point (`TrimPoints`: each time `trim_every` more records were appended):
it makes everything appended durable (so the oldest open window's newest footprint is in the log), waits
for a paced consumer (`TrimPace`: `cec run`'s results writer) to be within its lag of the durable end,
and trims to min(the extent start, every registered consumer's acknowledgement). Right after each trim
the log therefore keeps at most max(what recovery needs, the paced lag) records, whatever the machine's
load; between two trims it grows by at most one interval and one batch. When a run stops with everything
durable it trims to the bound of then (`at_rest`) and reports that bound (`RunStats.trim_bound`), so a
host whose consumer acknowledges last (`cec run`: the results writer's final commit) trims to it after
(`trim_after_consumers`). Never while the instance is restoring. A trim also acknowledges, to an input
that is a registered consumer's queue, everything below the `pos` of the oldest record kept: older than
every footprint a recovery needs, so at most any replay start, it is never read again.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from cec.exceptions import CodecError
from cec.records import RecordCodec
from operators.engine import OperatorInstance, Phase
from operators.engine.trimming import TrimPace, TrimPoints, bound, capped
from operators.sources import InputSource
from queuestore.base import QueueStore
from queuestore.output import OutputQueue

if TYPE_CHECKING:
    from cec.metrics import OperatorMetrics  # prometheus_client: imported only by a run that serves metrics

__all__ = ["LogTrimmer", "trim_after_consumers"]

# How long the operator waits between two looks at a paced consumer's acknowledgement (doubling from the
# first to the last): a poll interval, not a timing any result depends on.
_PACE_WAIT_S = (0.002, 0.1)


class LogTrimmer:
    """Trims `output`, the log of `instance`, every `every` appended records (module doc)."""

    def __init__(
        self,
        instance: OperatorInstance,
        source: InputSource,
        output: OutputQueue,
        codec: RecordCodec,
        every: int,
        metrics: OperatorMetrics | None = None,
        *,
        pace: TrimPace | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> None:
        self.instance = instance
        self.source = source
        self.output = output
        self.codec = codec
        self.metrics = metrics
        self.points = TrimPoints(every, output.appended)
        self.pace = pace
        self.stop = stop or (lambda: False)

    def _trimming(self) -> bool:
        return self.instance.phase is not Phase.RESTORING and self.instance.footprints

    def after_batch(self) -> None:
        """At a due point: everything appended durable, the paced consumer within its lag, then the trim."""
        if not self._trimming() or not self.points.due(self.output.appended):
            return
        self.output.flush()  # the bound of now is then durable: it may be applied at once
        self._trim_to(self._bound(), self._wait_for_pace())

    def at_rest(self) -> None:
        """Everything appended is durable (the end of a run): trim to the bound of now (the paced consumer
        within its lag first, as at a due point), and report it."""
        if not self._trimming():
            return
        low = self._bound()
        self.instance.stats.trim_bound = low
        self._trim_to(low, self._wait_for_pace())

    def _acknowledged(self) -> dict[str, int]:
        return self.output.store.acknowledged(self.output.topic, self.output.partition)

    def _wait_for_pace(self) -> dict[str, int] | None:
        """Back-pressure (`TrimPace`): wait, serving the writer's completions, until the paced consumer is
        within its lag of the durable end (or the run is asked to stop); the acknowledgements last read
        (None: no pace, none read)."""
        pace = self.pace
        if pace is None:
            return None
        output = self.output
        wait, longest = _PACE_WAIT_S
        acks = self._acknowledged()
        if pace.caught_up(output.index.next_offset, acks):
            return acks
        self.instance.stats.trim_waits += 1
        while not self.stop():
            output.poll(wait)
            wait = min(2 * wait, longest)
            acks = self._acknowledged()
            if pace.caught_up(output.index.next_offset, acks):
                break
        return acks

    def _bound(self) -> int:
        index = self.output.index
        oldest = self.instance.registry.oldest()
        return bound(index.next_offset, None if oldest is None else index.offset_for_time(oldest.tau2))

    def _trim_to(self, low: int, acks: dict[str, int] | None = None) -> None:
        """Trim to `low` capped by every registered consumer's acknowledgement (`acks`: as just read)."""
        output, index = self.output, self.output.index
        end = index.next_offset
        needed = end - low  # what recovery needs: from the extent start (or the crash record) to the end
        low = capped(low, (self._acknowledged() if acks is None else acks).values())
        stats = self.instance.stats
        if low > index.start_offset:
            trimmed = output.writer.trim(low)
            index.prune(low)
            stats.trimmed_offsets += trimmed
            if self.metrics is not None:
                self.metrics.trimmed(trimmed)
            stats.retained_samples.append((self.instance.in_count, end - low))
            self._acknowledge(low)
        stats.trims.append((self.instance.in_count, end - index.start_offset, needed))

    def register(self) -> None:
        """An input that is a registered consumer's queue: register this instance as its consumer from the
        current positions (the replay start)."""
        acknowledge = getattr(self.source, "acknowledge", None)
        if acknowledge is not None:
            acknowledge(self._consumer_name(), list(self.instance.positions))

    def _acknowledge(self, low: int) -> None:
        acknowledge = getattr(self.source, "acknowledge", None)
        if acknowledge is None:
            return
        with self.output.store.reader(self.output.topic, self.output.partition) as reader:
            records = reader.read_forward(low, 1)
        try:
            pos = self.codec.decode(records[0].value, records[0].meta).pos if records else None
        except CodecError:  # a part of a chunked value: acknowledge at the next trim
            return
        if pos is not None:
            acknowledge(self._consumer_name(), list(pos))

    def _consumer_name(self) -> str:
        """This instance as a consumer of its input queue: its output topic and partition."""
        name = re.sub(r"[^a-z0-9-]+", "-", self.output.topic.lower()).strip("-")[:48]
        digest = zlib.crc32(self.output.topic.encode()) & 0xFFFF
        return f"{name or 'op'}-{digest:04x}-{self.output.partition}"


def trim_after_consumers(store: QueueStore, topic: str, partition: int, low: int) -> int:
    """Trim `topic[partition]`, whose instance stopped with `low` as its bound (`RunStats.trim_bound`), to
    that bound capped by every registered consumer's acknowledgement of now: after the last consumer's
    final acknowledgement (`cec run`'s results writer), this leaves the log at what recovery needs. Opens
    the partition's writer (its lock: the instance must have stopped). Returns the offsets trimmed."""
    output = OutputQueue(store, topic, partition)
    try:
        low = capped(min(low, output.index.next_offset - 1), store.acknowledged(topic, partition).values())
        if low <= output.index.start_offset:
            return 0
        trimmed = output.writer.trim(low)
        output.index.prune(low)
        return trimmed
    finally:
        output.close()
