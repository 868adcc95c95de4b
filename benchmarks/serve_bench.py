"""Load generator for ninfer-serve, in the conventions of ``vllm bench serve``.

For each concurrency level it sends ``--num-prompts`` streaming chat requests over loopback
with at most C in flight (request rate infinite, as ``vllm bench serve --max-concurrency C``),
each generating exactly ``--output-len`` tokens (``ignore_eos``), and reports per level:

* TTFT: request sent -> first streamed token, as the client sees it;
* TPOT: (E2EL - TTFT) / (output tokens - 1), per request (vLLM's definition, first token
  excluded);
* ITL: gaps between consecutive streamed chunks that carry text (vLLM's definition; a token
  whose text is held back, e.g. half a UTF-8 character or a special token, sends no chunk);
* E2EL, output tok/s and requests/s over the level's wall time.

``--engine-baseline`` runs the same prompts through the engine alone, in this process (same
lanes, same ``step()`` loop, no HTTP; TTFT and ITL from its text events), so ``server
overhead per token = server TPOT - engine TPOT`` at the same concurrency: what the HTTP
layer, the engine-thread hand-off and SSE add to every generated token.

    python benchmarks/serve_bench.py --model out/tiny.ninfer --concurrency 1,2,4,8 \\
        --engine-baseline --server-cpus 0 --client-cpus 1
    python benchmarks/serve_bench.py --url http://127.0.0.1:8080 --concurrency 1,4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

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


@dataclass
class Sample:
    ttft: float = 0.0
    e2el: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    itl: list[float] = field(default_factory=list)
    ok: bool = False

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)


def prompts(count: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(count)]


# -- client ---------------------------------------------------------------------------------------


async def one_request(
    client: httpx.AsyncClient, url: str, model: str, prompt: str, output_len: int
) -> Sample:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
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
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return sample
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                sample.output_tokens = chunk["usage"]["completion_tokens"]
                sample.prompt_tokens = chunk["usage"]["prompt_tokens"]
            choices = chunk.get("choices") or []
            delta = choices[0].get("delta", {}) if choices else {}
            if delta.get("content") or delta.get("reasoning_content"):
                now = time.perf_counter()
                if last is None:
                    sample.ttft = now - start
                else:
                    sample.itl.append(now - last)
                last = now
    sample.e2el = time.perf_counter() - start
    sample.ok = sample.output_tokens > 0
    return sample


async def run_level(
    url: str, model: str, texts: list[str], output_len: int, concurrency: int
) -> tuple[list[Sample], float]:
    limit = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def bounded(text: str) -> Sample:
            async with limit:
                return await one_request(client, url, model, text, output_len)

        await one_request(client, url, model, texts[0], 4)  # warm the connection and caches
        started = time.perf_counter()
        samples = await asyncio.gather(*(bounded(t) for t in texts))
        return list(samples), time.perf_counter() - started


# -- engine alone ---------------------------------------------------------------------------------


def engine_level(
    model: Path, texts: list[str], output_len: int, concurrency: int, max_context: int
) -> tuple[list[Sample], float]:
    """The same workload through ``Engine.step`` directly (the server's engine thread, minus
    everything around it)."""
    from ninfer_runtime.engine import Engine, Finished, GenerationRequest, OutputEvent
    from ninfer_runtime.frontend import ReasoningDelta as Reasoning
    from ninfer_runtime.frontend import SamplingParams, TextDelta

    engine = _ENGINES.get((model, concurrency))
    if engine is None:
        engine = _ENGINES[(model, concurrency)] = Engine(
            model, max_context=max_context, max_lanes=concurrency
        )
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    pending = list(texts)
    samples: dict[str, Sample] = {}
    sent: dict[str, float] = {}
    last: dict[str, float] = {}
    started = time.perf_counter()
    while pending or engine.has_work:
        while pending and len(sent) - sum(s.ok for s in samples.values()) < concurrency:
            text = pending.pop(0)
            request = GenerationRequest(
                messages=[{"role": "user", "content": text}], enable_thinking=False, sampling=params
            )
            rid = engine.submit(request)
            sent[rid] = time.perf_counter()
            samples[rid] = Sample()
        for event in engine.step():
            now = time.perf_counter()
            sample = samples[event.request_id]
            # a "token" for TTFT / ITL is a text delta, as a streaming client sees one chunk
            if isinstance(event, OutputEvent) and isinstance(event.event, TextDelta | Reasoning):
                if event.request_id not in last:
                    sample.ttft = now - sent[event.request_id]
                else:
                    sample.itl.append(now - last[event.request_id])
                last[event.request_id] = now
            elif isinstance(event, Finished):
                sample.e2el = now - sent[event.request_id]
                sample.output_tokens = event.usage.completion_tokens
                sample.prompt_tokens = event.usage.prompt_tokens
                sample.ok = True
    return list(samples.values()), time.perf_counter() - started


_ENGINES: dict[tuple[Path, int], object] = {}


def engine_on(cpus: str | None, *args: object) -> tuple[list[Sample], float]:
    """``engine_level`` on the server's CPUs, so both runs get the same cores."""
    mine = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, {int(x) for x in cpus.split(",")})
    try:
        return engine_level(*args)  # type: ignore[arg-type]
    finally:
        os.sched_setaffinity(0, mine)


