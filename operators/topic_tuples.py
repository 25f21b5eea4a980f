"""Kafka records of an ordinary topic -> input tuples: the one rule of what a record becomes.

A record's value is decoded (`operators.formats`, a whole batch in one call where the decoder can); the
pseudo-fields `@timestamp` (the record timestamp in ms) and `@key` (the message key as UTF-8 text; bytes
that are not UTF-8 are kept exactly, so that the key rule makes the record a dead letter) are added when
the operator names them; then the key, value and time fields the operator uses must be present and not
null. A record that fails any of it is an error tuple whose reason the dead letter carries.

Two readers use it, so that a record gives the same tuple and the same dead-letter reason whichever reads
it: `operators.topic_source.KafkaTopicSource` (confluent-kafka; its C batch path gives exactly these tuples
for the records it accepts, and hands the rest here) and the attached query's input through Spark's own
Kafka source (`operators.spark.kafka_input`).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

from operators.base import InputTuple
from operators.formats import ValueDecoder

__all__ = ["KEY_FIELD", "TIMESTAMP_FIELD", "RecordTuples", "decode_values"]

TIMESTAMP_FIELD = "@timestamp"
KEY_FIELD = "@key"


class RecordTuples:
    """Decode and check records for an operator that reads `key_field`, `value_field` and `time_field`."""

    def __init__(
        self, decoder: ValueDecoder, key_field: str, value_field: str | None, time_field: str | None = None
    ) -> None:
        self.decoder = decoder
        self.required = [f for f in (key_field, value_field, time_field) if f]
        self.getter = operator.itemgetter(*self.required)
        self.inject_ts = TIMESTAMP_FIELD in self.required
        self.inject_key = KEY_FIELD in self.required

    @property
    def needs_message(self) -> bool:
        """Does a tuple need more of its record than the value (its timestamp or key)?"""
        return self.inject_ts or self.inject_key

    def tuples(
        self,
        js: Sequence[int],
        offsets: Sequence[int],
        raws: Sequence[bytes | None],
        *,
        timestamps: Sequence[int] | None = None,
        keys: Sequence[bytes | None] | None = None,
        decoded: list[Any] | None = None,
    ) -> list[InputTuple]:
        """The tuples of a batch of records (input partition j, offset, value; with `needs_message`, their
        timestamps in ms and message keys too). `decoded`: the values already decoded (`decode_values`)."""
        values: list[Any] = decoded if decoded is not None else decode_values(self.decoder, list(raws))
        if self.needs_message:
            if timestamps is None or keys is None:
                raise ValueError(
                    "the operator reads @timestamp or @key: give the records' timestamps and keys"
                )
            values = [
                v if type(v) is str else self.inject(v, ts, key)
                for v, ts, key in zip(values, timestamps, keys, strict=True)
            ]
        getter, single = self.getter, len(self.required) == 1
        make = tuple.__new__  # InputTuple's own constructor, minus the default-argument handling
        out: list[InputTuple] = []
        append = out.append
        for j, offset, value, raw in zip(js, offsets, values, raws, strict=True):
            if type(value) is str:
                append(make(InputTuple, (j, offset, None, value, raw)))
                continue
            try:
                got = getter(value)
                bad = got is None if single else None in got
            except (KeyError, TypeError):
                bad = True
            if bad:
                append(make(InputTuple, (j, offset, None, self.missing(value), raw)))
            else:
                append(make(InputTuple, (j, offset, value, None, raw)))
        return out

    def inject(self, value: Mapping[str, Any], timestamp: int, key: bytes | None) -> dict[str, Any]:
        out = dict(value)
        if self.inject_ts:
            out[TIMESTAMP_FIELD] = timestamp
        if self.inject_key:
            # Kept exactly: bytes that are not UTF-8 become lone surrogates, which the key rule
            # (`canonical_key`) refuses as a dead letter instead of folding them into a text key.
            out[KEY_FIELD] = None if key is None else key.decode("utf-8", "surrogateescape")
        return out

    def missing(self, value: Mapping[str, Any]) -> str:
        for name in self.required:
            if value.get(name) is None:
                return f"{'null' if name in value else 'missing'} field {name!r}: {_preview(value)}"
        return "record lacks a required field"


def decode_values(decoder: ValueDecoder, raws: list[Any]) -> list[Mapping[str, Any] | str]:
    """Each value's record, or the reason it cannot be one (`decode_many`'s convention): in one call where
    the decoder has `decode_many` (which gives exactly what decoding each value alone gives), else one by
    one. Nothing a decoder raises on a value stops the run, except `TopicSourceError` (not the value's
    fault: a registry that cannot be reached)."""
    from operators.exceptions import TopicSourceError

    many = getattr(decoder, "decode_many", None)
    if many is not None and None not in raws:
        try:
            return many(raws)
        except TopicSourceError:
            raise
        except Exception:  # a decoder's own failure: each value on its own, which names its reason
            import logging

            logging.getLogger(__name__).debug(
                "decode_many failed; decoding %d values one by one", len(raws), exc_info=True
            )
    return [_decode_one(decoder, raw) for raw in raws]


def _decode_one(decoder: ValueDecoder, raw: bytes | None) -> Mapping[str, Any] | str:
    """A record, or the reason it cannot be one (`decode_many`'s convention)."""
    from operators.exceptions import DecodeError, TopicSourceError

    if raw is None:
        return "null value (tombstone)"
    try:
        return decoder.decode(raw)
    except DecodeError as exc:
        return exc.reason
    except TopicSourceError:
        raise
    except Exception as exc:  # RecursionError, MemoryError on a hostile value...: the value's dead letter
        detail = str(exc).encode("utf-8", "backslashreplace").decode("utf-8")  # a reason is written as UTF-8
        return f"cannot decode: {type(exc).__name__}: {detail:.120}"


def _preview(value: Mapping[str, Any]) -> str:
    text = repr(dict(value))
    return text if len(text) <= 200 else text[:197] + "..."
