"""Images through the engine and the CLI on a tiny random Qwen3.5 VLM (CPU backend).

Greedy generation with one and with two images of different sizes must give transformers'
``Qwen3_5ForConditionalGeneration.generate`` tokens (the reference in float32 on the
checkpoint rounded through bf16, what the bf16 recipe stores). Around that: the media cache
(a resent image skips the encoder), the prefix cache (a checkpoint with an image serves only
the same image), preemption, the refusals, and ``ninfer --image``.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from ninfer_runtime.cli import main as ninfer_cli
from ninfer_runtime.engine import (
    Engine,
    Finished,
    GenerationRequest,
    TokenEvent,
    VisionOptions,
)
from ninfer_runtime.errors import RequestError
from ninfer_runtime.frontend import SamplingParams
from ninfer_runtime.frontend.vision import ImageError, ImageProcessor, decode_image
from ninfer_runtime.media import ImageInput
from ninfer_runtime.media_cache import EncodedImage, MediaCache
from tests.runtime.test_fidelity import round_through_bf16
from tests.runtime.tiny_vlm import PROCESSOR, write_tiny_vlm

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def png(width: int, height: int, seed: int) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


#: 24×16 (6 tokens), 16×40 (10 tokens), and another 24×16 picture
CAT, TOWER, DOG = png(24, 16, 1), png(16, 40, 2), png(24, 16, 3)


def chat(*parts: str | bytes) -> tuple[list[dict[str, Any]], list[ImageInput]]:
    """One user message of text and images (bytes) in the order given."""
    content = [
        {"type": "image"} if isinstance(p, bytes) else {"type": "text", "text": p} for p in parts
    ]
    images = [ImageInput(p) for p in parts if isinstance(p, bytes)]
    return [{"role": "user", "content": content}], images


def request(*parts: str | bytes, sampling: SamplingParams = GREEDY) -> GenerationRequest:
    messages, images = chat(*parts)
    return GenerationRequest(messages=messages, images=images, sampling=sampling)


def run(engine: Engine, req: GenerationRequest) -> tuple[list[int], Finished]:
    tokens, finished = [], None
    for event in engine.generate(req):
        if isinstance(event, TokenEvent):
            tokens.append(event.token_id)
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None
    return tokens, finished


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, torch_threads: Any) -> Path:
    return write_tiny_vlm(tmp_path_factory.mktemp("tiny_vlm_engine"))


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path) -> Path:
    from ninfer_convert.pipeline import convert

    path = tmp_path_factory.mktemp("vlm_engine_art") / "vlm.ninfer"
    convert("qwen3_5_bf16", {"base": str(checkpoint)}, path)
    return path


@pytest.fixture(scope="module")
def engine(artifact: Path) -> Engine:
    """Without the prefix cache: every request prefills its whole prompt."""
    return Engine(artifact, max_lanes=2, max_context=256)


@pytest.fixture(scope="module")
def hf(checkpoint: Path) -> Any:
    from transformers import Qwen3_5ForConditionalGeneration

    model = Qwen3_5ForConditionalGeneration.from_pretrained(checkpoint, dtype="float32").eval()
    round_through_bf16(model)
    return model


def hf_greedy(
    hf: Any,
    engine: Engine,
    req: GenerationRequest,
    new: int,
    processor: ImageProcessor | None = None,
    token_types: bool = True,
) -> list[int]:
    """transformers' ``new`` greedy tokens after ``req``'s prompt as ``engine`` renders it, its
    images through ``processor`` (the tiny VLM's by default); ``token_types``: pass
    ``mm_token_type_ids`` (the image placeholders marked), which M-RoPE models read."""
    import torch

    ids, _ = engine.render(req)
    processor = processor or ImageProcessor.from_config(PROCESSOR)
    pixels, grid = processor.process([decode_image(image.data) for image in req.images])
    image_id = hf.config.image_token_id
    inputs: dict[str, Any] = {}
    if token_types:
        inputs["mm_token_type_ids"] = torch.tensor(
            [[int(t == image_id) for t in ids]], dtype=torch.int32
        )
    hf.model.rope_deltas = None
    with torch.no_grad():
        out = hf.generate(
            input_ids=torch.tensor([ids]),
            pixel_values=torch.from_numpy(pixels),
            image_grid_thw=torch.from_numpy(grid),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            **inputs,
        )
    return out[0, len(ids) :].tolist()


# ---------------------------------------------------------------------------- parity
@pytest.mark.parametrize(
    "parts",
    [("What is this?", CAT), (TOWER, "and", CAT, "compare them.")],
    ids=["one", "two"],
)
def test_greedy_equals_transformers_generate(engine, hf, parts) -> None:
    req = request(*parts)
    ids, _ = engine.render(req)
    pads = sum(t == hf.config.image_token_id for t in ids)
    assert pads == (6 if len(req.images) == 1 else 16)  # each image widened to its tokens
    tokens, finished = run(engine, req)
    assert tokens == hf_greedy(hf, engine, req, len(tokens))
    assert finished.usage.prompt_tokens == len(ids)  # image tokens count as prompt tokens
    assert finished.usage.images == len(req.images)


def test_the_image_decides_the_output(engine) -> None:
    """The parity above is not vacuous: another picture of the same size (the same prompt
    ids) gives other tokens."""
    assert (
        engine.render(request("What is this?", CAT))[0]
        == engine.render(request("What is this?", DOG))[0]
    )
    long = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    cat = run(engine, request("What is this?", CAT, sampling=long))[0]
    dog = run(engine, request("What is this?", DOG, sampling=long))[0]
    assert cat != dog


# ---------------------------------------------------------------------------- caches
def test_a_resent_image_is_a_media_and_prefix_cache_hit(artifact) -> None:
    engine = Engine(artifact, max_lanes=2, max_context=256, prefix_cache=True)
    first, done = run(engine, request("What is this?", CAT))
    assert done.usage.cached_images == 0 and done.usage.cached_tokens == 0
    assert engine.media_cache.stats.misses == 1
    again, done = run(engine, request("What is this?", CAT))
    assert again == first
    assert done.usage.cached_images == 1 and engine.media_cache.stats.hits == 1
    assert done.usage.cached_tokens == done.usage.prompt_tokens  # its own prompt's checkpoint
    # the same prompt ids with another picture: no checkpoint of the first serves it
    other, done = run(engine, request("What is this?", DOG))
    assert done.usage.cached_images == 0
    first_pad = engine.render(request("What is this?", DOG))[0].index(engine.vision.image_token_id)
    assert done.usage.cached_tokens <= first_pad
    assert (
        other
        == run(Engine(artifact, max_lanes=1, max_context=256), request("What is this?", DOG))[0]
    )


def test_the_next_chat_turn_resumes_after_the_image(artifact) -> None:
    """The second turn of a chat about a picture resends it: it resumes from the first
    turn's checkpoint where the history stops being resent (past the image), reads the rest
    at positions shifted by the image, and generates what a cold engine does."""
    messages, images = chat("What is this?", CAT)
    engine = Engine(artifact, max_lanes=1, max_context=256, prefix_cache=True)
    first = GenerationRequest(messages=messages, images=images, sampling=GREEDY)
    reply = engine.tokenizer.decode(run(engine, first)[0], skip_special_tokens=True)
    later = [*messages, {"role": "assistant", "content": reply},
             {"role": "user", "content": "And its colour?"}]  # fmt: skip
    second = GenerationRequest(messages=later, images=images, sampling=GREEDY)
    tokens, done = run(engine, second)
    pads = np.flatnonzero(np.asarray(engine.render(second)[0]) == engine.vision.image_token_id)
    assert pads[-1] < done.usage.cached_tokens < done.usage.prompt_tokens
    assert done.usage.cached_images == 1
    assert tokens == run(Engine(artifact, max_lanes=1, max_context=256), second)[0]


def test_a_new_image_is_decoded_and_processed_once(artifact, monkeypatch) -> None:
    """Render counts a new image's tokens from its processed pixels and keeps them for the
    submit's encode; where the store cannot keep them, the submit processes it again, with
    the same tokens out."""
    decodes = []
    real = decode_image

    def counted(data, **kw):
        decodes.append(len(data))
        return real(data, **kw)

    monkeypatch.setattr("ninfer_runtime.frontend.vision.decode_image", counted)
    engine = Engine(artifact, max_lanes=1, max_context=256, prefix_cache=True)
    tokens, _ = run(engine, request("What is this?", TOWER))
    assert decodes == [len(TOWER)]
    assert len(engine.vision.pending) == 0  # taken by the encode
    decodes.clear()
    bare = Engine(artifact, max_lanes=1, max_context=256)
    bare.vision.pending = MediaCache(capacity=0)
    assert run(bare, request("What is this?", TOWER))[0] == tokens
    assert decodes == [len(TOWER)] * 2


def test_the_media_cache_keeps_the_most_recent_within_its_bytes() -> None:
    rows = [np.full((4, 8), i, dtype=np.float32) for i in range(3)]  # 128 bytes each
    cache = MediaCache(capacity=300)
    for i, r in enumerate(rows):
        cache.put(str(i), EncodedImage((1, 4, 4), r))
    assert "0" not in cache and len(cache) == 2 and cache.bytes == 256
    assert cache.get("1").rows[0, 0] == 1 and cache.get("0") is None
    cache.put("3", EncodedImage((1, 4, 4), rows[0]))  # "2" is now the least recently used
    assert "2" not in cache and "1" in cache
    assert (cache.stats.hits, cache.stats.misses, cache.stats.evictions) == (1, 1, 2)
    MediaCache(capacity=0).put("x", EncodedImage((1, 4, 4), rows[0]))  # kept nowhere
    taken = cache.take("1")
    assert taken is not None and taken.rows[0, 0] == 1
    assert "1" not in cache and cache.bytes == 128 and cache.take("1") is None


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_preemption_keeps_greedy_output_with_images(artifact, engine, prefix_cache) -> None:
    """Three image requests whose generations need twice the pages the pool has: lanes
    are preempted and re-read their prompts (images placed again) and replay their tokens
    at shifted positions; every stream equals the one an unconstrained run gives."""
    sampling = SamplingParams(temperature=0.0, max_tokens=300, ignore_eos=True)
    requests = [
        request("What is this?", CAT, sampling=sampling),
        request(TOWER, "and", CAT, "compare them.", sampling=sampling),
        request("Describe", DOG, "briefly.", sampling=sampling),
    ]
    roomy = Engine(artifact, max_lanes=3, max_context=512)
    budget = roomy.pool.slots * roomy.pool.slot_bytes + 4 * roomy.pool.page_bytes
    small = Engine(
        artifact, max_lanes=3, max_context=512, context_capacity=budget, prefix_cache=prefix_cache
    )
    assert concurrent(small, requests) == concurrent(roomy, requests)
    assert small.preemptions > 0 and small.replayed_tokens > 0


def concurrent(engine: Engine, requests: list[GenerationRequest]) -> list[list[int]]:
    ids: dict[str, list[int]] = {}
    for r in requests:
        copy = GenerationRequest(messages=r.messages, images=r.images, sampling=r.sampling)
        ids[engine.submit(copy)] = []
    while engine.has_work:
        for e in engine.step():
            if isinstance(e, TokenEvent):
                ids[e.request_id].append(e.token_id)
    return list(ids.values())


# ---------------------------------------------------------------------------- refusals
def one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert text and "\n" not in text
    return text


def test_bad_images_and_limits_are_one_line_errors(artifact, engine) -> None:
    with pytest.raises(ImageError, match="not a PNG, JPEG, WebP or GIF") as error:
        engine.render(request("What is this?", CAT, b"GIF89a nothing more"))
    assert error.value.param == "images[1]" and error.value.code == "invalid_image"
    one_line(error)
    limited = Engine(
        artifact,
        max_context=256,
        vision=VisionOptions(max_images=1, max_image_tokens=8, max_image_pixels=700),
    )
    with pytest.raises(ImageError, match="2 images in the request; at most 1") as error:
        limited.render(request(CAT, CAT))
    one_line(error)
    with pytest.raises(ImageError, match="the images take 10 tokens; at most 8") as error:
        limited.render(request(TOWER))
    one_line(error)
    with pytest.raises(ImageError, match=r"32x32 \(1024 pixels\), more than the limit of 700"):
        limited.submit(request(png(32, 32, 0)), rendered=([1, 2], False))
    with pytest.raises(RequestError, match="the messages hold 2 image part"):
        engine.render(GenerationRequest(messages=chat(CAT, DOG)[0], images=[ImageInput(CAT)]))


def test_images_are_refused_where_they_cannot_run(artifact, engine, artifact_path) -> None:
    images = [ImageInput(CAT)]
    for req in (GenerationRequest(prompt="x", images=images),
                GenerationRequest(prompt_ids=[1, 2], images=images)):  # fmt: skip
        with pytest.raises(RequestError, match="images come with chat messages") as error:
            engine.submit(req)
        one_line(error)
    off = Engine(artifact, max_context=256, vision=VisionOptions(enabled=False))
    assert off.vision is None and off.media_cache is None
    with pytest.raises(RequestError, match="image input is turned off") as error:
        off.render(request("What is this?", CAT))
    one_line(error)
    text_only = Engine(artifact_path("qwen3_5_bf16", "dense"), max_context=256)
    with pytest.raises(RequestError, match="has no vision component") as error:
        text_only.render(request("What is this?", CAT))
    one_line(error)


# ---------------------------------------------------------------------------- CLI
def test_cli_image_flag(artifact, engine, tmp_path) -> None:
    (tmp_path / "tower.png").write_bytes(TOWER)
    (tmp_path / "cat.png").write_bytes(CAT)
    args = [str(artifact), "--prompt", "compare them.", "--greedy", "--max-tokens", "4"]
    args += ["--image", str(tmp_path / "tower.png"), "--image", str(tmp_path / "cat.png")]
    result = CliRunner().invoke(ninfer_cli, [*args, "--print-token-ids"])
    assert result.exit_code == 0, result.output
    ids = json.loads(result.stdout.strip().splitlines()[-1])
    sampling = SamplingParams.resolve(
        engine.tokenizer.generation_defaults, temperature=0.0, max_tokens=4
    )
    assert ids == run(engine, request(TOWER, CAT, "compare them.", sampling=sampling))[0]
    assert "2 images" in result.stderr
    (tmp_path / "bad.png").write_bytes(b"not an image")
    bad = CliRunner().invoke(ninfer_cli, [*args[:3], "--image", str(tmp_path / "bad.png")])
    assert bad.exit_code != 0
    assert "bad.png" in bad.stderr and "not a PNG" in bad.stderr
    raw = CliRunner().invoke(ninfer_cli, [*args[:3], "--raw", "--image", str(tmp_path / "cat.png")])
    assert raw.exit_code != 0 and "--image" in raw.stderr


def test_server_config_tables_give_the_engine_its_vision_options(tmp_path) -> None:
    from ninfer_serve.config import ConfigError, load_settings

    config = tmp_path / "ninfer.toml"
    config.write_text(
        "[server]\nmax_images_per_request = 3\n[vision]\nenabled = false\nmax_image_tokens = 99\n"
        '[media]\ncache_capacity = "1MiB"\n'
    )
    options = load_settings(config, {}).vision_options()
    assert options == VisionOptions(
        enabled=False, max_images=3, max_image_tokens=99, cache_capacity=1 << 20
    )
    config.write_text('[media]\ncache_capacity = "lots"\n')
    with pytest.raises(ConfigError, match=r"media\.cache_capacity: media cache capacity 'lots'"):
        load_settings(config, {})
