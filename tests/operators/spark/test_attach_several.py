"""`cec_aggregate(key=[...], agg=[(FUNC, COLUMN), ...])`: several aggregates over a composite key on the
attached query, the operator `cec run --key a,b --agg FUNC:COLUMN` runs (MultiAggregate, through the one
engine), on a real broker and real local Spark:

1. keys spread over 3 input partitions with `allowed_lateness` (parts per (key, window)), through both
   input readers: the results equal `cec run`'s over the same topic and a plain-Python truth (SQL's null
   rule, exactly rounded averages), and the dead letters are `cec run`'s;
2. count windows and time windows without watermarks (each key in one input partition): the same;
3. the driver SIGKILLed mid-write and again while recovering: the restart's results are exactly the
   truth (which 1. holds the failure-free runs to; no failure-free run of its own), its dead letters
   exactly the input's bad records;
4. bad input is one ConfigError line before any work: an unknown aggregate, a malformed pair, a column
   or key field the input's schema lacks, a cec queue input, other result columns on an existing topic.
"""

from __future__ import annotations

import csv
import math
import uuid
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cec.exceptions import ConfigError
from cec.records import Kind
from cec.timeparse import parse_time_ms
from operators.spark.attach import cec_aggregate, read_results
from operators.spark.kafka_input import PYTHON, SPARK_KAFKA
from queuestore.kafka import KafkaQueueStore
from tests.brokers import Broker
from tests.helpers import cec, log_records
from tests.helpers.attached import run_to_end
from tests.helpers.topic_flights import (
    flight_records,
    flights_csv,
    flights_topic,
    flush_records,
    key_and_value_dead_letters,
    logged_dead_letters,
    need_reader,
)
from tests.operators.spark.result_rows import epoch_ms
from tests.operators.spark.test_attach import _killed_driver

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KEY = ["carrier", "origin"]
AGGS = [("avg", "arr_delay"), ("max", "dep_delay"), ("count", "*")]
AGG_FLAGS = ["--agg", "avg:arr_delay", "--agg", "max:dep_delay", "--agg", "count:*"]
COLUMNS = ["carrier", "origin", "window", "avg_arr_delay", "max_dep_delay", "count", "start", "end"]
WINDOW_MS = 200
LATENESS = "100ms"
STATE_PARTITIONS = 2
Row = tuple[Any, ...]


def _ordered(rows: Any) -> list[Row]:
    """Rows by (carrier, origin, start, window), which is unique (aggregates may be null: not sortable)."""
    return sorted(rows, key=lambda r: (r[0], r[1], r[6], r[2]))