# -- report ---------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


@dataclass
class Level:
    concurrency: int
    samples: list[Sample]
    duration: float

    def stats(self) -> dict[str, float]:
        ok = [s for s in self.samples if s.ok]
        ttft = [s.ttft for s in ok]
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
            "ttft_mean": statistics.fmean(ttft) * ms, "ttft_p50": pct(ttft, 50) * ms,
            "ttft_p99": pct(ttft, 99) * ms,
            "tpot_mean": statistics.fmean(tpot) * ms, "tpot_p50": pct(tpot, 50) * ms,
            "tpot_p99": pct(tpot, 99) * ms,
            "itl_mean": statistics.fmean(itl) * ms, "itl_p50": pct(itl, 50) * ms,
            "itl_p99": pct(itl, 99) * ms,
            "e2el_p50": pct(e2el, 50) * ms, "e2el_p99": pct(e2el, 99) * ms,
        }  # fmt: skip


def vllm_block(title: str, s: dict[str, float]) -> str:
    """The per-level summary in ``vllm bench serve``'s layout."""
    rows = [
        ("Successful requests:", f"{s['ok']:.0f}"),
        ("Failed requests:", f"{s['failed']:.0f}"),
        ("Benchmark duration (s):", f"{s['duration_s']:.2f}"),
        ("Total input tokens:", f"{s['input_tokens']:.0f}"),
        ("Total generated tokens:", f"{s['output_tokens']:.0f}"),
        ("Request throughput (req/s):", f"{s['req_s']:.2f}"),
        ("Output token throughput (tok/s):", f"{s['out_tok_s']:.2f}"),
        ("Mean TTFT (ms):", f"{s['ttft_mean']:.2f}"),
        ("Median TTFT (ms):", f"{s['ttft_p50']:.2f}"),
        ("P99 TTFT (ms):", f"{s['ttft_p99']:.2f}"),
        ("Mean TPOT (ms):", f"{s['tpot_mean']:.2f}"),
        ("Median TPOT (ms):", f"{s['tpot_p50']:.2f}"),
        ("P99 TPOT (ms):", f"{s['tpot_p99']:.2f}"),
        ("Mean ITL (ms):", f"{s['itl_mean']:.2f}"),
        ("Median ITL (ms):", f"{s['itl_p50']:.2f}"),
        ("P99 ITL (ms):", f"{s['itl_p99']:.2f}"),
    ]
    lines = [f"{f' {title} ':=^50}"] + [f"{k:<40}{v:>10}" for k, v in rows] + ["=" * 50]
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
            f"{e['out_tok_s']:.0f} | {e['ttft_p50']:.1f} | {e['tpot_p50']:.2f} | "
            f"{s['tpot_mean'] - e['tpot_mean']:+.3f}"
            if e
            else "- | - | - | -"
        )
        lines.append(
            f"| {c} | {s['req_s']:.2f} | {s['out_tok_s']:.0f} | {s['ttft_p50']:.1f} / "
            f"{s['ttft_p99']:.1f} | {s['tpot_p50']:.2f} / {s['tpot_p99']:.2f} | "
            f"{s['itl_p50']:.2f} / {s['itl_p99']:.2f} | {engine} |"
        )
    return "\n".join(lines)


