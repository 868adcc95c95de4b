"""Images through a real server on a tiny random Qwen3.5 VLM, with the official SDKs: an
image request gives the engine's own greedy answer (called directly on the same artifact),
in Chat, Responses and Anthropic Messages alike; the same image again is a prefix- and
media-cache hit (``cached_tokens``, ``ninfer_media_cache_hits_total``); an image the engine
cannot take (truncated, a 100-megapixel header) is one 400 naming the client's field, and
the server goes on serving."""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import Server, generate_all, metric, start_server

QUESTION = "What is this?"


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The engine tests' tiny VLM (their tokenizer, vision config and image processor)."""
    import torch

    from ninfer_convert.pipeline import convert
    from tests.runtime.tiny_vlm import write_tiny_vlm

    torch.set_num_threads(2)
    directory = write_tiny_vlm(tmp_path_factory.mktemp("serve_vlm"))
    out = tmp_path_factory.mktemp("serve_vlm_art") / "vlm.ninfer"
    convert("qwen3_5_bf16", {"base": str(directory)}, out)
    return out


@pytest.fixture(scope="module")
def server(artifact: Path) -> Iterator[Server]:
    yield from start_server(artifact, "--max-context", "256", "--max-concurrency", "2")


@pytest.fixture(scope="module")
def engine(artifact: Path) -> Any:
    from ninfer_runtime.engine import Engine

    return Engine(artifact, max_lanes=1, max_context=256)


@pytest.fixture(scope="module")
def cat() -> bytes:
    from tests.runtime.test_engine_images import CAT

    return CAT


def direct(engine: Any, image: bytes, **sampling: Any) -> tuple[list[bytes], Any, Any]:
    """(each generated token's bytes, the parsed reply, its ``Finished``) of the engine
    called in process, sampling as the server resolves it (the model's defaults under the
    request's fields)."""
    from ninfer_runtime.engine import GenerationRequest
    from ninfer_runtime.frontend import SamplingParams
    from ninfer_runtime.media import ImageInput

    thinking = sampling.pop("enable_thinking", None)
    messages = [{"role": "user", "content": [{"type": "text", "text": QUESTION},
                                             {"type": "image"}]}]  # fmt: skip
    request = GenerationRequest(
        messages=messages,
        images=[ImageInput(image)],
        enable_thinking=thinking,
        sampling=SamplingParams.resolve(engine.tokenizer.generation_defaults, **sampling),
    )
    ids, parsed, finished = generate_all(engine, request)
    return [engine.tokenizer.token_bytes(i) for i in ids], parsed, finished


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


def openai_client(server: Server) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def chat(server: Server, image: bytes) -> Any:
    content = [
        {"type": "text", "text": QUESTION},
        {"type": "image_url", "image_url": {"url": data_url(image), "detail": "auto"}},
    ]
    return openai_client(server).chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": content}],
        temperature=0,
        max_tokens=6,
        logprobs=True,
        extra_body={"ignore_eos": True},
    )


def test_chat_gives_the_engine_answer_and_then_a_cached_prefix(server, engine, cat):
    tokens, parsed, finished = direct(engine, cat, temperature=0.0, max_tokens=6, ignore_eos=True)
    first = chat(server, cat)
    # every generated token, reasoning and markup included, is the engine's
    assert [bytes(entry.bytes) for entry in first.choices[0].logprobs.content] == tokens
    message = first.choices[0].message
    assert (message.content or "", message.reasoning_content or "") == (
        parsed.content, parsed.reasoning
    )  # fmt: skip
    assert first.usage.prompt_tokens == finished.usage.prompt_tokens  # image tokens included
    assert first.usage.completion_tokens == 6
    hits = metric(server.url, "ninfer_media_cache_hits_total")
    again = chat(server, cat)
    assert again.choices[0].message.content == message.content
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    assert metric(server.url, "ninfer_media_cache_hits_total") == hits + 1


def test_responses_and_anthropic_give_the_engine_answer(server, engine, cat):
    from anthropic import Anthropic

    _, parsed, _ = direct(engine, cat, temperature=0.0, max_tokens=6)
    content = [
        {"type": "input_text", "text": QUESTION},
        {"type": "input_image", "image_url": data_url(cat), "detail": "auto"},
    ]
    response = openai_client(server).responses.create(
        model=server.model,
        input=[{"role": "user", "content": content}],
        temperature=0,
        max_output_tokens=6,
    )
    assert response.output_text == parsed.content
    # the stored conversation keeps its image: the next turn's prompt holds it again
    follow = openai_client(server).responses.create(
        model=server.model, previous_response_id=response.id, input="And now?", max_output_tokens=2
    )
    assert follow.usage.input_tokens > response.usage.input_tokens
    assert follow.usage.input_tokens_details.cached_tokens > 0
    _, parsed, finished = direct(engine, cat, temperature=0.0, max_tokens=6, enable_thinking=False)
    client = Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(cat).decode()}
    blocks = [{"type": "text", "text": QUESTION}, {"type": "image", "source": source}]
    message = client.messages.create(
        model=server.model,
        max_tokens=6,
        messages=[{"role": "user", "content": blocks}],
        extra_body={"temperature": 0},  # this SDK version no longer takes it as an argument
    )
    text = "".join(block.text for block in message.content if block.type == "text")
    assert text == parsed.content
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == finished.usage.prompt_tokens
    counted = client.messages.count_tokens(
        model=server.model, messages=[{"role": "user", "content": blocks}]
    )
    assert counted.input_tokens == finished.usage.prompt_tokens  # the image's tokens counted


def png_chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


