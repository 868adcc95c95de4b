"""Every console script (and each subcommand) answers ``-h`` as it answers ``--help``."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def _command(target: str) -> click.Command:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _invocations() -> list[object]:
    out = []
    for script, target in SCRIPTS.items():
        command = _command(target)
        subcommands = list(command.commands) if isinstance(command, click.Group) else []
        for words in ([], *([name] for name in subcommands)):
            out.append(pytest.param(script, words, id=" ".join([script, *words])))
    return out


@pytest.mark.parametrize(("script", "words"), _invocations())
def test_short_help_option(script: str, words: list[str]) -> None:
    command = _command(SCRIPTS[script])
    short = CliRunner().invoke(command, [*words, "-h"], prog_name=script)
    long = CliRunner().invoke(command, [*words, "--help"], prog_name=script)
    assert short.exit_code == 0, short.output
    assert short.output == long.output and "Usage:" in short.output
