"""Trimming of the local host's output log (DESIGN-NOTES section 3): the I/O around the engine's rule
(`operators.engine.trimming`), and the acknowledgements of an input that is a cec queue.

`LogTrimmer` takes a bound each time `trim_every` more records are durable, applies it once it is safe,
and trims to the bound of now when a run ends with everything durable (so under load the writer's pace,
not `trim_every`, sets how far behind trimming is, and a run that stops leaves its log trimmed to what
recovery needs). Never while the instance is restoring. A trim also acknowledges, to an input that is a
registered consumer's queue, everything below the `pos` of the oldest record kept: older than every
footprint a recovery needs, so at most any replay start, it is never read again.
"""

from __future__ import annotations

import re
import zlib

from cec.exceptions import CodecError
from cec.metrics import OperatorMetrics
from cec.records import RecordCodec
from operators.engine import OperatorInstance, Phase
from operators.engine.trimming import TrimSchedule, bound, capped
from operators.sources import InputSource
from queuestore.output import OutputQueue

__all__ = ["LogTrimmer"]


class LogTrimmer:
    """Trims `output`, the log of `instance`, every `every` durable records (module doc)."""

    def __init__(
        self,
        instance: OperatorInstance,
        source: InputSource,
        output: OutputQueue,
        codec: RecordCodec,
        every: int,
        metrics: OperatorMetrics | None = None,
    ) -> None:
        self.instance = instance
        self.source = source
        self.output = output
        self.codec = codec
        self.metrics = metrics
        self.schedule = TrimSchedule(every)

    def _trimming(self) -> bool:
        return self.instance.phase is not Phase.RESTORING and self.instance.footprints

    def after_batch(self) -> None:
        """A pending bound once it is safe, and the next one when due."""
        if not self._trimming():
            return
        ready = self.schedule.ready(self.output.durable_count)
        if ready is not None:
            self._trim_to(ready)
        self.schedule.take_if_due(
            durable_end=self.output.index.next_offset, appended=self.output.appended, take=self._bound
        )

    def at_rest(self) -> None:
        """Everything appended is durable (the end of a run): trim to the bound of now."""
        if not self._trimming():
            return
        self.schedule.at_rest()
        self._trim_to(self._bound())

    def _bound(self) -> int:
        index = self.output.index
        oldest = self.instance.registry.oldest()
        return bound(index.next_offset, None if oldest is None else index.offset_for_time(oldest.tau2))

    def _trim_to(self, low: int) -> None:
        output, index = self.output, self.output.index
        low = capped(low, output.store.acknowledged(output.topic, output.partition).values())
        if low > index.start_offset:
            trimmed = output.writer.trim(low)
            index.prune(low)
            stats = self.instance.stats
            stats.trimmed_offsets += trimmed
            if self.metrics is not None:
                self.metrics.trimmed(trimmed)
            stats.retained_samples.append((self.instance.in_count, index.next_offset - low))
            self._acknowledge(low)

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
