"""Load generator for ninfer-serve, in the conventions of ``vllm bench serve``.

For each concurrency level it sends ``--num-prompts`` streaming chat requests over loopback
with at most C in flight (request rate infinite, as ``vllm bench serve --max-concurrency C``),
each generating exactly ``--output-len`` tokens (``ignore_eos``), and reports per level:

* TTFT: request sent -> first streamed chunk carrying output, as the client sees it; when a
  request's tokens decode to no text (a synthetic artifact's random weights pick ids beyond
  its tokenizer's), the stream shows none before the end, and its TTFT is the server's own
  (``/metrics``, arrival to first token), marked as such;
* TPOT: (E2EL - TTFT) / (output tokens - 1), per request (vLLM's definition, first token
  excluded); output tokens come from the stream's usage block, never from its text;
* ITL: gaps between consecutive streamed chunks that carry text (vLLM's definition; a token
  whose text is held back, e.g. half a UTF-8 character or a special token, sends no chunk),
  and the server's own gap between tokens;
* E2EL, output tok/s and requests/s over the level's wall time.

``--engine-baseline`` runs the same prompts through the engine alone, in this process (same
lanes, same ``step()`` loop, no HTTP; TTFT and ITL from its token events), so ``server
overhead per token = server TPOT - engine TPOT`` at the same concurrency: what the HTTP
layer, the engine-thread hand-off and SSE add to every generated token. Per level the
baseline runs first, in a context pool of exactly its lanes x ``--max-context``, and is
released (its device memory handed back) before the server starts: on a GPU both hold the
weights, and the server then sizes its pool (``--context-capacity``) beside nothing else.

    python benchmarks/serve_bench.py --model out/tiny.ninfer --concurrency 1,2,4,8 \\
        --engine-baseline --server-cpus 0 --client-cpus 1
    python benchmarks/serve_bench.py --url http://127.0.0.1:8080 --concurrency 1,4
    python benchmarks/serve_bench.py --model 27b.ninfer --backend cuda --concurrency 1,8 \\
        --engine-baseline --commit "$(git rev-parse --short HEAD)"

The end of the output is a markdown block for docs/performance.md: date, device, commit, the
server's flags and the figures.

``--workload agent`` is an agent-like chat instead: ``--clients`` conversations run at once,
each ``--turns`` turns long, all opening with one shared system prompt of about
``--system-tokens`` tokens (text plus a list of function ``tools``); every turn resends the
client's whole history (earlier user messages and the assistant replies as streamed) plus a
new short user message, as a chat client does. With ``--model`` it runs twice, against a
server with the prefix cache on and one with it off (``[context_cache] enabled = false``), and
reports per mode the TTFT by turn (turn 1 against later turns), output tok/s, the share of
prompt tokens served from the cache (``usage.prompt_tokens_details.cached_tokens``) and the
lanes preempted (``/metrics``):

    python benchmarks/serve_bench.py --workload agent --model out/tiny.ninfer \
        --system-tokens 1500 --clients 4 --turns 3 --output-len 32 --max-context 4096
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import json
import math
import os
import platform
import random
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import httpx

# one BLAS thread, as the server runs it: the baseline must compare like with like
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
#: prompt vocabulary: words the bundled tiny model knows
SENTENCE = (
    "the capital of france is paris and the weather is sunny warm today tell me a joke why did "
    "the tensor cross the bus to reach other gpu hello how can i help you"
)
WORDS = SENTENCE.split()
#: the server's context pool on a GPU unless --context-capacity says otherwise: a 27B-class
#: model's 8 lanes x 1024 tokens take about 2.3 GiB (1 GiB of K/V, 1.3 GiB of recurrent
#: states) and prefix-cache snapshots the rest, while a fixed size keeps the run from
#: depending on what else holds the card ("auto" would take all of it)
CUDA_CONTEXT_CAPACITY = "16GiB"


class BenchError(Exception):
    """A run that cannot give figures (no request succeeded, the server did not start)."""


@dataclass
class Sample:
    #: seconds to the first token; NaN until known (a stream that showed no output)
    ttft: float = float("nan")
    #: who measured ``ttft``: "client" (first streamed chunk carrying output), "server" (its
    #: mean for the level, when the tokens decoded to no text) or "engine" (first token event)
    ttft_source: str = "client"
    e2el: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    itl: list[float] = field(default_factory=list)
    #: mean TTFT the server measured (request admitted to first token out of the engine)
    server_ttft: float = float("nan")
    #: mean prefill time the server measured (the engine taking it to its first token)
    server_prefill: float = float("nan")
    #: mean gap between tokens the server measured
    server_itl: float = float("nan")
    #: first token to last, as the server measured this request (its stream's ``timings``)
    server_decode: float = float("nan")
    ok: bool = False
    text: str = ""
    #: why the request failed (HTTP status and body, or the error sent in the stream)
    error: str = ""

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2 or math.isnan(self.ttft):
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)


def prompts(count: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(count)]


# -- client ---------------------------------------------------------------------------------------


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


def warmup_prompts(concurrency: int, words: int, seed: int) -> list[str]:
    """Prompts that share no text with the timed ones (a prefix cache warmed on those would
    shorten their prefill), one per lane so that every lane count's step is ready."""
    return prompts(concurrency, words, -1 - seed)


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


