"""Schemathesis hooks for ``test_schemathesis``: name the served model in generated bodies, and
steer generation away from the rules the published schema cannot state.

A request for another model is a valid 404, so without the model name nearly every generated
chat or messages body would stop at the model check and the rest of the request would go
untested.

The other rules hold across fields (docs/serve.md lists them): JSON Schema states what one
field may hold, not that a named tool must be among ``tools`` or that a role needs content. A
generated body that breaks one is schema-valid and rightly refused, so ``positive_data_acceptance``
would report it; each function below repairs the one rule it names, the smallest change that
keeps the body valid, and leaves the rest of the body as generated.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from typing import Any

import httpx
import schemathesis

MODEL = os.environ.get("NINFER_TEST_MODEL", "tiny")


def _is_blank(text: Any) -> bool:
    return not isinstance(text, str) or not text.strip()


def _integral_floats_as_ints(value: Any) -> Any:
    """``827.0`` is an integer to JSON Schema but a float to the server's strict validation
    (as to Python's JSON), so a body meant to be valid writes it as ``827``. Beyond 64 bits it
    stays a float: written out whole (``1.7976931348623157e308`` as 309 digits) no JSON reader
    of a fixed width takes it as a number, and a schema holding one is rightly refused."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, dict):
        return {key: _integral_floats_as_ints(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_integral_floats_as_ints(item) for item in value]
    return value


def _json_object_arguments(call: dict[str, Any]) -> None:
    """A tool call's ``arguments`` string must hold a JSON object (JSON Schema's
    ``contentMediaType`` is only an annotation)."""
    arguments = call.get("arguments")
    if isinstance(arguments, str):
        try:
            ok = isinstance(json.loads(arguments), dict)
        except ValueError:
            ok = False
        if not ok:
            call["arguments"] = "{}"


def _chat(body: dict[str, Any]) -> None:
    for message in body.get("messages") or []:
        for call in message.get("tool_calls") or []:
            _json_object_arguments(call["function"])
        # tool_calls are for assistant messages; other roles need content; an assistant
        # message needs content, reasoning or tool_calls
        if message.get("role") != "assistant":
            message.pop("tool_calls", None)
        needs_content = message.get("role") != "assistant" or not (
            message.get("tool_calls")
            or message.get("reasoning_content") is not None
            or message.get("reasoning") is not None
        )
        if needs_content and message.get("content") is None:
            message["content"] = "hi"
    tools = body.get("tools") or []
    _named_tool_in_tools(body, {t["function"]["name"] for t in tools}, "required")
    # json_schema needs its schema
    fmt = body.get("response_format")
    needs_schema = isinstance(fmt, dict) and fmt.get("type") == "json_schema"
    if needs_schema and (fmt.get("json_schema") or {}).get("schema") is None:
        fmt["json_schema"] = {"name": "answer", "schema": {}}
    # top_logprobs needs logprobs; stream_options needs stream
    if body.get("top_logprobs") is not None:
        body["logprobs"] = True
    if not body.get("stream"):
        body.pop("stream_options", None)
    _vllm_fields(body)


#: vLLM's ways to constrain a Chat answer, of which a request takes one
_CONSTRAINTS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
_STRUCTURED = ("json", "regex", "choice", "grammar", "json_object")
#: a value llguidance takes, for a constraint given as a string
_USABLE = {"json": "{}", "regex": "[a-z]{1,8}", "grammar": 'start: "yes" | "no"'}


def _vllm_fields(body: dict[str, Any]) -> None:
    """One answer constraint (none beside ``response_format`` JSON or a forced tool call),
    written as llguidance reads it (a regex, a grammar, a schema's JSON text: any string is
    schema-valid); ``min_tokens`` within ``max_tokens``; ``continue_final_message`` after an
    assistant message with text, without ``add_generation_prompt``."""
    fmt = body.get("response_format")
    taken = (isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema")) or (
        body.get("tool_choice") not in (None, "auto", "none")
    )
    for key in (*_CONSTRAINTS, "structured_outputs"):
        if body.get(key) is not None and taken:
            body.pop(key)
        taken = taken or body.get(key) is not None
    for key in ("json", "regex", "grammar"):
        if isinstance(body.get(f"guided_{key}"), str):
            body[f"guided_{key}"] = _USABLE[key]
    options = body.get("structured_outputs")
    if isinstance(options, dict):
        given = [k for k in _STRUCTURED if options.get(k) not in (None, False)]
        for key in given[1:]:
            options.pop(key)
        if not given:
            options["choice"] = ["yes", "no"]
        elif given[0] in _USABLE and isinstance(options[given[0]], str):
            options[given[0]] = _USABLE[given[0]]
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if isinstance(body.get("min_tokens"), int) and limit is not None:
        body["min_tokens"] = min(body["min_tokens"], limit)
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    if body.get("continue_final_message") and (
        last.get("role") != "assistant"
        or _is_blank(last.get("content"))
        or body.get("add_generation_prompt")
    ):
        body.pop("continue_final_message")


def _named_tool_in_tools(body: dict[str, Any], names: set[str], required: str) -> None:
    """A tool_choice that requires a tool needs tools; one that names a tool needs it in tools."""
    choice = body.get("tool_choice")
    if choice == required and not names:
        body.pop("tool_choice")
    elif isinstance(choice, dict):
        name = choice.get("name") or (choice.get("function") or {}).get("name")
        if "type" in choice and choice["type"] in ("any", "auto", "none"):
            if choice["type"] == "any" and not names:
                body.pop("tool_choice")
        elif name not in names:
            body.pop("tool_choice")


def _responses(body: dict[str, Any]) -> None:
    items = body.get("input")
    for item in items if isinstance(items, list) else []:
        if item.get("type") == "function_call":
            _json_object_arguments(item)
    _named_tool_in_tools(body, {t["name"] for t in body.get("tools") or []}, "required")
    # the prompt must not come out empty (input items like reasoning add no message)
    if not isinstance(body.get("input"), str) and not body.get("instructions"):
        body["instructions"] = "Be brief."
    # json_schema needs its schema
    fmt = (body.get("text") or {}).get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and fmt.get("schema") is None:
        fmt["schema"] = {}
    # top_logprobs needs the output text's log-probabilities included
    if body.get("top_logprobs"):
        body["include"] = [*(body.get("include") or []), "message.output_text.logprobs"]


def _anthropic(body: dict[str, Any]) -> None:
    _named_tool_in_tools(body, {t["name"] for t in body.get("tools") or []}, "")
    # an enabled thinking needs a budget below max_tokens
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget, most = thinking.get("budget_tokens"), body.get("max_tokens")
        if budget is None or (most is not None and budget >= most):
            body["thinking"] = {"type": "disabled"}
    # the conversation must not come out empty: a user message of no blocks adds no message
    for message in body.get("messages") or []:
        if message.get("role") == "user" and message.get("content") == []:
            message["content"] = "hi"
    # a last assistant message is a prefill: it needs text to continue
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    content = last.get("content")
    blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
    prefill = last.get("role") == "assistant" and not any(
        b.get("type") == "tool_use" for b in blocks
    )
    if prefill and all(_is_blank(b.get("text")) for b in blocks if b.get("type") == "text"):
        messages.append({"role": "user", "content": "hi"})


#: token ids every tokenizer here knows (a byte-level vocabulary starts with its 256 bytes)
_KNOWN_IDS = 256
#: a raw prompt's characters: at most 4 UTF-8 bytes each, so 48 of them fit a 256-token context
_PROMPT_CHARS = 48
#: prompts of a generated Completions request: each generates up to the context, so a request
#: of 64 of them would take longer than the fuzzer waits
_PROMPTS = 4


def _known_ids(ids: list[Any]) -> list[Any]:
    return [t % _KNOWN_IDS if isinstance(t, int) else t for t in ids[:_PROMPT_CHARS]]


def _completions(body: dict[str, Any]) -> None:
    """Token ids the vocabulary holds, prompts that fit the context (a few of them),
    ``stream_options`` only with ``stream``, vLLM's fields under Chat's rules and
    ``min_tokens`` within ``max_tokens`` (16 when not given)."""
    _vllm_fields(body)
    limit = body.get("max_tokens", 16)
    if isinstance(body.get("min_tokens"), int) and isinstance(limit, int):
        body["min_tokens"] = min(body["min_tokens"], limit)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        body["prompt"] = prompt[:_PROMPT_CHARS]
    elif isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        body["prompt"] = _known_ids(prompt)
    elif isinstance(prompt, list):
        body["prompt"] = [
            item[:_PROMPT_CHARS] if isinstance(item, str) else _known_ids(item)
            for item in prompt[:_PROMPTS]
        ]
    if not body.get("stream"):
        body.pop("stream_options", None)


#: the fields only a chat template reads
_TEMPLATE_FIELDS = (
    "add_generation_prompt",
    "continue_final_message",
    "tools",
    "chat_template_kwargs",
)


def _tokenize(body: dict[str, Any]) -> None:
    """A prompt or messages, not both; the template's fields with messages only, and there
    under Chat's rules."""
    if body.get("messages") is None:
        body.pop("messages", None)
        if body.get("prompt") is None:
            body["prompt"] = "hi"
        for key in _TEMPLATE_FIELDS:
            body.pop(key, None)
    else:
        body.pop("prompt", None)
        _chat(body)


def _detokenize(body: dict[str, Any]) -> None:
    if isinstance(body.get("tokens"), list):
        body["tokens"] = [t % _KNOWN_IDS if isinstance(t, int) else t for t in body["tokens"]]


#: the fields that make the prompt, by API
_PROMPT = ("messages", "system", "tools", "input", "instructions")
#: tokens a template adds for tools (its tool-use instructions), beyond the tools' own JSON
_TOOLS_OVERHEAD = 600


@functools.cache
def _max_context(base_url: str) -> int:
    models = httpx.get(f"{base_url}/v1/models", timeout=10).json()
    return int(models["data"][0]["max_model_len"])


@functools.cache
def _lanes(base_url: str) -> int:
    for line in httpx.get(f"{base_url}/metrics", timeout=10).text.splitlines():
        if line.startswith("ninfer_max_concurrency "):
            return int(float(line.split()[1]))
    raise KeyError("ninfer_max_concurrency")


def _fit_the_lanes(body: dict[str, Any], base_url: str) -> None:
    """``n`` samples need as many decode lanes, which the server chooses at start-up."""
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n > _lanes(base_url):
        body["n"] = _lanes(base_url)


def _fit_the_context(body: dict[str, Any], base_url: str, prompt_key: str) -> None:
    """A rendered prompt must fit the server's context, which depends on the template and the
    tokenizer. Its UTF-8 size bounds its token count (byte-level tokens) from above, so a body
    whose prompt might not fit gets the smallest prompt (and no tool_choice, which needs tools)."""
    prompt = {key: body[key] for key in _PROMPT if body.get(key)}
    size = len(json.dumps(prompt, ensure_ascii=False).encode())
    size += _TOOLS_OVERHEAD if body.get("tools") else 0
    if size < _max_context(base_url) - 64:
        return
    for key in (*_PROMPT, "tool_choice", "previous_response_id", "continue_final_message"):
        body.pop(key, None)
    body[prompt_key] = [{"role": "user", "content": "hi"}]


#: per operation: the rules to repair, and the field that holds the conversation
_STEER = {
    "/v1/chat/completions": (_chat, "messages"),
    "/v1/completions": (_completions, "prompt"),
    "/tokenize": (_tokenize, "messages"),
    "/detokenize": (_detokenize, "tokens"),
    "/v1/responses": (_responses, "input"),
    "/v1/responses/input_tokens": (_responses, "input"),
    "/v1/messages": (_anthropic, "messages"),
    "/v1/messages/count_tokens": (_anthropic, "messages"),
}


@schemathesis.hook
def before_call(context, case, **kwargs):  # type: ignore[no-untyped-def]
    # before_call, not map_body: it sees the cases of every phase (coverage included)
    body = case.body
    if not isinstance(body, dict):
        return
    if "model" in body:
        body["model"] = MODEL
    steering = _STEER.get(case.operation.path)
    # only bodies meant to be valid: a body generated to break the schema stays as it is
    if steering is None or case.meta is None or not case.meta.generation.mode.is_positive:
        return
    steer, prompt_key = steering
    body = case.body = _integral_floats_as_ints(body)
    with contextlib.suppress(AttributeError, KeyError, TypeError):  # a shape the rule skips
        steer(body)
        _fit_the_context(body, case.operation.base_url, prompt_key)
        _fit_the_lanes(body, case.operation.base_url)
