"""The C accelerator (`cec/_native.c`) against its pure-Python definitions.

Every native function is a fast path that must agree exactly with the Python code it stands in for, and
must decline (leave to Python) whatever it is not sure of. These tests feed both the same inputs, plain
and damaged, and compare. The last test builds the eventual checkpoint of a real damaged log both ways.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import random
import struct
import sys
from pathlib import Path
from typing import Any

import fastavro
import google_crc32c
import pytest
from confluent_kafka import KafkaError, Message
from hypothesis import given, settings
from hypothesis import strategies as st

import cec
import cec.avro_codec
import cec.compact_body
import cec.model
import cec.wire
import queuestore.kafka.reader
import recovery.eventual
import recovery.manager
from cec.config import Checkpointing
from cec.exceptions import CodecError
from cec.native import compile_avro, native
from cec.records import AvroCodec, Kind, OutputRecord, RecordCodec
from operators.aggregate import RESULT_SCHEMA, STATE_SCHEMA, AggState, KeyedAggregate
from operators.job import JobSpec, run_job
from queuestore.base import RecordMeta, Row
from queuestore.kafka import FRAME_KINDS, FRAME_MAGIC, encode_message, meta_to_headers, meta_to_key
from queuestore.kafka.framing import _message_rows, _to_row
from queuestore.sqlite import SqliteQueueStore
from recovery.eventual import (
    _FOOTPRINT_SLOTS,
    ECFootprint,
    EventualCheckpointBuilder,
    _native_scan,
    _scan_rows,
)
from recovery.manager import RecoveryManager
from tests.queuestore.damage import corrupt_record

needs_native = pytest.mark.skipif(native is None, reason="the C accelerator is not built")

_KEYS = ["a", "b", "k\x1fx", "ключ", "", "z" * 300]


def _record(rng: random.Random) -> OutputRecord:
    kind = rng.choice(list(Kind))
    windowed = kind in (Kind.R, Kind.GOPEN, Kind.GCHECK)
    return OutputRecord(
        kind,
        rng.randrange(-(2**40), 2**62),
        tuple(rng.randrange(0, 2**40) for _ in range(rng.randrange(0, 4))),
        rng.randrange(0, 10**6),
        rng.choice(_KEYS) if windowed else None,
        rng.randrange(0, 2**40) if windowed else -1,
        rng.randbytes(rng.randrange(0, 80)) if kind in (Kind.GOPEN, Kind.GCHECK) else None,
        rng.randbytes(rng.randrange(0, 40)) if kind in (Kind.R, Kind.DEAD) else None,
    )


def _compact_record(rng: random.Random) -> OutputRecord:
    """A record exercising every branch of the compact layout: pos near the time or not, R payloads that
    start with the window key and seq (an aggregate's result) or not, marks or none."""
    record = _record(rng)
    if rng.random() < 0.5 and record.pos:
        record = dataclasses.replace(record, time=record.pos[0] + rng.randrange(-3, 3))
    if record.kind is Kind.R and record.key is not None and rng.random() < 0.6:
        prefix = cec.compact_body.payload_prefix(record.key, record.seq)
        assert prefix is not None
        record = dataclasses.replace(record, payload=prefix + (record.payload or b"")[: rng.randrange(0, 20)])
    if rng.random() < 0.3:
        marks = tuple(rng.randrange(-(2**63), 2**63) for _ in range(rng.randrange(1, 4)))
        record = dataclasses.replace(record, marks=marks)
    return record


def _damage(rng: random.Random, row: Row) -> Row:
    offset, kind, t, key, seq, value = row
    how = rng.randrange(7)
    if how == 0 and value:
        at = rng.randrange(len(value))
        value = value[:at] + bytes([value[at] ^ (1 << rng.randrange(8))]) + value[at + 1 :]
    elif how == 1:
        t += 1
    elif how == 2:
        key = "other" if key is None else key + "!"
    elif how == 3:
        seq += 1
    elif how == 4:
        value = value[: rng.randrange(len(value) + 1)]
    elif how == 5:
        kind = "PART" if kind != "PART" else "R"
    else:
        value = bytes([value[0], 9]) + value[2:] if len(value) > 2 else b""  # unknown schema version
    return (offset, kind, t, key, seq, value)


def _rows(rng: random.Random, codec: RecordCodec, count: int, damaged: float) -> list[Row]:
    rows: list[Row] = []
    for offset in range(count, 0, -1):
        record = _record(rng)
        meta = record.meta()
        row: Row = (offset, meta.kind, meta.time, meta.key, meta.seq, codec.encode(record))
        rows.append(_damage(rng, row) if rng.random() < damaged else row)
    return rows


def _python_failing(codec: RecordCodec, rows: list[Row]) -> list[int]:
    failed = []
    for i, (_, kind, t, key, seq, value) in enumerate(rows):
        try:
            codec.verify(value, RecordMeta(kind, t, key, seq))
        except CodecError:
            failed.append(i)
    return failed


@needs_native
def test_crc32c_matches_google_crc32c() -> None:
    assert native is not None
    rng = random.Random(1)
    data = rng.randbytes(3000)
    for n in (0, 1, 7, 8, 9, 63, 64, 65, 1000, 3000):
        assert native.crc32c(data[:n]) == google_crc32c.value(data[:n])
    assert native.crc32c(data[100:], google_crc32c.value(data[:100])) == google_crc32c.value(data)


@needs_native
@pytest.mark.parametrize("seed", range(5))
def test_verify_rows_flags_exactly_what_verify_rejects(seed: int) -> None:
    assert native is not None
    rng = random.Random(seed)
    codec = RecordCodec()
    rows = _rows(rng, codec, 2000, damaged=0.2)
    expected = _python_failing(codec, rows)
    assert expected  # the damage is real
    flagged = native.verify_rows(rows, cec.wire.MAGIC, codec._known_versions, codec.max_bytes)
    assert flagged == expected  # every plain row passes; every damaged one is left to Python
    assert codec.failing_rows(rows) == expected


@needs_native
@needs_native
def test_verify_rows_formats_extreme_integers_as_python_does() -> None:
    """The metadata prefix is formatted in C (decimal by hand): the ends of the 64-bit range, zero and
    -1 must give Python's text, or intact records would be flagged (or damaged ones pass)."""
    assert native is not None
    codec = RecordCodec()
    edges = [-(2**63), -(2**63) + 1, -(10**18), -1, 0, 1, 9, 10, 10**18, 2**63 - 1]
    rows: list[Row] = []
    for i, (t, seq) in enumerate(zip(edges, reversed(edges), strict=True)):
        record = OutputRecord(Kind.GOPEN, t, (1,), 1, "k", seq, b"s", None)
        rows.append((i, *record.meta(), codec.encode(record)))
        rows.append((i, "GOPEN", t + (1 if t < 2**63 - 1 else -1), "k", seq, codec.encode(record)))
    failed = native.verify_rows(rows, cec.wire.MAGIC, codec._known_versions, codec.max_bytes)
    assert failed == _python_failing(codec, rows) == list(range(1, len(rows), 2))


def test_verify_rows_declines_what_it_does_not_know() -> None:
    assert native is not None
    codec = RecordCodec()
    good = codec.encode(OutputRecord(Kind.R, 5, (1,), 0, "k", 0, None, b"x"))
    rows: list[Any] = [
        (0, "R", 5, "k", 0, good),  # plain: passes
        (0, "R", 5, "k", 0, bytearray(good)),  # not bytes
        (0, "R", 2**70, "k", 0, good),  # time beyond int64
        (0, "R", 5, "\ud800", 0, good),  # a key that has no UTF-8 form
        (0, "R", 5, "k", 0),  # not a row
    ]
    assert native.verify_rows(rows, cec.wire.MAGIC, codec._known_versions, codec.max_bytes) == [1, 2, 3, 4]
    too_small = RecordCodec(max_bytes=len(good) - 1)
    assert native.verify_rows(rows[:1], cec.wire.MAGIC, too_small._known_versions, too_small.max_bytes) == [0]


def _scan_inputs(seed: int) -> tuple[list[Row], set[int]]:
    rng = random.Random(seed)
    keys = [f"k{i}" for i in range(12)] + [None]
    rows: list[Row] = []
    for offset in range(400, 0, -1):
        kind = rng.choice(["R", "GOPEN", "GCHECK", "DEAD", "PART", "EOS"])
        key = rng.choice(keys)
        value = b"v%d" % offset
        if kind == "PART" and rng.random() < 0.5:  # shaped like a part (else: damaged into a "part")
            value = struct.pack(">BII", 0xCD, rng.randrange(3), 3) + value
        rows.append((offset, kind, offset * 3, key, rng.randrange(3), value))
    failed = {i for i in range(len(rows)) if rng.random() < 0.03}
    return rows, failed


def _fp_view(windows: dict[str, ECFootprint]) -> list[tuple[str, int, str, bytes]]:
    return [(k, fp.offset, fp.key, fp._row) for k, fp in windows.items()]


@needs_native
@pytest.mark.parametrize("seed", range(8))
def test_ec_scan_matches_its_python_twin(seed: int) -> None:
    rows, failed = _scan_inputs(seed)
    codec = RecordCodec()
    for n in (1, 5, 12, 100):
        state: dict[str, Any] = {}
        for name, scan in (("python", _scan_rows), ("native", _native_scan)):
            windows: dict[str, ECFootprint] = {}
            closed: set[tuple[str, int]] = set()
            at, steps = 0, []
            while at < len(rows):
                at, status, oldest = scan(rows, at, failed, windows, closed, n, codec)
                steps.append((at, status, oldest))
                if status == 1:
                    break
                if status == 2:
                    at += 1  # the caller handles the failed row
            state[name] = (steps, _fp_view(windows), closed)
        assert state["native"] == state["python"]


@needs_native
def test_native_footprints_are_whole_objects() -> None:
    assert native is not None
    codec = RecordCodec()
    record = OutputRecord(Kind.GOPEN, 1, (2,), 1, "k", 0, b"s", None)
    row = (7, *record.meta(), codec.encode(record))
    fp = native.make(ECFootprint, _FOOTPRINT_SLOTS, (7, "k", row, codec, None))
    assert isinstance(fp, ECFootprint) and fp.offset == 7 and fp.key == "k"
    assert fp.record == record


@needs_native
@pytest.mark.parametrize("seed", range(4))
def test_record_decode_matches_fastavro(seed: int) -> None:
    """The Avro versions' fast decoder (version 3, the newest Avro one: logs written before version 4)."""
    rng = random.Random(seed)
    codec = RecordCodec({v: cec.wire.SCHEMAS[v] for v in (1, 2, 3)})
    schema = fastavro.parse_schema(cec.wire.SCHEMAS[codec.version])
    program = codec._layouts[codec.version].program
    rows: list[Row] = []
    for _ in range(500):
        record = _record(rng)
        meta = record.meta()
        data = codec.encode(record)
        rows.append((0, *meta, data))
        assert codec.decode(data, meta) == record
        assert codec.decode(data, meta, verified=True) == record
        obj = fastavro.schemaless_reader(io.BytesIO(data[6:]), schema, None)
        assert isinstance(obj, dict)
        assert obj["pos"] == list(record.pos) and obj["n"] == record.n and obj["state"] == record.state
        # Damaged or cut short: the fast decoder declines, the error is fastavro's / the checksum's.
        cut = data[: rng.randrange(6, len(data))]
        assert native is not None and native.decode_avro(program, cut, 6) is None
        with pytest.raises(CodecError):
            codec.decode(cut, meta)
        flipped = bytearray(data)
        flipped[rng.randrange(6, len(data))] ^= 0x40
        with contextlib.suppress(CodecError):
            assert codec.decode(bytes(flipped), meta) == record  # only a flip that decodes identically
    # The batch decoder (EC-load) gives what decode gives; rows it declines are decoded one by one.
    rows.append((0, "Q", 1, "k", 0, rows[0][5]))  # an unknown kind: decode's error
    rows.append((0, "R", 1, "k", 0, RecordCodec({1: cec.wire.SCHEMAS[1]}).encode(_record(rng))))
    slots = codec._layouts[codec.version].slots
    assert native.decode_avro_rows(program, rows, 6, OutputRecord, slots, {}, codec.version) == [None] * len(
        rows
    )
    with pytest.raises(CodecError, match="unknown record kind"):
        codec.decode_rows(rows, verified=True)
    expected = [codec.decode(r[5], RecordMeta(*r[1:5]), verified=True) for r in rows[:-2]]
    assert codec.decode_rows(rows[:-2], verified=True) == expected


@needs_native
@pytest.mark.parametrize("seed", range(4))
def test_compact_record_decode_matches_the_python_twin(seed: int) -> None:
    """Version 4: `_native.decode_compact(_rows)` gives exactly what `cec.compact_body.decode_compact` gives,
    and declines (None) every body the twin rejects, cut short or damaged."""
    assert native is not None
    rng = random.Random(seed)
    codec = RecordCodec()
    slots = codec._layouts[4].slots
    rows: list[Row] = []
    for _ in range(500):
        record = _compact_record(rng)
        meta = record.meta()
        data = codec.encode(record)
        assert data[1] == 4
        rows.append((0, *meta, data))
        head = (record.kind, *meta[1:])
        assert native.decode_compact(data, 6, head, OutputRecord, slots) == record
        assert cec.compact_body.decode_compact(data, 6, head) == record
        assert codec.decode(data, meta) == record
        for bad in (data[: rng.randrange(6, len(data))], _flip(rng, data)):
            try:
                twin: OutputRecord | None = cec.compact_body.decode_compact(bad, 6, head)
            except CodecError:
                twin = None
            assert native.decode_compact(bad, 6, head, OutputRecord, slots) == twin
    rows.append((0, "Q", 1, "k", 0, rows[0][5]))  # an unknown kind: declined
    rows.append((0, "R", 1, "k", 0, RecordCodec({1: cec.wire.SCHEMAS[1]}).encode(_record(rng))))  # v1
    fast = native.decode_compact_rows(rows, 6, OutputRecord, slots, cec.model.KIND_OF, 4)
    assert fast[-2:] == [None, None]
    assert fast[:-2] == [codec.decode(r[5], RecordMeta(*r[1:5])) for r in rows[:-2]]
    assert codec.decode_rows(rows[:-2], verified=True) == fast[:-2]


def _flip(rng: random.Random, data: bytes) -> bytes:
    flipped = bytearray(data)
    flipped[rng.randrange(6, len(data))] ^= 1 << rng.randrange(8)
    return bytes(flipped)


@needs_native
def test_state_decode_matches_fastavro() -> None:
    rng = random.Random(3)
    codec = AvroCodec(STATE_SCHEMA)
    op = KeyedAggregate(key_field="k", value_field="v", window_count=10)
    assert codec._program is not None
    for _ in range(300):
        state = AggState(
            rng.randrange(1, 100),
            rng.uniform(-1e9, 1e9),
            rng.random(),
            rng.random(),
            rng.randrange(2**40),
            -5,
        )
        data = op.encode_state(state)
        assert op.decode_state(data) == state
        assert codec.decode(data) == fastavro.schemaless_reader(io.BytesIO(data), codec.schema, None)
    assert (
        compile_avro(
            fastavro.parse_schema(
                {
                    "type": "record",
                    "name": "L",
                    "fields": [{"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}}],
                }
            )
        )
        is None
    )


@needs_native
def test_a_batch_of_payloads_decodes_as_each_alone() -> None:
    """`AvroCodec.decode_tuples` (the Spark source's results, one C call) equals `decode_tuple` per body,
    and a malformed body among intact ones fails as it fails alone."""
    rng = random.Random(5)
    codec = AvroCodec(RESULT_SCHEMA)
    bodies = [
        codec.encode(
            {
                "key": f"k{rng.randrange(1000)}",
                "window": rng.randrange(50),
                "value": rng.uniform(-1e6, 1e6),
                "count": rng.randrange(1, 20),
                "start": rng.randrange(2**40),
                "end": rng.randrange(2**40),
            }
        )
        for _ in range(200)
    ]
    assert codec.decode_tuples(bodies) == [codec.decode_tuple(b) for b in bodies]
    assert codec.decode_tuples([]) == []
    with pytest.raises(CodecError):
        codec.decode_tuples([*bodies[:3], b"\x02", *bodies[3:6]])


_STATE_OP = KeyedAggregate(key_field="k", value_field="v", window_count=10)
_LONGS = st.integers(-(2**63), 2**63 - 1)
_DOUBLES = st.floats(allow_nan=True, allow_infinity=True)
_STATES = st.builds(AggState, st.integers(0, 2**62), _DOUBLES, _DOUBLES, _DOUBLES, _LONGS, _LONGS)
# The first-tuple form (one tuple in: total, lo and hi one double), which `encode_footprint` shortens.
_FIRST_STATES = st.builds(
    lambda x, start, span: AggState(1, x, x, x, start, start + span),
    _DOUBLES,
    st.integers(-(2**40), 2**40),
    st.integers(0, 2**40),
)
# What a footprint's state may hold: either form of a state, or bytes no encoder wrote.
_STATE_BODIES = st.lists(
    st.one_of(
        _STATES.map(_STATE_OP.encode_footprint),
        _FIRST_STATES.map(_STATE_OP.encode_footprint),
        st.binary(max_size=40),
    ),
    max_size=30,
)


def _decoded_each(datas: list[bytes]) -> list[str] | type[Exception]:
    """`decode_state` of each body (as text: NaN and the sign of a zero compare), or the error the first
    failing body raises."""
    try:
        return [repr(_STATE_OP.decode_state(d)) for d in datas]
    except Exception as exc:  # the type is what the batch must match
        return type(exc)


def _decoded_batch(datas: list[bytes]) -> list[str] | type[Exception]:
    try:
        return [repr(s) for s in _STATE_OP.decode_states(datas)]
    except Exception as exc:
        return type(exc)


@settings(max_examples=300, deadline=None)
@given(_STATE_BODIES)
def test_a_batch_of_window_states_decodes_as_each_alone(datas: list[bytes]) -> None:
    """`KeyedAggregate.decode_states` (EC-load, C calls over all open windows) equals `decode_state` one by
    one for any bodies, both forms and damaged ones mixed: the same states, or the same error."""
    each = _decoded_each(datas)
    assert _decoded_batch(datas) == each
    assert each is CodecError or isinstance(each, list)


@settings(max_examples=100, deadline=None)
@given(_STATE_BODIES)
def test_a_batch_of_window_states_decodes_the_same_without_the_accelerator(datas: list[bytes]) -> None:
    with pytest.MonkeyPatch.context() as m:
        _python_only(m)
        slow = _decoded_batch(datas)
    assert slow == _decoded_batch(datas)


class _Msg:
    """Stands in for confluent_kafka.Message where a test needs an error event."""

    def __init__(self, offset: int, error: KafkaError | None = None) -> None:
        self._offset, self._error = offset, error

    def error(self) -> KafkaError | None:
        return self._error

    def offset(self) -> int:
        return self._offset

    def key(self) -> None:
        return None

    def value(self) -> None:
        return None

    def headers(self) -> None:
        return None


def _messages(rng: random.Random) -> list[Any]:
    out: list[Any] = []
    for offset in range(100, 400):
        if rng.random() < 0.1:
            continue  # a gap: transaction markers take offsets
        meta = RecordMeta(
            rng.choice(["R", "GOPEN", "DEAD"]),
            rng.randrange(-5, 10**12),
            rng.choice([*_KEYS, None]),
            rng.randrange(-1, 9),
        )
        body = rng.choice([b"v", b"\xcev", b""])
        if rng.random() < 0.5:  # the framed layout (the writer's), sometimes damaged
            key, value, headers = encode_message(body, meta)
            if rng.random() < 0.1:
                key, value, headers = encode_message(body, meta._replace(kind=rng.choice(["PART", "Zed"])))
            if rng.random() < 0.1:
                damaged = bytearray(value)
                damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
                value = bytes(damaged)
            if rng.random() < 0.05:
                key = rng.choice([b"\xff\xfe", None])
            out.append(Message(topic="t", partition=0, offset=offset, key=key, value=value, headers=headers))
        else:  # the legacy layout (logs written before the framed one), sometimes with a foreign key
            legacy: bytes | None = meta_to_key(meta)
            if rng.random() < 0.05:
                legacy = rng.choice([b"foreign", b"R\x1f 12\x1f3", b"R\x1f1_0\x1f3", b"\xff\x1f1\x1f2", None])
            out.append(
                Message(
                    topic="t",
                    partition=0,
                    offset=offset,
                    key=legacy,
                    value=rng.choice([b"v", None]),
                    headers=meta_to_headers(meta),
                )
            )
        if rng.random() < 0.02:
            out.append(_Msg(offset, KafkaError(KafkaError._PARTITION_EOF)))
    return out


@needs_native
@pytest.mark.parametrize("seed", range(4))
def test_message_rows_match_their_python_twin(seed: int) -> None:
    assert native is not None
    batch = _messages(random.Random(seed))
    for start, stop in ((0, -1), (150, -1), (150, 300), (0, 101), (390, 400)):
        results = []
        converters = (
            lambda b, i, out, start=start, stop=stop: native.message_rows(
                b, i, start, stop, out, _to_row, FRAME_MAGIC, FRAME_KINDS
            ),
            lambda b, i, out, start=start, stop=stop: _message_rows(b, i, start, stop, out),
        )
        for convert in converters:
            out: list[Row] = []
            steps, i = [], 0
            while i < len(batch):
                i, stopped = convert(batch, i, out)
                steps.append((i, stopped))
                if stopped:
                    break
                i += 1  # past the error event
            results.append((steps, out))
        assert results[0] == results[1]
        assert all(
            row == _to_row(batch_msg, row[0])
            for row, batch_msg in zip(
                results[0][1],
                [
                    m
                    for m in batch
                    if not isinstance(m, _Msg) and start <= m.offset() and (stop < 0 or m.offset() < stop)
                ],
                strict=False,
            )
        )


def _python_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (cec.wire, cec.avro_codec, recovery.eventual, recovery.manager, queuestore.kafka.reader):
        monkeypatch.setattr(module, "native", None)
    monkeypatch.setattr(recovery.eventual, "_scan", _scan_rows)


def _damaged_log(root: Path) -> SqliteQueueStore:
    spec = JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "agg": "avg",
            "window_count": 5,
        },
        source={"type": "generator", "count": 6000, "keys": 700, "seed": 5},
        store={"type": "sqlite", "root": str(root)},
        output_topic="agg",
        checkpointing=Checkpointing(q_target=300, ci_ms=10.0, cp_ms=10.0),
        batch_size=64,
    )
    run_job(spec, max_inputs=3000)
    store = SqliteQueueStore(root)
    with store.reader("agg", 0) as reader:
        ec = EventualCheckpointBuilder(reader).build()
    rng = random.Random(2)
    # G-checks the EC takes (not the crash-point record): each has an older footprint of its window (its
    # G-open) to fall back to.
    footprints = sorted(
        fp.offset
        for fp in ec.windows.values()
        if fp.record.kind is Kind.GCHECK and fp.offset != ec.end_offset - 1
    )
    assert len(footprints) >= 10, "the policy wrote too few G-checks for this test"
    for offset in rng.sample(footprints, min(40, len(footprints))):
        corrupt_record(store, "agg", 0, offset, flip_at=rng.randrange(6, 12))
    return store


def test_ec_and_ec_load_identical_with_and_without_the_accelerator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _damaged_log(tmp_path)
    op = KeyedAggregate(key_field="item_id", value_field="item_price", window_count=5)

    def recover(batch: bool = True) -> tuple[Any, ...]:
        with store.reader("agg", 0) as reader:
            rec = RecoveryManager(
                reader, op.decode_state, decode_states=op.decode_states if batch else None
            ).recover(1)
            ec = rec.checkpoint
            return (
                ec.crash_pos,
                ec.n,
                ec.extent_start,
                ec.records_read,
                ec.fallbacks,
                [
                    (
                        w.key,
                        w.seq,
                        w.state,
                        w.tau1,
                        w.tau2,
                        w.out_mark,
                        w.in_mark,
                        ec.windows[w.key].offset,
                        ec.windows[w.key].record,
                    )
                    for w in rec.windows
                ],
                rec.plan.start,
            )

    fast = recover()
    assert fast[4]  # damaged footprints were passed over
    assert recover(batch=False) == fast  # the window states decoded one by one
    with monkeypatch.context() as m:
        _python_only(m)
        slow = recover()
    assert fast == slow
    with store.reader("agg", 0) as reader:
        assert EventualCheckpointBuilder(reader, chunk=7).build().windows.keys() == {w[0] for w in fast[5]}


def test_a_stale_build_of_the_accelerator_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A `_native` built from another version of _native.c (an older checkout, not rebuilt) would be
    called with other arguments: it is refused, with a warning, and everything runs in Python."""
    import types

    import cec.native as loader

    monkeypatch.delenv("CEC_NO_NATIVE", raising=False)
    stale = types.ModuleType("cec._native")  # what a build without (or with another) ABI looks like
    monkeypatch.setitem(sys.modules, "cec._native", stale)
    monkeypatch.setattr(cec, "_native", stale, raising=False)
    with pytest.warns(RuntimeWarning, match="stale"):
        assert loader._load() is None
    stale.ABI = loader.ABI  # type: ignore[attr-defined]
    assert loader._load() is stale


@needs_native
def test_footprints_written_before_an_upgrade_load_through_the_c_decoder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A log that spans an upgrade (records of versions 1-3 below version-4 ones) is loaded in one C call per
    version, not record by record in Python: that per-record path made EC load of an older log 8x slower
    than the release that wrote it (measured: 57k against 434k windows/s at 92k windows)."""
    rng = random.Random(5)
    codec = RecordCodec()
    rows: list[Row] = []
    expected = []
    for offset in range(400):
        version = rng.choice((1, 2, 3, 4))
        record = _record(rng)
        if version >= 3 and rng.random() < 0.5:
            record = dataclasses.replace(record, marks=(rng.randrange(-5, 2**40),))
        writer = RecordCodec({v: cec.wire.SCHEMAS[v] for v in range(1, version + 1)})
        rows.append((offset, *record.meta(), writer.encode(record)))
        expected.append(record)

    def per_record(*args: Any, **kwargs: Any) -> OutputRecord:
        raise AssertionError("a plain row was decoded record by record")

    monkeypatch.setattr(RecordCodec, "decode", per_record)
    assert codec.decode_rows(rows, verified=True) == expected


_LONG_EDGES = (0, 1, -1, 63, 64, -64, -65, 2**62, -(2**63), 2**63 - 1)


@needs_native
@pytest.mark.parametrize("seed", range(6))
def test_record_encode_matches_its_python_definition(seed: int) -> None:
    """`RecordCodec.encode` (one C call per record: every G-check) writes exactly the bytes of its Python
    definition, or declines to it: pos near or far from the time, the long's edges, keyed R payloads,
    marks, keys that are not valid text, numbers beyond a long (Python raises, so must encode)."""
    rng = random.Random(seed)
    codec = RecordCodec()
    for i in range(600):
        record = _compact_record(rng)
        if i % 7 == 0:
            record = dataclasses.replace(
                record,
                time=rng.choice(_LONG_EDGES),
                pos=tuple(rng.choice(_LONG_EDGES) for _ in range(rng.randrange(0, 3))),
                seq=rng.choice(_LONG_EDGES),
                n=rng.choice(_LONG_EDGES[:8]),
            )
        if i % 50 == 0 and record.key is not None:
            record = dataclasses.replace(record, key=record.key + "\udcff")  # a lone surrogate
        try:
            expected: bytes | Exception = codec.encode_python(record)
        except Exception as exc:  # whichever Python raises, encode must raise too
            expected = exc
        if isinstance(expected, Exception):
            with pytest.raises(type(expected)):
                codec.encode(record)
            continue
        assert codec.encode(record) == expected
        assert codec.decode(expected, record.meta()) == record
    for beyond in (2**63, -(2**63) - 1):
        with pytest.raises(ValueError):
            codec.encode(OutputRecord(Kind.GCHECK, 1, (5,), beyond, "k", 0, b"s"))


@needs_native
@pytest.mark.parametrize("seed", range(3))
def test_state_encode_matches_fastavro(seed: int) -> None:
    """`AvroCodec.encode_tuple` (a window state at every G-check, in C) against fastavro, on the
    aggregate's state schema: doubles of every kind (nan, inf, -0.0, subnormals) and longs at their edges;
    what the C path does not take (an int for a double, a long out of range) goes to fastavro."""
    rng = random.Random(seed)
    codec = AvroCodec(STATE_SCHEMA)
    names = [f["name"] for f in STATE_SCHEMA["fields"]]
    doubles = (0.0, -0.0, float("inf"), float("-inf"), float("nan"), 5e-324, 1.5, -2.25e300)
    for _ in range(500):
        values = (
            rng.choice(_LONG_EDGES),
            rng.choice(doubles) if rng.random() < 0.5 else rng.uniform(-1e6, 1e6),
            rng.choice(doubles),
            rng.uniform(-1, 1),
            rng.choice(_LONG_EDGES),
            rng.randrange(-(2**40), 2**40),
        )
        buf = io.BytesIO()
        fastavro.schemaless_writer(
            buf, fastavro.parse_schema(STATE_SCHEMA), dict(zip(names, values, strict=True))
        )
        assert codec.encode_tuple(values) == buf.getvalue()
    assert codec.encode_tuple((3, 1, 1.0, 1.0, 0, 0)) == codec.encode(
        {"count": 3, "total": 1, "lo": 1.0, "hi": 1.0, "start": 0, "last": 0}
    )  # an int total: fastavro's conversion
    with pytest.raises(Exception):  # noqa: B017 - fastavro's own error for a long out of range
        codec.encode_tuple((2**63, 1.0, 1.0, 1.0, 0, 0))
