"""Session fixtures for runtime fidelity tests: tiny HF checkpoints, their artifacts, and
transformers references.

Everything is built once per session (a tiny checkpoint takes ~1 s, a conversion ~3 s).
BLAS is pinned to one thread: the matrices are tiny, and a multi-threaded OpenBLAS on a shared
2-core machine spends ~100x longer spinning than computing.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # effective if numpy is not loaded yet

import ctypes
import glob
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.tiny_checkpoints import build


def _pin_blas_threads() -> None:
    """If numpy was imported before this file, set its bundled OpenBLAS to one thread."""
    libs = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    for path in glob.glob(os.path.join(libs, "libscipy_openblas*.so")):
        lib = ctypes.CDLL(path)
        for symbol in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads"):
            if hasattr(lib, symbol):
                getattr(lib, symbol)(1)
                return


_pin_blas_threads()

#: rows of the quantization table printed at the end of the session
QUALITY_ROWS: list[tuple[str, float, float, float]] = []


@pytest.fixture(scope="session")
def torch_threads() -> Any:
    import torch

    torch.set_num_threads(2)
    return torch


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, torch_threads: Any) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runtime_ckpt")
    return {
        "dense": build(root / "dense", moe=False),
        "moe": build(root / "moe", moe=True),
    }


@pytest.fixture(scope="session")
def artifact_path(
    tmp_path_factory: pytest.TempPathFactory, checkpoints: dict[str, Path]
) -> Callable[[str, str], Path]:
    """``artifact_path(recipe, kind)``: the converted artifact, converted on first request."""
    from ninfer_convert.pipeline import convert

    root = tmp_path_factory.mktemp("runtime_art")
    done: dict[tuple[str, str], Path] = {}

    def get(recipe: str, kind: str) -> Path:
        key = (recipe, kind)
        if key not in done:
            out = root / f"{kind}-{recipe}.ninfer"
            convert(recipe, {"base": str(checkpoints[kind])}, out)
            done[key] = out
        return done[key]

    return get


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not QUALITY_ROWS:
        return
    tr = terminalreporter
    tr.section("quantized artifacts vs the bf16 artifact (tiny dense, same prompt)")
    tr.write_line(f"{'recipe':<12} {'top-1':>7} {'mean KL':>10} {'max|Δ| vs HF':>14}")
    for recipe, top1, kl, err in sorted(QUALITY_ROWS):
        tr.write_line(f"{recipe:<12} {top1:>7.3f} {kl:>10.5f} {err:>14.2e}")


# --------------------------------------------------------------- expert offload (MoE)
@pytest.fixture(scope="session")
def bundled_bf16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled trained model (``models/tiny-qwen3_5``) converted with ``qwen3_5_bf16``,
    its MTP component included: the tests that need real answers share it."""
    from ninfer_convert.pipeline import convert
    from tests.bundled import BUNDLED

    out = tmp_path_factory.mktemp("bundled_bf16") / "tiny.ninfer"
    convert("qwen3_5_bf16", {"base": str(BUNDLED)}, out)
    return out


@pytest.fixture(scope="session")
def qwen4_exp_ple(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen4Exp with PLE layers (``tests/tiny_qwen4_exp.py``, 16 indexer heads),
    converted with ``qwen4_exp_bf16``."""
    tiny = pytest.importorskip("tests.tiny_qwen4_exp")
    from ninfer_convert.pipeline import convert

    root = tmp_path_factory.mktemp("qwen4_exp_ple")
    checkpoint = tiny.build(root / "ple", indexer_n_heads=16)
    convert("qwen4_exp_bf16", {"base": str(checkpoint)}, root / "ple.ninfer")
    return root / "ple.ninfer"


@pytest.fixture(scope="module")
def q4_moe(artifact_path):
    """The tiny MoE artifact in q4 tiles, which the expert-offload tests split."""
    return artifact_path("tiny_q4", "moe")


@pytest.fixture(scope="module")
def shares(q4_moe):
    """The budget's floor (no routed expert resident) and the routed experts' bytes."""
    from tests.runtime.offload_runs import budget_shares

    return budget_shares(q4_moe)
