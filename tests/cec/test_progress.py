"""`cec.progress`: what library code reports (input with its total, EC scan, replay), the plain-line
reporter (injected clock), the live `rich` display on a terminal, and logging instead of prints."""

from __future__ import annotations

import ast
import os
import pty
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cec import progress
from operators.job import JobSpec, aggregate_operator, run_job
from queuestore.factory import store_spec
from tests.helpers import child_env

ROOT = Path(__file__).resolve().parents[2]


class Recorded(progress.Task):
    def __init__(self, description: str, total: int | None, unit: str) -> None:
        super().__init__(description, total, unit)
        self.updates: list[int] = []

    def update(self, completed: int, *, total: int | None = None) -> None:
        super().update(completed, total=total)
        self.updates.append(completed)


class Recorder:
    def __init__(self) -> None:
        self.tasks: list[Recorded] = []

    def task(self, description: str, total: int | None = None, unit: str = "records") -> progress.Task:
        self.tasks.append(Recorded(description, total, unit))
        return self.tasks[-1]

    def stop(self) -> None:
        pass

    def named(self, suffix: str) -> Recorded:
        (found,) = [t for t in self.tasks if t.description.endswith(suffix)]
        return found


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    previous = progress.set_reporter(rec)
    yield rec
    progress.set_reporter(previous)


def _spec(tmp_path: Path, count: int) -> JobSpec:
    return JobSpec(
        operator=aggregate_operator("item_id", "item_price", "avg", window_count=10, time="item_time"),
        source={"type": "generator", "count": count, "keys": 500, "seed": 3},
        store=store_spec(tmp_path, None),
        output_topic="agg",
        batch_size=100,
    )


def test_a_bounded_run_reports_its_input_against_the_total(tmp_path: Path, recorder: Recorder) -> None:
    run_job(_spec(tmp_path, 5000))
    inputs = recorder.named("input")
    assert inputs.total == 5000 and inputs.unit == "tuples"
    assert inputs.updates == sorted(inputs.updates) and inputs.updates[-1] == 5000
    assert inputs.closed


def test_recovery_reports_the_ec_scan_and_the_replay_with_their_totals(
    tmp_path: Path, recorder: Recorder
) -> None:
    run_job(_spec(tmp_path, 5000), max_inputs=3000)  # stops as a crash would: no EOS
    recorder.tasks.clear()
    stats = run_job(_spec(tmp_path, 5000))
    assert stats.recovery is not None
    scan = recorder.named("EC scan")
    assert scan.unit == "windows" and scan.total == stats.recovery.ec_windows
    assert scan.updates[-1] == scan.total and scan.closed
    replay = recorder.named("replay")
    report = stats.recovery
    assert replay.total == sum(report.crash_pos) - sum(report.replay_start) > 0
    assert replay.updates[-1] == replay.total and replay.closed
    inputs = recorder.named("input")
    assert inputs.total == 5000 and inputs.updates[-1] == 5000


def test_the_plain_reporter_writes_total_rate_and_eta_at_its_interval() -> None:
    now = [0.0]
    lines: list[str] = []
    reporter = progress.LogReporter(every_s=5.0, clock=lambda: now[0], emit=lines.append)
    task = reporter.task("aggregate[0] input", 1000, "tuples")
    now[0] = 1.0
    task.update(100)
    assert lines == []  # not before the interval
    now[0] = 5.0
    task.update(250)
    assert lines == ["aggregate[0] input: 250/1,000 tuples (25%), 50 tuples/s, ETA 0:00:15"]
    now[0] = 6.0
    task.update(300)
    assert len(lines) == 1
    now[0] = 20.0
    task.update(1000)
    task.close()
    assert lines[-1] == "aggregate[0] input: 1,000/1,000 tuples (100%), 50 tuples/s, done in 20.0 s"