# -- engine alone ---------------------------------------------------------------------------------


def engine_level(
    model: Path,
    texts: list[str],
    output_len: int,
    concurrency: int,
    max_context: int,
    backend: str = "cpu",
    repeat: int = 1,
    warmup: list[str] = (),
) -> tuple[list[Sample], float]:
    """The same workload through ``Engine.step`` directly (the server's engine thread, minus
    everything around it), ``repeat`` times pooled, on an engine of its own that is released
    before this returns."""
    from ninfer_runtime.engine import Engine
    from ninfer_runtime.errors import EngineError

    try:
        # no context budget: pages for exactly ``concurrency`` lanes of ``max_context``
        # tokens (never "auto", which on a GPU would take the card), and no prefix cache
        engine = Engine(
            model,
            max_context=max_context,
            max_lanes=concurrency,
            backend=backend,
            context_capacity=None,
            prefix_cache=False,
        )
    except EngineError as exc:
        raise BenchError(f"engine baseline on {model}: {exc}") from None
    try:
        drive(engine, warmup, 4, concurrency)  # kernels and every lane count's step
        samples: list[Sample] = []
        duration = 0.0
        for _ in range(repeat):
            more, seconds = drive(engine, texts, output_len, concurrency)
            samples += more
            duration += seconds
        return samples, duration
    finally:
        del engine
        in_use = release_device_memory(backend)
        print(f"engine baseline released{f' ({in_use})' if in_use else ''}", flush=True)


def drive(
    engine: object, texts: list[str], output_len: int, concurrency: int
) -> tuple[list[Sample], float]:
    """``texts`` through ``engine`` with at most ``concurrency`` in flight, timed per token
    event (every generated token has one, whether or not it decodes to text)."""
    from ninfer_runtime.engine import Failed, Finished, GenerationRequest, TokenEvent
    from ninfer_runtime.frontend import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    pending = list(texts)
    samples: dict[str, Sample] = {}
    sent: dict[str, float] = {}
    last: dict[str, float] = {}
    done = 0
    started = time.perf_counter()
    while pending or engine.has_work:
        while pending and len(sent) - done < concurrency:
            request = GenerationRequest(
                messages=[{"role": "user", "content": pending.pop(0)}],
                enable_thinking=False,
                sampling=params,
            )
            rid = engine.submit(request)
            sent[rid] = time.perf_counter()
            samples[rid] = Sample(ttft_source="engine")
        for event in engine.step():
            now = time.perf_counter()
            sample = samples[event.request_id]
            if isinstance(event, TokenEvent):
                if event.request_id not in last:
                    sample.ttft = now - sent[event.request_id]
                else:
                    sample.itl.append(now - last[event.request_id])
                last[event.request_id] = now
            elif isinstance(event, Finished):
                sample.e2el = now - sent[event.request_id]
                sample.output_tokens = event.usage.completion_tokens
                sample.prompt_tokens = event.usage.prompt_tokens
                sample.ok = sample.output_tokens > 0
                done += 1
            elif isinstance(event, Failed):
                sample.error = str(event.error)
                done += 1
    return list(samples.values()), time.perf_counter() - started


