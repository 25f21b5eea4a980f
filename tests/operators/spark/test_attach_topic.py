"""`cec_aggregate` on a user's own JSON topic (operators.spark.topic_reader over KafkaTopicSource), its
StreamingQuery handle, and G-checks under `Checkpointing(u_target=...)`, on a real broker and local Spark:

1. a JSON topic with 3 partitions written by a plain confluent-kafka producer, with bad records among the
   good ones: the results equal a plain-Python per-key aggregation of the same records, and every bad
   record is one dead letter with its partition, offset and reason;
2. the returned handle answers like a StreamingQuery and carries CEC's figures in its progress;
3. `metrics_port`: the driver serves cec.metrics, scraped after the query processed its input;
4. with a small U the output log holds G-checks, and after the driver is SIGKILLed in the middle of a sink
   write the restart from the logs (`resume_checkpoint=False`) replays at most U/2 + two micro-batches (a G-open-only run of the same input, restarted
   after it ran to the end, replays far more, because a few rare keys keep windows open from the start),
   and the output is exact either way;
5. without `checkpointing=` the default bounds a restart's replay from the logs the same way (its U scaled down to this
   input), with its G-checks inside the data's micro-batches: no no-data micro-batch is planned.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cec.records import Kind, RecordCodec
from operators.base import DEAD_LETTER_SCHEMA
from operators.sinks import count_kinds, iter_payloads
from operators.spark.attach import RESULT_COLUMNS, CecAggregateQuery, cec_aggregate, read_results
from queuestore.kafka import KafkaQueueStore
from tests.brokers import Broker
from tests.operators.spark.test_attach import _killed_driver
from tests.topic_data import create_topic, make_purchases, produce

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PARTITIONS = 3
WINDOW = 7
TRIGGER_ROWS = 600
U = 300
# The replay G-checks bound: U/2 (the threshold) plus two micro-batches (timers fire between micro-batches,
# and a window opened in one micro-batch may be G-checked only after the next).
BOUND = U // 2 + 2 * TRIGGER_ROWS
RARE = ("rare-a", "rare-b", "rare-c")  # fewer tuples than a window: open from their first tuple on


@dataclass
class JsonTopic:
    bootstrap: str
    topic: str
    records: list[tuple[int, int, bytes]]  # (partition, offset, value) as produced
    bad: dict[tuple[int, int], str]  # (partition, offset) -> what is wrong with it

    @property
    def count(self) -> int:
        return len(self.records)


def _bad_value(i: int) -> tuple[bytes, str]:
    kind = i % 4
    if kind == 0:
        return b"{not json", "not JSON"
    if kind == 1:
        return json.dumps({"item": f"item{i}", "ts": i}).encode(), "missing price"
    if kind == 2:
        return json.dumps({"item": None, "price": 1.5, "ts": i}).encode(), "null item"
    return json.dumps({"item": "item1", "price": "lots", "ts": i}).encode(), "price not a number"


def _hostile_values(p: int) -> list[bytes]:
    """Records, one after another in partition p, that are not one JSON object each but read as purchases
    of a key of p when joined with commas into an array (three of them: 1000, 2000, 3000), and poison pills
    that made a traceback (a RecursionError; a lone surrogate in the key, which UTF-8 cannot hold)."""
    key = f"item{p}".encode()
    return [
        b'{"item": "%s", "price": 1000.0, "ts": 1}, {"item": "%s", "price": 2000.0, "ts": 2}' % (key, key),
        b'{"item": "%s", "price": 3000.0, "ts": 3, "note": "' % key,
        b'"}',
        b'{"item": "%s", "price": 1.0, "ts": 4, "deep": ' % key + b"[" * 3000 + b"]" * 3000 + b"}",
        b'{"item": "\\ud800", "price": 1.0, "ts": 5}',
    ]


@pytest.fixture(scope="module")
def json_topic(spark_kafka_broker: Broker) -> JsonTopic:
    """3000 purchases over 60 keys (each key in one partition), a few rare keys, every 97th record bad, and
    hostile records (`_hostile_values`) in the middle of each partition."""
    bootstrap = spark_kafka_broker.bootstrap
    topic = f"json-purchases-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTITIONS)
    values: list[tuple[int, bytes, str | None]] = []
    for i, (p, rec) in enumerate(make_purchases(3000, 60, PARTITIONS, seed=5)):
        if i % 97 == 50:
            raw, why = _bad_value(i)
            values.append((p, raw, why))
        values.append((p, json.dumps(rec).encode(), None))
        if 1500 <= i < 1500 + PARTITIONS:
            values.extend((i % PARTITIONS, raw, "not JSON") for raw in _hostile_values(i % PARTITIONS))
        if i % 600 == 10:
            for r, name in enumerate(RARE):
                values.append(
                    (r % PARTITIONS, json.dumps({"item": name, "price": 2.0, "ts": i}).encode(), None)
                )
    produce(bootstrap, topic, [(p, None, v) for p, v, _ in values])
    offsets = [0] * PARTITIONS
    records, bad = [], {}
    for p, v, why in values:  # one producer, in order, no transactions: offsets are dense per partition
        records.append((p, offsets[p], v))
        if why is not None:
            bad[(p, offsets[p])] = why
        offsets[p] += 1
    return JsonTopic(bootstrap, topic, records, bad)


def _reference(data: JsonTopic) -> dict[str, list[tuple[Any, ...]]]:
    """The aggregation in plain Python: per key, in offset order, count windows of WINDOW valid tuples
    (value = mean price; start/end = first/last offset, as the aggregate does without a time field)."""
    per_key: dict[str, list[tuple[int, float]]] = {}
    for p, o, raw in sorted(data.records):
        if (p, o) in data.bad:
            continue
        rec = json.loads(raw)
        per_key.setdefault(str(rec["item"]), []).append((o, float(rec["price"])))
    out: dict[str, list[tuple[Any, ...]]] = {}
    for key, tuples in per_key.items():
        for w in range(len(tuples) // WINDOW):
            chunk = tuples[w * WINDOW : (w + 1) * WINDOW]
            mean = sum(x for _, x in chunk) / WINDOW
            out.setdefault(key, []).append((key, w, mean, WINDOW, chunk[0][0], chunk[-1][0]))
    return out


def _args(data: JsonTopic, root: Path, output: str, **extra: Any) -> dict[str, Any]:
    return {
        "input_topic": data.topic,
        "input_format": "json",
        "bootstrap_servers": data.bootstrap,
        "output_topic": output,
        "key": "item",
        "value": "price",
        "agg": "avg",
        "window_count": WINDOW,
        "state_dir": str(root / "state"),
        "checkpoint_location": str(root / "checkpoints"),
        "max_records_per_trigger": TRIGGER_ROWS,
        **extra,
    }


def _results(spark: SparkSession, data: JsonTopic, output: str) -> dict[str, list[tuple[Any, ...]]]:
    rows = read_results(spark, output, data.bootstrap).collect()
    assert max(Counter((r["key"], r["window"]) for r in rows).values()) == 1, "a window has two results"
    out: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        out.setdefault(str(row["key"]), []).append(tuple(row[c] for c in RESULT_COLUMNS))
    for values in out.values():
        values.sort(key=lambda r: r[1])
    return out


def _assert_equal(got: dict[str, list[tuple[Any, ...]]], want: dict[str, list[tuple[Any, ...]]]) -> None:
    assert got.keys() == want.keys()
    for key, rows in want.items():
        assert len(got[key]) == len(rows), key
        for g, w in zip(got[key], rows, strict=True):
            assert g[:2] == w[:2] and g[3:] == w[3:] and g[2] == pytest.approx(w[2], rel=1e-12), (g, w)


def _dead_letters(data: JsonTopic, root: Path, output: str) -> dict[tuple[int, int], str]:
    store = KafkaQueueStore(data.bootstrap, root / "probe")
    try:
        letters = list(iter_payloads(store, output, DEAD_LETTER_SCHEMA, Kind.DEAD))
    finally:
        store.close()
    found = {(d["partition"], d["offset"]): d["reason"] for d in letters}
    assert len(found) == len(letters), "a dead letter was written twice"
    return found


def _kinds(data: JsonTopic, root: Path, output: str) -> Counter[str]:
    store = KafkaQueueStore(data.bootstrap, root / "probe")
    try:
        return count_kinds(store, output)
    finally:
        store.close()


def _log_extent(data: JsonTopic, root: Path, output: str) -> tuple[int, list[int]]:
    """(open windows, extent start) read from the output log itself: a window is open if its latest
    footprint (G-open or G-check) is not followed by its R; the extent starts at the lowest pos among
    those footprints, or at the lowest crash point (a log's last pos) where that is lower."""
    codec = RecordCodec()
    store = KafkaQueueStore(data.bootstrap, root / "probe-extent")
    try:
        latest: dict[tuple[str | None, int], tuple[int, ...]] = {}
        crash: list[tuple[int, ...]] = []
        for q in range(store.partitions(output)):
            last: tuple[int, ...] | None = None
            with store.reader(output, q) as reader:
                for stored in reader.scan_forward(0):
                    record = codec.decode(stored.value, stored.meta)
                    last = record.pos
                    if record.kind in (Kind.GOPEN, Kind.GCHECK):
                        latest[(record.key, record.seq)] = record.pos
                    elif record.kind is Kind.R:
                        latest.pop((record.key, record.seq), None)
            assert last is not None
            crash.append(last)
    finally:
        store.close()
    start = [min([*(c[j] for c in crash), *(p[j] for p in latest.values())]) for j in range(len(crash[0]))]
    return len(latest), start


@dataclass
class Run:
    output: str
    root: Path
    query: CecAggregateQuery


@pytest.fixture(scope="module")
def json_run(spark: SparkSession, json_topic: JsonTopic, tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("attach-json")
    output = f"avg-json-{uuid.uuid4().hex[:8]}"
    query = cec_aggregate(
        spark, available_now=True, query_name=f"cec_{uuid.uuid4().hex[:6]}", **_args(json_topic, root, output)
    )
    assert query.awaitTermination(300) is True and query.exception() is None
    return Run(output, root, query)


def test_json_topic_equals_plain_python_aggregation(
    spark: SparkSession, json_topic: JsonTopic, json_run: Run
) -> None:
    _assert_equal(_results(spark, json_topic, json_run.output), _reference(json_topic))
    letters = _dead_letters(json_topic, json_run.root, json_run.output)
    assert letters.keys() == json_topic.bad.keys() and len(letters) >= 30
    for where, reason in letters.items():
        why = json_topic.bad[where]
        expected = {
            "not JSON": "JSON",
            "missing price": "price",
            "null item": "item",
            "price not a number": "price",
        }
        assert expected[why] in reason, (where, why, reason)
    # A record the source could not read is in its dead letter as read, in the input's own partition
    # numbering (the form of every host: operators/engine/records.py).
    store = KafkaQueueStore(json_topic.bootstrap, json_run.root / "probe")
    try:
        raws = {(d["partition"], d["offset"]): d["raw"] for d in iter_payloads(
            store, json_run.output, DEAD_LETTER_SCHEMA, Kind.DEAD)}  # fmt: skip
    finally:
        store.close()
    unread = [(p, o, v) for p, o, v in json_topic.records if json_topic.bad.get((p, o)) == "not JSON"]
    assert unread and all(raws[(p, o)] == v.decode("utf-8", "backslashreplace") for p, o, v in unread)


def test_handle_answers_like_a_streaming_query_with_cec_figures(json_topic: JsonTopic, json_run: Run) -> None:
    query = json_run.query
    assert uuid.UUID(query.id) and uuid.UUID(query.runId) and query.name and query.name.startswith("cec_")
    assert not query.isActive and query.exception() is None
    assert query.awaitTermination(1) is True
    recent = query.recentProgress
    assert len(recent) == query.batches >= json_topic.count // TRIGGER_ROWS
    assert sum(p["numInputRows"] for p in recent) == json_topic.count
    last = query.lastProgress
    assert last is not None and last["batchId"] == recent[-1]["batchId"]
    cec = last["cec"]
    kinds = _kinds(json_topic, json_run.root, json_run.output)
    assert cec["records"] == {k: kinds[k] for k in ("R", "GOPEN", "GCHECK", "DEAD")}
    # No checkpointing given: the default U (100,000) is far above this input, so no G-check was due.
    assert cec["gopens"] == kinds["GOPEN"] and cec["gchecks"] == 0
    assert sum(p["cec"]["batch_records"]["R"] for p in recent) == kinds["R"]
    # Open windows = keys whose valid tuple count is not a multiple of the window; the extent reaches back
    # to the rare keys' first tuples, near the start of the input.
    assert cec["open_windows"] == kinds["GOPEN"] - kinds["R"] > len(RARE)
    # Exactly what the log says: the state partitions computed their footprints' pos with the writers' rule.
    assert (cec["open_windows"], cec["extent_start"]) == _log_extent(
        json_topic, json_run.root, json_run.output
    )
    assert cec["extent_tuples"] > json_topic.count * 0.8
    assert cec["recovery"]["resumed"] is False and cec["recovery"]["replay_tuples"] == 0
    status = query.status
    assert "message" in status and status["cec"]["open_windows"] == cec["open_windows"]
    query.stop()  # idempotent on a finished query
    assert query.cec_progress["records"] == cec["records"]


def test_a_running_handle_stops(spark: SparkSession, json_topic: JsonTopic, tmp_path: Path) -> None:
    output = f"avg-json-run-{uuid.uuid4().hex[:8]}"
    with cec_aggregate(spark, **_args(json_topic, tmp_path, output)) as query:
        query.processAllAvailable()
        assert query.isActive and query.status["isTriggerActive"] in (True, False)
        assert query.lastProgress is not None and "cec" in query.lastProgress
        query.stop()
        assert not query.isActive and query.awaitTermination(10) is True
    _assert_equal(_results(spark, json_topic, output), _reference(json_topic))


def test_driver_serves_cec_metrics_after_the_input_is_processed(
    spark: SparkSession, json_topic: JsonTopic, tmp_path: Path
) -> None:
    output = f"avg-json-metrics-{uuid.uuid4().hex[:8]}"
    args = _args(json_topic, tmp_path, output, checkpointing={"u_target": U, "ci_ms": 100, "cp_ms": 100})
    query = cec_aggregate(spark, available_now=True, metrics_port=0, **args)
    try:
        assert query.awaitTermination(300) is True and query.exception() is None
        assert query.metrics_port
        with urllib.request.urlopen(f"http://127.0.0.1:{query.metrics_port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        mine = {
            sample.name: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.labels.get("topic") == output and sample.labels.get("partition") == "all"
        }
        cec = query.cec_progress
    finally:
        query.close()
    # G-checks moved footprints forward: the figures still match the log exactly.
    assert cec["gchecks"] > 0
    assert (cec["open_windows"], cec["extent_start"]) == _log_extent(json_topic, tmp_path, output)
    assert mine["cec_open_windows"] == cec["open_windows"] > 0
    assert mine["cec_replay_tuples"] == cec["extent_tuples"] > 0
    assert mine["cec_gopens_total"] == cec["gopens"] > 0
    assert mine["cec_gchecks_total"] == cec["gchecks"] > 0
    assert mine["cec_appended_records_total"] == sum(cec["records"].values()) > 0
    assert mine["cec_dead_letters_total"] == cec["records"]["DEAD"] == len(json_topic.bad)
    # What the driver cannot know is left unset, not reported as zero.
    assert not {"cec_checkpoint_duty_ratio", "cec_input_tuples_total", "cec_extent_records"} & mine.keys()


def test_gchecks_bound_the_replay_after_a_driver_kill(
    spark: SparkSession, json_topic: JsonTopic, tmp_path: Path
) -> None:
    replays = {}
    for name, extra in (("gopen", {}), ("u", {"checkpointing": {"u_target": U, "ci_ms": 100, "cp_ms": 100}})):
        output = f"avg-json-{name}-{uuid.uuid4().hex[:8]}"
        root = tmp_path / name
        # The replay a restart from the logs makes (a resumed checkpoint replays no extent).
        args = _args(json_topic, root, output, resume_checkpoint=False, **extra)
        if name == "u":
            # The 5th of 6 micro-batches (with the executors' writers the site counts micro-batches: one of
            # its write tasks kills the driver half way through its partition).
            _killed_driver(args, root / "driver", hit=5)
            assert _kinds(json_topic, root, output)["GCHECK"] > 0
        else:
            # The G-open-only baseline is only a replay figure to compare with, so it runs to the end of
            # the input in this process instead of in a killed driver (a JVM start saved): its restart
            # replays from the rare keys' first tuples wherever the first run stopped, as after a kill.
            first = cec_aggregate(spark, available_now=True, **args)
            assert first.awaitTermination(300) is True and first.exception() is None
        query = cec_aggregate(spark, available_now=True, **args)
        assert query.awaitTermination(300) is True and query.exception() is None
        rec = query.lastProgress["cec"]["recovery"]
        assert rec["resumed"] and rec["replay_s"] is not None
        replays[name] = rec["replay_tuples"]
        _assert_equal(_results(spark, json_topic, output), _reference(json_topic))
        assert _dead_letters(json_topic, root, output).keys() == json_topic.bad.keys()
        if name == "u":
            assert query.lastProgress["cec"]["gchecks"] > 0
            assert query.cec_progress["extent_tuples"] <= BOUND
    print(f"replay tuples after the kill: {replays}")  # the figure the report quotes (pytest -s)
    # G-open only: the rare keys' windows hold the extent at their first tuples; with U it stays short.
    assert replays["u"] <= BOUND < replays["gopen"], replays


def test_the_default_bounds_the_replay_after_a_restart_without_extra_micro_batches(
    spark: SparkSession, json_topic: JsonTopic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No `checkpointing=`: the default (`Checkpointing.default()`, its U scaled down to this input) bounds
    what a restart replays, and its G-checks come inside the data's micro-batches: the query plans no
    no-data micro-batch, so every micro-batch read input and each has its progress entry. Without
    G-checks the same input's extent reaches back to the rare keys' first tuples (`json_run`: over 80%
    of the input; the G-open-only restart of `test_gchecks_bound_the_replay_after_a_driver_kill`)."""
    monkeypatch.setattr("cec.config.DEFAULT_U_TARGET", U)  # read on the driver, where the default is made
    output = f"avg-json-default-{uuid.uuid4().hex[:8]}"
    args = _args(json_topic, tmp_path, output, resume_checkpoint=False)  # the replay from the logs
    first = cec_aggregate(spark, available_now=True, **args)
    assert first.awaitTermination(300) is True and first.exception() is None
    recent = first.recentProgress
    assert len(recent) == first.batches >= json_topic.count // TRIGGER_ROWS
    assert all(p["numInputRows"] > 0 for p in recent), [p["numInputRows"] for p in recent]
    assert sum(p["numInputRows"] for p in recent) == json_topic.count
    cec = first.cec_progress
    assert cec["gchecks"] > 0 and _kinds(json_topic, tmp_path, output)["GCHECK"] == cec["gchecks"]
    assert [c["u_target"] for c in cec["checkpointing"]] == [U] * PARTITIONS
    assert (cec["open_windows"], cec["extent_start"]) == _log_extent(json_topic, tmp_path, output)
    assert cec["extent_tuples"] <= BOUND < json_topic.count * 0.8

    again = cec_aggregate(spark, available_now=True, **args)
    assert again.awaitTermination(300) is True and again.exception() is None
    rec = again.lastProgress["cec"]["recovery"]
    print(f"replay tuples after a restart under the default: {rec['replay_tuples']}")  # pytest -s
    # The restart replays exactly the extent the first run's figures gave at its end.
    assert rec["resumed"] and rec["replay_tuples"] == cec["extent_tuples"] <= BOUND
    assert all(p["numInputRows"] > 0 for p in again.recentProgress)
    _assert_equal(_results(spark, json_topic, output), _reference(json_topic))
    assert _dead_letters(json_topic, tmp_path, output).keys() == json_topic.bad.keys()


def test_keys_follow_the_one_key_rule_on_the_attached_query(
    spark: SparkSession, spark_kafka_broker: Broker, tmp_path: Path
) -> None:
    """The README's key rule on `cec_aggregate` (the same as `cec run`'s): JSON 5 and "5" one key, true and
    "true" one key, "True", " k" and "k" keys of their own, a float key a dead letter."""
    bootstrap = spark_kafka_broker.bootstrap
    topic = f"json-keys-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 2)
    keys: list[Any] = [5, "5", True, "true", "True", "True", " k", " k", "k", "k", 5.0]
    produce(bootstrap, topic, [(1, None, json.dumps({"item": k, "price": 1.0}).encode()) for k in keys * 2])
    output = f"keys-{uuid.uuid4().hex[:8]}"
    query = cec_aggregate(
        spark,
        available_now=True,
        input_topic=topic,
        input_format="json",
        bootstrap_servers=bootstrap,
        output_topic=output,
        key="item",
        value="price",
        agg="count",
        window_count=4,
        state_dir=str(tmp_path / "state"),
        checkpoint_location=str(tmp_path / "checkpoints"),
    )
    assert query.awaitTermination(300) is True and query.exception() is None
    rows = read_results(spark, output, bootstrap).collect()
    assert sorted((r["key"], r["window"], r["count"]) for r in rows) == sorted(
        (k, 0, 4) for k in ("5", "true", "True", " k", "k")
    )
    store = KafkaQueueStore(bootstrap, tmp_path / "probe")
    try:
        reasons = [d["reason"] for d in iter_payloads(store, output, DEAD_LETTER_SCHEMA, Kind.DEAD)]
    finally:
        store.close()
    assert (
        reasons == ["key 'item' is a floating-point number (5.0): a key is text, an integer or a boolean"] * 2
    )
