"""`cec.Checkpointing`: validation, durations, JSON, and how JobSpec and the CLI carry it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cec import Checkpointing
from cec.cli import build_parser, main
from cec.cli.common import checkpointing_of
from cec.config import DEFAULT_U_TARGET, parse_duration_s
from cec.exceptions import ConfigError
from operators.job import JobSpec


def test_defaults_and_exact_field_names() -> None:
    c = Checkpointing()
    assert (c.q_target, c.u_target, c.ci_ms, c.cp_ms, c.recovery_target, c.policy) == (
        None, None, 5.0, 100.0, None, "targets",
    )  # fmt: skip
    assert not c.checkpoints and c.duty == pytest.approx(0.05)
    named = Checkpointing(
        q_target=20_000, u_target=100_000, ci_ms=10, cp_ms=50, recovery_target="3s", policy="cost-benefit"
    )
    assert named.checkpoints and named.recovery_target == 3.0 and named.ci_ms == 10.0


@pytest.mark.parametrize(
    ("given", "seconds"),
    [("3s", 3.0), ("500ms", 0.5), ("2 minutes", 120.0), ("1.5h", 5400.0), (7, 7.0), (0.25, 0.25), ("4", 4.0)],
)
def test_recovery_target_durations(given: str | float, seconds: float) -> None:
    assert Checkpointing(recovery_target=given).recovery_target == pytest.approx(seconds)
    assert parse_duration_s(given) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"q_target": 0},
        {"u_target": -5},
        {"q_target": 1.5},
        {"u_target": True},
        {"ci_ms": 0},
        {"ci_ms": 200.0},  # CI > CP
        {"cp_ms": float("nan")},
        {"recovery_target": "soon"},
        {"recovery_target": "3 fortnights"},
        {"recovery_target": 0},
        {"recovery_target": "-1s"},
        {"policy": "always"},
        {"mtbf": "never"},
    ],
)
def test_invalid_configurations_are_one_clear_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Checkpointing(**kwargs)  # type: ignore[arg-type]


def test_frozen_and_json_round_trip() -> None:
    c = Checkpointing(
        q_target=900, u_target=1000, ci_ms=2, cp_ms=10, recovery_target="500ms", policy="cost-benefit"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.q_target = 5  # type: ignore[misc]
    assert Checkpointing.from_json(c.to_json()) == c
    assert json.loads(c.to_json())["recovery_target"] == 0.5
    with pytest.raises(ConfigError):
        Checkpointing.from_json('{"q_target": 5, "Q": 7}')
    with pytest.raises(ConfigError):
        Checkpointing.from_json("[1]")


def test_jobspec_carries_it_through_json() -> None:
    spec = JobSpec(
        operator={
            "type": "aggregate",
            "key_field": "item_id",
            "value_field": "item_price",
            "window_count": 2,
        },
        source={"type": "generator", "count": 1, "keys": 1},
        store={"type": "sqlite", "root": "/tmp/x"},
        output_topic="t",
        checkpointing=Checkpointing(u_target=50, recovery_target="3s"),
    )
    back = JobSpec.from_json(spec.to_json())
    assert back == spec and isinstance(back.checkpointing, Checkpointing)
    assert JobSpec.from_json(
        JobSpec(spec.operator, spec.source, spec.store, "t").to_json()
    ).checkpointing == (Checkpointing())
    with pytest.raises(ConfigError):
        JobSpec(spec.operator, spec.source, spec.store, "t", checkpointing="fast")  # type: ignore[arg-type]


def _parsed(*argv: str) -> Checkpointing:
    return checkpointing_of(build_parser().parse_args(list(argv)))


def test_cli_flags_map_onto_checkpointing() -> None:
    assert _parsed("demo") == Checkpointing(q_target=20_000, u_target=100_000)  # the paper's Q and U
    assert _parsed("demo", "--recovery-target", "3s") == Checkpointing(recovery_target=3.0)
    assert _parsed("demo", "--recovery-target", "3s", "--U", "100000") == Checkpointing(
        u_target=100_000, recovery_target=3.0
    )
    run = ["run", "in.csv", "--key", "k", "--value", "v", "--window-count", "5", "--results", "r.csv"]
    # Bounded recovery by default (issue 25): U = DEFAULT_U_TARGET unless told otherwise; --gopen-only: none.
    assert _parsed(*run) == Checkpointing.default() == Checkpointing(u_target=DEFAULT_U_TARGET)
    assert _parsed(*run, "--gopen-only") == Checkpointing.gopen_only() == Checkpointing()
    assert _parsed(*run, "--recovery-target", "3s") == Checkpointing(recovery_target=3.0)
    assert _parsed(
        *run, "--Q", "900", "--U", "1000", "--ci-ms", "10", "--cp-ms", "20", "--policy", "cost-benefit"
    ) == Checkpointing(q_target=900, u_target=1000, ci_ms=10, cp_ms=20, policy="cost-benefit")
    assert _parsed(*run, "--policy", "cost-benefit", "--mtbf", "10 minutes") == Checkpointing(
        u_target=DEFAULT_U_TARGET, policy="cost-benefit", mtbf=600.0
    )


@pytest.mark.parametrize(
    "flags",
    [
        ["--recovery-target", "soon"],
        ["--ci-ms", "50", "--cp-ms", "10"],
        ["--ci-ms", "0"],
        ["--mtbf", "never"],
    ],
)
def test_cli_rejects_bad_checkpointing_in_one_line(
    tmp_path: Path, flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "in.csv"
    data.write_text("k,v\na,1\n")
    rc = main(["run", str(data), "--key", "k", "--value", "v", "--window-count", "2", "--results",
               str(tmp_path / "r.csv"), *flags])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("cec: error: ") and err.count("\n") == 1 and "Traceback" not in err