#: a valid PNG header declaring 10,000 × 10,000 pixels, with almost no data behind it
HUGE = (
    b"\x89PNG\r\n\x1a\n"
    + png_chunk(b"IHDR", struct.pack(">IIBBBBB", 10_000, 10_000, 8, 2, 0, 0, 0))
    + png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
    + png_chunk(b"IEND", b"")
)


@pytest.mark.parametrize("kind", ["truncated", "huge"])
def test_an_image_the_engine_refuses_is_one_400_naming_the_field(server, cat, kind):
    image = cat[: len(cat) // 2] if kind == "truncated" else HUGE
    body = {
        "model": server.model,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": QUESTION},
            {"type": "image_url", "image_url": {"url": data_url(image)}}]}],
    }  # fmt: skip
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_image"
    assert error["param"] == "messages[0].content[1].image_url.url"
    assert error["message"].startswith("messages[0].content[1].image_url.url: ")
    assert httpx.get(f"{server.url}/health", timeout=5).json() == {"status": "ok"}
    assert chat(server, cat).usage.completion_tokens == 6  # and it goes on serving


@pytest.fixture(scope="module")
def caching(artifact: Path) -> Any:
    """An engine with the prefix cache (cache boundaries are looked for only then)."""
    from ninfer_runtime.engine import Engine

    return Engine(artifact, max_lanes=1, max_context=256, prefix_cache=True)


MARK = {"type": "ephemeral"}


@pytest.mark.parametrize(
    ("marked", "before"),
    [
        # on the text after the image, the message's last block: after the message
        ([{"type": "image"}, {"type": "text", "text": QUESTION, "cache_control": MARK}], None),
        # on the image, a question after it: after the image
        ([{"type": "image", "cache_control": MARK}, {"type": "text", "text": QUESTION}],
         [{"type": "image"}]),
        # inside the message: after the text that follows the image
        ([{"type": "image"}, {"type": "text", "text": "Look.", "cache_control": MARK},
          {"type": "text", "text": QUESTION}],
         [{"type": "image"}, {"type": "text", "text": "Look."}]),
    ],
    ids=["after-message", "on-image", "inside-message"],
)  # fmt: skip
def test_an_anthropic_breakpoint_after_an_image_lands_at_the_widened_position(
    caching, cat, marked, before
):
    """``cache_control`` after an image marks a place whose position counts the image's
    tokens as the prompt does (a rendered prefix with one placeholder a picture would be no
    prefix of the prompt, and the mark would be lost)."""
    import asyncio
    from types import SimpleNamespace

    from ninfer_runtime.media import ImageInput
    from ninfer_serve.anthropic.messages import to_job
    from ninfer_serve.anthropic.models import MessagesRequest
    from ninfer_serve.cache_boundaries import _MARKER
    from ninfer_serve.generation import Generator

    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(cat).decode()}
    blocks = [dict(b, source=source) if b["type"] == "image" else b for b in marked]
    body = {"model": "m", "max_tokens": 2, "messages": [
        {"role": "user", "content": blocks},
        {"role": "assistant", "content": "A picture."},
        {"role": "user", "content": "And its colours?"}]}  # fmt: skip
    job = to_job(MessagesRequest.model_validate(body))
    gen = Generator(SimpleNamespace(engine=caching, check_available=lambda: None),
                    default_max_tokens=None, enable_thinking=None, keepalive=1.0)  # fmt: skip
    asyncio.run(gen.images.read(job.messages))
    request, prepared = gen.prepare(job)
    ids = prepared.ids
    found = [b.position for b in request.cache_boundaries if b.kind == "breakpoint"]
    # the conversation up to the place (``before`` None: the whole first message), rendered
    # and widened as the engine widens a prompt
    whole = before is None
    before = before or [{k: v for k, v in b.items() if k != "cache_control"} for b in marked]
    ending = [] if whole else [{"type": "text", "text": _MARKER}]
    cut = [{"role": "user", "content": [*before, *ending]}]
    text = caching.template.render(cut, add_generation_prompt=False, enable_thinking=False)
    plain = caching.tokenizer.encode(text if whole else text[: text.index(_MARKER)])
    widened = caching.vision.expand(plain, [ImageInput(cat)])
    assert len(widened) == len(plain) + 5  # one placeholder became the image's 6 tokens
    shared = next(i for i, (a, b) in enumerate(zip([*widened, -1], ids, strict=False)) if a != b)
    assert shared > widened.index(caching.vision.image_token_id) + 6  # past the image
    assert found == [shared]


def test_tokenize_counts_an_image_as_its_tokens(server, engine, cat):
    """``/tokenize`` of messages with an image renders them as chat does: the image's
    placeholder widened, so ``count`` is the chat request's ``prompt_tokens``."""
    _, _, finished = direct(engine, cat, temperature=0.0, max_tokens=1)
    content = [{"type": "text", "text": QUESTION},
               {"type": "image_url", "image_url": {"url": data_url(cat)}}]  # fmt: skip
    body = {"messages": [{"role": "user", "content": content}]}
    answer = httpx.post(f"{server.url}/tokenize", json=body, timeout=30).json()
    assert answer["count"] == len(answer["tokens"]) == finished.usage.prompt_tokens
    assert answer["tokens"].count(engine.vision.image_token_id) == 6
    refused = httpx.post(f"{server.url}/tokenize", json={**body, "add_special_tokens": True})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "add_special_tokens"
    bad = dict(content[1], image_url={"url": data_url(cat[:40])})
    broken = httpx.post(f"{server.url}/tokenize", json={"messages": [
        {"role": "user", "content": [content[0], bad]}]}, timeout=30)  # fmt: skip
    assert broken.status_code == 400
    assert broken.json()["error"]["param"] == "messages[0].content[1].image_url.url"
