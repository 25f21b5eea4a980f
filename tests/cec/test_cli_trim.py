"""`cec run --trim-every N`: the output log is trimmed while the results and dead-letter CSVs are written
incrementally by a registered consumer; the files equal a non-trimming run's, crashes included; at every
trim the log keeps at most max(what recovery needs, N + the writer's commit interval) records, under load
too, and the run ends with the log at what recovery needs (docs/long-runs.md, "Trimming")."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from operators.incremental_outputs import COMMIT_EVERY
from tests.brokers import Broker
from tests.cec.test_cli import _purchases_csv, cec
from tests.cec.test_cli_topic import PARTITIONS, _new_topic, csv_reference, per_key, topic_run
from tests.helpers import child_env, wait_for
from tests.topic_data import as_json, encoded, make_purchases, produce

# ~0.4 log records an input row (a result and a G-open every 5 rows of a key): 150,000 rows give 61,610
# records, 13 trims at 5,000 and 6 commits of the results writer, past every count a test below kills or
# asserts at (the 3rd trim, the writer's 4th commit, row 120,000); 200,000 before, a third more of every
# run for nothing an assertion needs.
ROWS = 150_000
TRIM_EVERY = "5000"
# The lag the operator allows the results writer at a trim (`cec.cli.trimming.trim_settings`).
LAG = int(TRIM_EVERY) + COMMIT_EVERY
# How far below the oldest footprint a trim bound may be: the stream index maps a time to the entry before
# it, one every 64 offsets, and a run of up to 256 G-checks shares one time.
INDEX_SLACK = 64 + 256


@contextlib.contextmanager
def core_busy() -> Iterator[None]:
    """A sibling process that keeps a core busy (load, not a timing) around the run under test only: the
    results writer, a thread of `cec run`, then falls behind the operator, which must wait for it at due
    points. Not around the input's production or the reference run, which it only slowed."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        burner.kill()
        burner.wait()


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


def _stats(path: Path) -> dict[str, Any]:
    stats: dict[str, Any] = json.loads(path.read_text())
    return stats


def _assert_every_trim_within_the_bound(stats: dict[str, Any], every: int, lag: int) -> None:
    """A trim at every due point (one per `every` records appended, whatever the load), each leaving at
    most max(what recovery needed, the writer's allowed lag) records."""
    trims = stats["trims"]
    assert len(trims) >= stats["outputs"] // (2 * every) > 0, (len(trims), stats["outputs"])
    over = [(inputs, kept, needed) for inputs, kept, needed in trims if kept > max(needed, lag)]
    assert not over, over[:5]


def test_trimmed_run_equals_the_plain_run_and_keeps_the_log_bounded(
    tmp_path: Path, plain: tuple[Path, bytes, bytes]
) -> None:
    """Under load (a sibling process burning a core): the files equal the plain run's, every due point
    trims within the stated bound, and the final trim, after the results writer's last acknowledgement,
    leaves what recovery needs. Failed before: trims were taken as the writer's pace allowed (none at all in
    one of four runs), the writer's lag was unbounded, and the log ended at the writer's last commit."""
    store = tmp_path / "store"
    results = tmp_path / "trim.csv"
    with core_busy():
        out = cec(*_args(plain[0], results, "--trim-every", TRIM_EVERY, "--store-dir", str(store)))
    assert out.returncode == 0, out.stderr
    _assert_same(results, plain)
    (stats_path,) = store.glob(".*.stats.json")
    stats = _stats(stats_path)
    retained = [r for _, r in stats["retained_samples"]]
    assert retained and all(0 < r <= LAG + INDEX_SLACK + stats["max_extent"] for r in retained), retained
    start, end = _log_bounds(store)
    (progress,) = store.glob(".*.results-writer.json")
    assert json.loads(progress.read_text())["offsets"][0] == end  # the writer acknowledged everything
    doc = cec("inspect", _topic(store), "--json", "--store-dir", str(store))
    (partition,) = json.loads(doc.stdout)["partitions"]
    assert 0 < end - start <= partition["extent"] + INDEX_SLACK, (start, end, partition["extent"])
    _assert_every_trim_within_the_bound(stats, int(TRIM_EVERY), LAG)
    n_results = len(plain[1].splitlines()) - 1
    assert f"results:      {n_results:,} closed windows" in out.stdout


def test_trim_every_0_turns_trimming_off(tmp_path: Path, plain: tuple[Path, bytes, bytes]) -> None:
    store = tmp_path / "store"
    results = tmp_path / "off.csv"
    out = cec(*_args(plain[0], results, "--trim-every", "0", "--store-dir", str(store)))
    assert out.returncode == 0, out.stderr
    _assert_same(results, plain)
    assert _log_bounds(store)[0] == 0 and not list(store.glob(".*.results-writer.json"))


