"""Kafka messages into a topic source's input tuples, a batch at a time (`KafkaTopicSource.poll`): the plain
batch in one pass at C speed (`_fast_batch`, or with the C accelerator one call, `_native_batch`), any
other batch record by record (`_slow_batch`: error events, ends inside the batch, absent values, fields
from the message). Either way a record that cannot be decoded or lacks a field the operator needs becomes
an error tuple (`operators.topic_tuples.RecordTuples`), which the runtime dead-letters."""

from __future__ import annotations

import gc
from itertools import chain, repeat
from typing import Any

from confluent_kafka import KafkaError, Message

from cec.native import native
from operators.base import InputTuple
from operators.formats import ValueDecoder
from operators.topic_tuples import RecordTuples, decode_values

__all__ = ["MessageBatches"]

# The message accessors, called over a whole batch at C speed (`MessageBatches._fast_batch`).
_ACCESSORS = (Message.error, Message.partition, Message.offset, Message.value)
_MSG_ERROR, _MSG_PARTITION, _MSG_OFFSET, _MSG_VALUE = _ACCESSORS


class MessageBatches:
    """The batch decoding of `KafkaTopicSource` (a mixin: it reads the source's positions, limits and
    decoder, and ends partitions through it)."""

    _decoder: ValueDecoder
    _records: RecordTuples
    _getter: Any
    _required: Any
    _inject_ts: bool
    _inject_key: bool
    _native_spec: Any
    _local: dict[int, int]
    _local_of: list[int]
    _limits: list[float]
    _next: list[int]
    _identity_partitions: bool

    def _on_error(self, err: KafkaError, msg: Any) -> None:
        raise NotImplementedError

    def _end_partition(self, local: int) -> None:
        raise NotImplementedError

    def _fast_batch(self, msgs: list[Message]) -> list[InputTuple] | None:
        """The batch's tuples when it is plain (the common case): no error event, every record below its
        partition's end, no value absent, every value decoded with the fields the operator needs. Every
        per-record step runs in C (`map` over the message accessors, one batch decode, `map` building
        the tuples); None, having changed nothing, when the batch needs the per-record path. With the C
        accelerator, all of it is one call (`_native_batch`)."""
        if self._native_spec is not None:
            return self._native_batch(msgs)
        if self._inject_ts or self._inject_key:
            return None
        # Truthiness, not `== None`: KafkaError's comparison with None leaks a TypeError (confluent-kafka).
        if any(map(_MSG_ERROR, msgs)):
            return None
        parts: list[int] = list(map(_MSG_PARTITION, msgs))  # type: ignore[arg-type]
        offsets: list[int] = list(map(_MSG_OFFSET, msgs))  # type: ignore[arg-type]
        local_of, limits = self._local, self._limits
        last = dict(zip(parts, offsets, strict=True))  # offsets grow within a partition: its last offset
        try:
            if any(offset >= limits[local_of[p]] for p, offset in last.items()):
                return None  # past an end, or prefetched after a partition ended: per record
        except KeyError:
            return None
        raws = list(map(_MSG_VALUE, msgs))
        if getattr(self._decoder, "decode_many", None) is None or None in raws:
            return None
        # A batch allocates a dict and a tuple per record, none of them cyclic: the cyclic collector's
        # passes over them halved the input rate (measured: benchmarks/bench_topic_source.py), so it is
        # paused for the batch (process-wide; left as it was if someone else turned it off).
        collecting = gc.isenabled()
        if collecting:
            gc.disable()
        try:
            return self._fast_tuples(msgs, parts, offsets, last, raws, decode_values(self._decoder, raws))
        finally:
            if collecting:
                gc.enable()

    def _native_batch(self, msgs: list[Message]) -> list[InputTuple] | None:
        """`_fast_batch` in one C call (`cec._native.topic_batch`): the same checks, the same tuples, the
        records as mappings that hold the fields the operator reads. A record it declines (tombstone,
        malformed, a field missing, null or nested...) is decoded here on its own, which gives its value
        or its reason exactly as the per-record path."""
        assert native is not None
        collecting = gc.isenabled()  # see _fast_batch
        if collecting:
            gc.disable()
        try:
            got = native.topic_batch(
                msgs, _ACCESSORS, InputTuple, self._local_of, self._limits, self._next, self._native_spec
            )
            if got is None:
                return None
            out, declined = got
            if declined:
                redo = [i for i, t in enumerate(out) if t is None]
                again = [msgs[i] for i in redo]
                fixed = self._tuples(
                    [self._local[m.partition()] for m in again],  # type: ignore[index]
                    [m.offset() for m in again],  # type: ignore[misc]
                    [m.value() for m in again],
                    [],
                )
                for i, tup in zip(redo, fixed, strict=True):
                    out[i] = tup
            return out
        finally:
            if collecting:
                gc.enable()

    def _fast_tuples(
        self,
        msgs: list[Message],
        parts: list[int],
        offsets: list[int],
        last: dict[int, int],
        raws: list[Any],
        decoded: list[Any],
    ) -> list[InputTuple]:
        n, local_of = len(msgs), self._local
        try:
            got = list(map(self._getter, decoded))  # a reason (str) or a record missing a field raises
        except (KeyError, TypeError):
            got = None
        if got is None or (None in got if len(self._required) == 1 else None in chain.from_iterable(got)):
            return self._tuples([local_of[p] for p in parts], offsets, raws, [], decoded=decoded)
        nxt = self._next
        for p, offset in last.items():
            nxt[local_of[p]] = offset + 1
        js = parts if self._identity_partitions else list(map(local_of.__getitem__, parts))
        return list(
            map(
                tuple.__new__,
                repeat(InputTuple, n),
                zip(js, offsets, decoded, repeat(None, n), raws, strict=True),
            )
        )

    def _slow_batch(self, msgs: list[Message]) -> list[InputTuple]:
        """Record by record: error events, ends inside the batch, absent values, injected fields."""
        # `limits[j]` is the pinned end (or no limit), -1 once partition j ended.
        limits, nxt, local_of = self._limits, self._next, self._local
        keep_msgs = self._inject_ts or self._inject_key
        js: list[int] = []
        offsets: list[int] = []
        raws: list[bytes | None] = []
        kept: list[Any] = []
        for msg in msgs:
            if msg.error() is not None:
                self._on_error(msg.error(), msg)  # type: ignore[arg-type]
                continue
            j = local_of[msg.partition()]  # type: ignore[index]
            offset: int = msg.offset()  # type: ignore[assignment]
            if offset >= limits[j]:
                if limits[j] >= 0:
                    self._end_partition(j)
                continue  # past the end, or prefetched before the partition ended
            nxt[j] = offset + 1
            js.append(j)
            offsets.append(offset)
            raws.append(msg.value())
            if keep_msgs:
                kept.append(msg)
        return self._tuples(js, offsets, raws, kept) if raws else []

    def _tuples(
        self,
        js: list[int],
        offsets: list[int],
        raws: list[Any],
        msgs: list[Any],
        *,
        decoded: list[Any] | None = None,
    ) -> list[InputTuple]:
        """Decode a batch (one call for the whole batch where the decoder can: `decode_many`) and check
        the fields the operator needs (`RecordTuples`)."""
        if decoded is not None:  # `_fast_batch` decoded them, and advanced no position
            nxt = self._next
            for j, offset in dict(zip(js, offsets, strict=True)).items():
                nxt[j] = offset + 1
        timestamps = [m.timestamp()[1] for m in msgs] if msgs else None
        keys = [m.key() for m in msgs] if msgs else None
        return self._records.tuples(js, offsets, raws, timestamps=timestamps, keys=keys, decoded=decoded)
