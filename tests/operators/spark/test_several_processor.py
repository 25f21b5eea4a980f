"""Several aggregates over a composite key in the attached query's pieces, without a JVM:

1. `cec_aggregate`'s `key=`/`value=`/`agg=` forms (`operators.spark.aggregate_form`): one key and a
   plain `agg` keep the single aggregate; lists give the several-aggregate form; mistakes are one line;
2. the packed key of a tuple (`partitioning.partition_key`) is its part id (`MultiAggregate.key_of`)
   without the window start, for any key values (hypothesis), and a window state survives the state
   partition's plain-tuple form (`state_partition.flat_state` / `state_of`);
3. in Spark, `partitioning.part_partition_key` takes a part id back to that packed key;
4. under watermarks a state partition keeps only its open parts (closed ones never reopen);
5. the processor driven directly over two micro-batches of tuples packed by the topic source's own code
   (`topic_reader.TupleBatches`) gives the windows a plain-Python grouping gives (the second micro-batch
   continues the windows the first left open), and the operator's dead letters.
"""

from __future__ import annotations

import json
import math
import pickle
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cec.exceptions import BadTupleError, ConfigError
from cec.records import AvroCodec, Kind
from operators import exact_sum
from operators.base import DEAD_LETTER_SCHEMA, InputTuple
from operators.multi_aggregate import MultiAggregate
from operators.multi_state import ColumnState, MultiState
from operators.spark.aggregate_form import aggregate_form
from operators.spark.packing import PackSpec
from operators.spark.partitioning import part_partition_key, partition_groups, partition_key
from operators.spark.processor import AggregateSpec, CecAggregateProcessor
from operators.spark.state_partition import PartitionState, flat_state, state_of
from operators.spark.topic_reader import TopicOptions, TupleBatches
from tests.operators.spark.test_processor import _RecordingHandle, _Timers

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

AGGS = (("avg", "arr_delay"), ("max", "dep_delay"), ("count", "*"))
KEY = ("carrier", "origin")


def test_key_and_agg_forms() -> None:
    single = aggregate_form("item", "price", "avg")
    assert (single.key_fields, single.agg, single.several_keys, single.aggs) == (("item",), "avg", None, None)
    several = aggregate_form(["carrier", "origin"], None, [["avg", "arr_delay"], ("count", "*")])
    assert several.several_keys == KEY and several.aggs == (("avg", "arr_delay"), ("count", "*"))
    assert several.value_columns == ("arr_delay",)
    composite_one = aggregate_form(["carrier", "origin"], "arr_delay", "sum")
    assert composite_one.aggs == (("sum", "arr_delay"),) and composite_one.several_keys == KEY
    one_key_pairs = aggregate_form("carrier", None, [("max", "dep_delay")])
    assert one_key_pairs.several_keys is None and one_key_pairs.aggs == (("max", "dep_delay"),)