def release_device_memory(backend: str) -> str:
    """Collect a released engine and hand the device memory CuPy keeps cached back to the
    driver, so that a server started next finds the card free; what is still in use, said
    in words ("" off the GPU)."""
    gc.collect()  # the engine's weights, pool and captured steps sit in reference cycles
    cupy = sys.modules.get("cupy")  # only a cuda engine imported it: never imported here
    if backend != "cuda" or cupy is None:
        return ""
    cupy.cuda.Device().synchronize()
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()
    free, total = cupy.cuda.runtime.memGetInfo()
    return f"{(total - free) / 2**30:.1f} of {total / 2**30:.1f} GiB of the GPU in use"


def engine_on(cpus: str | None, *args: object, **kwargs: object) -> tuple[list[Sample], float]:
    """``engine_level`` on the server's CPUs, so both runs get the same cores."""
    mine = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, {int(x) for x in cpus.split(",")})
    try:
        return engine_level(*args, **kwargs)  # type: ignore[arg-type]
    finally:
        os.sched_setaffinity(0, mine)


# -- report ---------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def mean(values: list[float]) -> float:
    """The mean, NaN for no values (shown as n/a)."""
    return statistics.fmean(values) if values else float("nan")


def shown(value: float, spec: str = ".2f") -> str:
    return "n/a" if math.isnan(value) else format(value, spec)


@dataclass
class Level:
    concurrency: int
    samples: list[Sample]
    duration: float
    #: what ran, for messages: "server" or "engine"
    kind: str = "server"

    def stats(self) -> dict[str, float]:
        ok = [s for s in self.samples if s.ok]
        if not ok:
            errors = sorted({s.error for s in self.samples if s.error})
            raise BenchError(
                f"C={self.concurrency}, {self.kind}: none of the {len(self.samples)} requests "
                f"produced a token ({errors[0] if errors else 'no error given'})"
            )
        ttft = [s.ttft for s in ok if not math.isnan(s.ttft)]
        tpot = [t for s in ok if (t := s.tpot) is not None]
        itl = [x for s in ok for x in s.itl]
        e2el = [s.e2el for s in ok]
        out = sum(s.output_tokens for s in ok)
        ms = 1000.0
        return {
            "ok": len(ok), "failed": len(self.samples) - len(ok),
            "duration_s": self.duration,
            "input_tokens": sum(s.prompt_tokens for s in ok), "output_tokens": out,
            "req_s": len(ok) / self.duration, "out_tok_s": out / self.duration,
            # requests whose TTFT is the server's own (their tokens showed no text)
            "ttft_from_server": sum(s.ttft_source == "server" for s in ok),
            "ttft_mean": mean(ttft) * ms, "ttft_p50": pct(ttft, 50) * ms,
            "ttft_p99": pct(ttft, 99) * ms,
            "tpot_mean": mean(tpot) * ms, "tpot_p50": pct(tpot, 50) * ms,
            "tpot_p99": pct(tpot, 99) * ms,
            "itl_mean": mean(itl) * ms, "itl_p50": pct(itl, 50) * ms,
            "itl_p99": pct(itl, 99) * ms,
            "e2el_p50": pct(e2el, 50) * ms, "e2el_p99": pct(e2el, 99) * ms,
            "server_ttft_mean": mean([s.server_ttft for s in ok]) * ms,
            "server_prefill_mean": mean([s.server_prefill for s in ok]) * ms,
            "server_itl_mean": mean([s.server_itl for s in ok]) * ms,
        }  # fmt: skip


def ttft_source(s: dict[str, float], engine: bool = False) -> str:
    """Who measured the TTFT figures, in words."""
    if engine:
        return "engine (first token event)"
    if s["ttft_from_server"] == 0:
        return "client (first streamed token)"
    if s["ttft_from_server"] == s["ok"]:
        return "server (no text streamed)"
    return f"server for {s['ttft_from_server']:.0f} of {s['ok']:.0f} (no text streamed)"


