"""What an operator instance hands its host: records, through one seam (`RecordSink`), and dead letters in
one form.

The instance decides *which* records exist and in what order, holds the records of the tuple being applied
until it is fully applied, and says which of them claims the tuple (the last one: `recovery.contract`,
"claiming a tuple") and the event-time marks each carries. The host's sink decides where they go and
stamps their `pos`, because the two hosts know different things when they stamp (`recovery.contract`,
"pos while replaying"):
- the local host knows the live input position vector and stamps each record as it appends it
  (`operators.local_sink.OutputQueueSink`);
- the Spark host emits rows that its sink sorts per output partition and stamps afterwards, from the
  tuple's own position and the previous record's pos (`operators.spark.stamping`).

A dead letter is an input tuple the operator could not use. Its one form, on every host: the input's
global partition (the stream's own partition number, not an instance's local index of it), its offset,
the reason, and `raw`: the input as it was read when the host kept it (a CSV line without its line end, a
topic record's value; bytes that are not UTF-8 shown as \\x escapes), else the decoded tuple as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from cec.records import AvroCodec, Kind
from cec.registry import OpenWindow, WindowRegistry
from operators.base import DEAD_LETTER_SCHEMA, InputTuple

__all__ = ["DeadLetters", "HeldRecord", "Marks", "Moment", "RecordSink", "raw_text"]

# A record of the tuple being applied, held until the tuple is done: kind, key, seq, state, payload, N.
HeldRecord = tuple[Kind, str | None, int, bytes | None, bytes | None, int]
# Each record's event-time marks (None: the instance keeps no watermark), or those of records no tuple made.
Marks = list[tuple[int, ...]]


class Moment(Protocol):
    """What a sink reads of the instance that hands it records, at that moment (the instance itself)."""

    @property
    def time(self) -> int:
        """The instance's logical time."""

    @property
    def positions(self) -> Sequence[int]:
        """The instance's live input position vector: the next offset per input partition."""

    @property
    def tuple_event_time(self) -> int | None:
        """The event time of the tuple whose records are handed over, if it has one."""

    @property
    def registry(self) -> WindowRegistry:
        """The instance's open windows (N is `registry.n`)."""


class RecordSink(Protocol):
    """Where an instance's records go (module doc). `at` is the instance at the moment; a sink that
    stamps later may keep what it needs of it (its live positions change with the next tuple)."""

    def tuple_records(self, at: Moment, tup: InputTuple, held: list[HeldRecord], marks: Marks | None) -> None:
        """The records `tup` produced, in order; the last one claims the tuple. `marks`: each record's."""

    def gchecks(
        self, at: Moment, windows: Sequence[OpenWindow], states: list[bytes], marks: tuple[int, ...]
    ) -> None:
        """G-checks of `windows` (each with its footprint state), all taken at this moment."""

    def end_of_stream(self, at: Moment, marks: tuple[int, ...]) -> None:
        """The EOS record: the input ended, everything before it is the operator's whole output."""


def raw_text(tup: InputTuple) -> str:
    """A dead letter's `raw` (module doc)."""
    raw = tup.raw
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "backslashreplace")
    if isinstance(raw, str):
        if raw.endswith("\n"):
            raw = raw[:-2] if raw.endswith("\r\n") else raw[:-1]
        # Undecodable bytes are kept by the CSV source as lone surrogates, which cannot be written as is.
        return raw.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return "" if tup.value is None else json.dumps(dict(tup.value), default=str)


class DeadLetters:
    """The payload of a DEAD record (module doc). `global_partitions[j]`: the stream partition of the
    instance's input partition j (default: the same number)."""

    __slots__ = ("_codec", "_global")

    def __init__(self, global_partitions: Sequence[int] | None = None) -> None:
        self._codec = AvroCodec(DEAD_LETTER_SCHEMA)
        self._global: tuple[int, ...] | None = None if global_partitions is None else tuple(global_partitions)

    def payload(self, tup: InputTuple, reason: str) -> bytes:
        partition = tup.partition if self._global is None else self._global[tup.partition]
        letter: Mapping[str, Any] = {
            "partition": partition,
            "offset": tup.offset,
            "reason": reason,
            "raw": raw_text(tup),
        }
        return self._codec.encode(letter)