def _truth(
    records: list[tuple[int, dict[str, Any]]], window: tuple[str, int], *, by_watermark: bool
) -> list[Row]:
    """Plain Python, no cec code: per (carrier, origin) windows of `window` ("count", N tuples, start/end the
    first/last tuple's offset; or "time", ms, aligned) over the records that are not dead letters. Without
    a watermark a key's last window stays open; with it (and the flush tuples) every window closes and is
    numbered start / size. SQL's null rule; avg is the exactly rounded sum over the count."""
    offsets: dict[int, int] = defaultdict(int)
    per_key: dict[tuple[str, str], list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for p, r in records:
        offset = offsets[p]
        offsets[p] += 1
        if "origin" not in r or r.get("arr_delay") == "late" or r["carrier"] == "ZZ":
            continue
        per_key[(r["carrier"], r["origin"])].append((offset, r))
    out: list[Row] = []
    kind, size = window
    for (carrier, origin), tuples in per_key.items():
        if kind == "count":
            groups = [tuples[i : i + size] for i in range(0, len(tuples) - size + 1, size)]
            bounds = [(g[0][0], g[-1][0]) for g in groups]
        else:
            by_start: dict[int, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
            for offset, r in tuples:
                by_start[r["ts"] // size * size].append((offset, r))
            starts = sorted(by_start) if by_watermark else sorted(by_start)[:-1]
            groups = [by_start[s] for s in starts]
            bounds = [(s, s + size) for s in starts]
        for seq, (group, (start, end)) in enumerate(zip(groups, bounds, strict=True)):
            arr = [r["arr_delay"] for _, r in group if r.get("arr_delay") is not None]
            dep = [float(r["dep_delay"]) for _, r in group if r.get("dep_delay") is not None]
            number = start // size if by_watermark else seq
            avg = math.fsum(arr) / len(arr) if arr else None
            out.append((carrier, origin, number, avg, max(dep) if dep else None, len(group), start, end))
    return _ordered(out)


def _args(broker: Broker, topic: str, root: Path, output: str, **extra: Any) -> dict[str, Any]:
    return {
        "input_topic": topic,
        "bootstrap_servers": broker.bootstrap,
        "input_format": "json",
        "output_topic": output,
        "key": KEY,
        "agg": AGGS,
        "state_dir": str(root / "state"),
        "checkpoint_location": str(root / "checkpoints"),
        "partitions": STATE_PARTITIONS,
        "max_records_per_trigger": 600,
        **extra,
    }


def _spark_results(spark: SparkSession, broker: Broker, output: str) -> list[Row]:
    frame = read_results(spark, output, broker.bootstrap)
    assert frame.columns == COLUMNS
    return _ordered(tuple(epoch_ms(v) for v in r) for r in frame.collect() if r["carrier"] != "ZZ")


def _cec_run(
    broker: Broker, source: str | Path, root: Path, flags: list[str], *, time: bool
) -> tuple[list[Row], list[Row]]:
    """`cec run` over a topic (one instance per input partition) or a CSV file: its results (in
    `_spark_results`' form) and dead letters (partition, offset or row, reason)."""
    if isinstance(source, Path):
        where = [str(source)]
    else:
        where = ["--input-topic", source, "--bootstrap-servers", broker.bootstrap, "--format", "json"]
    root.mkdir(parents=True, exist_ok=True)
    out = cec("run", *where, "--key", ",".join(KEY), *AGG_FLAGS, *flags, "--results", str(root / "run.csv"),
              "--store-dir", str(root / "run-store"))  # fmt: skip
    assert out.returncode == 0, out.stderr

    def when(text: str) -> int:
        return parse_time_ms(text) if time else int(text)

    def number(text: str) -> float | None:
        return None if text == "" else float(text)

    with (root / "run.csv").open(newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == COLUMNS
        rows = [
            (r["carrier"], r["origin"], int(r["window"]), number(r["avg_arr_delay"]), number(r["max_dep_delay"]),
             int(r["count"]), when(r["start"]), when(r["end"]))
            for r in reader
            if r["carrier"] != "ZZ"
        ]  # fmt: skip
    with (root / "run.dead-letters.csv").open(newline="") as f:
        dead = [(int(r["partition"]), int(r["offset"]), r["reason"]) for r in csv.DictReader(f)]
    return _ordered(rows), sorted(dead)


WANT_REASONS = {"missing key 'origin'", "value 'arr_delay' is not a number: 'late'"}


@pytest.mark.parametrize("reader", [PYTHON, SPARK_KAFKA])
def test_keys_spread_over_partitions_with_watermarks_equal_cec_run_and_the_truth(
    spark: SparkSession, kafka_broker: Broker, tmp_path: Path, reader: str
) -> None:
    need_reader(spark, reader)
    records = flight_records(3, 1500, spread=True) + flush_records(3, STATE_PARTITIONS, KEY)
    topic = flights_topic(kafka_broker, records, 3)
    time_flags = ["--time", "ts", "--window-time", f"{WINDOW_MS}ms", "--allowed-lateness", LATENESS]
    # `cec run` over the topic runs an instance per input partition (a spread key's windows split over
    # them), so its results are taken over the same records in one CSV file (event times increase along
    # it), its dead letters (per tuple) over the topic.
    flights = flights_csv(tmp_path / "flights.csv", records)
    want, _ = _cec_run(kafka_broker, flights, tmp_path / "csv", time_flags, time=True)
    _, want_dead = _cec_run(kafka_broker, topic, tmp_path / "topic", time_flags, time=True)
    truth = _truth(records, ("time", WINDOW_MS), by_watermark=True)
    assert want == truth

    output = f"several-wm-{uuid.uuid4().hex[:8]}"
    args = _args(kafka_broker, topic, tmp_path, output, time="ts", window_time=f"{WINDOW_MS}ms",
                 allowed_lateness=LATENESS, input_reader=reader)  # fmt: skip
    query = run_to_end(spark, args)
    assert query.input_reader == reader
    assert _spark_results(spark, kafka_broker, output) == truth
    dead = logged_dead_letters(kafka_broker, tmp_path, output)
    assert dead == want_dead and {reason for *_, reason in dead} == WANT_REASONS
    # Some (key, window) has tuples from every input partition: the results do not depend on the order.
    spread = defaultdict(set)
    for p, r in records:
        spread[(r["carrier"], r.get("origin"), r["ts"] // WINDOW_MS)].add(p)
    assert max(len(ps) for ps in spread.values()) == 3


@pytest.mark.parametrize(
    ("window", "reader"), [(("count", 7), PYTHON), (("time", WINDOW_MS), SPARK_KAFKA)], ids=["count", "time"]
)
def test_count_and_time_windows_without_watermarks_equal_cec_run_and_the_truth(
    spark: SparkSession, kafka_broker: Broker, tmp_path: Path, window: tuple[str, int], reader: str
) -> None:
    need_reader(spark, reader)
    records = flight_records(3, 1200, spread=False)
    topic = flights_topic(kafka_broker, records, 3)
    kind, size = window
    if kind == "count":
        flags, extra = ["--window-count", str(size)], {"window_count": size}
    else:
        flags = ["--time", "ts", "--window-time", f"{size}ms"]
        extra = {"time": "ts", "window_time": f"{size}ms"}
    want, want_dead = _cec_run(kafka_broker, topic, tmp_path, flags, time=kind == "time")
    truth = _truth(records, window, by_watermark=False)
    assert want == truth

    output = f"several-{kind}-{uuid.uuid4().hex[:8]}"
    run_to_end(spark, _args(kafka_broker, topic, tmp_path, output, input_reader=reader, **extra))
    assert _spark_results(spark, kafka_broker, output) == truth
    assert logged_dead_letters(kafka_broker, tmp_path, output) == want_dead


def test_several_aggregates_over_a_composite_key_are_exact_after_driver_sigkills(
    spark: SparkSession, kafka_broker: Broker, tmp_path: Path
) -> None:
    records = flight_records(3, 2400, spread=True) + flush_records(3, STATE_PARTITIONS, KEY)
    topic = flights_topic(kafka_broker, records, 3)
    truth = _truth(records, ("time", WINDOW_MS), by_watermark=True)
    extra = {
        "time": "ts",
        "window_time": f"{WINDOW_MS}ms",
        "allowed_lateness": LATENESS,
        "input_reader": PYTHON,
        # G-checks too: a footprint's pos must cover every tuple its state holds, from every input partition.
        "checkpointing": {"u_target": 200, "ci_ms": 50, "cp_ms": 50},
    }
    output = f"several-kill-{uuid.uuid4().hex[:8]}"
    # From the logs, the second kill inside the replay (a resumed checkpoint is test_attach_resume.py's).
    args = _args(kafka_broker, topic, tmp_path, output, resume_checkpoint=False, **extra)
    _killed_driver(args, tmp_path / "first", hit=3)
    _killed_driver(args, tmp_path / "recovering", hit=2)  # killed again in the micro-batch recovery ends in
    query = run_to_end(spark, args)
    assert query.recovery.resumed and query.recovery.ec_windows > 0
    assert _spark_results(spark, kafka_broker, output) == truth
    dead = logged_dead_letters(kafka_broker, tmp_path, output)
    assert dead == key_and_value_dead_letters(records) and {reason for *_, reason in dead} == WANT_REASONS
    store = KafkaQueueStore(kafka_broker.bootstrap, tmp_path / "kinds")
    try:
        kinds = [r.kind for q in range(STATE_PARTITIONS) for r in log_records(store, output, q)]
    finally:
        store.close()
    assert Kind.GCHECK in kinds and Kind.GOPEN in kinds


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"agg": [("median", "arr_delay")]}, "unknown aggregate 'median'"),
        ({"agg": [("avg",)]}, "agg takes (FUNC, COLUMN) pairs"),
        ({"agg": [("sum", "*")]}, "only count takes '*'"),
        ({"agg": [("avg", "carrier")]}, "'carrier' is a key column"),
        ({"agg": "avg"}, "give value=, or agg=[('avg', COLUMN), ...]"),
        ({"key": ["carrier", "carrier"]}, "names a column twice"),
        ({"value": "arr_delay"}, "value= goes with agg given as a function name"),
        (
            {"input_format": "csv", "input_schema": "carrier,origin,ts,arr_delay"},
            "value field 'dep_delay' is not in",
        ),
        (
            {"input_format": "csv", "input_schema": "carrier,ts,arr_delay,dep_delay"},
            "key field 'origin' is not in",
        ),
        (
            {
                "input_format": "avro",
                "input_schema": {
                    "type": "record",
                    "name": "F",
                    "fields": [
                        {"name": "carrier", "type": "string"},
                        {"name": "arr_delay", "type": "double"},
                        {"name": "dep_delay", "type": "double"},
                    ],
                },
            },
            "key field 'origin' is not in the avro input's schema",
        ),
        ({"input_format": "cec"}, "a cec queue input takes one key and one agg"),
    ],
)
def test_bad_several_aggregates_are_one_config_error_before_any_work(
    spark: SparkSession, kafka_broker: Broker, tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    output = f"several-bad-{uuid.uuid4().hex[:8]}"
    args = {**_args(kafka_broker, "no-such-topic", tmp_path, output, window_count=3), **change}
    with pytest.raises(ConfigError) as caught:
        cec_aggregate(spark, **args)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "state").exists()  # nothing opened: the checks come before the store


def test_other_result_columns_on_an_existing_output_topic_are_refused(
    spark: SparkSession, kafka_broker: Broker, tmp_path: Path
) -> None:
    topic = flights_topic(kafka_broker, flight_records(2, 200, spread=False), 2)
    output = f"several-columns-{uuid.uuid4().hex[:8]}"
    run_to_end(spark, _args(kafka_broker, topic, tmp_path, output, window_count=5))
    with pytest.raises(ConfigError, match="keep key= and agg= as they were"):
        cec_aggregate(
            spark, **_args(kafka_broker, topic, tmp_path, output, window_count=5, agg=[("sum", "arr_delay")])
        )
    with pytest.raises(ConfigError, match="keep key= and agg= as they were"):
        cec_aggregate(spark, **{**_args(kafka_broker, topic, tmp_path, output, window_count=5),
                                "key": "carrier", "value": "arr_delay", "agg": "avg"})  # fmt: skip
