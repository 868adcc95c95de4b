"""vLLM's extra request fields on Chat Completions against the bundled model, and a walk over
every field of every request model: each one either changes what the server does or is
refused by name.

The bundled model answers "Hi" with "Blue is a color." (five tokens, then end of turn) and
"What is the capital of France?" with "The capital of France is Paris.".
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import jsonschema_rs
import numpy as np
import pytest

from .conftest import Server, start_server

HI = [{"role": "user", "content": "Hi"}]
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
PREFILLED = [*FRANCE, {"role": "assistant", "content": "The capital of"}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def server(artifact) -> Iterator[Server]:
    yield from start_server(artifact, "--max-concurrency", "2", "--max-context", "1024")


def post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def chat(server: Server, **fields: Any) -> dict[str, Any]:
    """A greedy chat reply without reasoning (fields override), as JSON; asserts a 200."""
    body = {
        "model": server.model,
        "messages": HI,
        "temperature": 0,
        "max_tokens": 40,
        "enable_thinking": False,
        **fields,
    }
    reply = post(server, "/v1/chat/completions", body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def content(reply: dict[str, Any]) -> str:
    return reply["choices"][0]["message"]["content"]


def refused(server: Server, **fields: Any) -> dict[str, Any]:
    """The error of a chat request that must be refused with 400."""
    body = {"model": server.model, "messages": HI, "max_tokens": 8, **fields}
    reply = post(server, "/v1/chat/completions", body)
    assert reply.status_code == 400, reply.text
    return reply.json()["error"]


# -- guided decoding ------------------------------------------------------------------------------


def test_guided_choice_gives_one_of_the_choices(server: Server) -> None:
    choices = ["yes", "no", "maybe so"]
    for seed in range(4):
        for fields in ({"guided_choice": choices}, {"structured_outputs": {"choice": choices}}):
            assert content(chat(server, temperature=1.0, seed=seed, **fields)) in choices
    assert content(chat(server)) not in choices  # unconstrained, the model says something else


def test_guided_regex_output_matches(server: Server) -> None:
    pattern = r"[0-9]{3}-[a-z]{2,4}"
    for seed in range(3):
        for fields in ({"guided_regex": pattern}, {"structured_outputs": {"regex": pattern}}):
            reply = chat(server, temperature=1.0, seed=seed, **fields)
            assert re.fullmatch(pattern, content(reply)), content(reply)
            assert reply["choices"][0]["finish_reason"] == "stop"


def test_guided_json_parses_and_validates(server: Server) -> None:
    validator = jsonschema_rs.validator_for(PERSON)
    for fields in (
        {"guided_json": PERSON},
        {"guided_json": json.dumps(PERSON)},  # vLLM takes the schema's JSON text too
        {"structured_outputs": {"json": PERSON}},
        {"structured_outputs": {"json": json.dumps(PERSON)}},
    ):
        reply = chat(server, **fields)
        answer = json.loads(content(reply))
        validator.validate(answer)
        assert set(answer) == {"name", "age"}
    answer = chat(server, structured_outputs={"json_object": True}, max_tokens=60)
    assert content(answer).startswith("{")


def test_guided_grammar_in_lark_and_gbnf(server: Server) -> None:
    lark = 'start: "x" /[0-9]/ "y"'
    for fields in ({"guided_grammar": lark}, {"structured_outputs": {"grammar": lark}}):
        assert re.fullmatch(r"x[0-9]y", content(chat(server, **fields)))
    gbnf = 'root ::= "ab" | "cd" digit\ndigit ::= [0-9]'
    assert re.fullmatch(r"ab|cd[0-9]", content(chat(server, guided_grammar=gbnf)))


def test_one_constraint_at_a_time(server: Server) -> None:
    error = refused(server, guided_choice=["a"], guided_regex="b")
    assert "guided_regex" in error["message"] and "guided_choice" in error["message"]
    error = refused(server, response_format={"type": "json_object"}, guided_choice=["a"])
    assert "response_format" in error["message"] and "guided_choice" in error["message"]
    error = refused(server, guided_json=PERSON, structured_outputs={"regex": "a"})
    assert error["param"] == "structured_outputs.regex" and "guided_json" in error["message"]
    error = refused(server, tools=[TOOL], tool_choice="required", guided_regex="a")
    assert error["param"] == "tool_choice" and "guided_regex" in error["message"]


def test_bad_constraints_are_refused_by_name(server: Server) -> None:
    cases = [
        ({"guided_regex": "(unclosed"}, "guided_regex", "invalid_regex"),
        ({"guided_grammar": "start: missing_rule"}, "guided_grammar", "invalid_grammar"),
        ({"guided_grammar": "root ::: x"}, "guided_grammar", "invalid_grammar"),
        ({"guided_json": "{not json"}, "guided_json", "invalid_json_schema"),
        ({"guided_json": "[1, 2]"}, "guided_json", "invalid_json_schema"),
        ({"structured_outputs": {}}, "structured_outputs", "invalid_request"),
        ({"structured_outputs": {"json_object": False}}, "structured_outputs", "invalid_request"),
        ({"structured_outputs": {"regexp": "a"}}, "structured_outputs.regexp", "invalid_request"),
        (
            {"structured_outputs": {"choice": ["a"], "whitespace_pattern": " "}},
            "structured_outputs.whitespace_pattern",
            "unsupported_parameter",
        ),
        ({"guided_choice": []}, "guided_choice", "invalid_request"),
    ]
    for fields, param, code in cases:
        error = refused(server, **fields)
        assert (error["param"], error["code"]) == (param, code), (fields, error)
        assert "\n" not in error["message"]


# -- sampling switches ----------------------------------------------------------------------------


def test_min_tokens_forces_that_many_tokens(server: Server) -> None:
    short = chat(server)
    assert short["usage"]["completion_tokens"] == 5
    assert short["choices"][0]["finish_reason"] == "stop"
    longer = chat(server, min_tokens=12)
    assert longer["usage"]["completion_tokens"] >= 12
    assert content(longer).startswith(content(short))
    # the stream holds back the end of turn as well
    body = {"model": server.model, "messages": HI, "temperature": 0, "max_tokens": 40,
            "enable_thinking": False, "min_tokens": 12, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    events = [
        json.loads(line[6:]) for line in _data_lines(post(server, "/v1/chat/completions", body))
    ]
    streamed = "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]
    )
    assert streamed == content(longer)
    assert events[-1]["usage"]["completion_tokens"] == longer["usage"]["completion_tokens"]
    error = refused(server, min_tokens=9, max_tokens=8)
    assert error["param"] == "min_tokens" and "max_tokens" in error["message"]


def test_continuous_usage_stats_puts_the_counts_so_far_on_every_chunk(server: Server) -> None:
    body = {"model": server.model, "messages": HI, "temperature": 0, "max_tokens": 40,
            "enable_thinking": False, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # fmt: skip
    events = [
        json.loads(line[6:]) for line in _data_lines(post(server, "/v1/chat/completions", body))
    ]
    *chunks, final = events
    usages = [c["usage"] for c in chunks]
    assert all(u is not None for u in usages), usages
    prompt = final["usage"]["prompt_tokens"]
    assert {u["prompt_tokens"] for u in usages} == {prompt}
    generated = [u["completion_tokens"] for u in usages]
    assert generated[0] == 0 and generated == sorted(generated)
    assert generated[-1] == final["usage"]["completion_tokens"] == 5
    assert all(u["total_tokens"] == prompt + u["completion_tokens"] for u in usages)


def test_stream_options_without_stream_is_refused(server: Server) -> None:
    error = refused(server, stream_options={"include_usage": True})
    assert error["param"] == "stream_options" and "stream: true" in error["message"]


def test_include_stop_str_in_output(server: Server) -> None:
    assert content(chat(server, stop=["color"])) == "Blue is a"
    included = chat(server, stop=["color"], include_stop_str_in_output=True)
    assert content(included) == "Blue is a color"
    assert included["choices"][0]["stop_reason"] == "color"


def test_ignore_eos_and_special_tokens_shown(server: Server) -> None:
    skipped = content(chat(server, ignore_eos=True, max_tokens=12))
    shown = content(chat(server, ignore_eos=True, max_tokens=12, skip_special_tokens=False))
    assert skipped.startswith("Blue is a color.") and "<|im_end|>" not in skipped
    assert shown.startswith("Blue is a color.<|im_end|>") and "<|im_start|>" in shown


# -- the prompt -----------------------------------------------------------------------------------


def test_continue_final_message_continues_the_assistant_text(server: Server) -> None:
    continued = chat(server, messages=PREFILLED, continue_final_message=True)
    assert content(continued) == " France is Paris."
    # unset, add_generation_prompt follows continue_final_message; both true is refused
    error = refused(
        server, messages=PREFILLED, continue_final_message=True, add_generation_prompt=True
    )
    assert error["param"] == "continue_final_message"
    assert "add_generation_prompt" in error["message"]
    error = refused(server, messages=FRANCE, continue_final_message=True)
    assert error["param"] == "messages[0].role"
    # without continuing, the assistant turn is closed and a new one answers
    assert content(chat(server, messages=PREFILLED)) != " France is Paris."


def test_echo_puts_the_last_message_before_the_reply(server: Server) -> None:
    echoed = chat(server, messages=PREFILLED, continue_final_message=True, echo=True)
    assert content(echoed) == "The capital of France is Paris."
    body = {"model": server.model, "messages": PREFILLED, "temperature": 0, "max_tokens": 40,
            "enable_thinking": False, "continue_final_message": True, "echo": True,
            "stream": True}  # fmt: skip
    lines = _data_lines(post(server, "/v1/chat/completions", body))
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in lines]
    assert "".join(d.get("content") or "" for d in deltas) == "The capital of France is Paris."
    # as vLLM: a user message is not the reply's role, so nothing is echoed after it
    assert content(chat(server, echo=True)) == "Blue is a color."
    # without the generation prompt the reply continues the user's turn: its text is echoed
    assert content(chat(server, echo=True, add_generation_prompt=False)).startswith("Hi")


def test_add_generation_prompt_and_template_kwargs_change_the_prompt(server: Server) -> None:
    def prompt_tokens(**fields: Any) -> int:
        return chat(server, max_tokens=1, **fields)["usage"]["prompt_tokens"]

    base = prompt_tokens()
    assert prompt_tokens(add_generation_prompt=False) < base
    # enable_thinking false writes an empty reasoning block into the generation prompt
    thinking = prompt_tokens(enable_thinking=None, chat_template_kwargs={"enable_thinking": True})
    quiet = prompt_tokens(enable_thinking=None, chat_template_kwargs={"enable_thinking": False})
    assert quiet > thinking and quiet == base
    many = {f"k{i}": i for i in range(33)}
    assert refused(server, chat_template_kwargs=many)["param"] == "chat_template_kwargs"
    big = {"k": "x" * 20000}
    assert refused(server, chat_template_kwargs=big)["param"] == "chat_template_kwargs"


def _data_lines(reply: httpx.Response) -> list[str]:
    assert reply.status_code == 200, reply.text
    lines = [line for line in reply.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return lines[:-1]


# -- every field of every request model -----------------------------------------------------------
#
# Each field has an entry saying what setting it does; a field without one fails the walk.
# ``Prepared``: the engine request the handler builds (prompt tokens, sampling, the grammar's
# first mask, whether the reply ends after one call, the echoed text) differs. ``Served``: the
# HTTP reply differs (status, content type or body, ids and times aside). ``Refused``: a 4xx
# whose error names the field. ``Informational``: accepted without effect on the result by
# definition (``why``); the engine request is checked to be the same.


@dataclass(frozen=True)
class Prepared:
    value: Any
    given: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Served:
    value: Any
    given: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Refused:
    value: Any
    given: dict[str, Any] = field(default_factory=dict)
    status: int = 400


@dataclass(frozen=True)
class Informational:
    value: Any
    why: str


Effect = Prepared | Served | Refused | Informational

LARK = 'start: "a" | "b"'
CHAT: dict[str, Effect] = {
    "messages": Prepared(FRANCE),
    "model": Refused("another-model", status=404),
    "max_tokens": Prepared(7),
    "max_completion_tokens": Prepared(7),
    "temperature": Prepared(0.3),
    "top_p": Prepared(0.5),
    "top_k": Prepared(3),
    "min_p": Prepared(0.2),
    "presence_penalty": Prepared(0.5),
    "frequency_penalty": Prepared(0.5),
    "repetition_penalty": Prepared(1.2),
    "seed": Prepared(7),
    "stop": Prepared(["x"]),
    "stop_token_ids": Prepared([13]),
    "ignore_eos": Prepared(True),
    "min_tokens": Prepared(3),
    "include_stop_str_in_output": Prepared(True),
    "skip_special_tokens": Prepared(False),
    "stream": Served(True),
    "stream_options": Served({"include_usage": True}, {"stream": True}),
    "tools": Prepared([TOOL]),
    "tool_choice": Prepared("required", {"tools": [TOOL]}),
    "parallel_tool_calls": Prepared(False, {"tools": [TOOL]}),
    "response_format": Prepared({"type": "json_object"}),
    "guided_json": Prepared(PERSON),
    "guided_regex": Prepared("[0-9]+"),
    "guided_choice": Prepared(["yes", "no"]),
    "guided_grammar": Prepared(LARK),
    "structured_outputs": Prepared({"choice": ["yes", "no"]}),
    "chat_template_kwargs": Prepared({"enable_thinking": False}),
    "continue_final_message": Prepared(True, {"messages": PREFILLED}),
    "add_generation_prompt": Prepared(False),
    "echo": Served(True, {"messages": PREFILLED, "continue_final_message": True}),
    "enable_thinking": Prepared(False),
    "reasoning_effort": Prepared("high"),
    "max_thinking_tokens": Prepared(5),
    "n": Served(2),
    "logprobs": Prepared(True),
    "top_logprobs": Prepared(2, {"logprobs": True}),
    "logit_bias": Refused({"13": 5.0}),
    "best_of": Refused(2),
    "use_beam_search": Refused(True),
    "audio": Refused({"voice": "alloy", "format": "wav"}),
    "modalities": Refused(["text", "audio"]),
    "prediction": Refused({"type": "content", "content": "x"}),
    "web_search_options": Refused({}),
    "functions": Refused([TOOL["function"]]),
    "function_call": Refused("auto"),
    "guided_whitespace_pattern": Refused(" "),
    "structural_tag": Refused("{}"),
    "allowed_token_ids": Refused([1, 2]),
    "bad_words": Refused(["Blue"]),
    "length_penalty": Refused(0.5),
    "truncate_prompt_tokens": Refused(4),
    "spaces_between_special_tokens": Refused(False),
    "return_tokens_as_token_ids": Refused(True),
    "top_a": Refused(0.5),
    "typical_p": Refused(0.5),
    "user": Informational("someone", "an end-user id for the client's own records"),
    "metadata": Informational({"k": "v"}, "tags for stored completions; nothing is stored"),
    "store": Informational(
        True, "stored completions are not offered: a later fetch of the id answers 404"
    ),
    "service_tier": Informational("flex", "one tier here; the reply is the same"),
    "cache_salt": Prepared("tenant-a"),
}

RESPONSES: dict[str, Effect] = {
    "model": Refused("another-model", status=404),
    "input": Prepared("What is the capital of France?"),
    "instructions": Prepared("Answer briefly."),
    "previous_response_id": Prepared("resp_earlier"),
    "max_output_tokens": Prepared(7),
    "max_thinking_tokens": Prepared(5),
    "stream": Served(True),
    "store": Served(False),
    "temperature": Prepared(0.3),
    "top_p": Prepared(0.5),
    "top_k": Prepared(3),
    "min_p": Prepared(0.2),
    "seed": Prepared(7),
    "metadata": Served({"k": "v"}),
    "reasoning": Prepared({"effort": "none"}),
    "text": Prepared({"format": {"type": "json_object"}}),
    "tools": Prepared([{"type": "function", "name": "get_weather", "parameters": {}}]),
    "tool_choice": Prepared(
        "required", {"tools": [{"type": "function", "name": "get_weather", "parameters": {}}]}
    ),
    "parallel_tool_calls": Prepared(
        False, {"tools": [{"type": "function", "name": "get_weather", "parameters": {}}]}
    ),
    "max_tool_calls": Informational(1, "bounds calls to built-in tools; there are none here"),
    "truncation": Refused("auto"),
    "background": Refused(True),
    "include": Prepared(["message.output_text.logprobs"]),
    "service_tier": Informational("flex", "one tier here; the reply says 'default'"),
    "user": Served("someone"),
    "safety_identifier": Informational("someone", "an end-user id for the client's records"),
    "prompt_cache_key": Informational("k", "prefix caching is automatic, keyed by the prompt"),
    "client_metadata": Informational({"k": "v"}, "the client's own records"),
    "stream_options": Informational(
        {"include_obfuscation": True}, "stream events carry no obfuscation padding here"
    ),
    "top_logprobs": Prepared(2, {"include": ["message.output_text.logprobs"]}),
    "cache_salt": Prepared("tenant-a"),
}

MESSAGES: dict[str, Effect] = {
    "model": Refused("another-model", status=404),
    "messages": Prepared([{"role": "user", "content": "What is the capital of France?"}]),
    "system": Prepared("Answer briefly."),
    "tools": Prepared([{"name": "get_weather", "input_schema": {"type": "object"}}]),
    "tool_choice": Prepared(
        {"type": "any"}, {"tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]}
    ),
    "thinking": Prepared({"type": "enabled", "budget_tokens": 5}),
    "output_config": Prepared({"format": {"type": "json_schema", "schema": PERSON}}),
    "output_format": Prepared({"type": "json_schema", "schema": PERSON}),
    "mcp_servers": Refused([{"type": "url", "url": "https://example.com", "name": "x"}]),
    "max_tokens": Prepared(7),
    "stop_sequences": Prepared(["x"]),
    "stream": Served(True),
    "temperature": Prepared(0.3),
    "top_p": Prepared(0.5),
    "top_k": Prepared(3),
    "metadata": Informational({"user_id": "someone"}, "an end-user id for the client's records"),
    "service_tier": Informational("auto", "one tier here; the reply is the same"),
    "container": Informational("c", "only server tools use a container, and those are refused"),
    "cache_salt": Prepared("tenant-a"),
}


@dataclass(frozen=True)
class Api:
    name: str
    path: str
    model: Any
    table: dict[str, Effect]
    base: Callable[[str], dict[str, Any]]
    #: (request body, handler context) -> the engine request's fingerprint
    prepare: Callable[[dict[str, Any], Any], dict[str, Any]]


def _chat_job(body: dict[str, Any], context: Any) -> Any:
    from ninfer_serve.openai.chat import to_job
    from ninfer_serve.openai.models import ChatCompletionRequest

    return to_job(ChatCompletionRequest.model_validate(body))


def _responses_job(body: dict[str, Any], context: Any) -> Any:
    from ninfer_serve.openai.models import ResponsesRequest
    from ninfer_serve.openai.response_request import to_job

    return to_job(context.state, ResponsesRequest.model_validate(body))[0]


def _messages_job(body: dict[str, Any], context: Any) -> Any:
    from ninfer_serve.anthropic.messages import to_job
    from ninfer_serve.anthropic.models import MessagesRequest

    return to_job(MessagesRequest.model_validate(body))


def _apis() -> list[Api]:
    from ninfer_serve.anthropic.models import MessagesRequest
    from ninfer_serve.openai.models import ChatCompletionRequest, ResponsesRequest

    return [
        Api("chat", "/v1/chat/completions", ChatCompletionRequest, CHAT,
            lambda model: {"model": model, "messages": HI, "max_tokens": 16, "seed": 1},
            _chat_job),
        Api("responses", "/v1/responses", ResponsesRequest, RESPONSES,
            lambda model: {"model": model, "input": "Hi", "max_output_tokens": 16, "seed": 1},
            _responses_job),
        Api("messages", "/v1/messages", MessagesRequest, MESSAGES,
            lambda model: {"model": model, "messages": HI, "max_tokens": 16, "temperature": 0},
            _messages_job),
    ]  # fmt: skip


APIS = {api.name: api for api in _apis()}


@pytest.mark.parametrize("api", APIS.values(), ids=APIS)
def test_every_field_has_an_entry(api: Api) -> None:
    fields = set(api.model.model_fields)
    missing, stale = sorted(fields - set(api.table)), sorted(set(api.table) - fields)
    assert not missing, f"{api.name}: no entry in the walk's table for {missing}"
    assert not stale, f"{api.name}: entries for fields the model no longer has: {stale}"


class Handlers:
    """A generator on a real engine loop (its own event loop thread), for the handlers'
    translation of a body into the engine request; nothing is submitted."""

    def __init__(self, artifact: Any):
        from ninfer_runtime.engine import Engine
        from ninfer_serve.engine_loop import EngineLoop
        from ninfer_serve.generation import Generator
        from ninfer_serve.http import ServerState
        from ninfer_serve.metrics import Metrics
        from ninfer_serve.openai.response_store import ResponseStore, Stored

        self._aio = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._aio.run_forever, daemon=True)
        self._thread.start()
        metrics = Metrics("tiny", backend="cpu", max_concurrency=1, max_context=1024)
        self.loop = EngineLoop(
            lambda: Engine(artifact, max_context=1024),
            max_concurrency=1,
            max_pending=0,
            pending_timeout_s=5,
            metrics=metrics,
        )
        self._run(self._start())
        self.generator = Generator(
            self.loop, default_max_tokens=None, enable_thinking=None, keepalive=5
        )
        store = ResponseStore(4)
        earlier = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
        store.put(Stored({"id": "resp_earlier"}, [], earlier))
        self.state = ServerState(
            settings=None,  # type: ignore[arg-type]  (the translations read the store only)
            model_id="tiny",
            loop=self.loop,
            generator=self.generator,
            metrics=metrics,
            responses=store,
        )

    async def _start(self) -> None:
        self.loop.start()
        await self.loop.wait_loaded()

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._aio).result(60)

    def fingerprint(self, api: Api, body: dict[str, Any]) -> dict[str, Any]:
        job = api.prepare(body, self)
        request, prepared = self.generator.prepare(job)
        ids, opened = prepared.ids, prepared.opened
        processor = request.logits_processor
        first_mask = None
        if processor is not None:  # the tokens the grammar admits first
            vocab = self.loop.engine.model.config.vocab
            first_mask = np.isfinite(processor(np.zeros(vocab, np.float32), [])).tolist()
        return {
            "prompt": ids,
            "opened": opened,
            "sampling": request.sampling,
            "tools": request.tools,
            "parse_tool_calls": request.parse_tool_calls,
            "first_mask": first_mask,
            "one_call": not job.parallel_tool_calls,
            "echo": job.echo,
            "cache_salt": request.cache_salt,
            "cache_boundaries": list(request.cache_boundaries),
        }

    def close(self) -> None:
        self._run(self.loop.stop(1))
        self._aio.call_soon_threadsafe(self._aio.stop)
        self._thread.join(10)


@pytest.fixture(scope="module")
def handlers(artifact) -> Iterator[Handlers]:
    handlers = Handlers(artifact)
    yield handlers
    handlers.close()


_RANDOM = {"id", "created", "created_at", "timings", "item_id", "call_id", "response_id"}


def _normalized(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items() if k not in _RANDOM}
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    return value


def served(server: Server, api: Api, body: dict[str, Any]) -> tuple[int, str, Any]:
    """(status, content type, body without ids and times; a stream as its events)."""
    reply = post(server, api.path, body)
    kind = reply.headers.get("content-type", "").split(";")[0]
    if kind == "text/event-stream":
        events = [line[6:] for line in reply.text.splitlines() if line.startswith("data: ")]
        return reply.status_code, kind, [_normalized(json.loads(e)) for e in events if e[0] == "{"]
    return reply.status_code, kind, _normalized(reply.json())


CASES = [(api, name) for api in APIS.values() for name in api.table]


@pytest.mark.parametrize(("api", "name"), CASES, ids=[f"{a.name}-{n}" for a, n in CASES])
def test_a_field_changes_the_result_or_is_refused(
    api: Api, name: str, server: Server, handlers: Handlers
) -> None:
    effect = api.table[name]
    base = {**api.base(server.model), **getattr(effect, "given", {})}
    body = {**base, name: effect.value}
    if isinstance(effect, Refused):
        reply = post(server, api.path, body)
        assert reply.status_code == effect.status, reply.text
        error = reply.json()["error"]  # Anthropic's errors have no param: the message names it
        assert error.get("param") == name or name in error["message"], error
    elif isinstance(effect, Served):
        assert served(server, api, body) != served(server, api, base)
    elif isinstance(effect, Prepared):
        assert handlers.fingerprint(api, body) != handlers.fingerprint(api, base)
    else:
        assert effect.why
        assert handlers.fingerprint(api, body) == handlers.fingerprint(api, base)
        assert post(server, api.path, body).status_code == 200
