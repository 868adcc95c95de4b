"""GGUF-block artifacts on the CUDA backend against the CPU reference: a GGUF written by
``gguf``'s writer from the tiny dense and MoE checkpoints, converted with its blocks kept, runs
with every projection read in place (no float32 copy of any matrix; the GDN output
projection takes its activation in the stored column order), and answers as on the CPU: prompt
logits within float32 rounding, then 64 greedy steps with the same tokens (a step where the
reference's top two are within that bound is a tie, where comparing stops); and so does the
dense one with its q4_k objects tile packed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ninfer_format import Artifact
from ninfer_runtime.backends.cuda import tile_products, tiles, weights
from ninfer_runtime.models import load_model
from ninfer_runtime.runner import ModelRunner

from .conftest import REPORT, requires_gpu
from .test_backend import host

pytestmark = requires_gpu

RECIPES = {"dense": "qwen3_8_27b_gguf", "moe": "qwen3_6_35b_a3b_gguf"}
PROMPT, STEPS, TOL = 40, 64, 2e-3


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_gguf_block_artifact_answers_as_on_the_cpu(
    kind: str, gpu_checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    err, same = _answers_as_on_the_cpu(kind, gpu_checkpoints, tmp_path, monkeypatch, True)
    REPORT.append((f"gguf {kind}", "prompt logits max|Δ|", f"{err:.2e}"))
    REPORT.append((f"gguf {kind}", "identical greedy tokens", f"{same} of {STEPS}"))


def test_tile_packed_gguf_blocks_answer_as_on_the_cpu(
    gpu_checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dense GGUF with random Q4_K, Q5_K, Q6_K and IQ2_XXS down projections, tile packed
    as the loader packs objects of those types (at any size): their products and rows on
    the tile kernels."""
    monkeypatch.setattr(weights, "PACK_FROM_WEIGHTS", 0)
    calls = []
    product = tile_products.product
    monkeypatch.setattr(
        tile_products, "product", lambda *a, **k: calls.append(a[1].code) or product(*a, **k)
    )
    err, same = _answers_as_on_the_cpu("dense", gpu_checkpoints, tmp_path, monkeypatch, False)
    missing = {tiles.Q4_K, tiles.Q5_K, tiles.Q6_K, tiles.IQ2_XXS} - set(calls)
    assert not missing, f"codes with no product on the tile kernel: {sorted(missing)}"
    REPORT.append(("gguf dense, tiles", "prompt logits max|Δ|", f"{err:.2e}"))
    REPORT.append(("gguf dense, tiles", "identical greedy tokens", f"{same} of {STEPS}"))


def _answers_as_on_the_cpu(
    kind: str,
    checkpoints: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    faithful: bool,
) -> tuple[float, int]:
    """Prompt logits max|Δ| and greedy tokens identical of the GGUF-block artifact (``faithful``:
    every projection quantized from the checkpoint; else some random blocks) on the CPU
    and the GPU."""
    from ninfer_convert.pipeline import convert
    from tests.convert.test_gguf_import import build_gguf, config_only

    monkeypatch.setenv("NINFER_CUDA_PREFILL", "float32")  # comparable to float32 rounding

    monkeypatch.setenv("NINFER_CUDA_DECODE", "split")
    build_gguf(checkpoints[kind], tmp_path / "t.gguf", faithful=faithful)
    base = config_only(checkpoints[kind], tmp_path / "base")
    out = tmp_path / "g.ninfer"
    convert(RECIPES[kind], {"base": str(base), "gguf": str(tmp_path / "t.gguf")}, out)
    runners = {name: ModelRunner(load_model(Artifact.open(out), name)) for name in ("cpu", "cuda")}
    fallbacks = runners["cuda"].model.backend.residency.report.dense_fallbacks
    assert fallbacks == [], f"matrices copied as float32: {fallbacks}"
    ids = np.random.default_rng(2).integers(0, runners["cpu"].model.config.vocab, PROMPT)
    states = {name: r.new_state(PROMPT + STEPS + 1) for name, r in runners.items()}
    logits = {name: host(r.forward([ids], [states[name]]).logits[0]) for name, r in runners.items()}
    scale = float(np.abs(logits["cpu"]).max())
    err = float(np.abs(logits["cuda"] - logits["cpu"]).max())
    assert err < TOL * max(1.0, scale), err
    last = {name: v[-1] for name, v in logits.items()}
    same = 0
    for step in range(STEPS):
        t_cpu, t_gpu = int(np.argmax(last["cpu"])), int(np.argmax(last["cuda"]))
        if t_cpu != t_gpu:
            gap = float(last["cpu"][t_cpu] - last["cpu"][t_gpu])
            assert gap < TOL * max(1.0, scale), f"step {step}: cpu {t_cpu} cuda {t_gpu}"
            break
        same += 1
        for name, r in runners.items():
            last[name] = host(r.forward([np.array([t_cpu])], [states[name]]).logits[0])[0]
    return err, same
