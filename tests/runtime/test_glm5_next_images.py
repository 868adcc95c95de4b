"""Images for GLM5Next on the CPU backend: a tiny checkpoint (``tests.tiny_glm5_next`` with a
patch-4 tower, a tokenizer holding GLM's image tokens and the built-in GLM-5 chat template)
converted with ``glm5_next_bf16``, against transformers' ``Glm5NextForConditionalGeneration``
on the same weights (bf16-rounded, the fp32 vectors as they are).

* the image processor equals transformers' ``Glm5NextImageProcessorPil`` bit for bit (a canvas
  that pads, one that shrinks the image into a token budget, one that enlarges it);
* the prompt's logits with one image: max |Δ| within 1e-4 of max |reference| (the prompt runs
  past ``index_topk``, so the indexer's selection over image rows matters);
* the engine's greedy tokens for a chat with an image equal ``generate``'s.

The indexer gets 16 heads, as in ``test_glm5_next_artifact``: with few heads pools tie at zero
and which tied pool ``torch.topk`` keeps is its own choice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_runtime.backends import get_backend
from ninfer_runtime.engine import Engine
from ninfer_runtime.frontend.vision import ImageProcessor, decode_image
from ninfer_runtime.models import load_model
from ninfer_runtime.models.glm5_next.vision import Glm5NextVisionTower
from ninfer_runtime.models.vision_families import sequence_positions
from ninfer_runtime.multimodal import ImagePrompts
from ninfer_runtime.runner import ModelRunner
from tests.runtime.test_engine_images import hf_greedy, png, request, run

tiny = pytest.importorskip("tests.tiny_glm5_next")
torch = pytest.importorskip("torch")

TOL = 1e-4
OVERRIDES = {"index_n_heads": 16}
VISION: dict[str, Any] = dict(
    depth=2, hidden_size=32, num_heads=2, intermediate_size=48, patch_size=4,
    temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=tiny.TEXT["hidden_size"],
    projection_intermediate_size=64, swiglu_limit=2.0,
)  # fmt: skip
#: GLM's image specials, added on top of the tiny tokenizer (ids just below the vocabulary)
IMAGE_TOKENS = ("<|begin_of_image|>", "<|image|>", "<|end_of_image|>")
#: 50×30: padded to a 56×32 canvas (28 merged tokens, 8-pixel blocks)
PICTURE = png(50, 30, 1)
#: at most 12 merged tokens an image: a 50×30 picture shrinks into the budget
PROCESSOR = {**tiny.processor_config(VISION), "min_image_tokens": 4, "max_image_tokens": 12}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory, torch_threads: Any) -> tuple[Path, Path]:
    from tokenizers import Tokenizer

    from ninfer_runtime.frontend.chat_template import builtin_template_source

    root = tmp_path_factory.mktemp("glm5_next_images")
    checkpoint = root / "checkpoint"
    tiny.build_tiny_glm5_next(checkpoint, mtp=False, vision=VISION, **OVERRIDES)
    tiny.write_tokenizer(checkpoint, tiny.TEXT["vocab_size"] - len(IMAGE_TOKENS))
    tok = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    tok.add_special_tokens(list(IMAGE_TOKENS))
    tok.save(str(checkpoint / "tokenizer.json"))
    (checkpoint / "chat_template.jinja").write_text(builtin_template_source("glm5_chat.jinja"))
    (checkpoint / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    config = json.loads((checkpoint / "config.json").read_text())
    ids = {name: tok.token_to_id(name) for name in IMAGE_TOKENS}
    config["image_token_id"] = ids["<|image|>"]
    config["image_start_token_id"] = ids["<|begin_of_image|>"]
    config["image_end_token_id"] = ids["<|end_of_image|>"]
    (checkpoint / "config.json").write_text(json.dumps(config))
    tiny.convert("glm5_next_bf16", checkpoint, root / "tiny.ninfer")
    return checkpoint, root / "tiny.ninfer"


@pytest.fixture(scope="module")
def hf(converted: tuple[Path, Path]) -> Any:
    """transformers' model with the artifact's values: bf16-rounded but for the fp32 vectors."""
    from transformers import Glm5NextForConditionalGeneration

    model = Glm5NextForConditionalGeneration.from_pretrained(converted[0], dtype=torch.float32)
    model.config.text_config._attn_implementation = "eager"
    fp32 = ("A_log", "dt_bias", "hc.base", "hc.scale")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith(fp32):
                p.copy_(p.to(torch.bfloat16).float())
    return model.eval()


def _pixels(images: list[bytes], config: dict[str, Any] = PROCESSOR) -> tuple[Any, Any]:
    processor = ImageProcessor.from_config(config, sizing="tokens")
    return processor.process([decode_image(image) for image in images])


@pytest.mark.parametrize(
    ("size", "budget"),
    [
        ((50, 30), {}),
        ((50, 30), {"min_image_tokens": 4, "max_image_tokens": 12}),
        ((9, 6), {"min_image_tokens": 20}),
    ],
    ids=["padded", "shrunk", "enlarged"],
)
def test_processor_matches_transformers(size, budget) -> None:
    from transformers.models.glm5_next.image_processing_pil_glm5_next import (
        Glm5NextImageProcessorPil,
    )

    config = {**tiny.processor_config(VISION), **budget}
    image = decode_image(png(*size, 7))
    expected = Glm5NextImageProcessorPil(**config)(images=[image], return_tensors="np")
    pixels, grid = _pixels([png(*size, 7)], config)
    np.testing.assert_array_equal(grid, expected["image_grid_thw"])
    np.testing.assert_array_equal(pixels, expected["pixel_values"])


def _prompt(hf: Any, grid: np.ndarray) -> np.ndarray:
    """Random text, then the image between its start and end tokens, then more text."""
    c, rng = hf.config, np.random.default_rng(0)
    merge = VISION["spatial_merge_size"]
    count = int(np.prod(grid[0])) // merge**2
    ids = [*rng.integers(0, 300, 14), c.image_start_token_id, *[c.image_token_id] * count]
    ids += [c.image_end_token_id, *rng.integers(0, 300, 12)]
    return np.asarray(ids, dtype=np.int64)


def test_logits_match_transformers(converted, hf) -> None:
    from ninfer_format import Artifact

    pixels, grid = _pixels([PICTURE])
    ids = _prompt(hf, grid)
    assert len(ids) > 2 * tiny.TEXT["index_topk"]  # past the budget: selection matters
    with Artifact.open(converted[1]) as artifact:
        backend = get_backend("cpu")
        runner = ModelRunner(load_model(artifact, backend=backend))
        tower = Glm5NextVisionTower(artifact, backend)
    image_token = hf.config.image_token_id
    prompt = ImagePrompts(runner, tower, image_token, sequence_positions).prepare(ids, pixels, grid)
    assert prompt.rope_delta == 0
    with torch.no_grad():
        expected = (
            hf(
                input_ids=torch.from_numpy(ids)[None],
                pixel_values=torch.from_numpy(pixels),
                image_grid_thw=torch.from_numpy(grid),
                use_cache=False,
            )
            .logits[0]
            .numpy()
        )
    prompts = ImagePrompts(runner, tower, image_token, sequence_positions)
    ours = np.asarray(prompts.prefill(prompt, runner.new_state(64)).logits[0])
    assert np.abs(ours - expected).max() <= TOL * np.abs(expected).max()


def test_engine_greedy_equals_transformers_generate(converted, hf) -> None:
    engine = Engine(converted[1], max_lanes=2, max_context=256)
    assert engine.vision is not None
    req = request("Look:", PICTURE, "what is in this picture?")
    ids, _ = engine.render(req)
    assert sum(t == hf.config.image_token_id for t in ids) == 12
    tokens = run(engine, req)[0]
    processor = ImageProcessor.from_config(PROCESSOR, sizing="tokens")
    assert tokens == hf_greedy(hf, engine, req, len(tokens), processor, token_types=False)


def test_each_vision_family_states_its_backends(converted, monkeypatch) -> None:
    """Both families serve cuda (their GPU tests passed); a family that states only the CPU
    has a cuda engine refuse its images in one line."""
    import dataclasses

    from ninfer_format import Artifact
    from ninfer_runtime.images import VisionOptions, load_vision
    from ninfer_runtime.models import vision_families
    from ninfer_runtime.models.vision_families import GLM5_NEXT, QWEN3_5

    assert "cuda" in QWEN3_5.backends and "cuda" in GLM5_NEXT.backends
    cpu_only = dataclasses.replace(GLM5_NEXT, backends=("cpu",))
    monkeypatch.setitem(vision_families.FAMILY_OF, "glm5_next_vision", cpu_only)
    _, path = converted
    vision, refused = load_vision(
        Artifact.open(path),
        get_backend("cpu"),
        None,
        VisionOptions(),
        backend_name="cuda",
        tensor_parallel=1,
    )
    assert vision is None and refused == "image input for this model runs on cpu, not cuda"
