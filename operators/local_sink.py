"""The local host's `RecordSink` (`operators.engine.records`): each record's `pos` stamped as it is made,
then encoded and appended to the instance's output queue.

Stamping (`recovery.contract.PositionStamper`, the rule every host follows): a record of a tuple carries
the live position vector with that tuple claimed (the tuple's last record) or not, floored by the previous
record's pos, which starts at the log's crash point (`floor`); a record no tuple produced (G-check, EOS)
carries the live vector, floored.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

from cec.records import Kind, OutputRecord, RecordCodec
from cec.registry import OpenWindow
from operators.base import InputTuple
from operators.engine.records import HeldRecord, Marks, Moment
from queuestore.base import RecordMeta
from queuestore.output import OutputQueue
from recovery.contract import PositionStamper

__all__ = ["OutputQueueSink"]

_PLAIN_ENCODE = RecordCodec.encode
_KEY, _SEQ = attrgetter("key"), attrgetter("seq")
_KIND_NAME = {kind: kind.value for kind in Kind}  # Enum.value is a descriptor call: too slow per record


class OutputQueueSink:
    """Stamps and appends an instance's records to `output` (module doc). `batched`: G-checks taken at
    one moment are encoded in one call and appended in one store call (a codec that overrides `encode`, a
    test's timed codec, is called with whole records, one at a time)."""

    def __init__(self, output: OutputQueue, codec: RecordCodec, partitions: int) -> None:
        self.output = output
        self.codec = codec
        self.stamper = PositionStamper((0,) * partitions)
        self._encode_fields = codec.encode_fields if type(codec).encode is _PLAIN_ENCODE else None

    @property
    def batched(self) -> bool:
        return self._encode_fields is not None

    def floor(self, pos: Sequence[int]) -> None:
        """Continue stamping from a log's crash point (`recovery.contract`, "pos while replaying")."""
        self.stamper = PositionStamper(pos)

    def tuple_records(self, at: Moment, tup: InputTuple, held: list[HeldRecord], marks: Marks | None) -> None:
        last = len(held) - 1
        stamp = self.stamper.stamp
        encode = self._encode_fields
        append = self.output.append
        time, live, partition, offset = at.time, at.positions, tup.partition, tup.offset
        for i, (kind, key, seq, state, payload, n) in enumerate(held):
            pos = stamp(live, partition, offset, claims=i == last)
            record_marks = () if marks is None else marks[i]
            # The record's fields straight to its bytes (no OutputRecord per record: the per-tuple path).
            if encode is None:
                value = self.codec.encode(
                    OutputRecord(kind, time, pos, n, key, seq, state, payload, record_marks)
                )
            else:
                value = encode(kind, time, pos, n, key, seq, state, payload, record_marks)
            append(value, RecordMeta(_KIND_NAME[kind], time, key, seq))

    def gchecks(
        self, at: Moment, windows: Sequence[OpenWindow], states: list[bytes], marks: tuple[int, ...]
    ) -> None:
        time, n = at.time, at.registry.n
        pos = self.stamper.stamp_current(at.positions)
        keys = list(map(_KEY, windows))
        seqs = list(map(_SEQ, windows))
        if self._encode_fields is None:
            for key, seq, state in zip(keys, seqs, states, strict=True):
                record = OutputRecord(Kind.GCHECK, time, pos, n, key, seq, state, None, marks)
                self.output.append(self.codec.encode(record), record.meta())
            return
        values = self.codec.encode_run(Kind.GCHECK, time, pos, n, marks, keys, seqs, states)
        self.output.append_run("GCHECK", time, keys, seqs, values)

    def end_of_stream(self, at: Moment, marks: tuple[int, ...]) -> None:
        pos = self.stamper.stamp_current(at.positions)
        record = OutputRecord(Kind.EOS, at.time, pos, at.registry.n, None, -1, None, None, marks)
        self.output.append(self.codec.encode(record), record.meta())
