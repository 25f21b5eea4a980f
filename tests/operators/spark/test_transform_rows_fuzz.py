"""`transform=`'s decoding step (`operators.spark.transform_rows.FieldDecoder`, which turns Kafka values
into the input's typed fields) fuzzed: for any values, a batch gives exactly what each value alone gives, nothing
raises, and a value either fills the fields or is a dead letter with its reason and raw bytes. No Spark
session: the step is a plain function of Arrow batches."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import StructType

from operators.spark.topic_reader import TopicOptions
from operators.spark.transform_rows import FieldDecoder

SCHEMA = StructType.fromJson(
    {
        "type": "struct",
        "fields": [
            {"name": "item", "type": "string", "nullable": True, "metadata": {}},
            {"name": "price", "type": "double", "nullable": True, "metadata": {}},
            {"name": "n", "type": "long", "nullable": True, "metadata": {}},
            {"name": "ok", "type": "boolean", "nullable": True, "metadata": {}},
        ],
    }
)
OPTS = TopicOptions.parse(
    {"topic": "t", "bootstrap.servers": "b:9092", "format": "json", "key": "item", "value": "price"}
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=8),
)
records = st.dictionaries(
    st.sampled_from(["item", "price", "n", "ok", "other"]), scalars | st.lists(scalars, max_size=2)
)
values = st.one_of(
    records.map(lambda r: json.dumps(r).encode()),
    st.binary(max_size=40),
    st.sampled_from([b'{"item": "\\ud800", "price": 1}', b"[1, 2]", b"null", b'{"item": "a"', b'{"n": 1.5}']),
    st.none(),
)


def _batch(raws: list[bytes | None]) -> pa.RecordBatch:
    when = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return pa.RecordBatch.from_pydict(
        {
            "partition": pa.array([i % 3 for i in range(len(raws))], pa.int32()),
            "offset": pa.array(range(len(raws)), pa.int64()),
            "timestamp": pa.array([when] * len(raws), pa.timestamp("us", tz="UTC")),
            "value": pa.array(raws, pa.binary()),
        }
    )


def _rows(raws: list[bytes | None]) -> list[dict[str, Any]]:
    out = []
    for batch in FieldDecoder(OPTS, SCHEMA)(iter([_batch(raws)])):
        out.extend(batch.to_pylist())
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(values, min_size=1, max_size=12))
def test_a_batch_decodes_as_each_value_alone(raws: list[bytes | None]) -> None:
    together = _rows(raws)
    alone = [row for raw in raws for row in _rows([raw])]
    for row in alone:
        row["offset"] = None
        row["partition"] = None
    assert [{**r, "offset": None, "partition": None} for r in together] == alone
    assert [r["offset"] for r in together] == list(range(len(raws)))
    for raw, row in zip(raws, together, strict=True):
        fields = [row[name] for name in ("item", "price", "n", "ok")]
        if row["cec_error"] is None:
            assert row["cec_raw"] is None
            decoded = json.loads(raw)  # only a JSON object fills the fields
            assert isinstance(decoded, dict)
            assert row["price"] is None or isinstance(row["price"], float)
        else:
            assert fields == [None] * 4 and row["cec_raw"] == raw and row["cec_error"].strip()


def test_types_that_do_not_fit_are_dead_letters() -> None:
    rows = _rows(
        [
            b'{"item": "a", "price": 2, "n": 3, "ok": true}',
            b'{"item": 5, "price": "lots"}',
            b'{"n": 1.5}',
            b'{"n": 2.0, "ok": 1}',
            b'{"item": {"x": [1]}}',
        ]
    )
    assert [r["cec_error"] is None for r in rows] == [True, False, False, False, True]
    assert (rows[0]["item"], rows[0]["price"], rows[0]["n"], rows[0]["ok"]) == ("a", 2.0, 3, True)
    assert rows[1]["cec_error"] == "field 'price' does not fit input_schema: not a number: 'lots'"
    assert rows[2]["cec_error"] == "field 'n' does not fit input_schema: not an integer: 1.5"
    assert rows[3]["cec_error"] == "field 'ok' does not fit input_schema: not a boolean: 1"
    assert rows[4]["item"] == '{"x": [1]}'  # a nested value in a string column: its JSON text
