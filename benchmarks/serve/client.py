"""The HTTP side: streamed chat requests timed as a client sees them, a concurrency level or a
set of agent conversations driven through them, and the server's own figures from
``/metrics``."""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import time

import httpx

from .sample import Sample
from .workload import AGENT_TOOLS, Conversation, words


async def one_request(
    client: httpx.AsyncClient, url: str, model: str, prompt: str, output_len: int
) -> Sample:
    messages = [{"role": "user", "content": prompt}]
    return await stream_chat(client, url, {"model": model, "messages": messages}, output_len)


async def stream_chat(
    client: httpx.AsyncClient, url: str, request: dict, output_len: int
) -> Sample:
    """One streamed chat request (``request`` holds model, messages and any tools), timed as
    a client sees it; the reply's text is kept for a conversation's next turn."""
    body = {
        **request,
        "max_tokens": output_len,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "enable_thinking": False,
    }
    sample = Sample()
    start = time.perf_counter()
    last = None
    text = []
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            detail = (await response.aread()).decode("utf-8", "replace")
            sample.error = f"HTTP {response.status_code}: {detail[:300]}"
            return sample
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if error := chunk.get("error"):  # the engine failed mid-stream
                sample.error = str(error.get("message") if isinstance(error, dict) else error)
            if usage := chunk.get("usage"):
                sample.output_tokens = usage["completion_tokens"]
                sample.prompt_tokens = usage["prompt_tokens"]
                details = usage.get("prompt_tokens_details") or {}
                sample.cached_tokens = details.get("cached_tokens") or 0
            if timings := chunk.get("timings"):
                sample.server_decode = timings["predicted_ms"] / 1000
            choices = chunk.get("choices") or []
            delta = choices[0].get("delta", {}) if choices else {}
            text.append(delta.get("content") or "")
            if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
                now = time.perf_counter()
                if last is None:
                    sample.ttft = now - start
                else:
                    sample.itl.append(now - last)
                last = now
    sample.e2el = time.perf_counter() - start
    # tokens are counted from the usage block: one that decodes to no text sends no chunk
    sample.ok = sample.output_tokens > 0 and not sample.error
    if not sample.ok and not sample.error:
        sample.error = "the stream ended without a usage block counting any output token"
    sample.text = "".join(text)
    return sample


async def run_level(
    url: str,
    model: str,
    texts: list[str],
    output_len: int,
    concurrency: int,
    warmup: list[str] = (),
) -> tuple[list[Sample], float]:
    limit = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def bounded(text: str) -> Sample:
            async with limit:
                return await one_request(client, url, model, text, output_len)

        # warm the connections, the kernels and the decode steps
        await asyncio.gather(*(one_request(client, url, model, t, 4) for t in warmup))
        before = server_means(url)
        started = time.perf_counter()
        samples = await asyncio.gather(*(bounded(t) for t in texts))
        duration = time.perf_counter() - started
        after = server_means(url)
        ttft, prefill, itl = (
            (a[0] - b[0]) / (a[1] - b[1]) if a[1] > b[1] else float("nan")
            for a, b in zip(after, before, strict=True)
        )
        for sample in samples:  # the server's own view, means over the level
            sample.server_ttft, sample.server_prefill, sample.server_itl = ttft, prefill, itl
            if sample.ok and math.isnan(sample.ttft):  # no token showed in the stream
                sample.ttft, sample.ttft_source = ttft, "server"
        return list(samples), duration


def server_means(url: str) -> list[tuple[float, float]]:
    """(sum of seconds, count) so far of the server's time to first token (from admission),
    of its prefill time (the engine taking the request to its first token) and of its gaps
    between tokens."""
    names = (
        "ninfer_time_to_first_token_seconds",
        "ninfer_request_prefill_seconds",
        "ninfer_inter_token_latency_seconds",
    )
    return [(metric(url, f"{n}_sum"), metric(url, f"{n}_count")) for n in names]


async def system_words_for(url: str, model: str, tokens: int) -> int:
    """Words of system text that, with the tools, make about ``tokens`` prompt tokens, from
    three short probes (their prompts share no prefix with the workload's, so they seed no
    cache for it): tokens per word, and what the tools block adds."""
    probe = words(64, random.Random(-1))
    async with httpx.AsyncClient(timeout=600) as client:

        async def prompt_tokens(text: str, tools: bool) -> int:
            request = {"model": model, "messages": [{"role": "user", "content": text}]}
            sample = await stream_chat(
                client, url, request | ({"tools": AGENT_TOOLS} if tools else {}), 1
            )
            if not sample.ok:
                raise RuntimeError(f"the probe request to {url} failed")
            return sample.prompt_tokens

        one = await prompt_tokens(probe, tools=False)
        two = await prompt_tokens(f"{probe} {probe}", tools=False)
        with_tools = await prompt_tokens(probe, tools=True)
    per_word = max(two - one, 1) / 64
    return max(0, round((tokens - (with_tools - one)) / per_word))


async def run_agent(
    url: str, model: str, conversations: list[Conversation], turns: int, output_len: int
) -> tuple[list[list[Sample]], float]:
    """Every client's turns one after another, the clients at once; samples by turn."""
    limits = httpx.Limits(max_connections=len(conversations))
    by_turn: list[list[Sample]] = [[] for _ in range(turns)]
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def chat(conversation: Conversation) -> None:
            for turn in range(turns):
                request = {
                    "model": model,
                    "messages": conversation.next_turn(),
                    "tools": AGENT_TOOLS,
                }
                sample = await stream_chat(client, url, request, output_len)
                if sample.ok and math.isnan(sample.ttft):  # no token showed in the stream
                    sample.ttft = sample.e2el - sample.server_decode
                    sample.ttft_source = "client less server decode"
                by_turn[turn].append(sample)
                conversation.reply(sample.text)

        await one_request(client, url, model, "hello", 4)  # warm the connection
        started = time.perf_counter()
        await asyncio.gather(*(chat(c) for c in conversations))
        return by_turn, time.perf_counter() - started


def metric(url: str, name: str) -> float:
    """One unlabelled series of the server's /metrics (0 when it has none)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(match[1]) if match else 0.0
