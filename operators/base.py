"""What an operator is to the runtime.

An operator sees one input tuple at a time and acts through an `OperatorContext` (the runtime): it opens
and closes windows and emits results. The runtime owns everything CEC adds: window sequences, N, the
input position vector, footprints, the output queue. So an operator stays what it would be without fault
tolerance, as in the paper (about 30 lines changed in the Borealis aggregate).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

from cec.registry import OpenWindow, WindowRegistry

# The payload of a DEAD record: an input tuple the operator could not use, and why.
DEAD_LETTER_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "DeadLetter",
    "namespace": "cec",
    "fields": [
        {"name": "partition", "type": "long"},
        {"name": "offset", "type": "long"},
        {"name": "reason", "type": "string"},
        {"name": "raw", "type": "string"},
    ],
}

__all__ = ["DEAD_LETTER_SCHEMA", "InputTuple", "Operator", "OperatorContext"]


class InputTuple(NamedTuple):
    # A NamedTuple, not a frozen dataclass: sources build one per input record, and a NamedTuple is built
    # about 4x faster (measured 0.3 vs 1.1 us on this machine), which is a large share of a source's cost.
    partition: int
    offset: int
    # Read-only: not always a dict (the Kafka topic source delivers `cec._native.Record`, a mapping equal
    # to the record's dict); an operator that wants to change it builds its own (`{**value, ...}`).
    value: Mapping[str, Any] | None
    # Why the source could not decode the tuple (corrupt upstream record); it goes to the dead letters.
    error: str | None = None
    # The input as it was read (a CSV line, a topic record's value bytes), kept for its dead letter.
    raw: str | bytes | None = None


class OperatorContext(Protocol):
    @property
    def registry(self) -> WindowRegistry: ...

    @property
    def time(self) -> int:
        """The operator's logical time."""
        ...

    def open_window(self, key: str, state: Any) -> OpenWindow:
        """Open `key`'s next window with `state` (after the opening tuple). The G-open is emitted once
        the current tuple is processed, unless the window already closed again."""
        ...

    def close_window(self, key: str, result: Mapping[str, Any] | None) -> None:
        """Close `key`'s open window, emitting `result` as its R. `result` None: an R without a result
        (the window's state went into another window's result, as a session's slice does): it still ends the
        window's footprints for the EC, and every reader of results skips it."""
        ...

    def checkpoint_window(self, key: str) -> None:
        """Emit a G-check of `key`'s open window now, among the records of the tuple being applied: an
        operator that moves one window's state into another footprints the receiver before it closes the
        giver, so that every prefix of the log holds the state once."""
        ...

    def emit(self, result: Mapping[str, Any]) -> None:
        """Emit a result that belongs to no window (stateless operators)."""
        ...


class Operator(abc.ABC):
    """A (possibly stateful) stream operator. Must be deterministic given each key's input order."""

    name: str = "operator"
    result_schema: dict[str, Any]
    state_schema: dict[str, Any] | None = None
    # Event-time watermarks: None keeps none; else windows with an end (`window_end`) close when the
    # watermark, max event time per input partition less this many ms, min over partitions, passes it.
    allowed_lateness: int | None = None

    @property
    def stateful(self) -> bool:
        return self.state_schema is not None

    @abc.abstractmethod
    def key_of(self, value: Mapping[str, Any]) -> str | None:
        """The tuple's window key, or None if it has none (stateless operators, unparseable tuples).
        Raises `BadTupleError` for a key that cannot be kept exactly (e.g. bytes that are not UTF-8): such a
        key is never mapped onto another one."""

    def event_time(self, value: Mapping[str, Any]) -> int | None:
        """The tuple's event time in ms, if the operator has one; logical time advances with it."""
        return None

    @abc.abstractmethod
    def process(self, tup: InputTuple, ctx: OperatorContext) -> None:
        """Apply one tuple. Raise `cec.exceptions.BadTupleError` to dead-letter it; state must then be
        unchanged. So every check comes first: whatever a window's state, result or time will hold must
        fit its Avro type (longs within 64 bits, finite doubles) before the first window changes, because
        an encode error after that would crash the operator on the same tuple at every restart."""

    def window_end(self, state: Any) -> int | None:
        """The event time at which a window with `state` ends (the watermark closes it there), or None
        if only its own input closes it."""
        return None

    def expire(self, key: str, seq: int, state: Any) -> Mapping[str, Any]:
        """The result of `key`'s window `seq` closed by the watermark (only for windows with an end)."""
        raise NotImplementedError(f"{self.name} has no windows the watermark closes")

    def window_end_after(self, state: Any, watermark: int | None) -> int | None:
        """The first end past `watermark` (None: none yet) at which the watermark acts on a window with
        `state` (every end at or below it has acted already: its records are in the log). Default:
        `window_end`, which for a window closed whole always lies past the watermark."""
        return self.window_end(state)

    def close_expired(self, window: OpenWindow, end: int, ctx: OperatorContext) -> int | None:
        """The watermark passed `end` of `window` (open). Default: close it with its result (`expire`) and
        return None. An operator whose windows close together (a session's slices) may close others with
        it, or leave it open for a later window's close to take along; a window part that serves several
        windows (`operators.hopping`) may emit one window's result without closing anything and return the
        later end at which the watermark acts on it again."""
        ctx.close_window(window.key, self.expire(window.key, window.seq, window.state))
        return None

    # Whether each result is made at most once by a failure-free run, identified by `result_identity`: a
    # recovery then reads the results at the log's end (those of the tuple the crash cut, which is applied
    # again) and the instance does not make those again (`operators.hopping`: results that close no part).
    unique_results: bool = False

    def result_identity(self, result: Mapping[str, Any]) -> object:
        """What identifies a result when `unique_results` (e.g. its key and window start)."""
        raise NotImplementedError(f"{self.name} does not identify its results")

    def encode_state(self, state: Any) -> bytes:
        raise NotImplementedError(f"{self.name} is stateless")

    def decode_state(self, data: bytes) -> Any:
        """The state of `encode_state`'s or `encode_footprint`'s bytes (footprints in the log hold either)."""
        raise NotImplementedError(f"{self.name} is stateless")

    def decode_states(self, datas: list[bytes]) -> list[Any]:
        """`[decode_state(d) for d in datas]`: EC-load decodes every open window's state at once, ~91,000
        at the paper's scale (an operator with a batch decoder gives it here)."""
        decode = self.decode_state
        return [decode(d) for d in datas]

    def encode_footprint(self, state: Any) -> bytes:
        """The state bytes a footprint (G-open, G-check) carries: `encode_state`'s, unless the operator has a
        shorter form for some states (which `decode_state` must then read as well)."""
        return self.encode_state(state)

    def encode_footprints(self, states: list[Any]) -> list[bytes]:
        """`[encode_footprint(s) for s in states]`: a run of G-checks taken at one moment (the runtime's
        batched G-check); operators with a cheaper way to encode many states at once override it."""
        encode = self.encode_footprint
        return [encode(state) for state in states]

    def describe(self) -> str:
        return self.name
