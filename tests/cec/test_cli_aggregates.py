"""`cec run` with a composite key and several aggregates (--key a,b, repeatable --agg FUNC[:COLUMN]),
against the plain-Python truth of tests/operators/test_multi_aggregate.py; bad flags are one line, exit 2,
before any work."""

from __future__ import annotations

import csv
import json
import uuid
import zlib
from pathlib import Path
from typing import Any

import pytest

from cec.timeparse import format_time_ms
from tests.brokers import Broker
from tests.cec.test_cli_errors import assert_one_line_error, nothing_written
from tests.helpers import cec
from tests.operators.test_multi_aggregate import ROWS, _truth, _write_csv
from tests.topic_data import create_topic, produce

FLAGS = [
    "--key", "carrier,origin", "--time", "ts", "--window-time", "200ms",
    "--agg", "avg:arr_delay", "--agg", "max:dep_delay", "--agg", "count:*", "--agg", "count:arr_delay",
]  # fmt: skip


def _as_csv(row: dict[str, Any]) -> dict[str, str]:
    out = {}
    for name, value in row.items():
        if name in ("start", "end"):
            out[name] = format_time_ms(value)
        elif value is None:
            out[name] = ""  # SQL null
        else:
            out[name] = repr(value) if isinstance(value, float) else str(value)
    return out


def _read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


@pytest.mark.parametrize("crash", [None, "230"], ids=["clean", "crash-after-230"])
def test_cec_run_writes_one_column_per_key_field_and_aggregate(tmp_path: Path, crash: str | None) -> None:
    data = _write_csv(tmp_path / "flights.csv", ROWS)
    out = cec("run", str(data), *FLAGS, "--results", str(tmp_path / "out.csv"),
              *(["--crash-after", crash] if crash else []))  # fmt: skip
    assert out.returncode == 0, out.stderr
    header, rows = _read(tmp_path / "out.csv")
    assert header == [
        "carrier", "origin", "window", "avg_arr_delay", "max_dep_delay", "count_arr_delay", "count", "start", "end"
    ]  # fmt: skip
    key = ("carrier", "origin", "start")
    assert sorted(rows, key=lambda r: tuple(r[k] for k in key)) == [_as_csv(r) for r in _truth(ROWS)]
    _, dead = _read(tmp_path / "out.dead-letters.csv")
    assert sorted(r["reason"] for r in dead) == [
        "missing key 'origin'",
        "value 'arr_delay' is not a number: 'late'",
    ]


