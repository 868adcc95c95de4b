"""Every ```python and ```sh example in README.md and docs/*.md runs, on the CPU and offline.

Each block runs in a fresh folder holding what the examples name: ``model.ninfer`` (the bundled
model converted with ``tiny_mixed``, as ``make demo`` does, once per session), ``chat.json``,
``wiki.txt`` and ``models/`` (the bundled checkpoint). Shell blocks run with ``bash -e`` and
this environment's commands first on PATH; Python blocks run as scripts. Blocks without a
language (synopses, sample output) are not run.

A block that cannot run here (a GPU, the Hub, a running server, a long run) carries a marker on
a line of its own just before its fence, and is reported as skipped with that reason::

    <!-- no-test: needs a GPU -->
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bundled import BUNDLED

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNERS = {"python": "python", "py": "python", "sh": "bash", "bash": "bash", "shell": "bash"}
FENCE = re.compile(r"^ *(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)[^`]*$")
MARKER = re.compile(r"^\s*<!--\s*no-test:(?P<reason>.*?)-->\s*$")
CHAT = '[{"role": "user", "content": "What is the capital of France?"}]\n'
TEXT = "The capital of France is Paris. What is the capital of France?\n" * 8


@dataclass(frozen=True)
class Example:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    skip: str | None  # the marker's reason; None when unmarked

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def examples(path: Path) -> list[Example]:
    """The fenced blocks of a markdown file, each with the no-test marker just above it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Example] = []
    marker: str | None = None
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            m = MARKER.match(lines[i])
            if m is not None:
                marker = m["reason"].strip()
            elif lines[i].strip():
                marker = None  # a marker applies only to the block right below it
            i += 1
            continue
        mark = fence["fence"]
        closing = re.compile(rf"^ *{re.escape(mark[0])}{{{len(mark)},}}\s*$")
        end = i + 1
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        code = textwrap.dedent("\n".join(lines[i + 1 : end])) + "\n"
        found.append(Example(path, i + 1, fence["info"].lower(), code, marker))
        marker = None
        i = end + 1
    return found


ALL = [e for path in DOCS for e in examples(path)]
RUNNABLE = [e for e in ALL if e.language in RUNNERS]


def _markers(path: Path) -> int:
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if MARKER.match(line))


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_markers_have_a_reason_and_a_block(path: Path) -> None:
    marked = [e for e in examples(path) if e.skip is not None]
    assert len(marked) == _markers(path), f"{path.name}: a no-test marker not right above a block"
    for e in marked:
        assert e.skip, f"{e.where}: the no-test marker gives no reason"


def test_the_docs_have_runnable_examples() -> None:
    assert sum(e.skip is None for e in RUNNABLE) >= 10, [e.where for e in RUNNABLE]


@pytest.fixture(scope="session")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ninfer_convert.pipeline import convert

    out = tmp_path_factory.mktemp("docs") / "model.ninfer"
    convert("tiny_mixed", {"base": str(BUNDLED)}, out)
    return out


def _cases() -> list[object]:
    return [
        pytest.param(e, id=e.where, marks=[pytest.mark.skip(reason=f"{e.where}: {e.skip}")])
        if e.skip is not None
        else pytest.param(e, id=e.where)
        for e in RUNNABLE
    ]


@pytest.mark.parametrize("example", _cases())
def test_example_runs(example: Example, converted: Path, tmp_path: Path) -> None:
    shutil.copy(converted, tmp_path / "model.ninfer")
    (tmp_path / "chat.json").write_text(CHAT)
    (tmp_path / "wiki.txt").write_text(TEXT)
    (tmp_path / "models").symlink_to(ROOT / "models")
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OPENBLAS_NUM_THREADS": "1",
    }
    if RUNNERS[example.language] == "bash":
        command = ["bash", "-e", "-o", "pipefail", "-c", example.code]
    else:
        command = [sys.executable, "-c", example.code]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (
        f"{example.where} failed with status {done.returncode}:\n{example.code}\n"
        f"--- stdout\n{done.stdout[-2000:]}\n--- stderr\n{done.stderr[-3000:]}"
    )