@pytest.mark.parametrize("site", ["trim.before_prune:3", "results.before_ack:4"])
def test_sigkill_inside_a_trim_or_a_results_commit_then_restart_is_exact(
    tmp_path: Path, plain: tuple[Path, bytes, bytes], site: str
) -> None:
    """`cec run` SIGKILLed inside a trim (the log's head deleted, the index not pruned yet) or inside the
    results writer's commit (its files and progress durable, nothing acknowledged), then run again: the
    files equal the plain run's."""
    store = tmp_path / "store"
    results = tmp_path / "crash.csv"
    args = _args(plain[0], results, "--trim-every", TRIM_EVERY, "--store-dir", str(store))
    killed = cec(*args, faults=site)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    again = cec(*args)
    assert again.returncode == 0, again.stderr
    _assert_same(results, plain)


@pytest.mark.parametrize("k", [1, 120_000])
def test_crash_after_with_trimming_is_exact(tmp_path: Path, plain: tuple[Path, bytes, bytes], k: int) -> None:
    store = tmp_path / "store"
    results = tmp_path / "crash.csv"
    out = cec(*_args(plain[0], results, "--trim-every", TRIM_EVERY, "--store-dir", str(store),
                     "--crash-after", str(k)))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"SIGKILLed after {k:,} input rows" in out.stdout
    _assert_same(results, plain)


def _writer_committed(store: Path) -> bool:
    """The results writer has acknowledged a part of the log (the operator may trim up to it)."""
    for progress in store.glob(".*.results-writer.json"):
        try:
            return bool(json.loads(progress.read_text())["offsets"][0] > 0)
        except (FileNotFoundError, ValueError):
            return False
    return False


def test_a_dead_results_writer_stops_a_crash_after_run_with_one_line(
    tmp_path: Path, plain: tuple[Path, bytes, bytes]
) -> None:
    """The results writer (a thread of `cec run`) dies mid-run on a real fault: the CLI process's files may
    no longer grow (RLIMIT_FSIZE set on it once the writer committed; the worker it started keeps its own
    limit). The run ends with one line and a non-zero exit, its worker too; run again without the fault,
    the files equal the plain run's. Failed before: with --crash-after the worker ran in a process of its
    own that waited for the dead writer's acknowledgements for ever (and the CLI for the worker)."""
    import resource

    store = tmp_path / "store"
    results = tmp_path / "dead-writer.csv"
    # K past the end of the input: the first worker runs the whole input, pacing its trims on the writer.
    args = _args(plain[0], results, "--trim-every", TRIM_EVERY, "--store-dir", str(store),
                 "--crash-after", str(10 * ROWS))  # fmt: skip
    script = Path(sys.executable).parent / "cec"
    proc = subprocess.Popen(
        [str(script), *args],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its group: the CLI and its worker, which shares its pipes
    )
    try:
        wait_for(lambda: proc.poll() is not None or _writer_committed(store), timeout=120)
        assert proc.poll() is None, "the run ended before its writer could be broken"
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (1, resource.RLIM_INFINITY))
        # A condition with a generous bound: before the fix the run never ended.
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # nothing left once the run ended (a hung one: both)
        proc.communicate()
    assert proc.returncode == 2, stdout + stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert stderr.strip().splitlines() == ["cec: error: File too large"], stderr
    assert not results.exists()  # no complete results: the rows so far are under the `.partial` name
    again = cec(*_args(plain[0], results, "--trim-every", TRIM_EVERY, "--store-dir", str(store)))
    assert again.returncode == 0, again.stderr
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

    try:
        wait_for(lambda: proc.poll() is not None or _writer_committed(store), timeout=120)
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


# -- Apache Kafka: delete_records (skipped on Tansu, which cannot delete records) ---------------------------

KAFKA_TRIM_EVERY = 2_000


def _kafka_input(broker: Broker, root: Path, count: int) -> tuple[str, dict[str, Any]]:
    """A topic of `count` purchases over 3 partitions and its results per key (the same rows in a CSV)."""
    purchases = make_purchases(count, keys=40, partitions=PARTITIONS, seed=19)
    topic = _new_topic(broker, "purchases-trim-bound")
    produce(broker.bootstrap, topic, encoded(purchases, as_json))
    root.mkdir(parents=True, exist_ok=True)
    return topic, csv_reference(root, purchases)


