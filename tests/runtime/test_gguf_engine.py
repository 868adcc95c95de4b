"""A GGUF-block artifact through the engine: a GGUF written with ``gguf``'s own writer from
the tiny dense checkpoint (the way llama.cpp lays a ``qwen35`` model out, every projection
Q8_0 from the checkpoint's weights), converted with its blocks kept, answers as the bf16
artifact of the same checkpoint does, to within Q8_0's error (about 1% of the largest logit
here; 36% with the stored columns taken as they lie).

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


@pytest.fixture(scope="module")
def gguf_artifact(checkpoints, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gguf_engine")
    build_gguf(checkpoints["dense"], root / "tiny.gguf", faithful=True)
    base = config_only(checkpoints["dense"], root / "base")
    out = root / "g.ninfer"
    convert("qwen3_8_27b_gguf", {"base": str(base), "gguf": str(root / "tiny.gguf")}, out)
    return out


def test_gguf_blocks_answer_as_the_float_artifact(gguf_artifact, artifact_path, monkeypatch):
    with Artifact.open(gguf_artifact) as art:
        tiled = [u.parameter for u in art.uses if "input_columns" in (u.auxiliaries or {})]
        assert tiled and all(art.input_columns(name) is not None for name in tiled)
    reference = _prompt_logits(artifact_path("qwen3_5_bf16", "dense"))
    scale = float(np.abs(reference).max())
    err = float(np.abs(_prompt_logits(gguf_artifact) - reference).max())
    assert err < 0.03 * scale, f"max |Δ| {err:.3g} of max |logit| {scale:.3g}"
    # the same weights with the stored columns taken as they lie: far off (what the test guards)
    monkeypatch.setattr(Artifact, "input_columns", lambda self, name: None)
    unplaced = float(np.abs(_prompt_logits(gguf_artifact) - reference).max())
    assert unplaced > 10 * err, (unplaced, err)


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
