"""GLM5Next's image path on the CUDA backend against the CPU backend, on the tiny GLM5Next VLM
``tests/runtime/test_glm5_next_images.py`` builds (a patch-4 tower of two blocks, GLM's image
tokens, the GLM-5 chat template).

GLM5Next's images are served on the backends of ``vision_families.GLM5_NEXT.backends``: cuda
among them since this file passed on an H100 (2026-12-06).

* The tower: the same pictures encoded by a CPU and a CUDA ``Glm5NextVisionTower``, within a
  bound of the CPU rows' largest magnitude: ``FLOAT32_TOL`` with float32 prefill products
  (the differences are the small-M products' x carried as two bf16 halves, ~1e-5 of each
  product, through the tower's products and softmaxes), ``BF16_TOL`` with the default bf16
  ones (x rounded to bf16, unit roundoff 2^-9), as ``test_images_cuda.py`` states them for
  Qwen3.5's tower.
* The engine: a greedy image chat (its next turn resuming from the prefix cache) gives the CPU
  engine's tokens, with float32 prefill products and float32 K/V (token for token on a random
  model needs the reference's precision).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_format import Artifact
from ninfer_runtime.backends import get_backend
from ninfer_runtime.engine import Engine, GenerationRequest
from ninfer_runtime.models.glm5_next.vision import Glm5NextVisionTower
from tests.runtime.conftest import torch_threads  # noqa: F401  # the fixture converted needs
from tests.runtime.test_engine_images import GREEDY, chat, png, run
from tests.runtime.test_glm5_next_images import PICTURE, _pixels, converted  # noqa: F401

from .conftest import REPORT, requires_gpu

pytestmark = requires_gpu

FLOAT32_TOL, BF16_TOL = 1e-3, 2e-2
#: one picture, and two of different sizes in one call
PICTURES = {"one": [PICTURE], "two": [png(24, 40, 2), PICTURE]}


def host(a: Any) -> np.ndarray:
    import cupy as cp

    return cp.asnumpy(a) if isinstance(a, cp.ndarray) else np.asarray(a)


@pytest.mark.parametrize("precision", ["float32", "bf16"])
@pytest.mark.parametrize("pictures", sorted(PICTURES))
def test_tower_rows_match_the_cpu_tower(
    pictures: str,
    precision: str,
    converted: tuple[Path, Path],  # noqa: F811
) -> None:
    from ninfer_runtime.backends.cuda.backend import CudaBackend

    path = converted[1]
    pixels, grid = _pixels(PICTURES[pictures])
    want = Glm5NextVisionTower(Artifact.open(path), get_backend("cpu")).encode(pixels, grid)
    cuda = Glm5NextVisionTower(
        Artifact.open(path),
        CudaBackend(
            prefill_precision=precision,
            decode_precision="split" if precision == "float32" else "bf16",
        ),
    )
    got = host(cuda.encode(pixels, grid))
    assert got.shape == want.shape and np.isfinite(got).all()
    scale = float(np.abs(want).max())
    err = float(np.abs(got.astype(np.float64) - want).max())
    REPORT.append(
        (f"glm5_next/{pictures}-{precision}", "tower rows max|Δ| (rel)", f"{err / scale:.1e}")
    )
    tol = FLOAT32_TOL if precision == "float32" else BF16_TOL
    assert err <= tol * scale, f"max|Δ| {err:.3e} of max|row| {scale:.3e}"


def test_image_chat_greedy_tokens_equal_the_cpu_engine(
    converted: tuple[Path, Path],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NINFER_CUDA_PREFILL", "float32")
    monkeypatch.setenv("NINFER_CUDA_DECODE", "split")
    options: dict[str, Any] = dict(max_lanes=2, max_context=256, prefix_cache=True)
    engines = {
        "cpu": Engine(converted[1], **options),
        "cuda": Engine(converted[1], backend="cuda", kv_dtype="float32", **options),
    }
    assert engines["cuda"].vision is not None
    messages, images = chat("Look:", PICTURE, "what is in this picture?")
    got: dict[str, list[list[int]]] = {}
    for name, engine in engines.items():
        first = run(engine, GenerationRequest(messages=messages, images=images, sampling=GREEDY))[0]
        reply = engine.tokenizer.decode(first, skip_special_tokens=True)
        later = [*messages, {"role": "assistant", "content": reply},
                 {"role": "user", "content": "And its colour?"}]  # fmt: skip
        second, finished = run(
            engine, GenerationRequest(messages=later, images=images, sampling=GREEDY)
        )
        assert finished.usage.cached_tokens > 0  # resumed from the first turn, past the image
        got[name] = [first, second]
    REPORT.append(
        ("glm5_next/image chat", "greedy tokens cuda == cpu", str(got["cuda"] == got["cpu"]))
    )
    assert got["cuda"] == got["cpu"]
