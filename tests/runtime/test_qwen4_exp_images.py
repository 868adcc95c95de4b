"""Images for Qwen4Exp on the CPU backend: the tiny multimodal checkpoint
(``tests.tiny_qwen4_exp.build(multimodal=True)``) converted with ``qwen4_exp_bf16`` against
transformers' ``Qwen4ExpForConditionalGeneration`` on the same weights (bf16-rounded, GDN
``A_log`` / ``dt_bias`` fp32, as the recipe stores them).

* the prompt's logits with one image and with two of different sizes (the prompts run past the
  indexer's budget, so block keys rotate at M-RoPE positions and selection matters);
* the engine's greedy tokens for a chat with an image equal ``generate``'s (decode steps at
  their sequence index plus the prompt's ``rope_delta``; PLE hashes the placeholder ids);
* a chat's next turn resumes from the prefix cache past the image and generates what a cold
  engine does.

The indexer gets 16 heads, as in ``test_qwen4_exp_artifact``: with few heads blocks tie at zero
and which tied block ``torch.topk`` keeps is its own choice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_runtime.backends import get_backend
from ninfer_runtime.engine import Engine, GenerationRequest, TokenEvent
from ninfer_runtime.frontend import SamplingParams
from ninfer_runtime.frontend.vision import ImageProcessor, decode_image
from ninfer_runtime.media import ImageInput
from ninfer_runtime.models import load_model
from ninfer_runtime.models.qwen3_5.vision import VisionTower
from ninfer_runtime.multimodal import ImagePrompts
from ninfer_runtime.runner import ModelRunner
from tests.runtime.test_engine_images import hf_greedy, png, request, run
from tests.runtime.test_fidelity import round_through_bf16

tiny = pytest.importorskip("tests.tiny_qwen4_exp")
torch = pytest.importorskip("torch")

TOL = 1e-4
#: 48×32 (6 merged tokens) and 32×80 (10): the tiny tower merges 16×16-pixel blocks
WIDE, TALL = png(48, 32, 1), png(32, 80, 2)


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory, torch_threads: Any) -> tuple[Path, Path]:
    from ninfer_convert.pipeline import convert

    root = tmp_path_factory.mktemp("qwen4_exp_images")
    checkpoint = tiny.build(root / "vlm", multimodal=True, mtp=False, indexer_n_heads=16)
    convert("qwen4_exp_bf16", {"base": str(checkpoint)}, root / "vlm.ninfer")
    return checkpoint, root / "vlm.ninfer"


@pytest.fixture(scope="module")
def hf(converted: tuple[Path, Path]) -> Any:
    from transformers import Qwen4ExpForConditionalGeneration

    model = Qwen4ExpForConditionalGeneration.from_pretrained(converted[0], dtype=torch.float32)
    round_through_bf16(model)
    return model.eval()


def _pixels(images: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    processor = ImageProcessor.from_config(tiny.PROCESSOR)
    return processor.process([decode_image(image) for image in images])


def _prompt(hf: Any, images: list[bytes], grid: np.ndarray) -> np.ndarray:
    """Random text around each image's start, placeholders and end tokens."""
    c, rng = hf.config, np.random.default_rng(len(images))
    merge = tiny.VISION["spatial_merge_size"]
    ids = list(rng.integers(0, 300, 14))
    for t, h, w in grid.tolist():
        ids += [c.vision_start_token_id, *[c.image_token_id] * (t * h * w // merge**2)]
        ids += [c.vision_end_token_id, *rng.integers(0, 300, 12)]
    return np.asarray(ids, dtype=np.int64)


def _reference(hf: Any, ids: np.ndarray, pixels: np.ndarray, grid: np.ndarray) -> np.ndarray:
    hf.model.rope_deltas = None
    mm = torch.from_numpy((ids == hf.config.image_token_id).astype(np.int32))[None]
    with torch.no_grad():
        out = hf(
            input_ids=torch.from_numpy(ids)[None],
            pixel_values=torch.from_numpy(pixels),
            image_grid_thw=torch.from_numpy(grid),
            mm_token_type_ids=mm,
            use_cache=False,
        )
    return out.logits[0].numpy()


@pytest.mark.parametrize("images", [[WIDE], [TALL, WIDE]], ids=["one", "two"])
def test_logits_match_transformers(converted, hf, images) -> None:
    from ninfer_format import Artifact

    pixels, grid = _pixels(images)
    ids = _prompt(hf, images, grid)
    assert len(ids) > 2 * tiny.TEXT["indexer_budget"]  # past the budget: selection matters
    with Artifact.open(converted[1]) as artifact:
        backend = get_backend("cpu")
        runner = ModelRunner(load_model(artifact, backend=backend))
        prompts = ImagePrompts(runner, VisionTower(artifact, backend), hf.config.image_token_id)
    prompt = prompts.prepare(ids, pixels, grid)
    assert prompt.rope_delta < 0  # an image advances positions by its longer side only
    expected = _reference(hf, ids, pixels, grid)
    whole = prompts.prefill(prompt, runner.new_state(64)).logits[0]
    assert _relative(np.asarray(whole), expected) < TOL
    # in chunks of 16 (the last chunk's rows): index keys and RoPE rows kept across chunks
    chunked = prompts.prefill(prompt, runner.new_state(64), chunk=16).logits[0]
    assert _relative(np.asarray(chunked), expected[-len(chunked) :]) < TOL


def _relative(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def test_engine_greedy_equals_transformers_generate(converted, hf) -> None:
    engine = Engine(converted[1], max_lanes=2, max_context=256)
    req = request("Look:", WIDE, "what is in this picture?")
    ids, _ = engine.render(req)
    assert sum(t == hf.config.image_token_id for t in ids) == 6
    tokens = run(engine, req)[0]
    processor = ImageProcessor.from_config(tiny.PROCESSOR)
    assert tokens == hf_greedy(hf, engine, req, len(tokens), processor)


def test_the_next_chat_turn_resumes_after_the_image(converted) -> None:
    """The second turn resends the picture: it resumes from the first turn's checkpoint past
    the image (K/V, index keys with their RoPE rows, GDN and PLE states) and generates what a
    cold engine does."""
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hm?"}]}]
    images = [ImageInput(TALL)]
    warm = Engine(converted[1], max_lanes=1, max_context=256, prefix_cache=True)

    def run(engine: Engine, messages: list[dict[str, Any]]) -> tuple[list[int], Any]:
        req = GenerationRequest(messages=messages, images=images, sampling=greedy)
        events = list(engine.generate(req))
        return [e.token_id for e in events if isinstance(e, TokenEvent)], events[-1]

    reply = warm.tokenizer.decode(run(warm, messages)[0], skip_special_tokens=True)
    later = [*messages, {"role": "assistant", "content": reply}]
    later.append({"role": "user", "content": "And its colour, in a few words?"})
    tokens, done = run(warm, later)
    ids, _ = warm.render(GenerationRequest(messages=later, images=images, sampling=greedy))
    last_pad = np.flatnonzero(np.asarray(ids) == warm.vision.image_token_id)[-1]
    assert last_pad < done.usage.cached_tokens < done.usage.prompt_tokens
    assert tokens == run(Engine(converted[1], max_lanes=1, max_context=256), later)[0]
