"""Images through the engine on a tiny random Qwen3.5 MoE VLM (CPU backend).

The MoE text model takes the vision tower's rows as the dense one does: greedy generation
with one image gives transformers' ``Qwen3_5MoeForConditionalGeneration.generate`` tokens
(the reference in float32 on the checkpoint rounded through bf16, what the bf16 recipe
stores).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ninfer_runtime.engine import Engine
from tests.runtime.test_engine_images import CAT, TOWER, hf_greedy, request, run
from tests.runtime.test_fidelity import round_through_bf16
from tests.runtime.tiny_vlm import write_tiny_vlm

EXPERTS = dict(
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=128,
    shared_expert_intermediate_size=128,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, torch_threads: Any) -> Path:
    return write_tiny_vlm(tmp_path_factory.mktemp("tiny_moe_vlm"), experts=EXPERTS)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path) -> Engine:
    from ninfer_convert.pipeline import convert

    path = tmp_path_factory.mktemp("moe_vlm_art") / "moe_vlm.ninfer"
    convert("qwen3_5_moe_bf16", {"base": str(checkpoint)}, path)
    return Engine(path, max_lanes=1, max_context=256)


@pytest.fixture(scope="module")
def hf(checkpoint: Path) -> Any:
    from transformers import Qwen3_5MoeForConditionalGeneration

    model = Qwen3_5MoeForConditionalGeneration.from_pretrained(checkpoint, dtype="float32")
    round_through_bf16(model.eval())
    return model


@pytest.mark.parametrize(
    "parts", [("What is this?", CAT), (TOWER, "and", CAT, "compare them.")], ids=["one", "two"]
)
def test_moe_greedy_with_images_equals_transformers_generate(engine, hf, parts) -> None:
    assert engine.model.config.moe is not None  # the routed-expert text model
    req = request(*parts)
    tokens, finished = run(engine, req)
    assert tokens == hf_greedy(hf, engine, req, len(tokens))
    assert finished.usage.images == len(req.images)
    assert finished.usage.prompt_tokens == len(engine.render(req)[0])