def test_one_key_and_one_plain_agg_keep_the_columns_of_before(tmp_path: Path) -> None:
    data = _write_csv(tmp_path / "flights.csv", ROWS)
    out = cec("run", str(data), "--key", "carrier", "--value", "dep_delay", "--agg", "max", "--window-count", "50",
              "--results", str(tmp_path / "out.csv"))  # fmt: skip
    assert out.returncode == 0, out.stderr
    header, rows = _read(tmp_path / "out.csv")
    assert header == ["key", "window", "value", "count", "start", "end"]
    assert rows


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--key", "carrier", "--agg", "median:arr_delay", "--window-count", "3"],
            "invalid choice: 'median'",
        ),
        (["--key", "carrier", "--agg", "avg:no_such", "--window-count", "3"], "has no column 'no_such'"),
        (["--key", "carrier,gate", "--agg", "avg:arr_delay", "--window-count", "3"], "has no column 'gate'"),
        (["--key", "carrier", "--agg", "avg", "--window-count", "3"], "required: --value"),
        (["--key", "carrier", "--agg", "sum:*", "--window-count", "3"], "only count takes '*'"),
        (["--key", "carrier,", "--agg", "avg:arr_delay", "--window-count", "3"], "empty column name"),
    ],
)
def test_bad_aggregate_flags_are_one_line_exit_2_before_any_work(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    data = _write_csv(tmp_path / "flights.csv", ROWS)
    store = tmp_path / "store"
    out = cec("run", str(data), *flags, "--results", str(tmp_path / "out.csv"), "--store-dir", str(store))
    assert_one_line_error(out, message)
    assert out.returncode == 2
    assert nothing_written(store)
    assert not (tmp_path / "out.csv").exists()


def test_a_json_topic_gives_per_key_the_results_of_the_same_rows_in_a_csv(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    topic = f"flights-{uuid.uuid4().hex[:10]}"
    create_topic(kafka_broker.bootstrap, topic, 3)
    records = []
    for row in ROWS:
        value: dict[str, Any] = {"carrier": row["carrier"], "ts": int(row["ts"])}
        if row["origin"]:
            value["origin"] = row["origin"]
        for column in ("arr_delay", "dep_delay"):  # an empty CSV field is an absent JSON field
            if row[column]:
                value[column] = row[column] if row[column] == "late" else float(row[column])
        partition = zlib.crc32(f"{row['carrier']}".encode()) % 3  # a key stays in one partition
        records.append((partition, None, json.dumps(value).encode()))
    produce(kafka_broker.bootstrap, topic, records)
    data = _write_csv(tmp_path / "flights.csv", ROWS)
    csv_run = cec("run", str(data), *FLAGS, "--results", str(tmp_path / "csv.csv"))
    assert csv_run.returncode == 0, csv_run.stderr
    topic_run = cec("run", "--input-topic", topic, "--bootstrap-servers", kafka_broker.bootstrap, "--format", "json",
                    *FLAGS, "--results", str(tmp_path / "topic.csv"), "--crash-after", "60")  # fmt: skip
    assert topic_run.returncode == 0, topic_run.stdout + topic_run.stderr
    key = ("carrier", "origin", "start")
    want = sorted(_read(tmp_path / "csv.csv")[1], key=lambda r: tuple(r[k] for k in key))
    assert sorted(_read(tmp_path / "topic.csv")[1], key=lambda r: tuple(r[k] for k in key)) == want
    _, dead = _read(tmp_path / "topic.dead-letters.csv")
    assert sorted(r["reason"] for r in dead) == [
        "missing key 'origin'",
        "value 'arr_delay' is not a number: 'late'",
    ]


def test_inspect_and_state_as_of_show_the_windows_of_several_aggregates(tmp_path: Path) -> None:
    data = _write_csv(tmp_path / "flights.csv", ROWS)
    store = tmp_path / "store"
    out = cec("run", str(data), *FLAGS, "--results", str(tmp_path / "out.csv"), "--store-dir", str(store))
    assert out.returncode == 0, out.stderr
    (topic,) = [
        line.split("\t")[0]
        for line in cec("inspect", "--list", "--store-dir", str(store)).stdout.splitlines()
    ]
    inspected = cec("inspect", topic, "--store-dir", str(store), "--json")
    assert inspected.returncode == 0, inspected.stderr
    assert json.loads(inspected.stdout)["partitions"][0]["n"] == 6  # each (carrier, origin)'s last window
    state = cec("state", topic, "--as-of", "pos:230", "--input", str(data), "--store-dir", str(store),
                "--format", "csv")  # fmt: skip
    assert state.returncode == 0, state.stderr
    lines = state.stdout.splitlines()
    assert lines[0] == (
        "partition,key,window,count,start,last,n_arr_delay,sum_arr_delay,min_arr_delay,max_arr_delay,"
        "n_dep_delay,sum_dep_delay,min_dep_delay,max_dep_delay"
    )
    assert len(lines) == 1 + 6 and all(line.startswith('0,"[""') for line in lines[1:])


def test_the_single_aggregate_records_the_spec_and_topic_of_before_so_its_old_logs_resume(
    tmp_path: Path,
) -> None:
    from cec.cli.common import digest
    from cec.state_as_of import _recorded
    from operators.sources import CsvSource
    from queuestore.sqlite import SqliteQueueStore

    data = _write_csv(tmp_path / "flights.csv", ROWS)
    store = tmp_path / "store"
    out = cec("run", str(data), "--key", "carrier", "--value", "dep_delay", "--window-count", "5",
              "--results", str(tmp_path / "out.csv"), "--store-dir", str(store), "--crash-after", "100")  # fmt: skip
    assert out.returncode == 0, out.stderr
    # The spec the single aggregate's logs have recorded since before several aggregates existed.
    before = {"type": "aggregate", "key_field": "carrier", "value_field": "dep_delay", "agg": "avg",
              "window_count": 5, "window_ms": None, "time_field": None}  # fmt: skip
    source = CsvSource(str(data))
    try:
        content = source.identity()
    finally:
        source.close()
    (topic,) = [
        line.split("\t")[0]
        for line in cec("inspect", "--list", "--store-dir", str(store)).stdout.splitlines()
    ]
    assert topic == f"run-{digest([before, content])}"
    assert _recorded(SqliteQueueStore(store), topic, 0)["operator"] == before
