"""Log-probabilities and ``n`` samples on Chat Completions and Responses, through the official
``openai`` SDK against real servers (the bundled model, with and without MTP speculation).

The bundled model is nearly certain of its few answers, so greedy tokens are their rows' most
likely ones; sampling at temperature 1 still picks different first tokens for prompts it is
less sure of (``UNSURE``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from tokenizers import Tokenizer as Backend

from ninfer_runtime.frontend.tokenizer import Tokenizer
from ninfer_serve.openai.logprobs import chat_logprobs, completion_logprobs
from ninfer_serve.samples import sample_seed

from .conftest import BUNDLED, Server, metric, start_server, wait_for

QUESTION = [{"role": "user", "content": "What is the capital of Italy?"}]
ANSWER = "The capital of Italy is Rome."
#: a prompt whose first answer token is uncertain (about 0.7 / 0.27 for the two most likely)
UNSURE = [{"role": "user", "content": "x"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
LANES = 4


@pytest.fixture(scope="module")
def server(artifact) -> Iterator[Server]:
    yield from start_server(artifact, "--max-concurrency", str(LANES))


@pytest.fixture(scope="module")
def spec_server(artifact) -> Iterator[Server]:
    yield from start_server(artifact, "--spec", "mtp", "--draft-tokens", "2")


def client_for(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def greedy(server: Server, **extra: Any) -> Any:
    return client_for(server).chat.completions.create(
        model=server.model,
        messages=QUESTION,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
        extra_body=NO_THINKING,
        **extra,
    )


def joined(entries: list[Any]) -> bytes:
    return b"".join(bytes(e.bytes) for e in entries)


def test_greedy_tokens_are_their_rows_best(server):
    reply = greedy(server)
    choice = reply.choices[0]
    assert choice.message.content == ANSWER
    entries = choice.logprobs.content
    assert len(entries) == reply.usage.completion_tokens
    for entry in entries:
        assert len(entry.top_logprobs) == 5
        best = entry.top_logprobs[0]
        assert (best.token, best.bytes, best.logprob) == (entry.token, entry.bytes, entry.logprob)
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and values[0] <= 0
        assert sum(2.718281828**v for v in values) <= 1 + 1e-5
    assert joined(entries).decode() == ANSWER


def test_streamed_chunks_carry_their_deltas_tokens(server):
    plain = greedy(server).choices[0].logprobs.content
    stream = greedy(server, stream=True)
    streamed = []
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:  # each delta's text is its tokens' bytes
                assert joined(choice.logprobs.content).decode() == choice.delta.content
            if choice.logprobs is not None:
                streamed += choice.logprobs.content
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in plain]


def test_reasoning_tokens_are_listed_too(server):
    """With thinking on, the list holds every generated token: the reasoning and its closing
    tag, then the answer (vLLM's choice)."""
    reply = client_for(server).chat.completions.create(
        model=server.model, messages=QUESTION, temperature=0, logprobs=True
    )
    choice = reply.choices[0]
    text = joined(choice.logprobs.content)
    assert b"</think>" in text and text.endswith(ANSWER.encode())
    assert len(choice.logprobs.content) == reply.usage.completion_tokens
    assert all(e.top_logprobs == [] for e in choice.logprobs.content)


def test_speculation_scores_the_same(server, spec_server):
    plain = greedy(server).choices[0].logprobs.content
    reply = greedy(spec_server)
    drafted = reply.usage.completion_tokens_details
    assert drafted.accepted_prediction_tokens + drafted.rejected_prediction_tokens > 0
    spec = reply.choices[0].logprobs.content
    assert [e.token for e in spec] == [e.token for e in plain]
    for a, b in zip(spec, plain, strict=True):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-5)
        assert [t.token for t in a.top_logprobs] == [t.token for t in b.top_logprobs]
        for x, y in zip(a.top_logprobs, b.top_logprobs, strict=True):
            assert x.logprob == pytest.approx(y.logprob, abs=1e-5)


def sampled(server: Server, n: int, seed: int, **extra: Any) -> Any:
    return client_for(server).chat.completions.create(
        model=server.model,
        messages=UNSURE,
        temperature=1,
        seed=seed,
        n=n,
        max_tokens=6,
        extra_body=NO_THINKING,
        **extra,
    )


def test_seeded_samples_are_reproducible_and_differ(server):
    before = metric(server.url, "vllm:prefix_cache_hits_total")
    first = sampled(server, 3, seed=11)
    hits = metric(server.url, "vllm:prefix_cache_hits_total") - before
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert len(set(texts)) > 1
    # samples 1 and 2 resumed from the checkpoint sample 0's prefill left
    assert hits >= 2 * first.usage.prompt_tokens
    again = sampled(server, 3, seed=11)
    assert [c.message.content for c in again.choices] == texts
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens
    # each sample is the request alone with its derived seed; the usage adds theirs up
    generated = 0
    for i, text in enumerate(texts):
        alone = sampled(server, 1, seed=sample_seed(11, i))
        assert alone.choices[0].message.content == text
        generated += alone.usage.completion_tokens
    assert first.usage.completion_tokens == generated
    assert first.usage.prompt_tokens == alone.usage.prompt_tokens


