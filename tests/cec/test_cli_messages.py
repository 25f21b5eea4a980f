"""Issue 25's messages, as a user meets them (the installed `cec` script, real processes): every one is a
single line on stderr with a documented exit code, never a silent exit or a traceback."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from tests.brokers import Broker
from tests.helpers import cec, child_env, process_group_gone, wait_for
from tests.topic_data import create_topic, produce

ROWS = 200_000


def _data(path: Path) -> Path:
    with path.open("w", encoding="utf-8") as f:
        f.write("k,v\n")
        f.writelines(f"k{i % 5003},{i % 100}\n" for i in range(ROWS))
    return path


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(c) for c in text.split()]


def test_ctrl_c_at_once_says_how_to_resume_and_kills_its_worker(tmp_path: Path) -> None:
    """Ctrl-C, then Ctrl-C again while the run waits for its operator process (`--crash-after` runs the
    operator in one): exit 130, one line saying the log is intact and how to resume, no operator process
    left behind; the same command again completes the run exactly."""
    data = _data(tmp_path / "in.csv")
    store, results = tmp_path / "store", tmp_path / "out.csv"
    command = [
        str(Path(sys.executable).parent / "cec"), "run", str(data), "--key", "k", "--value", "v",
        "--window-count", "10", "--results", str(results), "--store-dir", str(store),
        "--crash-after", str(ROWS - 10), "--quiet",
    ]  # fmt: skip
    proc = subprocess.Popen(
        command, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        wait_for(lambda: bool(_children(proc.pid)) or proc.poll() is not None, timeout=60, interval=0.01)
        workers = _children(proc.pid)
        assert workers, "the operator process did not start"
        # The first SIGINT asks the run to stop between workers; a later one interrupts it at once. Sent
        # until the command ends: the signals the interpreter has not handled yet count as one.
        while proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    # The first SIGINT stops the run (its worker SIGKILLed at once: a crash, the log intact); one that the
    # interpreter handles while that stop is being reported interrupts it instead. Which of the two lines
    # comes depends on how many of the signals arrive before the end; each is one line saying how to resume.
    assert err.decode() in (
        "cec: stopped by SIGINT before the end of the input: no results file was written; run the same "
        "command again to resume from its log\n",
        f"cec: interrupted by Ctrl-C: the output log in {store} is intact (as after a crash) and no results "
        "file was written; run the same command again to resume from its log\n",
    ), err
    assert not results.exists()
    wait_for(lambda: all(not Path(f"/proc/{w}").exists() for w in workers), timeout=30)
    wait_for(process_group_gone(proc.pid), timeout=30)

    again = cec(*command[1:])
    assert again.returncode == 0, again.stdout + again.stderr
    reference = cec(
        "run", str(data), "--key", "k", "--value", "v", "--window-count", "10",
        "--results", str(tmp_path / "reference.csv"), "--quiet",
    )  # fmt: skip
    assert reference.returncode == 0, reference.stderr
    assert results.read_bytes() == (tmp_path / "reference.csv").read_bytes()


def test_ctrl_c_of_a_run_without_a_store_dir_says_how_to_make_it_resumable() -> None:
    from argparse import Namespace

    from cec.cli.common import interrupted_line

    line = interrupted_line(Namespace(command="run", store_dir=None, bootstrap_servers=None))
    assert line == (
        "interrupted by Ctrl-C: no results file was written and the log was in a temporary directory; give "
        "--store-dir DIR to make a run resumable"
    )
    assert interrupted_line(Namespace(command="inspect", store_dir="s")) == "interrupted by Ctrl-C"


def test_inspect_of_an_input_topic_says_it_is_not_a_cec_log(kafka_broker: Broker) -> None:
    topic = f"plain-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap, topic, 2)
    produce(kafka_broker.bootstrap, topic, [(p, None, b'{"item": "a", "price": 1}') for p in (0, 1, 1)])
    out = cec("inspect", topic, "--bootstrap-servers", kafka_broker.bootstrap)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr == (
        f"cec: error: {topic} is not a cec log: its records were not written by cec (an input topic?); "
        "cec inspect reads the output log of a run (cec inspect --list names them)\n"
    )


def test_inspect_list_of_a_kafka_runs_store_dir_without_a_broker_says_what_is_missing(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    data = tmp_path / "in.csv"
    data.write_text(f"item,price\n{uuid.uuid4().hex},1\n" + "".join(f"i{i % 7},{i}\n" for i in range(100)))
    store = tmp_path / "state"
    out = cec(
        "run", str(data), "--key", "item", "--value", "price", "--window-count", "5",
        "--results", str(tmp_path / "out.csv"), "--store-dir", str(store),
        "--bootstrap-servers", kafka_broker.bootstrap, "--quiet",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    topic = json.loads((store / "cec-run-topics.json").read_text()).popitem()[1]
    env = child_env()
    env.pop("CEC_BOOTSTRAP_SERVERS", None)
    listed = cec("inspect", "--list", "--store-dir", str(store), env=env)
    assert listed.returncode == 2 and listed.stdout == ""
    assert listed.stderr == (
        f"cec: error: store dir {store} holds no embedded log: it kept the stream indexes of a run on Kafka "
        f"({topic}); give --bootstrap-servers (or set CEC_BOOTSTRAP_SERVERS) to read it\n"
    )
    with_broker = cec(
        "inspect", "--list", "--store-dir", str(store), "--bootstrap-servers", kafka_broker.bootstrap
    )
    assert with_broker.returncode == 0 and f"{topic}\t1 partition(s)" in with_broker.stdout.splitlines()

    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = cec("inspect", "--list", "--store-dir", str(empty), env=env)
    assert nothing.returncode == 2
    assert nothing.stderr == (
        f"cec: error: store dir {empty} holds no cec log: give the --store-dir of a run, or --bootstrap-servers "
        "(or CEC_BOOTSTRAP_SERVERS) for a store on Kafka\n"
    )


def test_results_topic_count_window_start_end_are_input_offsets(kafka_broker: Broker, tmp_path: Path) -> None:
    """docs/kafka.md: in the results topic a count window's `start`/`end` are the offsets of its first and
    last input record (integers), not times."""
    from tests.cec.test_cli_topic import read_results_topic

    topic = f"offsets-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap, topic, 1)
    values = [(0, None, json.dumps({"item": "a" if i % 2 else "b", "price": i}).encode()) for i in range(8)]
    produce(kafka_broker.bootstrap, topic, values)
    results_topic = f"results-{uuid.uuid4().hex[:8]}"
    out = cec(
        "run", "--input-topic", topic, "--bootstrap-servers", kafka_broker.bootstrap, "--key", "item",
        "--value", "price", "--window-count", "2", "--results", str(tmp_path / "out.csv"),
        "--results-topic", results_topic, "--quiet",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    rows = sorted(
        (r["key"], r["window"], r["start"], r["end"])
        for _, r in read_results_topic(kafka_broker.bootstrap, results_topic)
    )
    assert rows == [("a", 0, 1, 3), ("a", 1, 5, 7), ("b", 0, 0, 2), ("b", 1, 4, 6)]


def test_demo_report_gives_the_crash_position_its_kill_line_gave(tmp_path: Path) -> None:
    out = cec(
        "demo", "--engine", "local", "--input", "30000", "--keys", "800", "--window", "10", "--quiet",
        "--store-dir", str(tmp_path),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    killed = re.search(
        r"SIGKILLed the aggregate process \(pid \d+\) at input position ~([\d,]+);", out.stdout
    )
    reported = re.search(r"crash: +SIGKILL at input position ~([\d,]+)\n", out.stdout)
    assert killed and reported, out.stdout
    assert killed.group(1) == reported.group(1)
    # The policy line says what the default checkpointing buys.
    assert (
        "U=100000 CI=5.0 ms CP=100.0 ms (a restart replays at most ~100,000 input tuples per instance)"
        in out.stdout
    )
    # A run that recovered says its G-checks are those made after recovery.
    assert "G-checks after recovery)" in out.stdout


def test_a_run_that_never_recovered_does_not_say_after_recovery(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    data.write_text("item,price\n" + "".join(f"i{i % 7},{i}\n" for i in range(1000)))
    out = cec(
        "run", str(data), "--key", "item", "--value", "price", "--window-count", "5",
        "--results", str(tmp_path / "out.csv"), "--quiet",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    duty = [line for line in out.stdout.splitlines() if "checkpoint duty:" in line]
    assert len(duty) == 1 and duty[0].endswith(" G-checks)"), out.stdout


def test_a_new_store_dir_on_kafka_says_which_log_it_resumes(kafka_broker: Broker, tmp_path: Path) -> None:
    """On Kafka the output log is named after the operator and the input, so a new --store-dir meets the
    log an earlier run wrote: said in one line, with how to start afresh (which then does)."""
    topic = f"again-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_broker.bootstrap, topic, 2)
    produce(
        kafka_broker.bootstrap,
        topic,
        [(i % 2, None, json.dumps({"item": f"i{i % 6}", "price": i}).encode()) for i in range(60)],
    )
    data = tmp_path / "in.csv"
    # Unique content: on Kafka a CSV run's log is named after the operator and the file's content.
    data.write_text(f"item,price\n{uuid.uuid4().hex},1\n" + "".join(f"i{i % 7},{i}\n" for i in range(100)))
    runs = {
        "topic": ["--input-topic", topic, "--format", "json", "--bootstrap-servers", kafka_broker.bootstrap],
        "csv": [str(data), "--bootstrap-servers", kafka_broker.bootstrap],
    }
    for name, source in runs.items():
        common = [
            "run", *source, "--key", "item", "--value", "price", "--window-count", "5",
            "--results", str(tmp_path / f"{name}.csv"), "--quiet",
        ]  # fmt: skip
        first = cec(*common, "--store-dir", str(tmp_path / f"{name}-a"))
        assert first.returncode == 0, first.stdout + first.stderr
        assert "resuming the output log" not in first.stdout
        # Without --quiet: the report must not call resuming a finished log a crash recovery.
        again = cec(*[arg for arg in common if arg != "--quiet"], "--store-dir", str(tmp_path / f"{name}-b"))
        assert again.returncode == 0, again.stdout + again.stderr
        assert "crash" not in again.stdout, again.stdout
        if (
            name == "topic"
        ):  # a topic run reports each partition's recovery (a CSV run only with --crash-after)
            assert "recovery:            none (the output log was complete" in again.stdout, again.stdout
        said = [line for line in again.stdout.splitlines() if line.startswith("resuming the output log")]
        assert len(said) == 1, again.stdout
        assert (
            "which an earlier run of this operator over the same input wrote from another store dir"
            in said[0]
        )
        assert "give --output-topic NEW-NAME" in said[0]
        fresh = cec(
            *common,
            "--store-dir",
            str(tmp_path / f"{name}-c"),
            "--output-topic",
            f"fresh-{uuid.uuid4().hex[:8]}",
        )
        assert fresh.returncode == 0, fresh.stdout + fresh.stderr
        assert "resuming the output log" not in fresh.stdout
        assert (tmp_path / f"{name}.csv").exists()