def vllm_block(title: str, s: dict[str, float], engine: bool = False) -> str:
    """The per-level summary in ``vllm bench serve``'s layout."""
    rows = [
        ("Successful requests:", f"{s['ok']:.0f}"),
        ("Failed requests:", f"{s['failed']:.0f}"),
        ("Benchmark duration (s):", f"{s['duration_s']:.2f}"),
        ("Total input tokens:", f"{s['input_tokens']:.0f}"),
        ("Total generated tokens:", f"{s['output_tokens']:.0f}"),
        ("Request throughput (req/s):", f"{s['req_s']:.2f}"),
        ("Output token throughput (tok/s):", f"{s['out_tok_s']:.2f}"),
        ("Mean TTFT (ms):", shown(s["ttft_mean"])),
        ("Median TTFT (ms):", shown(s["ttft_p50"])),
        ("P99 TTFT (ms):", shown(s["ttft_p99"])),
        *(
            []
            if engine
            else [
                ("Mean TTFT in the server (ms):", shown(s["server_ttft_mean"])),
                ("Mean prefill in the server (ms):", shown(s["server_prefill_mean"])),
            ]
        ),
        ("Mean TPOT (ms):", shown(s["tpot_mean"])),
        ("Median TPOT (ms):", shown(s["tpot_p50"])),
        ("P99 TPOT (ms):", shown(s["tpot_p99"])),
        ("Mean ITL (ms):", shown(s["itl_mean"])),
        ("Median ITL (ms):", shown(s["itl_p50"])),
        ("P99 ITL (ms):", shown(s["itl_p99"])),
        *([] if engine else [("Mean ITL in the server (ms):", shown(s["server_itl_mean"]))]),
    ]
    lines = [f"{f' {title} ':=^50}"] + [f"{k:<40}{v:>10}" for k, v in rows]
    lines += [f"TTFT measured by: {ttft_source(s, engine)}", "=" * 50]
    if math.isnan(s["itl_mean"]) and not engine:
        lines.append("(no text was streamed: ITL has no client-side samples)")
    return "\n".join(lines)


def table(levels: list[tuple[int, dict[str, float], dict[str, float] | None]]) -> str:
    """One row per concurrency: the server as a client sees it, then the engine alone."""
    head = (
        "| C | req/s | out tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | ITL p50 / p99 ms "
        "| engine alone: out tok/s | TTFT p50 ms | TPOT p50 ms | server overhead per token "
        "ms (TPOT mean) |"
    )
    lines = [head, "|" + "---:|" * 10]
    for c, s, e in levels:
        engine = (
            f"{e['out_tok_s']:.0f} | {shown(e['ttft_p50'], '.1f')} | {shown(e['tpot_p50'])} | "
            f"{shown(s['tpot_mean'] - e['tpot_mean'], '+.3f')}"
            if e
            else "- | - | - | -"
        )
        lines.append(
            f"| {c} | {s['req_s']:.2f} | {s['out_tok_s']:.0f} | {shown(s['ttft_p50'], '.1f')} / "
            f"{shown(s['ttft_p99'], '.1f')} | {shown(s['tpot_p50'])} / {shown(s['tpot_p99'])} | "
            f"{shown(s['itl_p50'])} / {shown(s['itl_p99'])} | {engine} |"
        )
    return "\n".join(lines)


