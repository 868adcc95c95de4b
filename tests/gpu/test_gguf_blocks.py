"""A GGUF-block artifact on the CUDA backend (its ``gguf_*`` weights decoded to float32 at
load, the GDN output projection's stored columns put in place) against the CPU reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ninfer_format import Artifact
from ninfer_runtime.models import load_model
from ninfer_runtime.runner import ModelRunner

from .conftest import requires_gpu

pytestmark = requires_gpu


def test_gguf_block_artifact_answers_as_on_the_cpu(
    gpu_checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cupy as cp

    from ninfer_convert.pipeline import convert
    from tests.convert.test_gguf_import import build_gguf, config_only

    monkeypatch.setenv("NINFER_CUDA_PREFILL", "float32")  # comparable to float32 rounding
    build_gguf(gpu_checkpoints["dense"], tmp_path / "t.gguf", faithful=True)
    base = config_only(gpu_checkpoints["dense"], tmp_path / "base")
    out = tmp_path / "g.ninfer"
    convert("qwen3_8_27b_gguf", {"base": str(base), "gguf": str(tmp_path / "t.gguf")}, out)
    ids = np.random.default_rng(2).integers(0, 512, 40)
    logits = {}
    for name in ("cpu", "cuda"):
        runner = ModelRunner(load_model(Artifact.open(out), name))
        got = runner.forward([ids], [runner.new_state(41)]).logits[0]
        logits[name] = cp.asnumpy(got) if isinstance(got, cp.ndarray) else np.asarray(got)
    scale = float(np.abs(logits["cpu"]).max())
    assert float(np.abs(logits["cuda"] - logits["cpu"]).max()) < 2e-3 * max(1.0, scale)
