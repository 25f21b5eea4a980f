"""`cec_aggregate(window_time=..., slide=...)` and `cec_aggregate(session_gap=...)`: hopping and session
windows of several aggregates over a composite key on the attached query, the operators `cec run --slide`
and `cec run --session-gap` run (`operators.hopping`, `operators.sessions`, through the one engine), on a
real broker and real local Spark, over a 3-partition JSON topic:

1. with `allowed_lateness` (keys spread over the 3 input partitions, far-future tuples that close every
   window) and without (each key in one input partition): the results equal a plain-Python truth
   (`tests.helpers.truth`) and `cec run`'s over the same records, and the dead letters are `cec run`'s;
2. the driver SIGKILLed mid-write and again while recovering, per window type: the restart's results are
   exactly the truth (which 1. holds the failure-free runs to; no failure-free run of its own), its dead
   letters exactly the input's bad records;
3. bad window keywords are one ConfigError line before any work.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cec.exceptions import ConfigError
from cec.records import Kind
from operators.spark.attach import cec_aggregate, read_results
from operators.spark.kafka_input import PYTHON, SPARK_KAFKA
from queuestore.kafka import KafkaQueueStore
from tests.brokers import Broker
from tests.helpers import cec, log_records
from tests.helpers.attached import run_to_end
from tests.helpers.topic_flights import (
    FLUSH_TS,
    Record,
    flight_records,
    flights_csv,
    flights_topic,
    flush_records,
    key_and_value_dead_letters,
    logged_dead_letters,
    need_reader,
)
from tests.helpers.truth import csv_form, csv_results, hopping_truth, session_truth
from tests.operators.spark.result_rows import epoch_ms
from tests.operators.spark.test_attach import _killed_driver

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KEY = ["carrier", "origin"]
AGGS = [("avg", "arr_delay"), ("max", "dep_delay"), ("count", "*")]
AGG_FLAGS = ["--agg", "avg:arr_delay", "--agg", "max:dep_delay", "--agg", "count:*"]
COLUMNS = ["carrier", "origin", "window", "avg_arr_delay", "max_dep_delay", "count", "start", "end"]
SIZE_MS, SLIDE_MS = 200, 50
GAP_MS = 40
LATENESS_MS = 100
STATE_PARTITIONS = 2
WANT_REASONS = {"missing key 'origin'", "value 'arr_delay' is not a number: 'late'"}

# The keywords of each window type, and `cec run`'s flags for the same windows.
WINDOWS: dict[str, tuple[dict[str, Any], list[str]]] = {
    "hopping": (
        {"window_time": f"{SIZE_MS}ms", "slide": f"{SLIDE_MS}ms"},
        ["--window-time", f"{SIZE_MS}ms", "--slide", f"{SLIDE_MS}ms"],
    ),
    "session": ({"session_gap": f"{GAP_MS}ms"}, ["--session-gap", f"{GAP_MS}ms"]),
}
Row = dict[str, str]


def _sorted(rows: Any) -> list[Row]:
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))


def _kept(records: list[Record]) -> list[dict[str, Any]]:
    """The records that are neither dead letters nor flush tuples, in their order."""
    return [r for _, r in records if "origin" in r and r.get("arr_delay") != "late" and r["carrier"] != "ZZ"]


def _truth(records: list[Record], window: str, *, watermarks: bool) -> list[Row]:
    """Plain Python (`tests.helpers.truth`), as `cec run --results` writes results. With watermarks every
    window closes (the flush tuples); without, a key's windows close by its own later tuples (each key's
    records come in time order)."""
    rows = _kept(records)
    if window == "hopping":
        lateness = LATENESS_MS if watermarks else None
        return hopping_truth(rows, KEY, SIZE_MS, SLIDE_MS, AGGS, lateness, closed_at=FLUSH_TS)
    return _sorted(csv_form(r) for r in session_truth(rows, GAP_MS, AGGS, KEY, last_open=not watermarks))


def _args(broker: Broker, topic: str, root: Path, output: str, window: str, **extra: Any) -> dict[str, Any]:
    return {
        "input_topic": topic,
        "bootstrap_servers": broker.bootstrap,
        "input_format": "json",
        "output_topic": output,
        "key": KEY,
        "agg": AGGS,
        "time": "ts",
        "state_dir": str(root / "state"),
        "checkpoint_location": str(root / "checkpoints"),
        "partitions": STATE_PARTITIONS,
        "max_records_per_trigger": 600,
        **WINDOWS[window][0],
        **extra,
    }


def _spark_results(spark: SparkSession, broker: Broker, output: str) -> list[Row]:
    frame = read_results(spark, output, broker.bootstrap)
    assert frame.columns == COLUMNS
    return _sorted(
        csv_form({k: epoch_ms(v) for k, v in r.asDict().items()})
        for r in frame.collect()
        if r["carrier"] != "ZZ"
    )


def _cec_run(broker: Broker, source: str | Path, root: Path, flags: list[str]) -> tuple[list[Row], list[Any]]:
    """`cec run` over a topic (one instance per input partition) or a CSV file: its results and dead
    letters (partition, offset or row, reason)."""
    if isinstance(source, Path):
        where = [str(source)]
    else:
        where = ["--input-topic", source, "--bootstrap-servers", broker.bootstrap, "--format", "json"]
    root.mkdir(parents=True, exist_ok=True)
    out = cec("run", *where, "--key", ",".join(KEY), *AGG_FLAGS, "--time", "ts", *flags,
              "--results", str(root / "run.csv"), "--store-dir", str(root / "run-store"))  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = [r for r in csv_results(root / "run.csv") if r["carrier"] != "ZZ"]
    dead = [
        (int(r["partition"]), int(r["offset"]), r["reason"])
        for r in csv_results(root / "run.dead-letters.csv")
    ]
    return rows, sorted(dead)


@pytest.mark.parametrize(
    ("window", "watermarks", "reader"),
    [
        ("hopping", True, PYTHON),
        ("hopping", False, SPARK_KAFKA),
        ("session", True, SPARK_KAFKA),
        ("session", False, PYTHON),
    ],
    ids=["hopping-watermarks", "hopping", "session-watermarks", "session"],
)
def test_hopping_and_session_windows_equal_cec_run_and_the_truth(
    spark: SparkSession, kafka_broker: Broker, tmp_path: Path, window: str, watermarks: bool, reader: str
) -> None:
    need_reader(spark, reader)
    records = flight_records(3, 1500, spread=watermarks)
    if watermarks:
        records += flush_records(3, STATE_PARTITIONS, KEY)
    topic = flights_topic(kafka_broker, records, 3)
    flags = [*WINDOWS[window][1], *(["--allowed-lateness", f"{LATENESS_MS}ms"] if watermarks else [])]
    truth = _truth(records, window, watermarks=watermarks)
    assert len(truth) > 100
    want, want_dead = _cec_run(kafka_broker, topic, tmp_path / "topic", flags)
    if watermarks:
        # `cec run` over the topic runs an instance per input partition (a spread key's windows split over
        # them): its results are taken over the same records in one CSV file (event times rise along it).
        want, _ = _cec_run(
            kafka_broker, flights_csv(tmp_path / "flights.csv", records), tmp_path / "csv", flags
        )
    assert want == truth

    output = f"{window}-{uuid.uuid4().hex[:8]}"
    extra: dict[str, Any] = {"input_reader": reader}
    if watermarks:
        extra["allowed_lateness"] = f"{LATENESS_MS}ms"
    query = run_to_end(spark, _args(kafka_broker, topic, tmp_path, output, window, **extra))
    assert query.input_reader == reader
    assert _spark_results(spark, kafka_broker, output) == truth
    dead = logged_dead_letters(kafka_broker, tmp_path, output)
    assert dead == want_dead and {reason for *_, reason in dead} == WANT_REASONS


@pytest.mark.parametrize("window", ["hopping", "session"])
def test_hopping_and_session_windows_are_exact_after_driver_sigkills(
    spark: SparkSession, kafka_broker: Broker, tmp_path: Path, window: str
) -> None:
    records = flight_records(3, 2400, spread=True) + flush_records(3, STATE_PARTITIONS, KEY)
    topic = flights_topic(kafka_broker, records, 3)
    truth = _truth(records, window, watermarks=True)
    extra = {
        "allowed_lateness": f"{LATENESS_MS}ms",
        "input_reader": PYTHON,
        # G-checks too: a footprint's pos must cover every tuple its state holds, from every input partition.
        "checkpointing": {"u_target": 200, "ci_ms": 50, "cp_ms": 50},
    }
    output = f"{window}-kill-{uuid.uuid4().hex[:8]}"
    # From the logs, the second kill inside the replay (a resumed checkpoint is test_attach_resume.py's).
    args = _args(kafka_broker, topic, tmp_path, output, window, resume_checkpoint=False, **extra)
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


def test_sessions_the_watermark_closed_with_the_last_ones_still_open_are_exact_after_driver_sigkills(
    spark: SparkSession, kafka_broker: Broker, tmp_path: Path
) -> None:
    """The watermark ends at the input's last time less the lateness (the flush tuples at that time), so
    each key's last sessions stay open while the ones before them, in back-to-back gap-wide slices, have
    closed, each at its own end: what a failure-free query emits, and the same after kills while
    processing and while recovering."""
    records = flight_records(3, 2400, spread=True)
    end = max(r["ts"] for _, r in records)
    records += flush_records(3, STATE_PARTITIONS, KEY, ts=end)
    topic = flights_topic(kafka_broker, records, 3)
    closed = [r for r in session_truth(_kept(records), GAP_MS, AGGS, KEY, last_open=False)
              if r["end"] <= end - LATENESS_MS]  # fmt: skip
    truth = _sorted(csv_form(r) for r in closed)
    # Most keys' slices are all occupied to the end: closing a run of them together would emit none.
    assert len(truth) > 30
    extra = {
        "allowed_lateness": f"{LATENESS_MS}ms",
        "input_reader": PYTHON,
        "checkpointing": {"u_target": 200, "ci_ms": 50, "cp_ms": 50},
    }
    output = f"session-open-kill-{uuid.uuid4().hex[:8]}"
    args = _args(kafka_broker, topic, tmp_path, output, "session", resume_checkpoint=False, **extra)
    _killed_driver(args, tmp_path / "first", hit=3)
    _killed_driver(args, tmp_path / "recovering", hit=2)
    query = run_to_end(spark, args)
    assert query.recovery.resumed and query.recovery.ec_windows > 0
    assert _spark_results(spark, kafka_broker, output) == truth


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"window_time": "15ms", "slide": "1h"}, "slide (3600000 ms) is larger than window_time (15 ms)"),
        ({"window_time": "1h", "slide": "7m"}, "slide (420000 ms) must divide window_time (3600000 ms)"),
        ({"window_count": 5, "slide": "1m"}, "slide goes with window_time"),
        ({"slide": "1m"}, "slide needs window_time"),
        ({"slide": "soon", "window_time": "1h"}, "soon"),
        ({"session_gap": "30m", "time": None}, "session_gap needs time="),
        ({"session_gap": "30m", "window_time": "1h"}, "session_gap is a window of its own"),
        ({"session_gap": 0}, "session_gap must be at least 1 ms"),
        ({"session_gap": "30m", "input_format": "cec"}, "not a cec queue"),
    ],
)
def test_bad_window_keywords_are_one_config_error_before_any_work(
    spark: SparkSession, kafka_broker: Broker, tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    output = f"windows-bad-{uuid.uuid4().hex[:8]}"
    args = {**_args(kafka_broker, "no-such-topic", tmp_path, output, "hopping"), **change}
    for name in ("window_time", "slide", "session_gap", "window_count"):
        if name not in change:
            args.pop(name, None)
    with pytest.raises(ConfigError) as caught:
        cec_aggregate(spark, **args)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "state").exists()  # nothing opened: the checks come before the store