def test_streamed_samples_carry_their_index(server):
    plain = sampled(server, 3, seed=11, logprobs=True)
    texts, tokens = ["", "", ""], [[], [], []]
    finished = set()
    for chunk in sampled(server, 3, seed=11, logprobs=True, stream=True):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            tokens[choice.index] += choice.logprobs.content if choice.logprobs else []
            if choice.finish_reason is not None:
                finished.add(choice.index)
    assert finished == {0, 1, 2}
    assert texts == [c.message.content for c in plain.choices]
    for i, choice in enumerate(plain.choices):
        assert [e.token for e in tokens[i]] == [e.token for e in choice.logprobs.content]


def test_leaving_stops_every_sample(server):
    """A client that leaves a streamed n > 1 request frees every sample's lane at once."""
    body = {
        "model": server.model,
        "messages": UNSURE,
        "n": 3,
        "max_tokens": 3000,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as r:
        indexes = set()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                indexes |= {c["index"] for c in json.loads(line[6:])["choices"]}
            if len(indexes) == 3:
                assert metric(server.url, "ninfer_requests_running") == 3
                break  # closes the stream
    assert wait_for(lambda: metric(server.url, "ninfer_requests_running") == 0, timeout=10)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"n": LANES + 1}, "n"),
        ({"best_of": 2}, "best_of"),
        ({"use_beam_search": True}, "use_beam_search"),
    ],
)
def test_refused_in_one_line(server, fields, param):
    body = {"model": server.model, "messages": QUESTION, **fields}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert param in error["message"] and "\n" not in error["message"]
    if error["param"] is not None:
        assert error["param"] == param


def test_responses_output_text_logprobs(server):
    client = client_for(server)
    args = {
        "model": server.model,
        "input": "What is the capital of Italy?",
        "temperature": 0,
        "reasoning": {"effort": "none"},
        "top_logprobs": 3,
        "include": ["message.output_text.logprobs"],
    }
    reply = client.responses.create(**args)
    (message,) = [item for item in reply.output if item.type == "message"]
    part = message.content[0]
    assert part.text == ANSWER
    assert joined(part.logprobs).decode() == ANSWER
    assert all(len(e.top_logprobs) == 3 for e in part.logprobs)
    chat = greedy(server).choices[0].logprobs.content
    assert [e.logprob for e in part.logprobs] == [e.logprob for e in chat]
    deltas, done = [], None
    for event in client.responses.create(**args, stream=True):
        if event.type == "response.output_text.delta":
            assert "".join(e.token for e in event.logprobs) == event.delta
            deltas += event.logprobs
        elif event.type == "response.output_text.done":
            done = event.logprobs
    assert [e.token for e in deltas] == [e.token for e in done] == [e.token for e in part.logprobs]
    refused = httpx.post(
        f"{server.url}/v1/responses",
        json={"model": server.model, "input": "hi", "top_logprobs": 2},
        timeout=30,
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "top_logprobs"


def bundled_tokenizer() -> Tokenizer:
    config = json.loads((BUNDLED / "tokenizer_config.json").read_text())
    backend = Backend.from_file(str(Path(BUNDLED) / "tokenizer.json"))
    return Tokenizer(backend, tokenizer_config=config)


def test_tokens_that_split_a_character():
    """The bundled vocabulary writes each byte of a multi-byte character as its own token:
    such a token reads U+FFFD and its bytes are exact, and the bytes join to the text."""
    tokenizer = bundled_tokenizer()
    text = "héllo 😀"
    ids = tokenizer.encode(text)
    items = [(t, -0.5, ((t, -0.5),)) for t in ids]
    entries = chat_logprobs(tokenizer, items)["content"]
    assert b"".join(bytes(e["bytes"]) for e in entries).decode() == text
    split = [e for e in entries if len(e["bytes"]) == 1 and e["bytes"][0] >= 0x80]
    assert split and all(e["token"] == "\ufffd" for e in split)
    assert all(e["top_logprobs"][0]["bytes"] == e["bytes"] for e in entries)
    legacy = completion_logprobs(tokenizer, items, text_offset=3)
    # each token starts where its character does: é and 😀 begin at their first byte
    starts = {text[o - 3] for o in legacy["text_offset"] if o - 3 < len(text)}
    assert legacy["text_offset"][0] == 3 and {"é", "😀"} <= starts
    assert legacy["text_offset"] == sorted(legacy["text_offset"])
