"""POST /tokenize and /detokenize against a real server (with an API key) on the bundled model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from .conftest import Server, start_server

KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}
CONVERSATION = [{"role": "user", "content": "What is the capital of France?"}]
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
AUDIO, AUDIO_TYPE = {"type": "input_audio"}, "messages[0].content[0].type"


@pytest.fixture(scope="module")
def server(artifact) -> Iterator[Server]:
    yield from start_server(artifact, "--max-context", "384", "--api-key", KEY)


def post(server: Server, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=AUTH, timeout=30)


def ok(server: Server, path: str, **body: Any) -> dict[str, Any]:
    response = post(server, path, body)
    assert response.status_code == 200, response.text
    return response.json()


def test_round_trip(server):
    text = "Hello world, ça va? 東京"
    answer = ok(server, "/tokenize", prompt=text, return_token_strs=True)
    assert answer["count"] == len(answer["tokens"]) > 3
    assert answer["max_model_len"] == 384
    assert len(answer["token_strs"]) == answer["count"] and answer["token_strs"][0] == "Hello"
    assert ok(server, "/detokenize", tokens=answer["tokens"]) == {"prompt": text}
    assert ok(server, "/tokenize", prompt=text)["token_strs"] is None
    assert ok(server, "/detokenize", tokens=[]) == {"prompt": ""}


def test_a_prompt_is_what_completions_reads(server):
    text = "The capital of France"
    tokens = ok(server, "/tokenize", prompt=text)["tokens"]
    plain = ok(server, "/tokenize", prompt=text, add_special_tokens=False)["tokens"]
    assert plain == tokens  # the bundled tokenizer adds no special tokens
    reply = ok(server, "/v1/completions", prompt=text, max_tokens=1)
    assert reply["usage"]["prompt_tokens"] == len(tokens)


def test_messages_are_what_chat_renders(server):
    answer = ok(server, "/tokenize", messages=CONVERSATION)
    chat = ok(server, "/v1/chat/completions", messages=CONVERSATION, max_tokens=1)
    assert answer["count"] == chat["usage"]["prompt_tokens"]
    # without the assistant turn's opening: a prefix of it
    bare = ok(server, "/tokenize", messages=CONVERSATION, add_generation_prompt=False)["tokens"]
    assert len(bare) < answer["count"] and answer["tokens"][: len(bare)] == bare
    text = ok(server, "/detokenize", tokens=answer["tokens"])["prompt"]
    assert text.startswith("<|im_start|>user\nWhat is the capital of France?")
    # continuing a final assistant message leaves it open
    prefill = [*CONVERSATION, {"role": "assistant", "content": "It is"}]
    cont = ok(server, "/tokenize", messages=prefill, continue_final_message=True)["tokens"]
    assert ok(server, "/detokenize", tokens=cont)["prompt"].endswith("It is")
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    with_tools = ok(server, "/tokenize", messages=CONVERSATION, tools=[tool])
    assert with_tools["count"] > answer["count"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": CONVERSATION}, "prompt"),
        ("/tokenize", {"prompt": "a", "add_generation_prompt": True}, "add_generation_prompt"),
        ("/tokenize", {"prompt": "a", "tools": []}, "tools"),
        (
            "/tokenize",
            {
                "messages": CONVERSATION,
                "add_generation_prompt": True,
                "continue_final_message": True,
            },
            "continue_final_message",
        ),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
        ("/tokenize", {"messages": []}, "messages"),
        (
            "/tokenize",
            {"messages": CONVERSATION, "chat_template_kwargs": {str(i): i for i in range(33)}},
            "chat_template_kwargs",
        ),
        ("/tokenize", {"prompt": "a", "extra": 1}, "extra"),
        # an image on a model without a vision tower, as Chat refuses it; other media
        ("/tokenize", {"messages": [{"role": "user", "content": [IMAGE]}]}, "messages"),
        ("/tokenize", {"messages": [{"role": "user", "content": [AUDIO]}]}, AUDIO_TYPE),
        ("/tokenize", {"prompt": "a", "model": "other"}, "model"),
        ("/detokenize", {"tokens": [1, 10**6]}, "tokens"),
        ("/detokenize", {}, "tokens"),
        ("/detokenize", {"tokens": "1 2"}, "tokens"),
    ],
)
def test_malformed_requests_are_refused_in_openais_shape(server, path, body, param):
    response = post(server, path, body)
    assert response.status_code == (404 if param == "model" else 400), response.text
    error = response.json()["error"]
    assert error["code"] and error["type"] == "invalid_request_error"
    assert error["param"] == param and "\n" not in error["message"]


def test_out_of_vocabulary_ids_name_the_position(server):
    response = post(server, "/detokenize", {"tokens": [1, 2, 10**6]})
    assert response.status_code == 400
    assert "tokens[2]" in response.json()["error"]["message"]
    negative = post(server, "/detokenize", {"tokens": [1, -1]})
    assert negative.status_code == 400 and negative.json()["error"]["param"].startswith("tokens")


def test_an_api_key_is_needed(server):
    for path in ("/tokenize", "/detokenize"):
        response = httpx.post(f"{server.url}{path}", json={"prompt": "a"}, timeout=10)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"


def test_add_special_tokens_lets_the_post_processor_add_its_tokens():
    """A tokenizer whose post-processor adds a BOS (the bundled one adds none): a prompt gets
    it by default, messages only when asked."""
    from tokenizers import Tokenizer as Backend
    from tokenizers.processors import TemplateProcessing

    from ninfer_runtime.frontend.tokenizer import Tokenizer
    from ninfer_serve.openai.tokenize import TokenizeRequest, _encode

    from .conftest import BUNDLED

    backend = Backend.from_file(str(BUNDLED / "tokenizer.json"))
    config = json.loads((BUNDLED / "tokenizer_config.json").read_text())
    bos = backend.token_to_id("<|im_start|>")
    backend.post_processor = TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", bos)]
    )
    tokenizer = Tokenizer(backend, tokenizer_config=config)
    template = SimpleNamespace(render=lambda messages, **kwargs: messages[0]["content"])
    generator = SimpleNamespace(
        engine=SimpleNamespace(tokenizer=tokenizer, template=template),
        thinking=lambda given, kwargs: given,
    )

    def encode(**body: Any) -> list[int]:
        return _encode(generator, TokenizeRequest.model_validate(body))  # type: ignore[arg-type]

    plain = tokenizer.encode("hello")
    assert encode(prompt="hello") == [bos, *plain]
    assert encode(prompt="hello", add_special_tokens=False) == plain
    message = [{"role": "user", "content": "hello"}]
    assert encode(messages=message) == plain
    assert encode(messages=message, add_special_tokens=True) == [bos, *plain]


# -- every field of the request models -----------------------------------------------------------
#
# Each field has an entry: ``Served`` (setting it to ``value`` on ``base`` changes the reply) or
# ``Refused`` (a 4xx naming it); ``add_special_tokens`` has no effect with the bundled tokenizer
# and is checked on one that has a post-processor above.

PROMPT = {"prompt": "Hello world"}
CHAT = {"messages": CONVERSATION}
PREFILL = {"messages": [*CONVERSATION, {"role": "assistant", "content": "It is"}]}
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


@dataclass(frozen=True)
class Served:
    base: dict[str, Any]
    value: Any


@dataclass(frozen=True)
class Refused:
    base: dict[str, Any]
    value: Any
    status: int = 400


WALK: dict[str, dict[str, Served | Refused | None]] = {
    "/tokenize": {
        "model": Refused(PROMPT, "another-model", status=404),
        "prompt": Served(PROMPT, "Goodbye"),
        "messages": Served(CHAT, [{"role": "user", "content": "Hi"}]),
        "add_special_tokens": None,  # test_add_special_tokens_lets_the_post_processor_add_...
        "add_generation_prompt": Served(CHAT, False),
        "continue_final_message": Served(PREFILL, True),
        "tools": Served(CHAT, [TOOL]),
        "chat_template_kwargs": Served(CHAT, {"enable_thinking": False}),
        "return_token_strs": Served(PROMPT, True),
    },
    "/detokenize": {
        "model": Refused({"tokens": [1]}, "another-model", status=404),
        "tokens": Served({"tokens": [1]}, [2, 3]),
    },
}


def test_every_field_has_an_entry():
    from ninfer_serve.openai.tokenize import DetokenizeRequest, TokenizeRequest

    assert set(TokenizeRequest.model_fields) == set(WALK["/tokenize"])
    assert set(DetokenizeRequest.model_fields) == set(WALK["/detokenize"])


@pytest.mark.parametrize(
    ("path", "name"),
    [(path, name) for path, table in WALK.items() for name, entry in table.items() if entry],
)
def test_a_field_changes_the_result_or_is_refused(server, path, name):
    entry = WALK[path][name]
    assert entry is not None
    response = post(server, path, {**entry.base, name: entry.value})
    if isinstance(entry, Refused):
        assert response.status_code == entry.status, response.text
        assert response.json()["error"]["param"] == name
        return
    assert response.status_code == 200, response.text
    assert response.json() != ok(server, path, **entry.base)
