"""Fixtures for the GPU tests: the backend, tiny checkpoints and their artifacts.

Tests here are marked ``gpu`` and skipped with a reason where CuPy or a device is missing;
nothing is skipped on a machine that has both (a failure to build or run is a failure).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ninfer_runtime.backends.cuda import unavailable_reason

REASON = unavailable_reason()
requires_gpu = [
    pytest.mark.gpu,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]

#: (case, what, value) rows printed at the end of the session
REPORT: list[tuple[str, str, str]] = []


@pytest.fixture(scope="session")
def cuda_backend() -> Any:
    """Float32 products throughout (prefill too): kernel tests hold float32 error bounds."""
    from ninfer_runtime.backends.cuda.backend import CudaBackend

    return CudaBackend(prefill_precision="float32", decode_precision="split")


@pytest.fixture(scope="session")
def gpu_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import torch

    from tests.tiny_checkpoints import build

    torch.set_num_threads(4)
    root = tmp_path_factory.mktemp("gpu_ckpt")
    return {"dense": build(root / "dense", moe=False), "moe": build(root / "moe", moe=True)}


@pytest.fixture(scope="session")
def gpu_artifact(
    tmp_path_factory: pytest.TempPathFactory, gpu_checkpoints: dict[str, Path]
) -> Callable[[str, str], Path]:
    """``gpu_artifact(recipe, kind)``: the converted tiny artifact, built on first request."""
    from ninfer_convert.pipeline import convert

    root = tmp_path_factory.mktemp("gpu_art")
    done: dict[tuple[str, str], Path] = {}

    def get(recipe: str, kind: str) -> Path:
        if (recipe, kind) not in done:
            out = root / f"{kind}-{recipe}.ninfer"
            convert(recipe, {"base": str(gpu_checkpoints[kind])}, out)
            done[recipe, kind] = out
        return done[recipe, kind]

    return get


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not REPORT:
        return
    tr = terminalreporter
    tr.section("cuda backend vs the CPU reference")
    for case, what, value in REPORT:
        tr.write_line(f"{case:<28} {what:<34} {value}")
