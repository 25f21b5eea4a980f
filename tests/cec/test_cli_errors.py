"""Every user mistake of the CLI: one line on stderr, a non-zero exit, no traceback, found before any work
(no topic, no log, no results file written)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import cec, child_env


def assert_one_line_error(out: subprocess.CompletedProcess[str], message: str) -> str:
    assert out.returncode != 0, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert message in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "in.csv"
    rows = ["k,v,ts,name"] + [f"k{i % 3},{i},{1000 * i},n{i}" for i in range(30)]
    path.write_text("\n".join(rows) + "\n")
    return path


def run_args(data: Path, results: Path, *more: str) -> list[str]:
    return [
        "run",
        str(data),
        "--key",
        "k",
        "--value",
        "v",
        "--window-count",
        "2",
        "--results",
        str(results),
        *more,
    ]


def nothing_written(store: Path) -> bool:
    return not store.exists() or not any(p.is_dir() for p in store.iterdir())


def test_an_abbreviated_flag_is_refused_not_taken_for_a_longer_one(data: Path, tmp_path: Path) -> None:
    """`--input in.csv` must not silently mean `--input-topic in.csv` (argparse's abbreviations)."""
    store = tmp_path / "store"
    args = run_args(data, tmp_path / "out.csv", "--store-dir", str(store))
    args.remove(str(data))
    out = cec(*args, "--input", str(data))
    assert_one_line_error(out, "unrecognized arguments: --input")
    assert nothing_written(store)
    assert_one_line_error(cec(*run_args(data, tmp_path / "out.csv", "--window-c", "3")), "--window-c")


# -- output and store paths --------------------------------------------------------------------------------
def test_results_in_a_missing_directory_is_refused_before_any_work(data: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    out = cec(*run_args(data, tmp_path / "nodir" / "out.csv", "--store-dir", str(store)))
    assert_one_line_error(out, "does not exist")
    assert out.returncode == 2
    assert nothing_written(store)  # no log was started: the mistake came out before the run


def test_results_path_that_is_a_directory_is_refused(data: Path, tmp_path: Path) -> None:
    (tmp_path / "out.csv").mkdir()
    assert_one_line_error(cec(*run_args(data, tmp_path / "out.csv")), "is a directory")


def test_store_dir_that_is_a_file_is_refused(data: Path, tmp_path: Path) -> None:
    file = tmp_path / "plain-file"
    file.write_text("x")
    out = cec(*run_args(data, tmp_path / "out.csv", "--store-dir", str(file)))
    assert_one_line_error(out, "is a file, not a directory")
    assert not (tmp_path / "out.csv").exists()


def test_store_dir_that_cannot_be_created_is_refused(data: Path, tmp_path: Path) -> None:
    file = tmp_path / "plain-file"
    file.write_text("x")
    out = cec(*run_args(data, tmp_path / "out.csv", "--store-dir", str(file / "sub")))
    assert_one_line_error(out, "cannot create --store-dir")


# -- a damaged store ---------------------------------------------------------------------------------------
def _first_run(data: Path, tmp_path: Path) -> tuple[Path, Path]:
    store = tmp_path / "store"
    ok = cec(*run_args(data, tmp_path / "first.csv", "--store-dir", str(store)))
    assert ok.returncode == 0, ok.stderr
    (topic_dir,) = [p for p in store.iterdir() if p.is_dir() and p.name.startswith("run-")]
    return store, topic_dir


@pytest.mark.parametrize("damaged", ["0.sqlite", "topic.json"])
def test_a_damaged_log_file_is_one_line_naming_it(data: Path, tmp_path: Path, damaged: str) -> None:
    store, topic_dir = _first_run(data, tmp_path)
    (topic_dir / damaged).write_bytes(b"this is not what cec wrote\n")
    line = assert_one_line_error(
        cec(*run_args(data, tmp_path / "again.csv", "--store-dir", str(store))), "is damaged"
    )
    assert damaged in line
    out = cec("inspect", topic_dir.name, "--store-dir", str(store))
    assert_one_line_error(out, "is damaged")


def test_a_damaged_run_memory_is_one_line(data: Path, tmp_path: Path) -> None:
    store, _ = _first_run(data, tmp_path)
    (store / "cec-run-topics.json").write_text("{")
    assert_one_line_error(cec(*run_args(data, tmp_path / "again.csv", "--store-dir", str(store))), "damaged")


def test_a_damaged_index_is_rebuilt_from_the_log_with_the_same_results(data: Path, tmp_path: Path) -> None:
    store, topic_dir = _first_run(data, tmp_path)
    index_dirs = [p for p in (store / "index").iterdir() if p.name.startswith(topic_dir.name)]
    assert index_dirs
    for index in index_dirs:
        for f in index.iterdir():
            f.write_bytes(b"garbage")
    again = cec(*run_args(data, tmp_path / "again.csv", "--store-dir", str(store)))
    assert again.returncode == 0, again.stderr
    assert "rebuilding it from the log" in again.stderr and "Traceback" not in again.stderr
    assert (tmp_path / "again.csv").read_bytes() == (tmp_path / "first.csv").read_bytes()


# -- columns and values ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--key", "nope", "--value", "v", "--window-count", "2"], "has no column 'nope'"),
        (["--key", "k", "--value", "name", "--window-count", "2"], "column 'name' of"),
        (["--key", "k", "--value", "v", "--time", "name", "--window-time", "1s"], "holds no times"),
        (["--key", "k", "--value", "v", "--window-time", "1s"], "--window-time needs --time"),
        (["--key", "k", "--value", "v", "--time", "ts", "--window-time", "soon"], "is not a duration"),
        (["--key", "k", "--value", "v", "--window-count", "0"], "must be >= 1"),
        (["--key", "k", "--window-count", "2"], "required: --value"),
        (["--key", "k", "--value", "v", "--window-count", "2", "--agg", "median"], "invalid choice"),
        (["--key", "k", "--value", "v", "--window-count", "2", "--log-level", "loud"], "invalid choice"),
    ],
)
def test_argument_mistakes_are_one_line(data: Path, tmp_path: Path, args: list[str], message: str) -> None:
    store = tmp_path / "store"
    out = cec("run", str(data), *args, "--results", str(tmp_path / "out.csv"), "--store-dir", str(store))
    assert_one_line_error(out, message)
    assert out.returncode == 2
    assert nothing_written(store) and not (tmp_path / "out.csv").exists()