def test_the_plain_reporter_keeps_quick_work_quiet_and_handles_unknown_totals() -> None:
    now = [0.0]
    lines: list[str] = []
    reporter = progress.LogReporter(every_s=5.0, clock=lambda: now[0], emit=lines.append)
    with reporter.task("quick", None, "tuples") as quick:
        quick.update(10)
    assert lines == []
    slow = reporter.task("follow", None, "tuples")
    now[0] = 10.0
    slow.update(500)
    assert lines == ["follow: 500 tuples, 50 tuples/s"]


def test_cec_run_on_a_terminal_shows_a_live_bar_with_total_rate_and_eta(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    data.write_text("k,v\n" + "".join(f"k{i % 50},{i}\n" for i in range(20_000)))
    script = Path(sys.executable).parent / "cec"
    master, slave = pty.openpty()
    env = child_env()
    env["COLUMNS"] = "160"
    proc = subprocess.Popen(
        [str(script), "run", str(data), "--key", "k", "--value", "v", "--window-count", "5",
         "--results", str(tmp_path / "out.csv")],
        stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    os.close(slave)
    shown = b""
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        assert ready, "no output from cec on its terminal"
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the terminal closed: the process ended
            break
        if not chunk:
            break
        shown += chunk
    out, _ = proc.communicate(timeout=60)
    os.close(master)
    assert proc.returncode == 0, shown.decode(errors="replace")
    text = shown.decode(errors="replace")
    assert "aggregate[0] input" in text
    assert "20000/20000" in text and "100%" in text  # the total is known: a CSV is bounded
    assert "ETA" in text and "/s" in text
    assert b"results:      " in out  # the report itself stays on stdout


def test_the_library_logs_instead_of_printing() -> None:
    """Only the command-line entry points print (cec/cli/common.py, cec/cli/main.py, operators/worker.py)."""
    entry_points = {"cec/cli/common.py", "cec/cli/main.py", "operators/worker.py"}
    printing = []
    for package in ("cec", "operators", "queuestore", "recovery"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in entry_points:
                continue
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                    printing.append(f"{rel}:{node.lineno}")
    assert printing == []


def test_quiet_before_or_after_the_subcommand_leaves_stderr_empty(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    data.write_text("k,v\n" + "".join(f"k{i % 5},{i}\n" for i in range(2000)) + "k1,oops\n")
    script = str(Path(sys.executable).parent / "cec")
    run = ["run", str(data), "--key", "k", "--value", "v", "--window-count", "3", "--crash-after", "500"]
    for args in (["--quiet", *run], [*run, "--quiet"]):
        out = subprocess.run(
            [script, *args, "--results", str(tmp_path / "o.csv")],
            capture_output=True,
            text=True,
            env=child_env(),
        )
        assert out.returncode == 0 and out.stderr == "", out.stderr
        assert "dead letters: 1 rows" in out.stdout


def test_log_level_reaches_the_operator_process(tmp_path: Path) -> None:
    data = tmp_path / "in.csv"
    # Big enough that the first process's log is durable when it is killed, so the second one recovers.
    data.write_text("k,v\n" + "".join(f"k{i % 5},{i}\n" for i in range(20_000)))
    script = str(Path(sys.executable).parent / "cec")
    run = ["run", str(data), "--key", "k", "--value", "v", "--window-count", "3", "--crash-after", "15000"]
    quiet = subprocess.run([script, *run, "--results", str(tmp_path / "a.csv")], capture_output=True, text=True,
                           env=child_env())  # fmt: skip
    assert "INFO" not in quiet.stderr
    loud = subprocess.run([script, "--log-level", "info", *run, "--progress", "--results", str(tmp_path / "b.csv")],
                          capture_output=True, text=True, env=child_env())  # fmt: skip
    assert loud.returncode == 0, loud.stderr
    # The restarted worker process logs through the level the CLI was given: what it recovered, or that
    # its log was still empty (the SQLite writer's I/O thread may not have committed anything before the
    # kill: any prefix is a valid log, the empty one included).
    assert "INFO operators.runtime: [aggregate[0] +" in loud.stderr, loud.stderr
    assert loud.stderr.count("recovered: extent") + loud.stderr.count("nothing to recover") == 2, loud.stderr
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
