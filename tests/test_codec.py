from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cec.exceptions import CodecError
from cec.records import SCHEMAS, AvroCodec, Kind, OutputRecord, RecordCodec

records = st.builds(
    OutputRecord,
    kind=st.sampled_from(list(Kind)),
    time=st.integers(-(2**62), 2**62),
    pos=st.lists(st.integers(0, 2**62), max_size=8).map(tuple),
    n=st.integers(0, 2**40),
    key=st.none() | st.text(max_size=40),
    seq=st.integers(-1, 2**40),
    state=st.none() | st.binary(max_size=200),
    payload=st.none() | st.binary(max_size=200),
)


# What the first release wrote (the metadata inside the body as well as beside it).
V1 = RecordCodec({1: SCHEMAS[1]})


@given(records)
def test_round_trip(record: OutputRecord) -> None:
    codec = RecordCodec()
    data = codec.encode(record)
    assert codec.decode(data, record.meta()) == record
    codec.verify(data, record.meta())
    assert codec.decode_rows([(9, *record.meta(), data)], verified=True) == [record]


@given(records)
def test_records_of_the_first_release_still_read(record: OutputRecord) -> None:
    codec = RecordCodec()
    data = V1.encode(record)
    assert data[1] == 1 and codec.version == max(SCHEMAS)
    assert codec.decode(data) == record  # version 1 decodes on its own...
    assert codec.decode(data, record.meta()) == record  # ...and with its stored metadata
    codec.verify(data, record.meta())
    assert codec.decode_rows([(9, *record.meta(), data)], verified=True) == [record]


def test_the_newest_version_carries_the_metadata_only_beside_the_value() -> None:
    codec = RecordCodec()
    record = OutputRecord(Kind.GOPEN, 250_000, (125_000,), 91_000, "item-12345", 3, b"s" * 12, None)
    data = codec.encode(record)
    assert b"item-12345" not in data and b"item-12345" in V1.encode(record)
    assert len(data) < len(V1.encode(record)) - 12
    with pytest.raises(CodecError, match="decode it with the metadata the store kept"):
        codec.decode(data)
    with pytest.raises(CodecError, match="unknown record kind 'Q'"):
        codec.decode(data, record.meta()._replace(kind="Q"))


@given(records, st.data())
def test_any_single_byte_flip_is_detected(record: OutputRecord, data: st.DataObject) -> None:
    codec = RecordCodec()
    encoded = bytearray(codec.encode(record))
    i = data.draw(st.integers(0, len(encoded) - 1))
    encoded[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CodecError):
        codec.decode(bytes(encoded), record.meta())
    with pytest.raises(CodecError):
        codec.verify(bytes(encoded), record.meta())


@given(records)
def test_truncated_record_is_detected(record: OutputRecord) -> None:
    codec = RecordCodec()
    encoded = codec.encode(record)
    for cut in range(len(encoded)):
        with pytest.raises(CodecError):
            codec.decode(encoded[:cut], record.meta())


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_untrusted_bytes_fail_cleanly(data: bytes) -> None:
    codec = RecordCodec()
    meta = OutputRecord(Kind.R, 1, (), 0, "k", 0).meta()
    for version in (b"\xce\x01", b"\xce\x02"):
        with contextlib.suppress(CodecError):  # the only acceptable failure
            codec.decode(version + data, meta)


def test_metadata_kept_beside_the_value_is_covered_by_the_checksum() -> None:
    codec = RecordCodec()
    record = OutputRecord(Kind.GCHECK, 10, (3,), 2, "k", 4, b"state", None)
    data = codec.encode(record)
    codec.verify(data, record.meta())
    for wrong in (
        OutputRecord(Kind.R, 10, (3,), 2, "k", 4).meta(),
        OutputRecord(Kind.GCHECK, 11, (3,), 2, "k", 4).meta(),
        OutputRecord(Kind.GCHECK, 10, (3,), 2, "j", 4).meta(),
        OutputRecord(Kind.GCHECK, 10, (3,), 2, "k", 5).meta(),
        OutputRecord(Kind.GCHECK, 10, (3,), 2, None, 4).meta(),
    ):
        with pytest.raises(CodecError):
            codec.verify(data, wrong)


def test_unknown_version_and_magic_are_clear_errors() -> None:
    codec = RecordCodec()
    record = OutputRecord(Kind.R, 1, (1,), 0)
    data = bytearray(codec.encode(record))
    data[1] = 9
    with pytest.raises(CodecError, match="unknown record schema version 9"):
        codec.decode(bytes(data), record.meta())
    data[0] = 0x00
    with pytest.raises(CodecError, match="not a CEC record"):
        codec.decode(bytes(data), record.meta())


def test_size_limit_bounds_what_decode_accepts() -> None:
    big = OutputRecord(Kind.GCHECK, 1, (1,), 1, "k", 0, b"x" * 5000)
    data = RecordCodec().encode(big)
    with pytest.raises(CodecError, match="exceeds"):
        RecordCodec(max_bytes=1000).decode(data, big.meta())


def test_newer_reader_loads_records_written_by_an_older_release() -> None:
    """Version skew: a reader of the next version (one more field, with a default) decodes every older
    version's records; the current one decodes v1 and v2 (before `marks`, which then default to ())."""
    current = RecordCodec()
    newest = max(SCHEMAS)
    next_schema = dict(SCHEMAS[newest])
    next_schema["fields"] = [
        *SCHEMAS[newest]["fields"],
        {"name": "operator_id", "type": "string", "default": ""},
    ]
    newer = RecordCodec({**SCHEMAS, newest + 1: next_schema})
    old = OutputRecord(Kind.GOPEN, 7, (5, 6), 3, "item-1", 2, b"st", None)
    assert newer.version == newest + 1
    assert newer.decode(V1.encode(old)) == old
    assert current.decode(RecordCodec({v: SCHEMAS[v] for v in (1, 2)}).encode(old), old.meta()) == old
    assert newer.decode(current.encode(old), old.meta()) == old
    assert newer.decode(newer.encode(old), old.meta()) == old  # the field OutputRecord lacks is ignored
    with_marks = OutputRecord(Kind.R, 7, (5, 6), 3, "item-1", 2, None, b"p", (4, -(1 << 63)))
    assert current.decode(current.encode(with_marks), with_marks.meta()) == with_marks
    # ...and an old reader refuses, clearly, what it cannot know.
    with pytest.raises(CodecError, match=f"unknown record schema version {newest + 1}"):
        current.decode(newer.encode(old), old.meta())


def test_payload_codec_rejects_garbage() -> None:
    codec = AvroCodec({"type": "record", "name": "P", "fields": [{"name": "s", "type": "string"}]})
    assert codec.decode(codec.encode({"s": "x"})) == {"s": "x"}
    with pytest.raises(CodecError):
        codec.decode(b"\x7f")