# -- server process -------------------------------------------------------------------------------


def start_server(
    model: Path, concurrency: int, max_context: int, cpus: str | None
) -> tuple[subprocess.Popen[str], str, str]:
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
    ]
    if cpus:
        command = ["taskset", "-c", cpus, *command]  # comma-separated CPU numbers
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    for line in process.stderr:
        match = re.search(r"serving '([^']+)' at (http://\S+)/v1", line)
        if match:
            return process, match[2], match[1]
    raise RuntimeError("the server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="benchmark a running server")
    parser.add_argument("--model", type=Path, help="start a server on this artifact per level")
    parser.add_argument("--model-id", default=None)
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument(
        "--num-prompts", type=int, default=0, help="requests per level (default: max(16, 4 x C))"
    )
    parser.add_argument("--input-words", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--max-context", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine-baseline", action="store_true")
    parser.add_argument("--repeat", type=int, default=1, help="runs per level, pooled")
    parser.add_argument(
        "--server-cpus", help="comma-separated CPUs for the server (and the engine baseline)"
    )
    parser.add_argument("--client-cpus", help="comma-separated CPUs for this load generator")
    parser.add_argument("--json", type=Path, help="write all numbers here")
    args = parser.parse_args()
    if (args.url is None) == (args.model is None):
        parser.error("give exactly one of --url and --model")
    if args.engine_baseline and args.model is None:
        parser.error("--engine-baseline needs --model")
    if args.client_cpus:
        os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(",")})
    levels = []
    for c in (int(x) for x in args.concurrency.split(",")):
        count = args.num_prompts or max(16, 4 * c)
        texts = prompts(count, args.input_words, args.seed + c)
        process = None
        url, model = args.url, args.model_id
        if args.model is not None:
            process, url, served = start_server(args.model, c, args.max_context, args.server_cpus)
            model = model or served
        runs: dict[str, tuple[list[Sample], float]] = {"server": ([], 0.0), "engine": ([], 0.0)}
        try:
            for _ in range(args.repeat):  # alternate, so drift on a shared machine hits both
                samples, duration = asyncio.run(run_level(url, model, texts, args.output_len, c))
                runs["server"] = (runs["server"][0] + samples, runs["server"][1] + duration)
                if args.engine_baseline:
                    samples, duration = engine_on(
                        args.server_cpus, args.model, texts, args.output_len, c, args.max_context
                    )
                    runs["engine"] = (runs["engine"][0] + samples, runs["engine"][1] + duration)
        finally:
            if process is not None:
                process.terminate()
                process.wait(30)
        server = Level(c, *runs["server"]).stats()
        print(vllm_block(f"Serving Benchmark Result (C={c})", server))
        engine = None
        if args.engine_baseline:
            engine = Level(c, *runs["engine"]).stats()
            print(vllm_block(f"Engine alone (C={c})", engine))
        levels.append((c, server, engine))
    print()
    print(table(levels))
    if args.json:
        args.json.write_text(
            json.dumps(
                [{"concurrency": c, "server": s, "engine": e} for c, s, e in levels], indent=2
            )
        )


if __name__ == "__main__":
    main()
