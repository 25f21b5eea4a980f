"""`operators.spark.kafka_input.KafkaRowPacker`: Spark's Kafka rows -> the attached query's packed rows.

Fuzzed (hypothesis): for any values (JSON objects with good, missing, null or odd fields, arbitrary bytes,
tombstones), message keys and timestamps, packing a whole Arrow batch gives exactly what packing each row
alone gives, nothing raises, and each tuple is what the one rule of ordinary topics makes of its record
(`operators.topic_tuples`: the reason `_decode_one` gives, or the fields): so the Kafka-source path and the
Python source dead-letter the same records with the same reasons. No Spark session: the packer runs in a
Python worker on its own.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.formats import JsonDecoder
from operators.spark.kafka_input import KafkaRowPacker
from operators.spark.packing import PACK_OPTION, PackSpec, unpack
from operators.spark.topic_reader import TopicOptions
from operators.topic_tuples import _decode_one

_FIELDS = ("cec_key", "cec_v", "cec_time", "cec_error")


def _options(time_field: str | None) -> TopicOptions:
    pack = PackSpec((3,), "item", "price", time_field)
    raw = {"topic": "t", "bootstrap.servers": "unused:1", "format": "json", "key": "item", "value": "price"}
    if time_field:
        raw["time"] = time_field
    return TopicOptions.parse({**raw, PACK_OPTION: pack.to_option()})


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=6),
)
_objects = st.dictionaries(st.sampled_from(["item", "price", "ts", "x"]), _scalars, max_size=4)
_values = st.one_of(
    _objects.map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=24),
    st.none(),
    st.sampled_from([b"{not json", b"[1, 2]", b'{"item": "\\ud800", "price": 1}', b"\xef\xbb\xbf{}"]),
)
_rows = st.lists(
    st.tuples(_values, st.one_of(st.none(), st.binary(max_size=6)), st.integers(0, 2**41)), max_size=40
)


def _batch(partition: int, first: int, rows: list[tuple[bytes | None, bytes | None, int]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array([partition] * len(rows), pa.int32()),
            pa.array(range(first, first + 2 * len(rows), 2), pa.int64()),  # gaps, as markers leave
            pa.array([v for v, _, _ in rows], pa.binary()),
            pa.array([ts * 1000 for _, _, ts in rows], pa.timestamp("us", tz="UTC")),
            pa.array([k for _, k, _ in rows], pa.binary()),
        ],
        names=["partition", "offset", "value", "timestamp", "key"],
    )


def _tuples(packer: KafkaRowPacker, batches: list[pa.RecordBatch]) -> dict[str, list[Any]]:
    frames = [b.to_pandas() for b in packer(iter(batches))]
    names = [n for n in _FIELDS if not frames or n in frames[0].columns]
    return unpack(frames, names)


@settings(max_examples=150, deadline=None)
@given(rows=_rows, partition=st.integers(0, 5), first=st.integers(0, 10**9), with_time=st.booleans())
def test_a_batch_packs_as_its_rows_one_by_one(
    rows: list[tuple[bytes | None, bytes | None, int]], partition: int, first: int, with_time: bool
) -> None:
    packer = KafkaRowPacker(_options("@timestamp" if with_time else None))
    whole = _batch(partition, first, rows)
    got = _tuples(packer, [whole])
    alone = _tuples(packer, [whole.slice(i, 1) for i in range(whole.num_rows)])
    assert got == alone
    assert got["cec_j"] == [partition] * len(rows)
    assert got["cec_o"] == list(range(first, first + 2 * len(rows), 2))
    decoder = JsonDecoder()
    for i, (raw, _key, ts) in enumerate(rows):
        record = _decode_one(decoder, raw)
        error = got["cec_error"][i]
        if isinstance(record, str):  # the decoder's own reason, as the Python source writes it
            assert error == record
            continue
        fields = dict(record)
        if with_time:
            fields["@timestamp"] = ts
        if fields.get("item") is None or fields.get("price") is None:
            assert error is not None and ("missing field" in error or "null field" in error)
            continue
        if error is not None:  # the key rule (canonical_key): a float key, a lone surrogate...
            assert "key 'item'" in error and got["cec_key"][i] is None
            continue
        assert got["cec_v"][i] == json.dumps(fields["price"], default=str)
        if with_time:
            assert got["cec_time"][i] == json.dumps(ts)


def test_rows_of_two_partitions_in_one_batch_keep_their_partition() -> None:
    packer = KafkaRowPacker(_options(None))
    good = json.dumps({"item": "a", "price": 2}).encode()
    batch = pa.concat_batches([_batch(1, 10, [(good, None, 0)] * 3), _batch(0, 4, [(good, None, 0)] * 2)])
    got = _tuples(packer, [batch])
    assert list(zip(got["cec_j"], got["cec_o"], strict=True)) == [(0, 4), (0, 6), (1, 10), (1, 12), (1, 14)]
    assert got["cec_error"] == [None] * 5 and got["cec_key"] == ["a"] * 5