@pytest.mark.parametrize(
    ("key", "value", "agg", "message"),
    [
        ([], None, [("avg", "x")], "key must be a column name or a list of column names"),
        (["a", ""], None, [("avg", "x")], "key must be a column name"),
        (5, None, [("avg", "x")], "key must be a column name"),
        ("a", None, "avg", "give value=, or agg=[('avg', COLUMN), ...]"),
        ("a", "x", "median", "unknown aggregate 'median'"),
        ("a", None, [("median", "x")], "unknown aggregate 'median'"),
        ("a", None, [("avg", "x", "y")], "agg takes (FUNC, COLUMN) pairs"),
        ("a", None, ["avg"], "agg takes (FUNC, COLUMN) pairs"),
        ("a", None, [], "give at least one aggregate"),
        ("a", None, [("avg", "x"), ("avg", "x")], "is given twice"),
        ("a", None, 3, "agg must be a function name or a list of (FUNC, COLUMN) pairs"),
        ("a", "x", [("avg", "x")], "value= goes with agg given as a function name"),
        (["a", "b"], None, [("avg", "b")], "'b' is a key column"),
        ("a", "a", "avg", "key, value and time must be different columns"),
    ],
)
def test_bad_forms_are_one_line(key: Any, value: Any, agg: Any, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        aggregate_form(key, value, agg)
    assert message in str(caught.value) and "\n" not in str(caught.value)


_KEY_VALUES = st.one_of(
    st.none(), st.text(max_size=6), st.integers(), st.booleans(), st.floats(allow_nan=False), st.just('a"],1')
)


@given(st.lists(_KEY_VALUES, min_size=1, max_size=3), st.integers(-(10**12), 10**12), st.booleans())
def test_packed_key_is_the_part_id_without_its_start(values: list[Any], t: int, watermarks: bool) -> None:
    fields = [f"f{i}" for i in range(len(values))]
    record = {**dict(zip(fields, values, strict=True)), "ts": t, "x": 1.0}
    operator = MultiAggregate(
        key_fields=fields,
        aggs=[("sum", "x")],
        window_ms=100,
        time_field="ts",
        allowed_lateness=0 if watermarks else None,
    )
    as_array = len(fields) > 1 or watermarks
    packed = partition_key(record, fields, as_array=as_array)
    try:
        part = operator.key_of(record)
    except BadTupleError:
        part = None
    if part is None:
        assert packed is None  # refused by the operator wherever it goes
        return
    assert packed is not None
    if watermarks:
        parts = json.loads(part)
        assert parts[-1] == t - t % 100
        assert json.dumps(parts[:-1], ensure_ascii=False, separators=(",", ":")) == packed
        assert part == packed[:-1] + f",{parts[-1]}]"  # what part_partition_key's pattern takes off
    else:
        assert part == packed


@given(
    st.integers(1, 10**6),
    st.integers(-(10**12), 10**12),
    st.lists(st.tuples(st.integers(0, 50), st.integers(-(10**30), 10**30), st.floats(-1e9, 1e9)), max_size=3),
)
def test_window_state_survives_its_plain_form(
    count: int, start: int, columns: list[tuple[int, int, float]]
) -> None:
    state = MultiState(
        count, start, start + 5, [ColumnState(n, total, lo, lo + 1) for n, total, lo in columns]
    )
    assert state_of(flat_state(state)) == state


@given(
    st.lists(
        st.tuples(
            st.integers(0, 50), st.integers(-(10**20), 10**20), st.integers(0, 2200), st.floats(-1e9, 1e9)
        ),
        max_size=3,
    )
)
def test_an_exact_sum_ending_in_a_thousand_zero_bits_survives_its_plain_form_and_stays_small(
    columns: list[tuple[int, int, int, float]],
) -> None:
    """The plain form keeps a sum (units of 2^-1074) as its odd part and shift: equal after the round
    trip, any sum; at most 2 B more a column, a few bytes where the whole integer is over a hundred; and
    a state saved in the earlier form (the whole sum) still reads back."""
    state = MultiState(3, 10, 20, [ColumnState(n, m << s, lo, lo + 1) for n, m, s, lo in columns])
    flat = flat_state(state)
    assert state_of(flat) == state
    earlier = (3, 10, 20, tuple((c.n, c.total, c.lo, c.hi) for c in state.columns))
    assert state_of(earlier) == state
    assert len(pickle.dumps(flat)) <= len(pickle.dumps(earlier)) + 2 * len(columns)  # the shift's 2 B
    # One column of 40.875 (the benchmark's values are multiples of 1/8): the whole sum is 1,080 bits.
    one = MultiState(1, 0, 0, [ColumnState(1, exact_sum.exact(40.875), 40.875, 40.875)])
    whole = (1, 0, 0, ((1, exact_sum.exact(40.875), 40.875, 40.875),))
    assert len(pickle.dumps(flat_state(one))) < 60 < 150 < len(pickle.dumps(whole))


def _options() -> TopicOptions:
    return TopicOptions(
        topic="flights",
        bootstrap="unused:9092",
        fmt="json",
        key="carrier",
        value=None,
        time="ts",
        pack=PackSpec((1,), "carrier", None, "ts"),
        key_fields=KEY,
        value_fields=("arr_delay", "dep_delay"),
        key_array=True,
    )


def _tuples(count: int) -> list[InputTuple]:
    out = []
    for i in range(count):
        value: dict[str, Any] = {
            "carrier": ["AA", "UA"][i % 2],
            "origin": ["JFK", "SFO", "ORD"][i % 3],
            "ts": i * 10,
        }
        if i % 5:
            value["arr_delay"] = i / 7
        if i % 4:
            value["dep_delay"] = i % 9
        if i == 17:
            value["arr_delay"] = "n/a"  # not a number: a dead letter
        if i == 23:
            del value["origin"]  # a composite key with a missing field: a dead letter
        out.append(InputTuple(i % 2, i // 2, value))
    return out


def _truth(tuples: list[InputTuple], window_ms: int) -> list[tuple[Any, ...]]:
    """Per key, tumbling time windows closed by the key's next tuple past the end (the last stays open)."""
    groups: dict[tuple[str, str], dict[int, list[dict[str, Any]]]] = defaultdict(dict)
    for tup in sorted(tuples, key=lambda t: (t.partition, t.offset)):
        v = tup.value
        assert v is not None
        if "origin" not in v or v.get("arr_delay") == "n/a":
            continue
        groups[(v["carrier"], v["origin"])].setdefault(v["ts"] // window_ms * window_ms, []).append(v)
    out = []
    for (carrier, origin), windows in groups.items():
        for seq, start in enumerate(sorted(windows)[:-1]):
            rows = windows[start]
            arr = [r["arr_delay"] for r in rows if "arr_delay" in r]
            dep = [float(r["dep_delay"]) for r in rows if "dep_delay" in r]
            avg = math.fsum(arr) / len(arr) if arr else None
            out.append(
                (carrier, origin, seq, avg, max(dep) if dep else None, len(rows), start, start + window_ms)
            )
    return sorted(out, key=lambda r: (r[0], r[1], r[6]))


def test_processor_runs_several_aggregates_over_a_composite_key() -> None:
    window_ms = 60
    spec = AggregateSpec(
        "carrier", None, "avg", None, window_ms, "ts", json_values=True, key_fields=KEY, aggs=AGGS
    )
    groups = partition_groups(1)
    processor = CecAggregateProcessor(spec, [[(0, 0)]], 0, None, groups)
    handle = _RecordingHandle()
    processor.init(handle)  # type: ignore[arg-type]
    tuples = _tuples(200)
    batches = TupleBatches(_options())
    out: list[pd.DataFrame] = []
    for half in (tuples[:90], tuples[90:]):  # the second micro-batch continues the first one's windows
        frames = [batches.of(j, [t for t in half if t.partition == j]).to_pandas() for j in (1, 0)]
        out.extend(processor.handleInputRows((groups[0],), iter(frames), _Timers()))  # type: ignore[arg-type]
    records = pd.concat(out, ignore_index=True)
    operator = spec.build()
    codec = AvroCodec(operator.result_schema)
    names = [f["name"] for f in operator.result_schema["fields"]]
    assert names == ["carrier", "origin", "window", "avg_arr_delay", "max_dep_delay", "count", "start", "end"]
    results = sorted(
        tuple(row[n] for n in names)
        for row in (
            codec.decode(bytes(p)) for p in records[records["cec_kind"] == Kind.R.value]["cec_payload"]
        )
    )
    assert results == _truth(tuples, window_ms)
    dead = AvroCodec(DEAD_LETTER_SCHEMA)
    reasons = sorted(
        dead.decode(bytes(p))["reason"]
        for p in records[records["cec_kind"] == Kind.DEAD.value]["cec_payload"]
    )
    assert reasons == ["missing key 'origin'", "value 'arr_delay' is not a number: 'n/a'"]


def test_part_ids_map_back_to_their_packed_key_in_spark(spark: SparkSession) -> None:
    """`part_partition_key` (a Spark column) takes a part id to the key its tuples were packed by."""
    from pyspark.sql import functions as F

    values = ["AA", 'a"],1', "x,-5]", "ünï", "-3", "true", "a\\b", "1]"]
    records = [
        {"carrier": c, "origin": o, "ts": t}
        for c in values
        for o in values[:3]
        for t in (-250, 0, 10**12 + 7)
    ]
    operator = MultiAggregate(
        key_fields=list(KEY), aggs=[("count", "*")], window_ms=100, time_field="ts", allowed_lateness=0
    )
    pairs = [(operator.key_of(r), partition_key(r, KEY, as_array=True)) for r in records]
    frame = spark.createDataFrame(pairs, "part string, packed string")
    mapped = frame.select(part_partition_key(F.col("part"), by_window=True).alias("got"), "packed").collect()
    assert [row["got"] for row in mapped] == [packed for _, packed in pairs]


def test_under_watermarks_a_partition_keeps_only_its_open_parts() -> None:
    """Parts per (key, window start) closed by the watermark are results, and gone from the state."""
    window_ms = 60
    spec = AggregateSpec(
        "carrier",
        None,
        "avg",
        None,
        window_ms,
        "ts",
        json_values=True,
        allowed_lateness=0,
        key_fields=KEY,
        aggs=AGGS,
    )
    groups = partition_groups(1)
    processor = CecAggregateProcessor(spec, [[(0, 0)]], 0, None, groups)
    handle = _RecordingHandle()
    processor.init(handle)  # type: ignore[arg-type]
    tuples = [t for t in _tuples(300) if t.offset not in (8, 11)]  # no dead letters here
    batches = TupleBatches(_options())
    out: list[pd.DataFrame] = []
    for third in (tuples[:100], tuples[100:200], tuples[200:]):
        frames = [batches.of(j, [t for t in third if t.partition == j]).to_pandas() for j in (0, 1)]
        out.extend(processor.handleInputRows((groups[0],), iter(frames), _Timers()))  # type: ignore[arg-type]
    records = pd.concat(out, ignore_index=True)
    codec = AvroCodec(spec.build().result_schema)
    results = [codec.decode(bytes(p)) for p in records[records["cec_kind"] == Kind.R.value]["cec_payload"]]
    last = max(t.value["ts"] for t in tuples if t.value is not None)
    closed = {(v["carrier"], v["origin"], v["ts"] // window_ms) for t in tuples if (v := t.value) is not None
              and v["ts"] // window_ms * window_ms + window_ms <= last}  # fmt: skip
    assert {(r["carrier"], r["origin"], r["window"]) for r in results} == closed
    state = PartitionState.load(handle.states["cec_partition"].value)
    assert state.keys and all(saved[1] >= 0 for saved in state.keys.values())  # open parts only
    assert len(state.keys) == state.open_count() < len(results)
