"""`cec run --session-gap GAP --time COL`: session windows over a CSV file and a 3-partition JSON topic,
against the plain-Python truth of tests/operators/test_sessions.py; bad flags are one line, exit 2, before
any work."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.brokers import Broker
from tests.cec.test_cli_aggregates import _as_csv, _read
from tests.cec.test_cli_errors import assert_one_line_error, nothing_written
from tests.helpers import cec
from tests.operators.test_sessions import (
    GAP,
    LATENESS,
    bad_rows,
    partition_of,
    partition_rows,
    session_rows,
    truth,
    watermark_truth,
    write_csv,
)
from tests.topic_data import create_topic, produce

FLAGS = [
    "--key", "carrier,origin", "--time", "ts", "--session-gap", f"{GAP}ms",
    "--agg", "avg:arr_delay", "--agg", "max:dep_delay", "--agg", "count:*", "--agg", "count:arr_delay",
]  # fmt: skip
KEY = ("carrier", "origin", "start")


def _by_key(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return sorted(rows, key=lambda r: tuple(r[k] for k in KEY))


def _want(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    return _by_key([_as_csv(r) for r in truth(rows)])


@pytest.mark.parametrize("crash", [None, "900"], ids=["clean", "crash-after-900"])
def test_cec_run_writes_one_row_per_key_and_session(tmp_path: Path, crash: str | None) -> None:
    rows = session_rows(3, 2500)
    with_bad, _ = bad_rows(rows)
    data = write_csv(tmp_path / "flights.csv", with_bad)
    out = cec("run", str(data), *FLAGS, "--results", str(tmp_path / "out.csv"),
              *(["--crash-after", crash] if crash else []))  # fmt: skip
    assert out.returncode == 0, out.stderr
    if crash:
        assert f"SIGKILLed after {crash} input rows" in out.stdout
    header, got = _read(tmp_path / "out.csv")
    assert header == [
        "carrier", "origin", "window", "avg_arr_delay", "max_dep_delay", "count_arr_delay", "count", "start", "end"
    ]  # fmt: skip
    assert got[0]["start"].endswith("Z") and "T" in got[0]["start"]  # ISO-8601 UTC
    assert _by_key(got) == _want(rows)
    _, dead = _read(tmp_path / "out.dead-letters.csv")
    assert sorted(r["reason"].split(":")[0] for r in dead) == ["late tuple", "missing key 'origin'", "value 'arr_delay' is not a number"]  # fmt: skip


def test_one_key_and_one_aggregate_keep_the_columns_of_before(tmp_path: Path) -> None:
    rows = session_rows(4, 200)
    data = write_csv(tmp_path / "flights.csv", rows)
    out = cec("run", str(data), "--key", "carrier", "--value", "dep_delay", "--agg", "max", "--time", "ts",
              "--session-gap", f"{GAP}ms", "--results", str(tmp_path / "out.csv"))  # fmt: skip
    assert out.returncode == 0, out.stderr
    header, got = _read(tmp_path / "out.csv")
    assert header == ["key", "window", "value", "count", "start", "end"]
    assert got


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--session-gap", "30m"], "--session-gap needs --time COL"),
        (["--time", "ts", "--session-gap", "30m", "--window-time", "1h"], "not allowed with argument"),
        (["--time", "ts", "--session-gap", "30m", "--window-count", "3"], "not allowed with argument"),
        (["--time", "ts", "--session-gap", "0s"], "session gap must be"),
        (["--time", "ts", "--session-gap", "soon"], "session gap"),
        (
            ["--allowed-lateness", "0", "--window-count", "3"],
            "--allowed-lateness needs --window-time or --session-gap",
        ),
    ],
)
def test_bad_session_flags_are_one_line_exit_2_before_any_work(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    data = write_csv(tmp_path / "flights.csv", session_rows(5, 20))
    store = tmp_path / "store"
    out = cec("run", str(data), "--key", "carrier", "--value", "arr_delay", *flags,
              "--results", str(tmp_path / "out.csv"), "--store-dir", str(store))  # fmt: skip
    assert_one_line_error(out, message)
    assert out.returncode == 2
    assert nothing_written(store)
    assert not (tmp_path / "out.csv").exists()


def test_a_three_partition_json_topic_gives_the_sessions_of_plain_python(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    rows = session_rows(6, 900)
    topic = f"sessions-{uuid.uuid4().hex[:10]}"
    create_topic(kafka_broker.bootstrap, topic, 3)
    records = []
    for row in rows:
        value = {k: row[k] for k in ("carrier", "origin", "ts")}
        for column in ("arr_delay", "dep_delay"):  # SQL null: an absent JSON field
            if row[column] is not None:
                value[column] = row[column]
        records.append((partition_of(row), None, json.dumps(value).encode()))  # a key stays in one partition
    assert {p for p, _, _ in records} == {0, 1, 2}
    produce(kafka_broker.bootstrap, topic, records)
    out = cec("run", "--input-topic", topic, "--bootstrap-servers", kafka_broker.bootstrap, "--format", "json",
              *FLAGS, "--results", str(tmp_path / "topic.csv"), "--crash-after", "250")  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SIGKILLed after 250 input records" in out.stdout
    assert _by_key(_read(tmp_path / "topic.csv")[1]) == _want(rows)


def test_with_an_allowed_lateness_the_watermark_closes_sessions(tmp_path: Path) -> None:
    (rows,) = partition_rows(8, 800, partitions=1)
    data = write_csv(tmp_path / "flights.csv", rows)
    out = cec("run", str(data), *FLAGS, "--allowed-lateness", f"{LATENESS}ms", "--results", str(tmp_path / "out.csv"),
              "--crash-after", "500")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "SIGKILLed after 500 input rows" in out.stdout
    header, got = _read(tmp_path / "out.csv")
    assert header[:3] == ["carrier", "origin", "window"]
    want = _by_key([_as_csv(r) for r in watermark_truth([rows])])
    assert len(want) > 100
    assert _by_key(got) == want


def test_a_json_topic_with_an_allowed_lateness_closes_each_partitions_sessions_by_its_watermark(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    """`cec run --input-topic` runs one operator instance per input partition, each with its own
    watermark: every partition's sessions as plain Python closes them, with the slices folded into their
    sessions written to Kafka as results-less records that the results pass skips."""
    parts = partition_rows(9, 300)
    topic = f"sessions-wm-{uuid.uuid4().hex[:10]}"
    create_topic(kafka_broker.bootstrap, topic, 3)
    records = []
    for p, rows in enumerate(parts):
        for row in rows:
            value = {k: row[k] for k in ("carrier", "origin", "ts")}
            for column in ("arr_delay", "dep_delay"):
                if row[column] is not None:
                    value[column] = row[column]
            records.append((p, None, json.dumps(value).encode()))
    produce(kafka_broker.bootstrap, topic, records)
    out = cec("run", "--input-topic", topic, "--bootstrap-servers", kafka_broker.bootstrap, "--format", "json",
              *FLAGS, "--allowed-lateness", f"{LATENESS}ms", "--results", str(tmp_path / "topic.csv"),
              "--crash-after", "120")  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SIGKILLed after 120 input records" in out.stdout
    want = sorted(json.dumps(_as_csv(r), sort_keys=True) for p in parts for r in watermark_truth([p]))
    assert len(want) > 100
    got = sorted(json.dumps(r, sort_keys=True) for r in _read(tmp_path / "topic.csv")[1])
    assert got == want
