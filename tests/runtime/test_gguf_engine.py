"""A GGUF-block artifact through the engine: a GGUF written with ``gguf``'s own writer from
the tiny dense and MoE checkpoints (the way llama.cpp lays a ``qwen35`` / ``qwen35moe``
model out, every projection Q8_0 from the checkpoint's weights, the experts in rank-3
banks), converted with its blocks kept (with the base directory, or alone from its metadata),
answers as the bf16 artifact of the same checkpoint does, to within Q8_0's error (about 1%
of the largest logit on a typical row; 30-40% with the stored columns taken as they lie).

The GDN output projection keeps llama.cpp's tiled input columns, with an ``input_columns``
map on its use; the model must compute with them put in place.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ninfer_convert.pipeline import convert
from ninfer_format import Artifact
from ninfer_runtime.models import load_model
from ninfer_runtime.runner import ModelRunner
from tests.convert.test_gguf_import import build_gguf, config_only

PROMPT = 40


def _prompt_logits(path: Path) -> np.ndarray:
    runner = ModelRunner(load_model(Artifact.open(path), "cpu"))
    ids = np.random.default_rng(5).integers(0, runner.model.config.vocab, PROMPT)
    state = runner.new_state(PROMPT + 1)
    return np.asarray(runner.forward([ids], [state]).logits[0], dtype=np.float64)


#: per kind: the GGUF recipe, and the bf16 recipe of the same checkpoint
RECIPES = {
    "dense": ("qwen3_8_27b_gguf", "qwen3_5_bf16"),
    "moe": ("qwen3_6_35b_a3b_gguf", "qwen3_5_moe_bf16"),
}


def _gguf_artifact(checkpoint: Path, root: Path, kind: str, alone: bool) -> Path:
    """The GGUF of ``checkpoint`` converted with its blocks kept: with the checkpoint's base
    directory, or (``alone``) from the file and its metadata only."""
    from tests.convert.test_gguf_lone import metadata

    path = build_gguf(
        checkpoint, root / "tiny.gguf", faithful=True, extra=metadata(checkpoint)
    ).path
    out = root / "g.ninfer"
    specs = {"base": str(path)}
    if not alone:
        specs = {"base": str(config_only(checkpoint, root / "base")), "gguf": str(path)}
    convert(RECIPES[kind][0], specs, out)
    return out


@pytest.mark.parametrize(("kind", "alone"), [("dense", False), ("moe", False), ("moe", True)])
def test_gguf_blocks_answer_as_the_float_artifact(
    kind, alone, checkpoints, artifact_path, tmp_path, monkeypatch
):
    gguf_artifact = _gguf_artifact(checkpoints[kind], tmp_path, kind, alone)
    with Artifact.open(gguf_artifact) as art:
        tiled = [u.parameter for u in art.uses if "input_columns" in (u.auxiliaries or {})]
        assert tiled and all(art.input_columns(name) is not None for name in tiled)
    reference = _prompt_logits(artifact_path(RECIPES[kind][1], kind))
    scale = float(np.abs(reference).max())

    def row_errors() -> np.ndarray:  # each prompt row's max |Δ logit|
        return np.abs(_prompt_logits(gguf_artifact) - reference).max(axis=-1)

    # Q8_0's error: ~1% of the largest logit on a typical row; the MoE's top-2 of 4 experts
    # can flip on a near tie, which moves a few rows further
    rows = row_errors()
    assert np.median(rows) < 0.015 * scale and rows.max() < 0.1 * scale, (rows, scale)
    # the same weights with the stored columns taken as they lie: far off (what the test guards)
    monkeypatch.setattr(Artifact, "input_columns", lambda self, name: None)
    assert np.median(row_errors()) > 10 * np.median(rows)


def test_an_auxiliary_the_runtime_does_not_apply_is_refused() -> None:
    from types import SimpleNamespace

    from ninfer_runtime.errors import ModelError
    from ninfer_runtime.models.registry import check_auxiliaries

    def artifact(*roles: str) -> SimpleNamespace:
        use = SimpleNamespace(parameter="w", input="x", auxiliaries=dict.fromkeys(roles, None))
        return SimpleNamespace(uses=[use])

    check_auxiliaries(artifact("input_columns", "activation_input_divisor"))
    with pytest.raises(ModelError, match="use of 'w' at 'x': auxiliary 'hadamard_signs' is not"):
        check_auxiliaries(artifact("input_columns", "hadamard_signs"))


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_the_cuda_backend_reads_every_gguf_matrix_in_place(kind, checkpoints, tmp_path):
    """Every parameter bound to ``gguf_*`` blocks plans as rows of resident objects (the
    experts' rank-3 banks as their rows, the GDN output projection with its stored column
    order), so the CUDA backend keeps no float32 copy of any of them."""
    from ninfer_format.codecs.gguf_blocks import LAYOUT
    from ninfer_runtime.backends.cuda.weights import plan_segments

    path = _gguf_artifact(checkpoints[kind], tmp_path, kind, alone=False)
    with Artifact.open(path) as art:
        report = art.binder_report.parameters
        in_gguf = {
            name
            for name, binding in art.bindings.items()
            if name in report
            and any(art.objects[oid].layout == LAYOUT for oid in _objects(binding))
        }
        assert any("experts" in name for name in in_gguf) == (kind == "moe")
        unplanned = sorted(name for name in in_gguf if plan_segments(art, name) is None)
        assert unplanned == []
        tiled = [u.parameter for u in art.uses if "input_columns" in (u.auxiliaries or {})]
        assert tiled and set(tiled) <= in_gguf


def _objects(binding) -> list[str]:
    parts = getattr(binding, "parts", None)
    return [p.object for p in parts] if parts is not None else [binding.object]
