"""What ``pip install ninfer`` puts on sys.path: the project's packages and nothing else."""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = {"ninfer_format", "ninfer_convert", "ninfer_runtime", "ninfer_serve"}


def test_only_the_project_packages_install_at_top_level() -> None:
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = find_packages(ROOT, include=find["packages"]["find"]["include"])
    assert {p.partition(".")[0] for p in packages} == TOP_LEVEL
    assert "ninfer_convert.recipes" in packages  # the recipes ship inside the converter
