"""Typed specs (`operators.specs`, `queuestore.factory.StoreSpec`) and `JobSpec`: validated on construction
with one line, read from and written back to their dict forms exactly, so that job files and logs written
by the previous release (dict specs, `extra`) still load and resume."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cec.exceptions import CecError, ConfigError
from operators.job import JobSpec, aggregate_operator, build_operator, instance_spec, run_job
from operators.sources import CsvSource
from operators.specs import AggregateSpec, FilterSpec, OperatorSpec, SourceSpec, StoreSpec
from queuestore.sqlite import SqliteQueueStore
from recovery.exceptions import InputMismatchError
from recovery.identity import ATTACHMENT
from tests.helpers import results
from tests.topic_data import make_purchases, write_csv

# A job file as the previous release wrote it (`JobSpec.to_json` of dict specs, with `extra`): an
# aggregate spec without `agg`, a source without partitions, the results topic in `extra`.
PREVIOUS_JOB = {
    "operator": {"type": "aggregate", "key_field": "item", "value_field": "price", "window_count": 7},
    "source": {"type": "csv", "path": "PATH"},
    "store": {"type": "sqlite", "root": "ROOT"},
    "output_topic": "agg",
    "output_partition": 0,
    "output_partitions": 1,
    "checkpointing": {"q_target": 50, "u_target": None, "ci_ms": 5.0, "cp_ms": 100.0, "recovery_target": None,
                      "policy": "targets", "mtbf": 3600.0},
    "batch_size": 64,
    "progress": False,
    "stats_path": None,
    "footprints": True,
    "trim_every": None,
    "metrics_port": None,
    "extra": {},
}  # fmt: skip


@pytest.mark.parametrize(
    "form",
    [
        aggregate_operator("k", "v", "sum", window_count=3),
        aggregate_operator("k", "v", "avg", window_time="5s", time="t", allowed_lateness="1s"),
        {"type": "aggregate", "key_field": "k", "value_field": "v", "window_count": 2},  # no agg
        {"window_count": 2, "value_field": "v", "type": "aggregate", "key_field": "k", "time_field": None},
        {"type": "filter", "field": "item_price", "op": ">", "value": 0, "schema": "purchase"},
    ],
)
def test_an_operator_dict_reads_back_exactly(form: dict[str, Any]) -> None:
    spec = OperatorSpec.from_dict(form)
    assert spec.to_dict() == form and list(spec.to_dict()) == list(form)  # the same fields, in order
    assert json.dumps(spec.to_dict()) == json.dumps(form)  # what a log records and `cec run` digests


def test_typed_specs_write_the_form_the_cli_always_wrote() -> None:
    """`cec run` names its output topic after its operator's dict form: a typed spec writes that form."""
    assert AggregateSpec("k", "v", "max", window_count=5).to_dict() == aggregate_operator(
        "k", "v", "max", window_count=5
    )
    timed = AggregateSpec("k", "v", window_ms=5000, time_field="t", allowed_lateness_ms=0)
    assert timed.to_dict() == aggregate_operator(
        "k", "v", "avg", window_time="5s", time="t", allowed_lateness="0"
    )
    assert SourceSpec(type="csv", path="/x.csv").to_dict() == {"type": "csv", "path": "/x.csv"}
    assert FilterSpec(field="p", op=">", value=0, schema="purchase").build().describe() == "filter p > 0"


