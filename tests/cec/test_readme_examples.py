"""The README's and docs' `cec` commands over the example files run as written (issue 25).

Every code block of README.md and docs/*.md that names one of the example inputs (`purchases.csv`,
`events.csv`, `flights.csv`, `big.csv`) is found by parsing the Markdown (fenced blocks, and blocks
indented by four spaces); its `cec` commands are run in order, in a fresh directory holding what
`cec demo --make-data .` writes, exactly as the block has them except for three things a test cannot do
as a user would: a trailing `&` (the command runs in the foreground), a fixed `--metrics-port` (a free
port instead) and the placeholder cluster of `export CEC_BOOTSTRAP_SERVERS=...` (the test broker).
Each command must exit 0, and a topic a block names (`run-<fingerprint>`) must be the one its `cec run`
made, so the shown outputs belong to the shown data.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from cec.example_data import EXAMPLE_FILES
from tests.brokers import Broker
from tests.helpers import child_env

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^(\s*)```")


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # of the block's first line, 1-based
    commands: tuple[str, ...]  # `cec ...` and `export ...` commands, continuation lines joined

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _blocks(path: Path) -> list[tuple[int, list[str]]]:
    """(first line, lines) of every fenced block and every block indented by four spaces."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[tuple[int, list[str]]] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence:
            indent = len(fence.group(1))
            j = i + 1
            while j < len(lines) and not _FENCE.match(lines[j]):
                j += 1
            out.append((i + 2, [line[indent:] for line in lines[i + 1 : j]]))
            i = j + 1
            continue
        if lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            out.append((i + 1, [line[4:] for line in lines[i:j]]))
            i = j
            continue
        i += 1
    return out


def _commands(lines: list[str]) -> list[str]:
    """The block's shell commands (a leading `$ ` prompt dropped, `\\` continuations joined, comments cut)."""
    commands: list[str] = []
    pending = ""
    for raw in lines:
        line = raw.strip()
        if not pending and line.startswith("$ "):
            line = line[2:]
        elif not pending and not line.startswith(("cec ", "export ")):
            continue  # output shown in the block, or another tool's command
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        commands.append(pending + line)
        pending = ""
    return [c for c in commands if c.startswith(("cec ", "export "))]


def _example_blocks() -> list[Block]:
    found = []
    for path in DOCS:
        for first, lines in _blocks(path):
            commands = _commands(lines)
            words = {w for c in commands for w in shlex.split(c, comments=True)}
            if words & EXAMPLE_FILES.keys():
                found.append(Block(path.relative_to(ROOT).as_posix(), first, tuple(commands)))
    return found


BLOCKS = _example_blocks()


def test_the_docs_have_example_blocks() -> None:
    # The parser finds the blocks that must run (a change of Markdown layout must not empty this test).
    names = {b.doc for b in BLOCKS}
    assert {"README.md", "docs/kafka.md", "docs/long-runs.md"} <= names, [b.id for b in BLOCKS]
    assert sum(b.doc == "README.md" for b in BLOCKS) >= 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def example_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("example-data")
    script = Path(sys.executable).parent / "cec"
    out = subprocess.run(
        [str(script), "demo", "--make-data", str(where)], capture_output=True, text=True, timeout=120,
        env=child_env(),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert sorted(p.name for p in where.iterdir()) == sorted(EXAMPLE_FILES)
    return where


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_example_block_runs_as_written(
    block: Block, example_data: Path, kafka_broker: Broker, tmp_path: Path
) -> None:
    for name in EXAMPLE_FILES:
        os.link(example_data / name, tmp_path / name)
    env = child_env()
    env.pop("CEC_BOOTSTRAP_SERVERS", None)
    made: set[str] = set()
    script = str(Path(sys.executable).parent / "cec")
    for command in block.commands:
        words = shlex.split(command, comments=True)
        if words[0] == "export":
            name, _, _value = words[1].partition("=")
            assert name == "CEC_BOOTSTRAP_SERVERS", command
            env[name] = kafka_broker.bootstrap  # the block's placeholder cluster
            continue
        if words[-1] == "&":
            words.pop()
        if "--metrics-port" in words:
            words[words.index("--metrics-port") + 1] = str(_free_port())
        named = [w for w in words if w.startswith("run-")]
        for topic in named:
            if "<" not in topic:
                assert topic in made, f"{block.id}: {topic} is not the topic the block's run made ({made})"
        if named and any("<" in t for t in named):
            words = [next(iter(made)) if "<" in w else w for w in words]
        out = subprocess.run(
            [script, *words[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env
        )
        assert out.returncode == 0, f"{block.id}: {command}\n{out.stdout}{out.stderr}"
        made.update(re.findall(r"\brun-[0-9a-f]{16}\b", out.stdout + out.stderr))
        if words[1] == "run":
            made.update(_topics_in(tmp_path))


def _topics_in(where: Path) -> set[str]:
    """The output topics `cec run` remembers in the store directories under `where`."""
    import json

    found: set[str] = set()
    for memory in where.rglob("cec-run-topics.json"):
        found.update(json.loads(memory.read_text()).values())
    return found
