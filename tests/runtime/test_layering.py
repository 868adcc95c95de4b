"""The runtime's module boundaries: who may import whom, and what reaches into a model."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ninfer_runtime.models import Model, load_model
from ninfer_runtime.runner import ModelRunner

ROOT = Path(__file__).resolve().parents[2]
QWEN = ROOT / "ninfer_runtime" / "models" / "qwen3_5"


def imported(path: Path) -> set[str]:
    """Modules a file imports, relative ones as written (``.model``, ``..batch``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
    return names


def test_the_mtp_block_and_the_model_do_not_import_each_other() -> None:
    assert ".model" not in imported(QWEN / "mtp.py")
    assert ".layer" in imported(QWEN / "mtp.py") and ".layer" in imported(QWEN / "model.py")


def test_only_the_synthetic_writer_of_the_runtime_imports_the_converter() -> None:
    users = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "ninfer_runtime").rglob("*.py")
        if any(m.startswith("ninfer_convert") for m in imported(p))
    }
    # the synthetic package, behind require_extra("convert")
    assert users and all(u.startswith("ninfer_runtime/bench/synthetic/") for u in users), users


def test_nothing_reaches_into_a_models_private_attributes() -> None:
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for folder in ("ninfer_runtime", "ninfer_serve", "benchmarks", "scripts", "tests")
        for p in (ROOT / folder).rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\bmodel\._", line) and p.name != "test_layering.py"
    ]
    assert not found


@pytest.fixture(scope="module")
def model(artifact_path):
    return load_model(artifact_path("qwen3_5_bf16", "dense"))


def test_the_model_offers_every_member_of_the_contract(model) -> None:
    members = {n for n in vars(Model) if not n.startswith("_")} | set(Model.__annotations__)
    assert members >= {"hidden_states", "logits", "mtp_logits", "state_specs", "backend"}
    assert [n for n in sorted(members) if not hasattr(model, n)] == []
    assert ModelRunner(model).specs == model.state_specs()[0]


def runtime_imports(source: str, package: tuple[str, ...]) -> set[str]:
    """The ``ninfer_runtime`` modules that ``source`` (a module of ``package``) imports
    outside ``if TYPE_CHECKING:`` blocks, as absolute names."""
    tree = ast.parse(source)
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING")
        for stmt in block.body
        for n in ast.walk(stmt)
    }
    names = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            names.add(".".join((*base, *([node.module] if node.module else []))))
    return {n for n in names if n.startswith("ninfer_runtime.")}


#: the model layer and everything above it; the layers below never import them
ABOVE_THE_OPS = ("models", "runner", "engine", "scheduler", "frontend", "loader", "cli")
BELOW_THE_MODELS = (
    "functional.py",
    "arrays.py",
    "ops/**/*.py",
    "backends/**/*.py",
    "expert_offload/**/*.py",
)


def test_the_op_families_backends_and_array_math_import_nothing_above_them() -> None:
    found = [
        f"{p.relative_to(ROOT)} imports {name}"
        for below in BELOW_THE_MODELS
        for p in sorted((ROOT / "ninfer_runtime").glob(below))
        for name in runtime_imports(p.read_text(), p.relative_to(ROOT).parts[:-1])
        if name.split(".")[1] in ABOVE_THE_OPS
    ]
    assert not found


def test_the_layering_check_resolves_relative_imports_and_skips_type_only_ones() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from ...models.functional import silu\n"
        "from ..registry import resolve\n"
        "if TYPE_CHECKING:\n"
        "    from ...frontend.sampling_params import SamplingParams\n"
    )
    names = runtime_imports(source, ("ninfer_runtime", "ops", "norm"))
    assert names == {"ninfer_runtime.models.functional", "ninfer_runtime.ops.registry"}