def test_a_spec_reads_like_its_dict_form() -> None:
    source = SourceSpec(type="generator", count=10, keys=3)
    assert source["count"] == 10 and source.get("seed") is None and "keys" in source and "seed" not in source
    assert source.keys == 3  # a field named like a mapping's method stays a field
    assert source == {"type": "generator", "count": 10, "keys": 3} and sorted(source) == [
        "count",
        "keys",
        "type",
    ]
    store = StoreSpec.from_dict({"type": "sqlite", "root": "/r"})
    assert store["root"] == "/r" and store.root == "/r" and len(store) == 2


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: OperatorSpec.from_dict({"type": "join"}), "unknown operator type 'join'"),
        (lambda: OperatorSpec.from_dict({**aggregate_operator("k", "v", "avg", window_count=2), "windw": 1}),
         "unknown operator field(s): windw"),
        (lambda: AggregateSpec("k", "v", "median", window_count=2), "unknown aggregate 'median'"),
        (lambda: AggregateSpec("k", "v", window_count=0), "window_count must be an integer >= 1, got 0"),
        (lambda: AggregateSpec("k", "v", window_count="10"), "window_count must be an integer >= 1"),  # type: ignore[arg-type]
        (lambda: AggregateSpec("k", "v"), "give exactly one of a count window or a time window"),
        (lambda: AggregateSpec("", "v", window_count=1), "key_field must be a non-empty string"),
        (lambda: AggregateSpec("k", "v", window_ms=10), "a time window needs a time field"),
        (lambda: FilterSpec(field="p", op="~", value=0, schema="purchase"), "unknown comparison '~'"),
        (lambda: FilterSpec(field="p", op=">", value=0, schema="nope"), "unknown schema 'nope'"),
        (lambda: SourceSpec.from_dict({"type": "csv"}), "a csv source needs path"),
        (lambda: SourceSpec.from_dict({"type": "ftp"}), "unknown source type 'ftp'"),
        (lambda: SourceSpec.from_dict({"type": "csv", "path": "x", "pth": 1}), "unknown source field(s): pth"),
        (lambda: SourceSpec(type="generator", count=5, keys=0), "keys must be an integer >= 1"),
        (lambda: SourceSpec(type="csv", path="x", input_partitions=[-1]), "input_partitions must be"),
        (lambda: StoreSpec.from_dict({"type": "kafka", "bootstrap_servers": "h:1"}), "a kafka store needs state_dir"),
        (lambda: StoreSpec.from_dict({"type": "s3"}), "unknown store type 's3'"),
        (lambda: JobSpec.from_dict({**PREVIOUS_JOB, "extra": {"colour": 1}}), "unknown job extra field(s)"),
        (lambda: JobSpec.from_dict({**PREVIOUS_JOB, "outputs": 2}), "unknown job field(s): outputs"),
        (lambda: JobSpec.from_json("{"), "a job spec is not valid JSON"),
    ],
)  # fmt: skip
def test_mistakes_are_one_line_config_errors(make: Any, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make()
    assert isinstance(caught.value, CecError)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_job_spec_takes_dict_forms_and_round_trips_through_json(tmp_path: Path) -> None:
    job = JobSpec(
        operator=aggregate_operator("k", "v", "sum", window_count=3),
        source={"type": "generator", "count": 100, "keys": 5, "partitions": 2},
        store={"type": "sqlite", "root": str(tmp_path)},
        output_topic="t",
        output_partitions=2,
        results_topic="results",
    )
    assert isinstance(job.operator, AggregateSpec) and isinstance(job.source, SourceSpec)
    assert isinstance(job.store, StoreSpec)
    again = JobSpec.from_json(job.to_json())
    assert again == job and again.to_json() == job.to_json() and again.results_topic == "results"
    instance = instance_spec(job, 1)
    assert instance.source["input_partitions"] == [1] and instance.source.partitions == 2
    assert build_operator(job.operator).describe() == build_operator(job.operator.to_dict()).describe()


def test_a_job_file_of_the_previous_release_loads() -> None:
    old = {**PREVIOUS_JOB, "extra": {"results_topic": "published"}}
    job = JobSpec.from_json(json.dumps(old))
    assert job.results_topic == "published" and job.checkpointing.q_target == 50
    assert job.operator.to_dict() == PREVIOUS_JOB["operator"]  # what its log recorded
    assert job.source.to_dict() == PREVIOUS_JOB["source"] and job.store.to_dict() == PREVIOUS_JOB["store"]
    assert "extra" not in json.loads(job.to_json())


def test_a_log_written_by_the_previous_release_resumes(tmp_path: Path) -> None:
    """The previous release recorded `JobSpec.operator` as given (a dict) with the log: a job loaded from
    its job file resumes that log (the recorded operator equals the spec's), with the failure-free results.
    A spec that differs in one field is refused, so the check is really made."""
    rows = make_purchases(3_000, keys=40, partitions=1, seed=3)
    data = tmp_path / "in.csv"
    write_csv(data, rows)
    old = json.loads(
        json.dumps(PREVIOUS_JOB).replace("PATH", str(data)).replace("ROOT", str(tmp_path / "st"))
    )
    reference = json.loads(json.dumps(old).replace(str(tmp_path / "st"), str(tmp_path / "ref")))
    run_job(JobSpec.from_json(json.dumps(reference)))
    want = results(SqliteQueueStore(tmp_path / "ref"), "agg")

    run_job(JobSpec.from_json(json.dumps(old)), max_inputs=1_200)  # stopped midway: the log to resume
    store = SqliteQueueStore(tmp_path / "st")
    source = CsvSource(data)
    # The identity exactly as the previous release wrote it: its operator the dict of the job file.
    recorded = {"format": 1, "input": json.loads(json.dumps(source.identity())), "operator": old["operator"]}
    source.close()
    store.write_attachment("agg", 0, ATTACHMENT, json.dumps(recorded, sort_keys=True).encode())
    store.close()

    changed = json.loads(json.dumps(old))
    changed["operator"]["window_count"] = 8
    with pytest.raises(InputMismatchError):
        run_job(JobSpec.from_json(json.dumps(changed)))
    stats = run_job(JobSpec.from_json(json.dumps(old)))
    assert stats.recovery is not None and stats.completed
    assert results(SqliteQueueStore(tmp_path / "st"), "agg") == want


def test_a_field_changed_by_replace_is_written() -> None:
    """A spec read from a dict and changed with `dataclasses.replace` writes the change, given or not."""
    spec = OperatorSpec.from_dict(
        {"type": "aggregate", "key_field": "k", "value_field": "v", "window_count": 2}
    )
    changed = replace(spec, agg="sum", window_count=4)
    assert changed.to_dict() == {
        "type": "aggregate", "key_field": "k", "value_field": "v", "window_count": 4, "agg": "sum",
    }  # fmt: skip
    assert OperatorSpec.from_dict(changed.to_dict()).build().describe() == changed.build().describe()
