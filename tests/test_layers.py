"""The import layers: the tuple model at the bottom, `recovery/` below the operators and the CLI, the CLI's
commands above one shared module. Read from the source (every import, function-level ones too), so a
lazy import that breaks a layer fails here as well as a top-level one."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The model: what a record is and how it is stored and encoded. It imports nothing of the layers above.
MODEL = (
    "cec/records.py",
    "cec/stored.py",
    "cec/wire.py",
    "cec/varint.py",
    "cec/compact_body.py",
    "cec/avro_codec.py",
)
ABOVE_THE_MODEL = ("queuestore", "operators", "recovery", "cec.cli", "cec.inspection", "cec.verified")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _under(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_the_model_imports_nothing_above_it() -> None:
    found = [rel for rel in MODEL if (ROOT / rel).exists()]
    assert "cec/records.py" in found and "cec/stored.py" in found
    upward = {rel: sorted(n for n in _imports(ROOT / rel) if _under(n, ABOVE_THE_MODEL)) for rel in found}
    assert upward == {rel: [] for rel in found}


def test_recovery_imports_neither_the_operators_nor_the_cli() -> None:
    upward = {
        path.relative_to(ROOT).as_posix(): sorted(
            n for n in _imports(path) if _under(n, ("operators", "cec.cli"))
        )
        for path in sorted((ROOT / "recovery").rglob("*.py"))
    }
    assert {rel: names for rel, names in upward.items() if names} == {}


def test_the_cli_commands_stand_on_one_shared_module_without_a_circle() -> None:
    cli = ROOT / "cec" / "cli"
    commands = {p.stem: {n.split(".")[2] for n in _imports(p) if _under(n, ("cec.cli",)) and n.count(".") >= 2}
                for p in cli.glob("*.py")}  # fmt: skip
    assert commands["common"] == set()  # the bottom: every command may import it
    assert commands["trimming"] == set()  # `cec run`'s trimming flag, beside the bottom
    assert commands["run_operator"] <= {"common"}
    assert commands["standby"] == set()  # `cec run --standby`'s checks, beside the bottom
    assert commands["run_topic"] <= {"common", "run_operator", "trimming", "standby"}
    for name in ("demo", "run", "inspect", "recover", "state"):
        assert "main" not in commands[name], name  # the parser imports the commands, never the reverse
