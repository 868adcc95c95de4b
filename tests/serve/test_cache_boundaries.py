"""Where a prompt's seams are (the end of the system message and tools, of earlier messages,
the places a client marked) and which prefix-cache namespace a request goes in."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ninfer_runtime.engine import CacheBoundary
from ninfer_serve.cache_boundaries import (
    MAX_RENDERS,
    MIN_PROMPT_TOKENS,
    Breakpoint,
    conversation_boundaries,
    token_breakpoints,
)
from ninfer_serve.cache_isolation import cache_salt, presented_key

from .conftest import Server, start_server

SYSTEM = "You are a careful assistant for a hardware shop. " * 40
DOCUMENT = "The warranty covers parts and labour for two years from purchase. " * 30
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Find an order by its number and say where it is. " * 20,
        "parameters": {"type": "object", "properties": {"number": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def engine(artifact: Path) -> Iterator[Any]:
    from ninfer_runtime.engine import Engine

    yield Engine(artifact, max_context=4096)


def _render(engine: Any, tools: list[dict[str, Any]] | None = None):
    def render(messages: list[dict[str, Any]]) -> str:
        return engine.template.render(messages, tools=tools, add_generation_prompt=False)

    return render


def _boundaries(engine: Any, messages: list[dict[str, Any]], tools=None, breakpoints=()):
    text = engine.template.render(messages, tools=tools)
    ids = engine.tokenizer.encode(text)
    found = conversation_boundaries(
        _render(engine, tools),
        engine.tokenizer.encode,
        messages,
        ids,
        has_tools=bool(tools),
        breakpoints=breakpoints,
    )
    return found, ids


def _tokens(engine: Any, messages: list[dict[str, Any]], tools=None) -> int:
    return len(engine.tokenizer.encode(_render(engine, tools)(messages)))


def test_the_end_of_the_system_message_is_a_boundary(engine: Any) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hours?"}]
    found, ids = _boundaries(engine, messages)
    system_end = _tokens(engine, messages[:1])
    assert CacheBoundary(system_end, "boundary") in found
    assert system_end > 200 and system_end < len(ids)


def test_the_end_of_the_tool_definitions_is_a_boundary(engine: Any) -> None:
    messages = [{"role": "user", "content": "Where is order 12?"}]
    found, ids = _boundaries(engine, messages, tools=[TOOL])
    assert [b.kind for b in found] == ["boundary"]
    (tools_end,) = [b.position for b in found]
    # the tool block and the first message's opening, which every request with these tools
    # and a user message first shares
    before = engine.tokenizer.decode(ids[:tools_end])
    assert before.endswith("write nothing after the last block.<|im_end|>\n<|im_start|>user\n")
    other = [{"role": "user", "content": "Cancel order 7."}]
    other_ids = engine.tokenizer.encode(engine.template.render(other, tools=[TOOL]))
    assert other_ids[:tools_end] == ids[:tools_end]
    assert other_ids[tools_end] != ids[tools_end]


def test_earlier_messages_end_at_boundaries(engine: Any) -> None:
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": DOCUMENT},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "How long is the warranty?"},
    ]
    found, ids = _boundaries(engine, messages)
    positions = [b.position for b in found]
    assert positions == [_tokens(engine, messages[:k]) for k in (1, 2)]
    # the assistant message rendered last carries an empty reasoning block it does not
    # carry once a user message follows, so its end is no token prefix and is dropped
    third = engine.tokenizer.encode(_render(engine)(messages[:3]))
    assert ids[: len(third)] != third
    assert all(b.kind == "boundary" for b in found)
    for position in positions:  # each is where the prompt's own tokens are
        assert ids[:position] == engine.tokenizer.encode(engine.tokenizer.decode(ids[:position]))


def test_a_rendered_prefix_that_is_not_a_token_prefix_is_dropped() -> None:
    # a template that writes the latest message differently (as reasoning-dropping ones do)
    def render(messages: list[dict[str, Any]]) -> str:
        parts = [m["content"] for m in messages]
        if parts:
            parts[-1] = parts[-1].upper()
        return "|".join(parts)

    def plain(messages: list[dict[str, Any]]) -> str:
        return "|".join(m["content"] for m in messages)

    messages = [{"role": "user", "content": "a" * 300}, {"role": "user", "content": "b" * 10}]
    ids = [ord(c) for c in render(messages)]

    def encode(text: str) -> list[int]:
        return [ord(c) for c in text]

    assert conversation_boundaries(render, encode, messages, ids, has_tools=False) == []
    ids = [ord(c) for c in plain(messages)]
    kept = conversation_boundaries(plain, encode, messages, ids, has_tools=False)
    assert kept == [CacheBoundary(300, "boundary")]


def test_short_prompts_get_no_structural_boundaries_but_keep_breakpoints() -> None:
    def render(messages: list[dict[str, Any]]) -> str:
        return "".join(m["content"] for m in messages)

    def encode(text: str) -> list[int]:
        return [ord(c) for c in text]

    messages = [{"role": "system", "content": "s" * 100}, {"role": "user", "content": "q" * 20}]
    ids = encode(render(messages))
    assert len(ids) < MIN_PROMPT_TOKENS
    assert conversation_boundaries(render, encode, messages, ids, has_tools=False) == []
    marked = conversation_boundaries(
        render, encode, messages, ids, has_tools=False, breakpoints=[Breakpoint(2, 7)]
    )
    assert marked == [CacheBoundary(107, "breakpoint")]


def test_a_breakpoint_inside_a_message_ends_where_the_document_does(engine: Any) -> None:
    question = "\n\nHow long is the warranty?"
    messages = [{"role": "user", "content": DOCUMENT + question}]
    found, ids = _boundaries(engine, messages, breakpoints=[Breakpoint(1, len(DOCUMENT))])
    assert [b.kind for b in found] == ["breakpoint"]
    (position,) = [b.position for b in found]
    before = engine.tokenizer.decode(ids[:position])
    assert before.endswith(DOCUMENT[-20:].rstrip()) or before.endswith(DOCUMENT[-20:])
    assert "How long" not in before
    # another question after the same document shares the prompt up to there
    other = [{"role": "user", "content": DOCUMENT + "\n\nWho pays for shipping?"}]
    other_ids = engine.tokenizer.encode(engine.template.render(other))
    assert other_ids[:position] == ids[:position]


def test_renders_are_bounded() -> None:
    calls = 0

    def render(messages: list[dict[str, Any]]) -> str:
        nonlocal calls
        calls += 1
        return "".join(m["content"] for m in messages)

    def encode(text: str) -> list[int]:
        return [ord(c) for c in text]

    messages = [{"role": "user", "content": "x" * 100} for _ in range(40)]
    ids = encode("".join(m["content"] for m in messages))
    marks = [Breakpoint(k) for k in range(1, 40)]
    conversation_boundaries(render, encode, messages, ids, has_tools=True, breakpoints=marks)
    assert calls == MAX_RENDERS


def test_token_breakpoints_are_those_inside_the_prompt() -> None:
    assert token_breakpoints([0, 5, 5, 3, 10, 12], 10) == [
        CacheBoundary(3, "breakpoint"),
        CacheBoundary(5, "breakpoint"),
    ]


# -- the wire: where clients mark places ----------------------------------------------------------


def test_chat_marks_on_messages_and_parts() -> None:
    from ninfer_serve.openai.chat import to_job
    from ninfer_serve.openai.models import ChatCompletionRequest

    body = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {"role": "system", "content": "Be brief.", "prompt_cache_breakpoint": True},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "doc", "prompt_cache_breakpoint": True},
                        {"type": "text", "text": "q?"},
                    ],
                },
            ],
            "cache_salt": "tenant-a",
        }
    )
    job = to_job(body)
    assert job.cache_breakpoints == [Breakpoint(1), Breakpoint(2, 3)]
    assert job.cache_salt == "tenant-a"
    # the marks are not part of what the template renders
    assert "prompt_cache_breakpoint" not in job.messages[0]
    assert all("prompt_cache_breakpoint" not in p for p in job.messages[1]["content"])


def test_anthropic_cache_control_marks_system_tools_and_blocks() -> None:
    from ninfer_serve.anthropic.messages import to_job
    from ninfer_serve.anthropic.models import MessagesRequest

    mark = {"type": "ephemeral"}
    body = MessagesRequest.model_validate(
        {
            "model": "m",
            "system": [
                {"type": "text", "text": "One.", "cache_control": mark},
                {"type": "text", "text": "Two."},
            ],
            "tools": [{"name": "t", "input_schema": {"type": "object"}, "cache_control": mark}],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "A long document.", "cache_control": mark},
                        {"type": "text", "text": "A question?"},
                    ],
                },
                {"role": "assistant", "content": [{"type": "text", "text": "Yes."}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "c", "content": "r"},
                        {"type": "text", "text": "And?", "cache_control": mark},
                    ],
                },
            ],
        }
    )
    job = to_job(body)
    # messages: system, user, assistant, tool, user
    assert [m["role"] for m in job.messages] == ["system", "user", "assistant", "tool", "user"]
    assert job.cache_breakpoints == [
        Breakpoint(1, len("One.")),
        Breakpoint(1),
        Breakpoint(2, len("A long document.")),
        Breakpoint(5),
    ]


def test_completions_take_token_breakpoints() -> None:
    from ninfer_serve.openai.completions import CompletionRequest

    body = CompletionRequest.model_validate(
        {"prompt": "x", "prompt_cache_options": {"breakpoints": [4, 9]}, "cache_salt": "s"}
    )
    assert body.prompt_cache_options is not None
    assert body.prompt_cache_options.breakpoints == [4, 9]
    with pytest.raises(ValueError, match="breakpoints"):
        CompletionRequest.model_validate(
            {"prompt": "x", "prompt_cache_options": {"breakpoints": [0]}}
        )


# -- isolation -------------------------------------------------------------------------------------


def test_isolation_modes_pick_the_namespace() -> None:
    assert cache_salt("none", None, "k1") == (None, True)
    assert cache_salt("none", "a", None) == ("salt:a", True)
    assert cache_salt("salt", "a", "k1") == ("salt:a", True)
    private, shared = cache_salt("salt", None, None)
    assert not shared and private != cache_salt("salt", None, None)[0]
    one, two = cache_salt("api_key", None, "k1"), cache_salt("api_key", None, "k2")
    assert one[1] and two[1] and one[0] != two[0]
    assert one == cache_salt("api_key", None, "k1")
    assert "k1" not in (one[0] or "")  # the key itself is never the salt
    assert cache_salt("api_key", "a", "k1")[0] != one[0]
    assert not cache_salt("api_key", None, None)[1]


def test_the_presented_key_is_read_from_either_header() -> None:
    assert presented_key({"x-api-key": "k1"}) == "k1"
    assert presented_key({"authorization": "Bearer k2"}) == "k2"
    assert presented_key({"authorization": "Basic abc"}) is None
    assert presented_key({}) is None


# -- a server: the second request of a shared prefix resumes at the first one's seam ---------------

LONG_SYSTEM = "You are a careful assistant for a hardware shop; answer in one line. " * 52


@pytest.fixture(scope="module")
def server(artifact: Path) -> Iterator[Server]:
    # room for every test's checkpoints at once, so none is let go before it is looked for
    yield from start_server(artifact, "--max-context", "4096", "--context-capacity", "256MiB")


def _post(server: Server, path: str, body: dict[str, Any], **headers: str) -> dict[str, Any]:
    reply = httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _chat(server: Server, messages: list[dict[str, Any]], **fields: Any) -> tuple[int, str]:
    """(cached prompt tokens, the reply's text) of a greedy chat request."""
    body = {"model": server.model, "messages": messages, "max_tokens": 6, "temperature": 0}
    reply = _post(server, "/v1/chat/completions", {**body, **fields})
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"], str(
        reply["choices"][0]["message"]
    )