@pytest.fixture(scope="module")
def kafka_input(kafka_broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """150,000 purchases: ~21,000 records a partition, past the writer's allowed lag (10,500 offsets with
    `--trim-every 500`) well before the end, so every partition is trimmed by then whatever the pace."""
    return _kafka_input(kafka_broker, tmp_path_factory.mktemp("reference"), 150_000)


def _kept(broker: Broker, output: str, store: Path) -> list[tuple[int, int]]:
    """(log start, records kept) of every partition of `output`, read from the broker."""
    from queuestore.kafka import KafkaQueueStore

    kafka = KafkaQueueStore(broker.bootstrap, store)
    try:
        out = []
        for p in range(PARTITIONS):
            with kafka.reader(output, p) as reader:
                start = reader.start_offset()
                out.append((start, sum(1 for _ in reader.scan_forward(start))))
        return out
    finally:
        kafka.close()


def _kafka_extents(broker: Broker, output: str, store: Path) -> list[int]:
    out = cec("inspect", output, "--json", "--bootstrap-servers", broker.bootstrap, "--store-dir", str(store))
    assert out.returncode == 0, out.stderr
    return [int(p["extent"]) for p in json.loads(out.stdout)["partitions"]]


@pytest.mark.kafka_transactions
def test_on_kafka_every_trim_keeps_the_log_within_the_stated_bound_under_load(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    """`cec run --input-topic` over 3 partitions on Apache Kafka, a core busy beside it: every partition
    trims at every due point within the stated bound (`delete_records`; each partition's log grows to
    over twice the bound), the results equal the CSV's, and the final trim leaves each partition at what
    recovery needs."""
    topic, want = _kafka_input(kafka_broker, tmp_path / "reference", 240_000)
    store, output = tmp_path / "store", f"out-{uuid.uuid4().hex[:10]}"
    with core_busy():
        out = topic_run(kafka_broker, topic, tmp_path / "out.csv", "--output-topic", output, "--store-dir",
                        str(store), "--trim-every", str(KAFKA_TRIM_EVERY), "--U", "200")  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert per_key(tmp_path / "out.csv") == want
    extents = _kafka_extents(kafka_broker, output, store)
    for (start, kept), extent in zip(_kept(kafka_broker, output, store), extents, strict=True):
        assert start > 0 and kept <= extent + INDEX_SLACK, (start, kept, extent)
    for p in range(PARTITIONS):
        stats = _stats(store / f".{output}.{p}.stats.json")
        assert stats["outputs"] > 2 * (KAFKA_TRIM_EVERY + COMMIT_EVERY), stats["outputs"]
        _assert_every_trim_within_the_bound(stats, KAFKA_TRIM_EVERY, KAFKA_TRIM_EVERY + COMMIT_EVERY)


@pytest.mark.kafka_transactions
def test_on_kafka_a_results_topic_run_trims_by_default(
    kafka_broker: Broker, tmp_path: Path, kafka_input: tuple[str, dict[str, Any]]
) -> None:
    """Results stream (`--results-topic`): trimming is on without `--trim-every` (every 10,000 records)."""
    topic, want = kafka_input
    store, output = tmp_path / "store", f"out-{uuid.uuid4().hex[:10]}"
    out = topic_run(kafka_broker, topic, tmp_path / "out.csv", "--output-topic", output, "--store-dir",
                    str(store), "--results-topic", f"res-{uuid.uuid4().hex[:10]}")  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert per_key(tmp_path / "out.csv") == want
    assert all(start > 0 for start, _ in _kept(kafka_broker, output, store))


@pytest.mark.kafka_transactions
@pytest.mark.parametrize(
    "kills",
    [
        ["trim.before_prune:4"],  # inside a trim: the head deleted, the index not pruned
        ["results.before_ack:4"],  # inside the results writer's commit: durable, not acknowledged
        ["runtime.after_input:120000", "runtime.replaying:1"],  # then again during the recovery
    ],
)
def test_on_kafka_sigkill_with_trimming_on_then_restart_is_exact(
    kafka_broker: Broker, tmp_path: Path, kafka_input: tuple[str, dict[str, Any]], kills: list[str]
) -> None:
    topic, want = kafka_input
    store, output = tmp_path / "store", f"out-{uuid.uuid4().hex[:10]}"
    args = ("--output-topic", output, "--store-dir", str(store), "--trim-every", "500", "--U", "200")
    for i, site in enumerate(kills):
        killed = topic_run(kafka_broker, topic, tmp_path / "out.csv", *args, faults=site)
        assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
        if i == 0:
            assert any(start > 0 for start, _ in _kept(kafka_broker, output, store))  # killed once trimmed
    again = topic_run(kafka_broker, topic, tmp_path / "out.csv", *args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert per_key(tmp_path / "out.csv") == want
    assert all(start > 0 for start, _ in _kept(kafka_broker, output, store))