def test_a_run_where_every_row_is_dead_lettered_says_so_and_fails(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    data.write_text("k,v\n" + "".join(f",{i}\n" for i in range(40)))  # the key column is empty
    out = cec(
        "run",
        str(data),
        "--key",
        "k",
        "--value",
        "v",
        "--window-count",
        "2",
        "--results",
        str(tmp_path / "o.csv"),
    )
    assert_one_line_error(
        out, "every one of the 40 input rows was dead-lettered (the first: missing key 'k')"
    )
    assert out.returncode == 2
    assert "dead letters: 40 rows" in out.stdout  # the summary still says where they went


# -- Kafka input formats: refused before the broker is contacted -------------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "avro"], "--format avro needs --schema"),
        (["--format", "avro", "--schema", "/nonexistent.avsc"], "cannot read Avro schema"),
        (["--format", "csv"], "--format csv needs --columns"),
        (["--format", "registry"], "--format registry needs --schema-registry"),
        (["--format", "xml"], "invalid choice"),
    ],
)
def test_topic_format_mistakes_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    out = cec(
        "run", "--input-topic", "t", "--bootstrap-servers", "127.0.0.1:9",  # nothing listens: never contacted
        "--key", "k", "--value", "v", "--window-count", "2", "--results", str(tmp_path / "o.csv"), *args,
        timeout=30,
    )  # fmt: skip
    assert_one_line_error(out, message)


def test_topic_run_checks_the_results_directory_before_the_broker(tmp_path: Path) -> None:
    out = cec(
        "run", "--input-topic", "t", "--bootstrap-servers", "127.0.0.1:9", "--key", "k", "--value", "v",
        "--window-count", "2", "--results", str(tmp_path / "nodir" / "o.csv"), timeout=30,
    )  # fmt: skip
    assert_one_line_error(out, "does not exist")


# -- cec demo without PySpark ------------------------------------------------------------------------------
def test_demo_without_pyspark_says_how_to_install_it_or_run_locally(tmp_path: Path) -> None:
    shim = tmp_path / "shim" / "pyspark"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('No module named pyspark (fault injection)')\n")
    env = child_env()
    env["PYTHONPATH"] = str(shim.parent) + ":" + env["PYTHONPATH"]
    store = tmp_path / "store"
    out = cec("demo", "--input", "1000", "--store-dir", str(store), env=env)
    line = assert_one_line_error(out, "pip install 'cec-stream[spark]'")
    assert "--engine local" in line and out.returncode == 2
    assert nothing_written(store)
    # The same environment runs the demo locally: only Spark was missing.
    local = cec("demo", "--engine", "local", "--input", "2000", "--keys", "50", "--quiet", env=env)
    assert local.returncode == 0, local.stderr
    assert "verdict:               PASS" in local.stdout