def _checkpoints(server: Server, kind: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(f'ninfer_cache_checkpoints{{kind="{kind}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(kind)


def test_a_shared_system_prompt_is_resumed_by_the_next_request(server, engine) -> None:
    system = {"role": "system", "content": LONG_SYSTEM}
    system_tokens = _tokens(engine, [system])
    assert system_tokens >= 2000
    first = [system, {"role": "user", "content": "What are your hours?"}]
    second = [system, {"role": "user", "content": "Do you sell drills?"}]
    assert _chat(server, first)[0] == 0
    cached, text = _chat(server, second)
    assert cached >= system_tokens
    # the same request where nothing is shared (a salt of its own) answers the same
    cold_cached, cold_text = _chat(server, second, cache_salt="cold-system")
    assert cold_cached == 0 and cold_text == text
    assert _checkpoints(server, "boundary") >= 1


def test_shared_tool_definitions_are_resumed_by_the_next_request(server, engine) -> None:
    tools = [TOOL, {**TOOL, "function": {**TOOL["function"], "name": "cancel_order"}}] * 2
    tools = [
        {**t, "function": {**t["function"], "name": f"{t['function']['name']}_{i}"}}
        for i, t in enumerate(tools)
    ]
    tools_end = _tokens(engine, [{"role": "user", "content": ""}], tools=tools) - len(
        engine.tokenizer.encode("<|im_end|>\n")
    )
    first = [{"role": "user", "content": "Where is order 12?"}]
    second = [{"role": "user", "content": "Cancel order 7, please."}]
    assert _chat(server, first, tools=tools)[0] == 0
    cached, text = _chat(server, second, tools=tools)
    assert cached >= tools_end > 1000
    assert _chat(server, second, tools=tools, cache_salt="cold-tools") == (0, text)


def test_anthropic_cache_control_at_the_end_of_a_long_first_block(server, engine) -> None:
    NOTES = "Shop notes. " + LONG_SYSTEM

    def ask(question: str, **fields: Any) -> tuple[int, Any]:
        blocks = [
            {"type": "text", "text": NOTES, "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": question},
        ]
        body = {
            "model": server.model,
            "max_tokens": 6,
            "temperature": 0,
            "messages": [{"role": "user", "content": blocks}],
            **fields,
        }
        reply = _post(server, "/v1/messages", body)
        return reply["usage"]["cache_read_input_tokens"], reply["content"]

    document_tokens = len(engine.tokenizer.encode("<|im_start|>user\n" + NOTES.rstrip()))
    assert ask("Which drills do you stock?")[0] == 0
    cached, content = ask("Do you open on Sundays?")
    assert cached >= document_tokens
    assert ask("Do you open on Sundays?", cache_salt="cold-anthropic") == (0, content)


def test_a_document_with_different_questions_and_a_breakpoint(server, engine) -> None:
    CATALOGUE = "Catalogue. " + LONG_SYSTEM

    def ask(question: str, **fields: Any) -> tuple[int, str]:
        parts = [
            {"type": "text", "text": CATALOGUE, "prompt_cache_breakpoint": True},
            {"type": "text", "text": "\n\n" + question},
        ]
        return _chat(server, [{"role": "user", "content": parts}], **fields)

    document_tokens = len(engine.tokenizer.encode("<|im_start|>user\n" + CATALOGUE.rstrip()))
    assert ask("What is the warranty?")[0] == 0
    cached, text = ask("Who pays for shipping?")
    assert cached >= document_tokens
    assert ask("Who pays for shipping?", cache_salt="cold-rag") == (0, text)
    assert _checkpoints(server, "breakpoint") >= 1


def test_completions_token_breakpoints(server, engine) -> None:
    document = engine.tokenizer.encode("Manual. " + LONG_SYSTEM)

    def ask(question: str) -> int:
        body = {
            "model": server.model,
            "prompt": document + engine.tokenizer.encode(question),
            "max_tokens": 2,
            "temperature": 0,
            "prompt_cache_options": {"breakpoints": [len(document)]},
        }
        reply = _post(server, "/v1/completions", body)
        return reply["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert ask(" Q: warranty?") == 0
    assert ask(" Q: shipping?") == len(document)


def test_different_salts_never_share(server) -> None:
    messages = [{"role": "user", "content": "Salted. " * 60 + "Which drill?"}]
    assert _chat(server, messages, cache_salt="tenant-a")[0] == 0
    assert _chat(server, messages, cache_salt="tenant-b")[0] == 0
    assert _chat(server, messages)[0] == 0  # nor with the unsalted namespace
    assert _chat(server, messages, cache_salt="tenant-a")[0] > 400


def test_responses_and_messages_take_cache_salt_too(server) -> None:
    text = "Responses and Messages. " * 20 + "Which drill?"

    def responses(salt: str) -> int:
        body = {"model": server.model, "input": text, "max_output_tokens": 2, "cache_salt": salt}
        return _post(server, "/v1/responses", body)["usage"]["input_tokens_details"][
            "cached_tokens"
        ]

    def messages(salt: str) -> int:
        body = {
            "model": server.model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 2,
            "cache_salt": salt,
        }
        return _post(server, "/v1/messages", body)["usage"]["cache_read_input_tokens"]

    assert responses("r-one") == 0
    assert responses("r-two") == 0
    assert messages("m-one") == 0
    assert responses("r-one") > 300 and messages("m-one") > 300


def _keyed(server: Server, headers: dict[str, str], **fields: Any) -> int:
    messages = [{"role": "user", "content": "Keyed. " * 60 + "Which drill?"}]
    body = {"model": server.model, "messages": messages, "max_tokens": 2, **fields}
    reply = _post(server, "/v1/chat/completions", body, **headers)
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_api_key_isolation_keeps_two_keys_apart(artifact: Path, tmp_path: Path) -> None:
    config = tmp_path / "ninfer.toml"
    config.write_text('[context_cache]\nisolation = "api_key"\n')
    key_one = {"Authorization": "Bearer key-one"}
    key_two = {"x-api-key": "key-two"}
    servers = start_server(artifact, "--max-context", "2048", "--config", str(config))
    server = next(servers)
    try:
        assert _keyed(server, key_one) == 0
        assert _keyed(server, key_two) == 0
        assert _keyed(server, {}) == 0  # no key: private, even to itself
        assert _keyed(server, {}) == 0
        assert _keyed(server, key_one) > 300
        assert _keyed(server, key_two, cache_salt="x") == 0  # a salt splits a key's namespace
    finally:
        servers.close()  # stops it (Ctrl-C), checking that it drains and exits cleanly


def test_the_history_end_is_found_before_the_engine_thread(artifact: Path) -> None:
    """The worker thread that renders a chat request also finds where the next turn's
    prompt stops being this one's (``Prepared.history_end``), as the engine would, so the
    engine's thread does not tokenize the conversation again."""
    from types import SimpleNamespace

    from ninfer_runtime.engine import Engine
    from ninfer_serve.generation import Generator
    from ninfer_serve.openai.chat import to_job
    from ninfer_serve.openai.models import ChatCompletionRequest

    caching = Engine(artifact, max_context=4096, prefix_cache=True)
    generator = Generator(
        SimpleNamespace(engine=caching, check_available=lambda: None),
        default_max_tokens=None,
        enable_thinking=None,
        keepalive=1.0,
    )
    messages = [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": "Hi"}]
    job = to_job(ChatCompletionRequest(model="m", messages=messages))
    request, prepared = generator.prepare(job)
    assert prepared.history_end is not None
    assert prepared.history_end == caching.history_end(request, prepared.ids)
