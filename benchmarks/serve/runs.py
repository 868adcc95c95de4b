"""The two workloads end to end. Random: per concurrency level the engine baseline, then a
server started with that many lanes (or the one at ``--url``), then the level's report. Agent:
the same conversations against a server with the prefix cache on and one with it off."""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex

import httpx

from .client import metric, run_agent, run_level, system_words_for
from .engine_baseline import engine_on
from .errors import BenchError
from .report import agent_table, markdown_report, table, vllm_block
from .run_info import run_meta
from .server_process import server_args, server_command, start_server, stop_server
from .stats import Level, agent_stats
from .workload import agent_conversations, prompts, warmup_prompts


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