def markdown_report(
    meta: dict[str, str], levels: list[tuple[int, dict[str, float], dict[str, float] | None]]
) -> str:
    """The block docs/performance.md takes: where and what ran, then per concurrency the
    server's TPOT against the engine's alone, TTFT and output tok/s."""
    lines = [
        f"### Serving: {meta['model']}, {meta['backend']}, {meta['date']}",
        "",
        f"- date {meta['date']}, device {meta['device']}, commit {meta['commit']}",
        f"- server: `{meta['server']}`",
        f"- workload: {meta['workload']}",
        "",
        "| C | server TPOT mean ms | engine TPOT mean ms | overhead per token ms "
        "| TTFT p50 ms server / engine | out tok/s server / engine | TTFT measured by |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c, s, e in levels:
        e = e or dict.fromkeys(s, float("nan"))
        lines.append(
            f"| {c} | {shown(s['tpot_mean'])} | {shown(e['tpot_mean'])} "
            f"| {shown(s['tpot_mean'] - e['tpot_mean'], '+.3f')} "
            f"| {shown(s['ttft_p50'], '.1f')} / {shown(e['ttft_p50'], '.1f')} "
            f"| {s['out_tok_s']:.1f} / {shown(e['out_tok_s'], '.1f')} | {ttft_source(s)} |"
        )
    return "\n".join(lines)


def device_name(backend: str) -> str:
    """The GPU's name from nvidia-smi (CuPy is not imported for it), else the CPU's."""
    if backend == "cuda":
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        return out.splitlines()[0] if out else "unknown GPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} (CPU)"
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def current_commit() -> str:
    """The checkout's short commit, or "unknown" (a copied tree has no git metadata)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


# -- agent workload -------------------------------------------------------------------------------

#: the tools every agent request lists (they are rendered into the shared system prompt)
AGENT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    arg: {"type": kind, "description": f"the {arg.replace('_', ' ')}"}
                    for arg, kind in args.items()
                },
                "required": list(args)[:1],
            },
        },
    }
    for name, description, args in (
        ("get_weather", "Current weather for a city", {"city": "string", "unit": "string"}),
        ("search_web", "Search the web", {"query": "string", "count": "integer"}),
        ("read_file", "Read a workspace file", {"path": "string", "max_lines": "integer"}),
        ("run_shell", "Run a shell command", {"command": "string", "timeout_s": "number"}),
    )
]  # fmt: skip


def words(count: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


@dataclass
class Conversation:
    """One agent client: the shared system prompt, then its own turns, each resent whole."""

    system: str
    user_words: int
    rng: random.Random
    messages: list[dict] = field(default_factory=list)

    def next_turn(self) -> list[dict]:
        """The history plus a new short user message: what this turn sends."""
        if not self.messages:
            self.messages.append({"role": "system", "content": self.system})
        self.messages.append({"role": "user", "content": words(self.user_words, self.rng)})
        return list(self.messages)

    def reply(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})


def agent_conversations(
    clients: int, system_words: int, user_words: int, seed: int
) -> list[Conversation]:
    system = "You are a helpful agent. " + words(system_words, random.Random(seed))
    return [
        Conversation(system, user_words, random.Random(seed * 1000 + c + 1)) for c in range(clients)
    ]


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


def agent_stats(by_turn: list[list[Sample]], duration: float, preemptions: float) -> dict:
    def timed(samples: list[Sample]) -> list[Sample]:
        """The samples with a TTFT (a NaN, from a failed request, would break a sort by it)."""
        return [s for s in samples if s.ok and not math.isnan(s.ttft)]

    def ttft(samples: list[Sample]) -> dict[str, float]:
        values = [s.ttft * 1000 for s in timed(samples)]
        return {"ttft_mean": mean(values), "ttft_p50": pct(values, 50), "ttft_p90": pct(values, 90)}

    def share(samples: list[Sample]) -> float:
        prompt = sum(s.prompt_tokens for s in samples if s.ok)
        return sum(s.cached_tokens for s in samples if s.ok) / prompt if prompt else 0.0

    every = [s for turn in by_turn for s in turn]
    ok = [s for s in every if s.ok]
    return {
        "ok": len(ok), "failed": len(every) - len(ok), "duration_s": duration,
        "prompt_tokens": sum(s.prompt_tokens for s in ok),
        "cached_tokens": sum(s.cached_tokens for s in ok),
        "output_tokens": sum(s.output_tokens for s in ok),
        "out_tok_s": sum(s.output_tokens for s in ok) / duration,
        "cached_share": share(every), "preemptions": preemptions,
        "ttft_sources": sorted({s.ttft_source for s in ok}),
        "first_turn": ttft(by_turn[0]),
        # the clients after the first the server took: all arrive at once, and only the first
        # must read the shared prefix whole
        "first_turn_followers": ttft(sorted(timed(by_turn[0]), key=lambda s: s.ttft)[1:]),
        "later_turns": ttft([s for turn in by_turn[1:] for s in turn]),
        "turns": [
            {"turn": i + 1, "requests": len(turn), "prompt_tokens_mean": statistics.fmean(
                [s.prompt_tokens for s in turn if s.ok] or [0]),
             "cached_share": share(turn), **ttft(turn)}
            for i, turn in enumerate(by_turn)
        ],
    }  # fmt: skip


def agent_table(modes: dict[str, dict]) -> str:
    """Per mode: TTFT of every turn, then turn 1 against the later turns and the totals."""
    lines = [
        "| cache | turn | requests | prompt tokens (mean) | cached share "
        "| TTFT mean / p50 / p90 ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for mode, s in modes.items():
        for t in s["turns"]:
            lines.append(
                f"| {mode} | {t['turn']} | {t['requests']} | {t['prompt_tokens_mean']:.0f} | "
                f"{t['cached_share']:.1%} | {t['ttft_mean']:.1f} / {t['ttft_p50']:.1f} / "
                f"{t['ttft_p90']:.1f} |"
            )
    lines += [
        "",
        "| cache | turn 1 TTFT mean / p50 / p90 ms | turn 1 after the first client "
        "| turns 2+ TTFT mean / p50 / p90 ms "
        "| out tok/s | cached share | preemptions | ok / failed | duration s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, s in modes.items():
        first, followers, later = (
            " / ".join(f"{t[k]:.1f}" for k in ("ttft_mean", "ttft_p50", "ttft_p90"))
            for t in (s["first_turn"], s["first_turn_followers"], s["later_turns"])
        )
        lines.append(
            f"| {mode} | {first} | {followers} | {later} | {s['out_tok_s']:.1f} "
            f"| {s['cached_share']:.1%} "
            f"| {s['preemptions']:.0f} "
            f"| {s['ok']} / {s['failed']} | {s['duration_s']:.1f} |"
        )
    return "\n".join(lines)


def agent_main(args: argparse.Namespace) -> None:
    """The agent workload against ``--url``, or twice against servers started on
    ``--model``: the prefix cache on, then off; the same conversations (greedy) in both."""
    modes = ["server"] if args.url else ["on", "off"]
    results: dict[str, dict] = {}
    replies: dict[str, list[str]] = {}
    system_words = None
    for mode in modes:
        process = None
        url, model = args.url, args.model_id
        try:
            if args.model is not None:
                process, url, served = start_server(
                    args.model, min(args.clients, 8), args.max_context, args.server_cpus,
                    server_args(args, cache=mode == "on"),
                )  # fmt: skip
                model = model or served
            if system_words is None:  # the same prompts for every mode
                system_words = asyncio.run(system_words_for(url, model, args.system_tokens))
            conversations = agent_conversations(
                args.clients, system_words, args.user_words, args.seed
            )
            before = metric(url, "ninfer_preemptions_total")
            by_turn, duration = asyncio.run(
                run_agent(url, model, conversations, args.turns, args.output_len)
            )
            preemptions = metric(url, "ninfer_preemptions_total") - before
        finally:
            if process is not None:
                stop_server(process)
        results[mode] = agent_stats(by_turn, duration, preemptions)
        replies[mode] = [m["content"] for c in conversations for m in c.messages]
    print(agent_table(results))
    sources = sorted({x for r in results.values() for x in r["ttft_sources"]})
    print(f"\nTTFT measured by: {', '.join(sources) or 'none'}")
    if len(replies) == 2:
        same = replies["on"] == replies["off"]
        print(f"\nconversations identical with the cache on and off: {'yes' if same else 'NO'}")
    if args.json:
        workload = {
            k: getattr(args, k) for k in ("system_tokens", "clients", "turns", "user_words")
        }
        workload |= {"output_len": args.output_len, "system_words": system_words}
        args.json.write_text(json.dumps({"workload": workload, "modes": results}, indent=2))


# -- server process -------------------------------------------------------------------------------


def server_command(
    model: Path, concurrency: int, max_context: int, cpus: str | None, extra: list[str] = ()
) -> list[str]:
    """``python -m ninfer_serve`` with this interpreter (works without the ``ninfer-serve``
    script, e.g. with the project on PYTHONPATH), its lanes given explicitly."""
    command = [
        sys.executable,
        "-m",
        "ninfer_serve",
        str(model),
        "--port",
        "0",
        "--max-concurrency",
        str(concurrency),
        "--max-context",
        str(max_context),
        "--max-pending-requests",
        "1024",
        "--log-level",
        "warning",
        *extra,
    ]
    if cpus:
        command = ["taskset", "-c", cpus, *command]  # comma-separated CPU numbers
    return command


#: the server's address in its start-up lines ("loading ...; URL/health answers 503 until
#: ready", "serving 'model' at URL/v1 ...")
SERVER_URL = re.compile(r"(http://[^\s/]+)/(?:v1|health)\b")


def start_server(
    model: Path,
    concurrency: int,
    max_context: int,
    cpus: str | None,
    extra: list[str] = (),
    timeout: float = 1800,
) -> tuple[subprocess.Popen[str], str, str]:
    """A server on a free port, once ``/health`` says ready: (process, URL, the model id
    ``/v1/models`` lists)."""
    command = server_command(model, concurrency, max_context, cpus, extra)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    seen: deque[str] = deque(maxlen=20)
    url = None
    for line in process.stderr:
        seen.append(line)
        if match := SERVER_URL.search(line):
            url = match[1]
            break
    try:
        if url is None:
            raise BenchError("the server did not start; its last lines:\n" + "".join(seen))
        # keep reading its log: a full pipe would block the server at its next message
        threading.Thread(target=echo_errors, args=(process.stderr,), daemon=True).start()
        wait_ready(process, url, timeout)
        models = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
        return process, url, models[0]["id"]
    except BaseException:
        stop_server(process)
        raise


def wait_ready(process: subprocess.Popen[str], url: str, timeout: float) -> None:
    """Until ``/health`` answers 200 (the model loaded), or a clear error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchError(f"the server exited with status {process.returncode} while loading")
        try:
            if httpx.get(f"{url}/health", timeout=10).status_code == 200:
                return
        except httpx.HTTPError:
            pass  # not listening yet
        time.sleep(0.2)
    raise BenchError(f"the server at {url} was not ready after {timeout:.0f} s")


def echo_errors(log: TextIO) -> None:
    """The server's log after start-up, shown (it runs at level warning: nothing to hide)."""
    for line in log:
        sys.stderr.write(f"[server] {line}")


def stop_server(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)


def server_args(args: argparse.Namespace, cache: bool = True) -> list[str]:
    """``--backend``, ``--context-capacity`` (on a GPU ``CUDA_CONTEXT_CAPACITY`` unless
    given) and ``--server-args`` (last: its flags win), plus a config turning the prefix cache
    off when ``cache`` is false."""
    extra = ["--backend", args.backend]
    capacity = args.context_capacity or (CUDA_CONTEXT_CAPACITY if args.backend == "cuda" else None)
    if capacity:
        extra += ["--context-capacity", capacity]
    extra += shlex.split(args.server_args or "")
    if not cache:
        config = Path(tempfile.mkdtemp(prefix="serve-bench-")) / "cache-off.toml"
        config.write_text("[context_cache]\nenabled = false\n")
        extra += ["--config", str(config)]
    return extra


def parse_levels(text: str, engine_lanes: bool) -> list[int]:
    """Concurrency levels from "1,8"; 1..8 each where the engine's lanes serve them."""
    try:
        levels = [int(x) for x in text.split(",")]
    except ValueError:
        raise BenchError(f"--concurrency {text!r}: expected numbers such as 1,8") from None
    top = 8 if engine_lanes else 1 << 20
    if not levels or not all(1 <= c <= top for c in levels):
        raise BenchError(f"--concurrency {text!r}: each level must be in 1..{top}")
    return levels


def run_random(args: argparse.Namespace) -> None:
    """The random workload, level by level: the engine baseline first (then released), then
    the server (started for the level with its lanes, or the one at ``--url``)."""
    levels = []
    commands = []
    for c in parse_levels(args.concurrency, args.model is not None):
        count = args.num_prompts or max(16, 4 * c)
        texts = prompts(count, args.input_words, args.seed + c)
        warmup = warmup_prompts(c, args.input_words, args.seed + c)
        engine = None
        if args.engine_baseline:
            print(
                f"[C={c}] engine baseline, in this process: backend {args.backend}, {c} "
                f"lane(s) x {args.max_context} tokens of context, {count} requests",
                flush=True,
            )
            samples, duration = engine_on(
                args.server_cpus,
                args.model,
                texts,
                args.output_len,
                c,
                args.max_context,
                args.backend,
                repeat=args.repeat,
                warmup=warmup,
            )
            engine = Level(c, samples, duration, "engine").stats()
        process = None
        url, model = args.url, args.model_id
        if args.model is not None:
            extra = server_args(args)
            command = server_command(args.model, c, args.max_context, args.server_cpus, extra)
            commands.append(command)
            print(f"[C={c}] server: {shlex.join(command)}", flush=True)
            process, url, served = start_server(
                args.model, c, args.max_context, args.server_cpus, extra
            )
            model = model or served
        elif model is None:
            model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
        samples, duration = [], 0.0
        try:
            for _ in range(args.repeat):
                more, seconds = asyncio.run(
                    run_level(url, model, texts, args.output_len, c, warmup)
                )
                samples += more
                duration += seconds
        finally:
            if process is not None:
                stop_server(process)
        server = Level(c, samples, duration, "server").stats()
        print(vllm_block(f"Serving Benchmark Result (C={c})", server))
        if engine is not None:
            print(vllm_block(f"Engine alone (C={c})", engine, engine=True))
        levels.append((c, server, engine))
    print()
    print(table(levels))
    meta = run_meta(args, commands[-1] if commands else None)
    print("\n<!-- serve_bench: markdown for docs/performance.md -->")
    print(markdown_report(meta, levels))
    if args.json:
        result = [{"concurrency": c, "server": s, "engine": e} for c, s, e in levels]
        args.json.write_text(json.dumps({"run": meta, "levels": result}, indent=2))


def run_meta(args: argparse.Namespace, command: list[str] | None) -> dict[str, str]:
    """Date, device, commit, model, server flags and workload, for the markdown block."""
    if command is None:
        server = f"a running server at {args.url}"
    else:  # the flags of the last level's server, its artifact path shortened
        flags = command[command.index("ninfer_serve") + 2 :]
        server = shlex.join(["ninfer-serve", args.model.name, *flags])
    count = f"{args.num_prompts}" if args.num_prompts else "max(16, 4 x C)"
    baseline = "run in this process before each server" if args.engine_baseline else "not run"
    return {
        "date": datetime.date.today().isoformat(),
        "device": device_name(args.backend) if args.model is not None else "unknown (--url)",
        "commit": args.commit or current_commit(),
        "model": args.model.name if args.model is not None else args.url,
        "backend": args.backend,
        "server": server,
        "workload": (
            f"{count} requests per level of {args.input_words} random words, "
            f"{args.output_len} output tokens each (ignore_eos, greedy), streamed; "
            f"{args.repeat} run(s) per level; engine baseline {baseline}"
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="benchmark a running server")
    parser.add_argument("--model", type=Path, help="start a server on this artifact per level")
    parser.add_argument("--model-id", default=None, help="default: what /v1/models lists")
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument(
        "--num-prompts", type=int, default=0, help="requests per level (default: max(16, 4 x C))"
    )
    parser.add_argument("--input-words", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument(
        "--max-context", type=int, help="server's context per request (default: 1024; agent: 8192)"
    )
    parser.add_argument("--workload", choices=["random", "agent"], default="random")
    parser.add_argument("--system-tokens", type=int, default=4000, help="agent: shared prefix")
    parser.add_argument("--clients", type=int, default=8, help="agent: conversations at once")
    parser.add_argument("--turns", type=int, default=5, help="agent: turns per conversation")
    parser.add_argument("--user-words", type=int, default=24, help="agent: words per user turn")
    parser.add_argument(
        "--server-args",
        help='more ninfer-serve flags, e.g. "--kv-dtype bfloat16" (they win over the defaults)',
    )
    parser.add_argument(
        "--backend", choices=["cpu", "cuda"], default="cpu", help="server and engine baseline"
    )
    parser.add_argument(
        "--context-capacity",
        help=f"the server's context pool (cuda default: {CUDA_CONTEXT_CAPACITY}; auto: all "
        "the GPU memory the weights leave, less the headroom)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--engine-baseline",
        action="store_true",
        help="also run the engine alone, in this process, before each level's server",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per level, pooled")
    parser.add_argument(
        "--server-cpus", help="comma-separated CPUs for the server (and the engine baseline)"
    )
    parser.add_argument("--client-cpus", help="comma-separated CPUs for this load generator")
    parser.add_argument(
        "--commit", help="commit named in the markdown block (default: git's, else unknown)"
    )
    parser.add_argument("--json", type=Path, help="write all numbers here")
    args = parser.parse_args()
    if (args.url is None) == (args.model is None):
        parser.error("give exactly one of --url and --model")
    if args.engine_baseline and args.model is None:
        parser.error("--engine-baseline needs --model")
    if args.model is not None and not args.model.is_file():
        parser.error(f"--model {args.model}: no such file")
    if args.client_cpus:
        os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(",")})
    if args.max_context is None:
        args.max_context = 8192 if args.workload == "agent" else 1024
    try:
        if args.workload == "agent":
            if args.engine_baseline:
                parser.error("--engine-baseline is for the random workload")
            agent_main(args)
        else:
            run_random(args)
    except BenchError as exc:
        sys.exit(f"serve_bench: error: {exc}")


if __name__ == "__main__":
    main()
