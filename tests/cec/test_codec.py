from __future__ import annotations

import contextlib
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cec.exceptions import CodecError
from cec.records import SCHEMAS, AvroCodec, Kind, OutputRecord, RecordCodec
from operators.aggregate import RESULT_SCHEMA

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


_KEY_WINDOW = AvroCodec(
    {
        "type": "record",
        "name": "KeyWindow",
        "fields": [{"name": "key", "type": "string"}, {"name": "window", "type": "long"}],
    }
)


@st.composite
def aggregate_records(draw: st.DrawFn) -> OutputRecord:
    """Records shaped like an aggregate's: a window key and seq, pos near the time, and for results a payload
    that starts with the key and seq as Avro writes them (what version 4 leaves out and puts back)."""
    key = draw(st.text(max_size=40))
    seq = draw(st.integers(0, 2**40))
    time = draw(st.integers(0, 2**62))
    pos = (time - draw(st.integers(0, 3)), *draw(st.lists(st.integers(0, 2**62), max_size=3)))
    kind = draw(st.sampled_from([Kind.R, Kind.GOPEN, Kind.GCHECK]))
    state = payload = None
    if kind is Kind.R:
        payload = _KEY_WINDOW.encode({"key": key, "window": seq}) + draw(st.binary(max_size=40))
    else:
        state = draw(st.binary(max_size=60))
    marks = tuple(draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3)))
    return OutputRecord(kind, time, pos, draw(st.integers(0, 2**40)), key, seq, state, payload, marks)


@settings(deadline=None)  # a loaded machine: per-example time is not what this checks
@given(aggregate_records())
def test_compact_round_trip_of_aggregate_records(record: OutputRecord) -> None:
    codec = RecordCodec()
    data = codec.encode(record)
    assert data[1] == 4
    assert codec.decode(data, record.meta()) == record  # the payload's key and seq put back, byte for byte
    codec.verify(data, record.meta())
    assert codec.decode_rows([(9, *record.meta(), data)], verified=True) == [record]
    if record.payload is not None:
        assert len(data) < len(RecordCodec({v: SCHEMAS[v] for v in (1, 2, 3)}).encode(record)) - len(
            record.key or ""
        )


def test_compact_records_leave_out_what_the_metadata_says() -> None:
    """Version 4 against version 3, for an aggregate's G-open and R at 1,000 keys (what bench_quix writes):
    the R payload without its key and window, pos[0] one byte from the time, no union/array bytes."""
    v3, v4 = RecordCodec({v: SCHEMAS[v] for v in (1, 2, 3)}), RecordCodec()
    results = AvroCodec(RESULT_SCHEMA)
    payload = results.encode(
        {"key": "417", "window": 52, "value": 12.5, "count": 10, "start": 91_000, "end": 91_990}
    )
    r = OutputRecord(Kind.R, 92_001, (92_001,), 1000, "417", 52, None, payload)
    gopen = OutputRecord(Kind.GOPEN, 92_002, (92_002,), 1000, "418", 53, b"s" * 31, None)
    for record in (r, gopen):
        assert v4.decode(v4.encode(record), record.meta()) == record
    assert b"417" not in v4.encode(r)[6:] and b"417" in v3.encode(r)
    assert len(v4.encode(r)) == len(v3.encode(r)) - 10  # 4 key, 1 window, 3 pos, 3 union/array, +1 flags
    assert len(v4.encode(gopen)) == len(v3.encode(gopen)) - 5
    # A payload that does not start with the window key and seq is kept whole.
    other = dataclasses.replace(r, payload=b"\x02x" + payload[4:])
    assert v4.decode(v4.encode(other), other.meta()).payload == other.payload


def test_compact_keyed_payload_needs_its_key() -> None:
    """A version-4 R whose payload's key was left out cannot be decoded with other metadata: the key is
    checked by the checksum, and even unverified the payload is never rebuilt from a wrong or absent key."""
    codec = RecordCodec()
    payload = AvroCodec(RESULT_SCHEMA).encode(
        {"key": "k", "window": 1, "value": 1.0, "count": 1, "start": 0, "end": 0}
    )
    record = OutputRecord(Kind.R, 5, (5,), 0, "k", 1, None, payload)
    data = codec.encode(record)
    with pytest.raises(CodecError):
        codec.decode(data, record.meta()._replace(key=None))
    with pytest.raises(CodecError):
        codec.decode(data, record.meta()._replace(key="j"))
    wrong = codec.decode(data, record.meta()._replace(key="j"), verified=True)
    assert wrong.payload != payload  # what `verified` trusts is the caller's: verify first


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
    for version in (b"\xce\x01", b"\xce\x02", b"\xce\x03", b"\xce\x04"):
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
    """Version skew: a reader of the next version (here an Avro one: version 3's fields and one more, with a
    default) decodes every older version's records, the compact version 4 included; the current one decodes
    v1, v2 and v3 (before `marks` in v1/v2, which then default to ())."""
    current = RecordCodec()
    newest = max(SCHEMAS)
    assert newest == 4 and current.version == 4
    next_schema = dict(SCHEMAS[3])
    next_schema["fields"] = [*SCHEMAS[3]["fields"], {"name": "operator_id", "type": "string", "default": ""}]
    newer = RecordCodec({**SCHEMAS, newest + 1: next_schema})
    old = OutputRecord(Kind.GOPEN, 7, (5, 6), 3, "item-1", 2, b"st", None)
    assert newer.version == newest + 1
    assert newer.decode(V1.encode(old)) == old
    for version in (2, 3):
        older = RecordCodec({v: SCHEMAS[v] for v in range(1, version + 1)})
        data = older.encode(old)
        assert data[1] == version
        assert current.decode(data, old.meta()) == old
        assert current.decode_rows([(0, *old.meta(), data)], verified=True) == [old]
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


@settings(max_examples=50)
@given(st.lists(st.tuples(records, st.sampled_from([1, 2, 3, 4])), max_size=12))
def test_rows_of_a_log_that_spans_upgrades_decode_by_their_own_version(
    written: list[tuple[OutputRecord, int]],
) -> None:
    """EC-load decodes a batch of footprints that older releases may have written (versions 1-3 before an
    upgrade, 4 after): each row as its own version says, as `decode` does it one by one. Versions 1 and 2
    have no `marks`: they decode with the default ()."""
    codec = RecordCodec()
    rows = []
    expected = []
    for offset, (record, version) in enumerate(written):
        if version < 3:
            record = dataclasses.replace(record, marks=())
        writer = RecordCodec({v: SCHEMAS[v] for v in range(1, version + 1)})
        rows.append((offset, *record.meta(), writer.encode(record)))
        expected.append(record)
    assert codec.decode_rows(rows, verified=True) == expected
    assert [codec.decode(r[5], record.meta()) for r, record in zip(rows, expected, strict=True)] == expected
