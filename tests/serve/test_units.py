"""In-process tests: the engine's logits-processor hook and the protocol translations that the
tiny model never exercises through HTTP (it writes no reasoning text)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ninfer_runtime.engine import Engine, GenerationRequest
from ninfer_runtime.frontend import (
    ReasoningDelta,
    SamplingParams,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from ninfer_serve.anthropic.message_stream import ContentBlocks as _Blocks
from ninfer_serve.anthropic.messages import to_job as anthropic_job
from ninfer_serve.anthropic.models import MessagesRequest
from ninfer_serve.engine_thread import Prepared
from ninfer_serve.openai.response_events import ResponseBuilder
from ninfer_serve.openai.response_items import input_messages

from .conftest import generate_all

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def engine(artifact) -> Engine:
    return Engine(artifact, max_context=1024)


def test_processor_sees_only_the_answer(engine):
    calls: list[list[int]] = []

    def watch(logits: np.ndarray, answer: list[int]) -> np.ndarray:
        calls.append(list(answer))
        return logits

    request = GenerationRequest(messages=QUESTION, logits_processor=watch,
                                sampling=SamplingParams(temperature=0))  # fmt: skip
    ids, out, finished = generate_all(engine, request)
    think_close = engine.tokenizer.special.think_close
    answer = ids[ids.index(think_close) + 1 :]
    assert out.content == "The capital of France is Paris."
    assert calls[0] == [] and calls[-1] == answer  # from </think> on, never before
    assert finished.usage.reasoning_tokens == ids.index(think_close) + 1


def test_processor_masks_tokens(engine):
    target = engine.tokenizer.encode(" Rome")
    eos = engine.tokenizer.eos_token_ids[0]

    def force(logits: np.ndarray, answer: list[int]) -> np.ndarray:
        allowed = target[len(answer)] if len(answer) < len(target) else eos
        out = np.full_like(logits, -np.inf)
        out[allowed] = 0.0
        return out

    request = GenerationRequest(messages=QUESTION, enable_thinking=False, logits_processor=force)
    _, out, finished = generate_all(engine, request)
    assert out.content == "Rome" and finished.stop.kind == "eos"


def test_tool_call_parsing_can_be_off(engine):
    forced = engine.tokenizer.encode("<tool_call>\n<function=f>\n</function>\n</tool_call>")
    eos = engine.tokenizer.eos_token_ids[0]

    def force(logits: np.ndarray, answer: list[int]) -> np.ndarray:
        out = np.full_like(logits, -np.inf)
        out[forced[len(answer)] if len(answer) < len(forced) else eos] = 0.0
        return out

    base = {"messages": QUESTION, "enable_thinking": False, "logits_processor": force}
    on = generate_all(engine, GenerationRequest(**base))[1]
    off = generate_all(engine, GenerationRequest(**base, parse_tool_calls=False))[1]
    assert [c.name for c in on.tool_calls] == ["f"] and on.content == ""
    assert off.tool_calls == [] and off.content.startswith("<tool_call>")


def test_continue_final_message(engine):
    messages = [*QUESTION, {"role": "assistant", "content": "The capital of"}]
    request = GenerationRequest(messages=messages, continue_final_message=True,
                                sampling=SamplingParams(temperature=0))  # fmt: skip
    ids, opened = engine.render(request)
    assert engine.tokenizer.decode(ids).endswith("The capital of") and not opened
    _, out, _ = generate_all(engine, request)
    assert out.content == " France is Paris."  # the space joins it to the continued text


def test_responses_items_become_chat_messages():
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "use the tool"}]},
        {"type": "function_call", "call_id": "c1", "name": "get", "arguments": '{"a": 1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "It is sunny."}]},
    ]  # fmt: skip
    assert input_messages(items) == [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "reasoning_content": "use the tool",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "get", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
    ]  # fmt: skip


def test_anthropic_blocks_become_chat_messages():
    body = MessagesRequest.model_validate({
        "model": "m",
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "tool time", "signature": "s"},
                {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"a": 1}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "text", "text": "And tomorrow?"},
            ]},
            {"role": "assistant", "content": "Tomorrow"},
        ],
        "tools": [{"name": "get", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
    })  # fmt: skip
    job = anthropic_job(body)
    assert [m["role"] for m in job.messages] == [
        "system", "user", "assistant", "tool", "user", "assistant"
    ]  # fmt: skip
    assert job.messages[2]["reasoning_content"] == "tool time"
    assert job.messages[2]["tool_calls"][0]["function"] == {"name": "get", "arguments": {"a": 1}}
    assert job.continue_final_message  # a final text-only assistant turn is a prefill
    assert job.tool_choice == "required" and job.parallel_tool_calls is False
    assert job.enable_thinking is False  # no thinking field: Anthropic's default, off


EVENTS = [
    ReasoningDelta("let me "),
    ReasoningDelta("see"),
    TextDelta("Calling."),
    ToolCallStart(0, "call_abc", "get"),
    ToolCallArgumentsDelta(0, '{"a": '),
    ToolCallArgumentsDelta(0, "1}"),
    ToolCallEnd(0),
]


def test_anthropic_block_lifecycle():
    blocks = _Blocks()
    frames = [frame for event in EVENTS for frame in blocks.feed(event)] + blocks.close()
    payloads = [json.loads(f.decode().split("data: ", 1)[1]) for f in frames]
    kinds = [(p["type"], p.get("content_block", p.get("delta", {})).get("type")) for p in payloads]
    assert kinds == [
        ("content_block_start", "thinking"),
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "signature_delta"),
        ("content_block_stop", None),
        ("content_block_start", "text"),
        ("content_block_delta", "text_delta"),
        ("content_block_stop", None),
        ("content_block_start", "tool_use"),
        ("content_block_delta", "input_json_delta"),
        ("content_block_delta", "input_json_delta"),
        ("content_block_stop", None),
    ]
    assert [p["index"] for p in payloads if p["type"] == "content_block_start"] == [0, 1, 2]
    assert payloads[8]["content_block"]["id"] == "toolu_abc"


def test_responses_builder_items_and_events():
    builder = ResponseBuilder({"id": "resp_1", "object": "response"})
    frames = [frame for event in EVENTS for frame in builder.feed(event)] + builder.finish()
    payloads = [json.loads(f.decode().split("data: ", 1)[1]) for f in frames]
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    names = [p["type"] for p in payloads]
    assert names[:3] == ["response.output_item.added", "response.content_part.added",
                         "response.reasoning_text.delta"]  # fmt: skip
    assert names.count("response.output_item.done") == 3
    assert "response.function_call_arguments.done" in names
    output = builder.response()["output"]
    assert [i["type"] for i in output] == ["reasoning", "message", "function_call"]
    assert output[0]["content"][0]["text"] == "let me see"
    assert json.loads(output[2]["arguments"]) == {"a": 1}
    assert all(i["status"] == "completed" for i in output)


def test_bound_socket_is_tcp_nodelay():
    import socket

    from ninfer_serve.listener import listen as _bind

    sock = _bind("127.0.0.1", 0)
    try:  # asyncio only sets TCP_NODELAY on accepted sockets whose proto says TCP
        assert sock.proto == socket.IPPROTO_TCP
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        sock.close()


def test_engine_failure_fails_requests_and_health(engine):
    import asyncio

    from ninfer_serve.admission import EngineUnavailable
    from ninfer_serve.engine_loop import EngineLoop
    from ninfer_serve.metrics import Metrics

    class Broken:
        """The real engine, except that its second step raises."""

        def __init__(self, inner: Engine):
            self.inner, self.steps = inner, 0

        def __getattr__(self, name: str):
            return getattr(self.inner, name)

        def step(self, flush=None):
            self.steps += 1
            if self.steps == 2:
                raise RuntimeError("device lost")
            return self.inner.step(flush=flush)

    async def scenario() -> tuple[Exception | None, str | None, bool]:
        metrics = Metrics("tiny", backend="cpu", max_concurrency=1, max_context=1024)
        loop = EngineLoop(lambda: Broken(engine), max_concurrency=1, max_pending=0,
                          pending_timeout_s=5, metrics=metrics)  # fmt: skip
        loop.start()
        await loop.wait_loaded()
        ticket = loop.admit()
        await loop.acquire_lane(ticket)
        params = SamplingParams(max_tokens=50, ignore_eos=True)
        request = GenerationRequest(prompt="Hello", sampling=params)
        ids, opened = engine.render(request)
        stream = loop.submit(ticket, request, Prepared(ids, opened, None))
        error = None
        async for chunk in stream.chunks():
            error = chunk.error or error
        ready = loop.ready
        free = loop.running == 0
        await loop.drain(1)
        return error, loop.failed, ready or not free

    error, failed, bad = asyncio.run(scenario())
    assert isinstance(error, EngineUnavailable) and "device lost" in str(error)
    assert failed is not None and "device lost" in failed
    assert not bad  # not ready any more (/health 503), and the lane was released
    for rid in list(engine.scheduler.active):  # leave the shared engine clean for other tests
        engine.cancel(rid)
