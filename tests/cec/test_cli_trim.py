"""`cec run --trim-every N`: the output log is trimmed while the results and dead-letter CSVs are written
incrementally by a registered consumer; the files equal a non-trimming run's, crashes included."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.brokers import Broker
from tests.cec.test_cli import _purchases_csv, cec
from tests.cec.test_cli_topic import PARTITIONS, _new_topic, per_key, topic_run
from tests.helpers import child_env, wait_for
from tests.topic_data import as_json, encoded, make_purchases, produce

ROWS = 200_000
TRIM_EVERY = "5000"


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, bytes]:
    """The input and the results + dead letters of a run that never trims."""
    root = tmp_path_factory.mktemp("plain")
    data = root / "in.csv"
    _purchases_csv(data, ROWS)
    out = cec(*_args(data, root / "plain.csv"))
    assert out.returncode == 0, out.stderr
    return data, (root / "plain.csv").read_bytes(), (root / "plain.dead-letters.csv").read_bytes()


def _args(data: Path, results: Path, *extra: str) -> list[str]:
    return ["run", str(data), "--key", "item_id", "--value", "item_price", "--window-count", "5",
            "--U", "2000", "--results", str(results), *extra]  # fmt: skip


def _topic(store: Path) -> str:
    (topic,) = json.loads((store / "cec-run-topics.json").read_text()).values()
    return str(topic)


def _log_bounds(store: Path) -> tuple[int, int]:
    out = cec("inspect", _topic(store), "--json", "--store-dir", str(store))
    assert out.returncode == 0, out.stderr
    (partition,) = json.loads(out.stdout)["partitions"]
    return partition["start_offset"], partition["end_offset"]


def _assert_same(results: Path, plain: tuple[Path, bytes, bytes]) -> None:
    _, want, want_dead = plain
    assert results.read_bytes() == want
    assert results.with_name(results.stem + ".dead-letters.csv").read_bytes() == want_dead


def test_trimmed_run_equals_the_plain_run_and_keeps_the_log_bounded(
    tmp_path: Path, plain: tuple[Path, bytes, bytes]
) -> None:
    store = tmp_path / "store"
    results = tmp_path / "trim.csv"
    out = cec(*_args(plain[0], results, "--trim-every", TRIM_EVERY, "--store-dir", str(store)))
    assert out.returncode == 0, out.stderr
    _assert_same(results, plain)
    start, end = _log_bounds(store)
    # Trimming waited on the results writer: the log starts at or below its last commit, at one of its
    # commits (every 10,000 records). How often the operator trims is the runtime's (its bound is taken
    # every N durable records and applied once they are durable): not asserted here.
    (progress,) = store.glob(".*.results-writer.json")
    assert start % 10_000 == 0 and start <= json.loads(progress.read_text())["offsets"][0] == end, start
    (stats,) = store.glob(".*.stats.json")
    retained = [r for _, r in json.loads(stats.read_text())["retained_samples"]]
    assert all(0 < r < end for r in retained), retained
    n_results = len(plain[1].splitlines()) - 1
    assert f"results:      {n_results:,} closed windows" in out.stdout


@pytest.mark.parametrize("k", [1, 120_000])
def test_crash_after_with_trimming_is_exact(tmp_path: Path, plain: tuple[Path, bytes, bytes], k: int) -> None:
    store = tmp_path / "store"
    results = tmp_path / "crash.csv"
    out = cec(*_args(plain[0], results, "--trim-every", TRIM_EVERY, "--store-dir", str(store),
                     "--crash-after", str(k)))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"SIGKILLed after {k:,} input rows" in out.stdout
    _assert_same(results, plain)


def test_sigkill_of_a_trimming_run_then_restart_is_exact(
    tmp_path: Path, plain: tuple[Path, bytes, bytes]
) -> None:
    """The whole `cec run` (operator and results writer) SIGKILLed from outside once the writer committed;
    run again with the same store dir, it resumes the log and the results files without a row twice."""
    store = tmp_path / "store"
    results = tmp_path / "killed.csv"
    args = _args(plain[0], results, "--trim-every", TRIM_EVERY, "--store-dir", str(store))
    script = Path(sys.executable).parent / "cec"
    proc = subprocess.Popen(
        [str(script), *args], env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )

    def committed() -> bool:
        """The results writer has acknowledged a part of the log (the operator may trim up to it)."""
        for progress in store.glob(".*.results-writer.json"):
            try:
                return json.loads(progress.read_text())["offsets"][0] > 0
            except (FileNotFoundError, ValueError):
                return False
        return False

    try:
        wait_for(lambda: proc.poll() is not None or committed(), timeout=120)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -9, "the run ended before it could be killed"
    # Killed before the end: the rows so far are under the `.partial` name only.
    assert not results.exists()
    assert len(Path(f"{results}.partial").read_bytes()) < len(plain[1])
    again = cec(*args)
    assert again.returncode == 0, again.stderr
    _assert_same(results, plain)
    assert not Path(f"{results}.partial").exists()


def test_rows_written_after_the_last_commit_are_not_kept_twice(
    tmp_path: Path, plain: tuple[Path, bytes, bytes]
) -> None:
    """Rows past the length recorded with the last acknowledgement (a writer killed between its write and
    its commit) are cut by the next run, which writes from the log only what it had not acknowledged."""
    store = tmp_path / "store"
    results = tmp_path / "out.csv"
    dead = tmp_path / "out.dead-letters.csv"
    args = _args(plain[0], results, "--trim-every", TRIM_EVERY, "--store-dir", str(store))
    assert cec(*args).returncode == 0
    tail = plain[1].splitlines(keepends=True)[-50:]
    with results.open("ab") as f:
        f.write(b"".join(tail))  # as if written again but never committed
    with dead.open("ab") as f:
        f.write(b"0,1,half a ro")  # a torn row
    again = cec(*args)
    assert again.returncode == 0, again.stderr
    _assert_same(results, plain)


def test_results_file_removed_after_a_trimmed_run_is_one_clear_error(
    tmp_path: Path, plain: tuple[Path, bytes, bytes]
) -> None:
    store = tmp_path / "store"
    results = tmp_path / "out.csv"
    args = _args(plain[0], results, "--trim-every", TRIM_EVERY, "--store-dir", str(store))
    assert cec(*args).returncode == 0
    results.unlink()
    again = cec(*args)
    assert again.returncode != 0
    assert "Traceback" not in again.stderr
    assert again.stderr.strip().count("\n") == 0 and "use a new --store-dir" in again.stderr


def test_topic_run_with_trimming_on_kafka_keeps_results_exact(tmp_path: Path, kafka_broker: Broker) -> None:
    """Kafka (Tansu) cannot delete records, so trimming is a logged no-op there; the results, written by
    the registered consumer of every output partition while the run goes on (crash included), still
    equal the non-trimming run's per key, in order."""
    topic = _new_topic(kafka_broker, "purchases-trim")
    produce(
        kafka_broker.bootstrap, topic, encoded(make_purchases(3000, keys=40, partitions=PARTITIONS), as_json)
    )
    plain_out = topic_run(kafka_broker, topic, tmp_path / "plain.csv")
    assert plain_out.returncode == 0, plain_out.stderr
    want = per_key(tmp_path / "plain.csv")
    assert sum(len(rows) for rows in want.values()) > 100
    store = tmp_path / "store"
    out = topic_run(kafka_broker, topic, tmp_path / "trim.csv", "--trim-every", "200", "--crash-after", "400",
                    "--store-dir", str(store))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert per_key(tmp_path / "trim.csv") == want
    plain_dead = sorted((tmp_path / "plain.dead-letters.csv").read_text().splitlines())
    assert sorted((tmp_path / "trim.dead-letters.csv").read_text().splitlines()) == plain_dead
    (progress,) = store.glob(".*.results-writer.json")
    assert json.loads(progress.read_text())["n_results"] == sum(len(rows) for rows in want.values())
