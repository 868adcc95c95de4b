"""``pip install ninfer`` alone (no extra): every command works or names its extra in one line.

A plain venv (no system site packages) gets the base dependencies of pyproject.toml and the
package built from a copy of this tree, then every console script runs in it. Building it takes
about 10 s, so it is one test: under xdist it is built once.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.bundled import BUNDLED

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGES = ["ninfer_format", "ninfer_convert", "ninfer_runtime", "ninfer_serve"]

pytestmark = pytest.mark.slow
#: the venv sees only what is installed in it, not this tree through $PYTHONPATH
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=ENV)


def _base_venv(root: Path) -> Path:
    """The venv's bin folder, with ninfer and its base dependencies only."""
    source = root / "src"
    for name in PACKAGES:
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    base = [*PYPROJECT["build-system"]["requires"], *PYPROJECT["project"]["dependencies"]]
    fetched = _pip(python, *base)
    if fetched.returncode != 0:
        pytest.skip(f"no package index gave the base dependencies: {fetched.stderr[-300:]}")
    built = _pip(python, "--no-deps", "--no-build-isolation", str(source))
    assert built.returncode == 0, built.stderr
    return venv / "bin"


def _declared(extra: str) -> set[str]:
    """Distribution names an extra installs, per pyproject.toml (included extras too)."""
    names: set[str] = set()
    for requirement in PYPROJECT["project"]["optional-dependencies"][extra]:
        name, included = re.match(r"([\w.-]+)(?:\[([^\]]*)\])?", requirement).groups("")
        if name == "ninfer":
            for inner in included.split(","):
                names |= _declared(inner)
        else:
            names.add(name)
    return names


def test_each_command_works_or_names_its_extra(tmp_path: Path) -> None:
    bin = _base_venv(tmp_path)
    sample = tmp_path / "sample.ninfer"
    text = tmp_path / "text.txt"
    text.write_text("The capital of France is Paris.\n")

    def run(*args: str) -> tuple[int, str]:
        done = subprocess.run(
            [str(bin / args[0]), *args[1:]], capture_output=True, text=True, cwd=tmp_path, env=ENV
        )
        return done.returncode, (done.stdout + done.stderr).strip()

    failures = []
    for script in PYPROJECT["project"]["scripts"]:
        status, output = run(script, "-h")
        if status != 0 or "Usage:" not in output:
            failures.append(f"{script} -h: status {status}: {output[-500:]}")
    working = [
        ("ninfer-sample", str(sample)),
        ("ninfer-inspect", str(sample), "--verify", "--strict"),
        ("ninfer-convert", "--list-recipes"),
    ]
    for args in working:
        status, output = run(*args)
        if status != 0:
            failures.append(f"{' '.join(args)}: status {status}: {output[-500:]}")
    needing = [
        ("runtime", ("ninfer", str(sample), "--prompt", "Hello")),
        ("runtime", ("ninfer-perplexity", str(sample), "--text", str(text))),
        ("convert", ("ninfer-convert", "--recipe", "tiny_mixed", "--source", str(BUNDLED),
                     "-o", str(tmp_path / "tiny.ninfer"))),
        ("convert", ("ninfer-convert", "verify", str(sample), "--source", str(BUNDLED))),
        ("convert", ("ninfer-bench", "synth", "--geometry", "tiny_dense", "--formats",
                     "tiny_q4", "-o", str(tmp_path / "synth.ninfer"))),
        ("runtime", ("ninfer-bench", "cache", str(sample), "--backend", "cpu")),
        ("serve", ("ninfer-serve", str(sample))),
    ]  # fmt: skip
    for extra, args in needing:
        status, output = run(*args)
        said = re.fullmatch(
            rf"{re.escape(args[0])}( verify| synth| cache)? needs the {extra} extra: "
            rf"pip install 'ninfer\[{extra}\]' \(missing: (?P<missing>[^)]+)\)",
            output,
        )
        if status == 0 or said is None:
            failures.append(f"{' '.join(args)}: status {status}: {output[-500:]}")
        elif not set(said["missing"].split(", ")) <= _declared(extra):
            failures.append(f"{' '.join(args)}: names packages outside [{extra}]: {output}")
    assert not failures, "\n".join(failures)
    assert not (tmp_path / "tiny.ninfer").exists() and not (tmp_path / "synth.ninfer").exists()
