"""A `--recovery-target` that needs more than the usual checkpoint budget says so at the start of the run,
in one warning line with what it will cost (issue 26). The rates are injected as the previous run's stats
file of the same job (the channel the CLI reads them from), never measured on the wall clock here."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from cec.config import Checkpointing
from cec.rates import MeasuredRates
from cec.target_cost import rates_of_stats, target_cost_line
from tests.helpers import cec

TOPIC = "target-cost"


def _rates(input_rate: float) -> MeasuredRates:
    return MeasuredRates(
        ec_build_rate=400_000.0,
        ec_load_rate=300_000.0,
        replay_rate=20_000.0,
        gcheck_seconds=50e-6,
        input_rate=input_rate,
        process_rate=100_000.0,
        outputs_per_input=1.0,
        measured={"input_rate", "gcheck_seconds", "process_rate"},
    )


def test_a_target_within_the_usual_budget_says_nothing() -> None:
    assert target_cost_line(Checkpointing(recovery_target="2s"), _rates(1_000.0), 1_000) is None


def test_a_target_above_the_usual_budget_says_what_it_costs() -> None:
    line = target_cost_line(Checkpointing(recovery_target="2s"), _rates(50_000.0), 10_000)
    assert line is not None
    assert line.startswith("--recovery-target 2s needs about 63% of operator time for G-checks")
    assert "above the usual budget of 5% (CI=5 ms every CP=100 ms); it will take up to 90%" in line
    assert "\n" not in line


def test_a_target_no_budget_meets_says_so() -> None:
    line = target_cost_line(Checkpointing(recovery_target="100ms"), _rates(50_000.0), 100_000)
    assert line is not None and "recovery target 0.1 s cannot be met" in line


def test_stats_without_a_measured_input_rate_plan_nothing() -> None:
    assert rates_of_stats({"rates": _rates(0.0).as_dict(), "open_windows": 10}) is None
    assert rates_of_stats({"rates": "garbage"}) is None
    assert rates_of_stats(None) is None
    found = rates_of_stats({"rates": _rates(50_000.0).as_dict(), "open_windows": 10_000})
    assert found is not None and found[0].input_rate == 50_000.0 and found[1] == 10_000


def _run(tmp_path: Path, store: Path, target: str) -> tuple[int, list[str]]:
    data = tmp_path / "in.csv"
    with data.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["k", "v"])
        w.writerows([f"k{i % 7}", i] for i in range(200))
    out = cec(
        "run", str(data), "--key", "k", "--value", "v", "--window-count", "5",
        "--results", str(tmp_path / "out.csv"), "--store-dir", str(store), "--output-topic", TOPIC,
        "--recovery-target", target,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return out.returncode, [line for line in out.stderr.splitlines() if "usual budget" in line]


def test_cli_warns_once_at_start_from_the_previous_runs_rates(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    previous = {"rates": _rates(50_000.0).as_dict(), "open_windows": 10_000}
    (store / f".{TOPIC}.stats.json").write_text(json.dumps(previous))
    _, said = _run(tmp_path, store, "2s")
    assert len(said) == 1, said
    assert "WARNING" in said[0] and "--recovery-target 2s needs about 63% of operator time" in said[0]


def test_cli_says_nothing_on_a_first_run(tmp_path: Path) -> None:
    _, said = _run(tmp_path, tmp_path / "store", "2s")
    assert said == []
