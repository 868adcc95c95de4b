"""litellm against a real server on the bundled model: ``text_completion`` through
/v1/completions (both of litellm's OpenAI-compatible routes to it) and ``completion`` through
/v1/chat/completions give the text the server gives the same greedy request directly."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .conftest import Server, start_server

# litellm fetches its model price list from the network when imported unless told to use the
# copy it ships; the server under test is the only thing these tests talk to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
litellm = pytest.importorskip(
    "litellm", reason="litellm is not installed (pip install litellm; .ci/run installs it)"
)

# litellm's own pydantic models warn about ReadOnly TypedDict items when first built
pytestmark = pytest.mark.filterwarnings("ignore:.*ReadOnly.*:UserWarning")

#: a raw prompt: its continuation (" is Paris.") is not what a chat request for it would answer
PROMPT = "The capital of France"
QUESTION = "What is the capital of France?"
#: any key: the server runs without --api-key, and litellm wants one for OpenAI routes
KEY = "sk-local"


@pytest.fixture(scope="module")
def server(artifact) -> Iterator[Server]:
    yield from start_server(artifact)


def served(server: Server, path: str, **body: Any) -> dict[str, Any]:
    response = httpx.post(f"{server.url}/v1/{path}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("provider", ["text-completion-openai", "openai"])
def test_text_completion_is_the_servers_completion(server, provider):
    greedy = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    direct = served(server, "completions", model=server.model, **greedy)["choices"][0]
    assert direct["text"]
    reply = litellm.text_completion(
        model=f"{provider}/{server.model}", api_base=f"{server.url}/v1", api_key=KEY, **greedy
    )
    (choice,) = reply.choices
    assert choice.text == direct["text"]
    assert choice.finish_reason == direct["finish_reason"]


def test_text_completion_of_several_prompts(server):
    prompts = [PROMPT, "Once upon a time"]
    greedy = {"max_tokens": 6, "temperature": 0}
    direct = served(server, "completions", model=server.model, prompt=prompts, **greedy)
    reply = litellm.text_completion(
        model=f"text-completion-openai/{server.model}",
        api_base=f"{server.url}/v1",
        api_key=KEY,
        prompt=prompts,
        **greedy,
    )
    texts = {c.index: c.text for c in reply.choices}
    assert texts == {c["index"]: c["text"] for c in direct["choices"]}
    assert len(set(texts.values())) == 2


def test_completion_is_the_servers_chat_completion(server):
    messages = [{"role": "user", "content": QUESTION}]
    greedy = {"messages": messages, "max_tokens": 24, "temperature": 0}
    direct = served(server, "chat/completions", model=server.model, **greedy)
    text = direct["choices"][0]["message"]["content"]
    assert text
    reply = litellm.completion(
        model=f"openai/{server.model}", api_base=f"{server.url}/v1", api_key=KEY, **greedy
    )
    assert reply.choices[0].message.content == text
    assert reply.usage.prompt_tokens == direct["usage"]["prompt_tokens"]
