"""Prompts with images (``ninfer_runtime.multimodal``) against transformers'
``Qwen3_5ForConditionalGeneration`` on a tiny random Qwen3.5 VLM.

The reference runs in float32 on the checkpoint rounded through bf16 (what the bf16 recipe
stores), so what remains is the math: the tower, the placement of its rows at the image
placeholders, the M-RoPE positions and the text layers. Tolerance: max |Δ| of the logits
within 1e-4 of max |reference| (a wrong position stream or a shifted image row costs 1e-2
and more). Text-only prompts must give exactly the plain path's numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_format import Artifact
from ninfer_runtime.backends import get_backend
from ninfer_runtime.errors import ModelError
from ninfer_runtime.models import load_model
from ninfer_runtime.models.qwen3_5.mrope import prompt_positions, rope_streams
from ninfer_runtime.models.qwen3_5.vision import VisionTower
from ninfer_runtime.multimodal import ImagePrompts
from ninfer_runtime.runner import ModelRunner
from tests.runtime.test_fidelity import round_through_bf16
from tests.runtime.test_vision_tower import VISION, pixels, randomize_vision, relative_error
from tests.tiny_checkpoints import COMMON, randomize

TOL = 1e-4
#: placeholder ids inside the tiny vocabulary (the real ones lie past it)
VISION_START, VISION_END, IMAGE, VIDEO = 500, 501, 502, 503
MERGE = VISION["spatial_merge_size"]
ONE_IMAGE = [[1, 4, 6]]  # 6 placeholders, 2 × 3 merged
TWO_IMAGES = [[1, 4, 6], [1, 8, 4]]  # 6 and 8 (4 × 2) placeholders


def image_prompt(grid: list[list[int]], seed: int = 0) -> np.ndarray:
    """Text, then for each image ``<vision_start> pad × merged <vision_end>`` and more text."""
    rng = np.random.default_rng(seed)
    parts = [rng.integers(0, VISION_START, 5)]
    for t, h, w in grid:
        pads = [IMAGE] * (t * h * w // MERGE**2)
        parts += [[VISION_START, *pads, VISION_END], rng.integers(0, VISION_START, 4)]
    return np.concatenate(parts).astype(np.int64)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, torch_threads: Any) -> Path:
    """A tiny VLM with random text and vision weights (far from flat logits)."""
    import torch
    import transformers as t

    torch.manual_seed(0)
    text = t.Qwen3_5TextConfig(intermediate_size=256, **COMMON)
    config = t.Qwen3_5Config(
        text_config=text.to_dict(),
        vision_config=t.Qwen3_5VisionConfig(**VISION),
        image_token_id=IMAGE,
        video_token_id=VIDEO,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
    )
    model = t.Qwen3_5ForConditionalGeneration(config)
    randomize(model)
    randomize_vision(model.model.visual)
    directory = tmp_path_factory.mktemp("tiny_vlm_prefill")
    model.eval().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def hf(checkpoint: Path) -> Any:
    from transformers import Qwen3_5ForConditionalGeneration

    model = Qwen3_5ForConditionalGeneration.from_pretrained(checkpoint, dtype="float32").eval()
    round_through_bf16(model)
    return model


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path) -> ImagePrompts:
    from ninfer_convert.pipeline import convert

    path = tmp_path_factory.mktemp("vlm_prefill_art") / "bf16.ninfer"
    convert("qwen3_5_bf16", {"base": str(checkpoint)}, path)
    with Artifact.open(path) as art:
        tower = VisionTower(art, get_backend("cpu"))
        runner = ModelRunner(load_model(art))
    return ImagePrompts(runner, tower, IMAGE)


def hf_inputs(ids: np.ndarray, grid: list[list[int]], seed: int) -> dict[str, Any]:
    import torch

    inputs: dict[str, Any] = {
        "input_ids": torch.as_tensor(ids)[None],
        "mm_token_type_ids": torch.as_tensor(ids == IMAGE, dtype=torch.int32)[None],
    }
    if grid:
        inputs["pixel_values"] = torch.from_numpy(pixels(grid, seed))
        inputs["image_grid_thw"] = torch.tensor(grid)
    return inputs


def hf_logits(hf: Any, ids: np.ndarray, grid: list[list[int]], seed: int) -> np.ndarray:
    import torch

    hf.model.rope_deltas = None  # a fresh prompt: positions from get_rope_index
    with torch.no_grad():
        return hf(**hf_inputs(ids, grid, seed)).logits[0].numpy()


def ours(prompts: ImagePrompts, ids: np.ndarray, grid: list[list[int]], seed: int, chunk: int):
    prompt = prompts.prepare(ids, pixels(grid, seed) if grid else None, np.array(grid))
    state = prompts.runner.new_state(64)
    return prompt, state, prompts.prefill(prompt, state, chunk=chunk)


# ---------------------------------------------------------------------------- parity
@pytest.mark.parametrize(
    ("grid", "chunk"),
    [(ONE_IMAGE, 512), (TWO_IMAGES, 512), (TWO_IMAGES, 7)],
    ids=["one", "two", "two-chunked"],
)
def test_prompt_logits_match_transformers(prompts, hf, grid, chunk) -> None:
    ids = image_prompt(grid, seed=len(grid))
    _, _, out = ours(prompts, ids, grid, seed=3, chunk=chunk)
    got = np.asarray(out.logits[0])  # the last chunk's rows
    assert relative_error(got, hf_logits(hf, ids, grid, seed=3)[-len(got) :]) < TOL


def test_images_change_the_logits(prompts, hf) -> None:
    """The parity above is not vacuous: other pixels, or the image's positions as plain
    text positions, move the reference far past the tolerance."""
    ids = image_prompt(ONE_IMAGE, seed=1)
    ref = hf_logits(hf, ids, ONE_IMAGE, seed=3)
    assert relative_error(hf_logits(hf, ids, ONE_IMAGE, seed=4), ref) > 100 * TOL
    prompt = prompts.prepare(ids, pixels(ONE_IMAGE, 3), np.array(ONE_IMAGE))
    state = prompts.runner.new_state(64)
    flat = prompts.runner.prefill(ids, state, embeddings=prompt.embeddings, positions=None)
    assert relative_error(np.asarray(flat.logits[0]), ref) > 100 * TOL


def test_text_only_prompt_equals_the_plain_path(prompts) -> None:
    ids = np.random.default_rng(5).integers(0, VISION_START, 12)
    prompt, _, out = ours(prompts, ids, [], seed=0, chunk=512)
    assert prompt.rope_delta == 0
    assert np.array_equal(prompt.positions, np.broadcast_to(np.arange(12), (3, 12)))
    plain = prompts.runner.prefill(ids, prompts.runner.new_state(64))
    assert np.array_equal(np.asarray(out.logits[0]), np.asarray(plain.logits[0]))


def test_greedy_continuation_matches_generate(prompts, hf) -> None:
    import torch

    ids, new = image_prompt(TWO_IMAGES, seed=2), 5
    prompt, state, out = ours(prompts, ids, TWO_IMAGES, seed=6, chunk=512)
    steps = [np.asarray(out.logits[0])[-1]]
    for _ in range(new - 1):
        out = prompts.extend([int(np.argmax(steps[-1]))], state, prompt.rope_delta)
        steps.append(np.asarray(out.logits[0])[-1])
    hf.model.rope_deltas = None
    with torch.no_grad():
        generated = hf.generate(
            **hf_inputs(ids, TWO_IMAGES, seed=6),
            max_new_tokens=new,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    assert generated.sequences[0, len(ids) :].tolist() == [int(np.argmax(s)) for s in steps]
    for got, ref in zip(steps, generated.logits, strict=True):  # positions past the prompt
        assert relative_error(got, ref[0].numpy()) < TOL


# ---------------------------------------------------------------------------- positions
def test_positions_equal_get_rope_index(hf) -> None:
    import torch

    grid = [[1, 4, 6], [2, 4, 4], [1, 8, 4]]  # a two-frame image advances by its sides only
    ids = image_prompt(grid, seed=7)
    positions, delta = prompt_positions(ids, np.array(grid), IMAGE, MERGE)
    ref, ref_delta = hf.model.get_rope_index(
        torch.as_tensor(ids)[None],
        mm_token_type_ids=torch.as_tensor(ids == IMAGE, dtype=torch.int32)[None],
        image_grid_thw=torch.tensor(grid),
    )
    assert np.array_equal(positions, ref[:, 0].numpy())
    assert delta == int(ref_delta) and delta < 0


def test_rope_streams_are_interleaved_as_transformers_recomposes_them(hf) -> None:
    import torch

    rotary = hf.model.language_model.rotary_emb
    pairs = rotary.inv_freq.shape[0]
    streams = rope_streams(rotary.mrope_section, pairs)
    assert streams.tolist() == [0, 1, 2, 0, 1, 2, 0, 0]  # mrope_section [4, 2, 2]
    codes = torch.arange(3, dtype=torch.float32)[:, None, None, None].expand(3, 1, 1, pairs)
    assert rotary.recomposition_frequencies(codes.clone())[0, 0, :pairs].tolist() == list(
        map(float, streams)
    )


def test_placeholders_that_do_not_fit_the_images_are_refused(prompts) -> None:
    ids = image_prompt(ONE_IMAGE)
    with pytest.raises(ModelError, match=r"1 run\(s\) of image placeholder tokens for 2"):
        prompts.prepare(ids, pixels(TWO_IMAGES), np.array(TWO_IMAGES))
    short = np.delete(ids, np.flatnonzero(ids == IMAGE)[0])
    with pytest.raises(ModelError, match=r"image 0 has 5 placeholder tokens; .* needs 6"):
        prompts.prepare(short, pixels(ONE_IMAGE), np.array(ONE_IMAGE))
