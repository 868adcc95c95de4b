"""The agent workload on the engine alone, step by step: where a turn's first token waits.

    python benchmarks/agent_steps.py --model MODEL.ninfer [--backend cuda] [--system-tokens 4000]
        [--clients 8] [--turns 5] [--output-len 32] [--prefill-chunk 1024] [--show c0t1,c7t1]

The conversations of ``serve_bench.py --workload agent`` (the same system prompt, tools and
user messages for the same ``--seed``, greedy, ``ignore_eos``, thinking off), rendered and
given their cache boundaries as the server does, are submitted straight to one ``Engine``
(prefix cache on unless ``--no-cache``; ``--clients`` lanes): no HTTP, no rendering time. A
client submits its next turn before the step after the one that finished its last, as a
client with no latency would. Every step is logged: its wall time, what its prefill forward
read (which requests, how many rows, whether as a compiled multi-row step or a host-built
chunk) and how many lanes decoded. Per turn it prints the step each request was submitted
before, how many steps it took from there to its first token (the step that sampled it
counted) and its TTFT in the engine (submission to the first token's sampling); ``--show``
prints the steps of the named requests (``c<client>t<turn>``, turns from 0). ``--one-read``
reads one prompt's chunk a step (the oldest's), as the engine did before packed reads.
``--trace`` (CUDA) records the device's work of the whole replay (``torch.profiler``, as
``ninfer-bench run --kernel-trace``) and prints, for every step that read prompt rows, its
kernels, their time, the span they took and the device's idle time in it (what the host
made it wait), with its largest kernels and those launched most. ``--host-profile`` runs the
replay with its packed steps (more than one prompt read) under cProfile instead and prints the
host's time by function in them. ``--provider FAMILY.OP=NAME`` serves an op by that provider
whatever its policy says (as ``ninfer-bench run --provider``), to compare providers on one
machine.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from serve.workload import AGENT_TOOLS, agent_conversations

from ninfer_runtime.bench.cli_providers import parse_provider
from ninfer_runtime.engine import (
    Engine,
    Event,
    Finished,
    GenerationRequest,
    OutputEvent,
    TokenEvent,
)
from ninfer_runtime.frontend import SamplingParams
from ninfer_runtime.frontend.parsers.events import TextDelta
from ninfer_runtime.ops import registry
from ninfer_serve.cache_boundaries import conversation_boundaries


@dataclass
class Step:
    """One ``Engine.step``: its prefill reads (request id, start, end), the requests that
    decoded, the first tokens sampled in it, and its wall time."""

    index: int
    reads: list[tuple[str, int, int]] = field(default_factory=list)
    decoded: list[str] = field(default_factory=list)
    first: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def describe(self, step_rows: int) -> str:
        rows = [end - start for _, start, end in self.reads]
        kind = "rows" if len(set(rows)) == 1 and rows[0] <= step_rows else "chunk"
        reads = ", ".join(f"{rid}[{a}:{b}]" for rid, a, b in self.reads)
        prefill = f"{kind} of {sum(rows)} rows: {reads}" if rows else "no prefill"
        return (
            f"step {self.index} ({self.seconds * 1000:.1f} ms): {prefill}; "
            f"decode {len(self.decoded)} lanes; first tokens {self.first or '-'}"
        )


@dataclass
class Submitted:
    """One request: its client and turn, the step it was submitted before (and when), its
    prompt's tokens, the step that sampled its first token (and when), its cached tokens."""

    client: int
    turn: int
    step: int
    at: float
    prompt_tokens: int
    first_step: int | None = None
    first_at: float | None = None
    cached: int = 0


class Replay:
    """The workload on ``engine``: the conversations, what was submitted, the steps."""

    def __init__(
        self, engine: Engine, conversations: list, turns: int, output_len: int, one_read: bool
    ):
        self.engine = engine
        self.conversations = conversations
        self.turns = turns
        self.output_len = output_len
        self.requests: dict[str, Submitted] = {}
        self.steps: list[Step] = []
        self.texts: dict[str, list[str]] = {}
        self.step: Step | None = None
        self.seconds = 0.0
        scheduler = engine.scheduler
        plan, generating = type(scheduler).prefill_reads, type(scheduler).generating

        def logged_reads():  # this step's prefill reads, as the scheduler plans them
            reads = plan(scheduler)
            if one_read:  # the oldest prompt's read only
                reads = reads[:1]
            self.step.reads = [(a.request.request_id, s, e) for a, s, e in reads]
            return reads

        def logged_decoding():  # the lanes this step decodes
            lanes = generating(scheduler)
            self.step.decoded = [a.request.request_id for a in lanes]
            return lanes

        scheduler.prefill_reads, scheduler.generating = logged_reads, logged_decoding

    def submit(self, client: int, turn: int) -> None:
        engine = self.engine
        messages = self.conversations[client].next_turn()
        request = GenerationRequest(
            messages=messages,
            tools=AGENT_TOOLS,
            enable_thinking=False,
            sampling=SamplingParams(temperature=0.0, max_tokens=self.output_len, ignore_eos=True),
            request_id=f"c{client}t{turn}",
        )
        ids, opened = engine.render(request)
        if engine.cache is not None:  # as the server gives them

            def render(prefix: list[dict]) -> str:
                return engine.template.render(
                    prefix, tools=AGENT_TOOLS, add_generation_prompt=False, enable_thinking=False
                )

            request.cache_boundaries = conversation_boundaries(
                render, engine.tokenizer.encode, list(messages), ids, has_tools=True
            )
        engine.submit(request, rendered=(ids, opened))
        rid = request.request_id
        self.requests[rid] = Submitted(client, turn, len(self.steps), time.perf_counter(), len(ids))
        self.texts[rid] = []

    def run(self, window: Callable[[str], AbstractContextManager[Any]] | None = None) -> None:
        """The workload to its end; ``window(label)`` (a kernel trace's) wraps each step,
        labelled by its index."""
        started = time.perf_counter()
        engine, due = self.engine, {c: 0 for c in range(len(self.conversations))}
        turn = dict.fromkeys(due, 0)
        while due or engine.has_work:
            for client in [c for c, s in due.items() if s <= len(self.steps)]:
                del due[client]
                self.submit(client, turn[client])
            self.step = Step(len(self.steps))
            self.steps.append(self.step)
            start = time.perf_counter()
            with nullcontext() if window is None else window(str(self.step.index)):
                events = engine.step(flush=self._firsts)  # first tokens timed before decoding
            self.step.seconds = time.perf_counter() - start
            for event in events:
                self._firsts([event])
                if isinstance(event, Finished):
                    r = self.requests[event.request_id]
                    r.cached = event.usage.cached_tokens
                    self.conversations[r.client].reply("".join(self.texts[event.request_id]))
                    turn[r.client] += 1
                    if turn[r.client] < self.turns:
                        due[r.client] = len(self.steps)
        self.seconds = time.perf_counter() - started

    def _firsts(self, events: list[Event]) -> None:
        now = time.perf_counter()
        for event in events:
            r = self.requests.get(event.request_id)
            if isinstance(event, TokenEvent) and r is not None and r.first_step is None:
                r.first_step, r.first_at = self.step.index, now
                self.step.first.append(event.request_id)
            elif isinstance(event, OutputEvent) and isinstance(event.event, TextDelta):
                self.texts[event.request_id].append(event.event.text)


def traced(replay: Replay) -> list[str]:
    """Run ``replay`` under a kernel trace: a line for each step that read prompt rows."""
    from ninfer_runtime.bench import kernel_trace as K
    from ninfer_runtime.bench.kernel_profiler import record, unavailable

    reason = unavailable(replay.engine.runner)
    if reason:
        replay.run()
        return [K.unavailable_line(reason)]
    windows = record(replay.run)
    lines = ["device work of the steps that read prompt rows (kernel trace):"]
    for step in replay.steps:
        if not step.reads:
            continue
        events = windows.get(str(step.index), [])
        t = K.summarize(events)
        rows = sum(end - start for _, start, end in step.reads)
        top = ", ".join(f"{k.name} {k.ms:.1f}" for k in t.top[:4])
        launched = Counter(K.short_name(name) for name, _, _ in events)
        most = ", ".join(f"{name} x{count}" for name, count in launched.most_common(12))
        lines.append(
            f"  step {step.index} ({step.seconds * 1e3:.1f} ms traced, {rows} rows in "
            f"{len(step.reads)} reads, {len(step.decoded)} lanes decoding): {t.kernels} "
            f"kernels, {t.kernel_ms:.1f} ms of kernels, span {t.span_ms:.1f} ms, idle "
            f"{t.idle_ms:.1f} ms; {top}"
        )
        lines.append(f"    launched most: {most}")
    return lines


def host_profiled(replay: Replay, functions: int = 40) -> list[str]:
    """Run ``replay`` with its packed steps (those that read more than one prompt) under
    cProfile: the host's time by function there, where the device idles waiting on it."""
    text, profiled = io.StringIO(), []
    stats: pstats.Stats | None = None

    @contextmanager
    def window(label: str) -> Iterator[None]:
        nonlocal stats
        profiler = cProfile.Profile()
        profiler.enable()
        try:
            yield
        finally:
            profiler.disable()
            step = replay.steps[int(label)]
            if len(step.reads) > 1:
                profiled.append(step)
                if stats is None:
                    stats = pstats.Stats(profiler, stream=text)
                else:
                    stats.add(profiler)

    replay.run(window)
    if stats is None:
        return ["host time by function: no step read more than one prompt"]
    stats.sort_stats("tottime").print_stats(functions)
    stats.sort_stats("cumulative").print_stats(functions)
    wall = sum(step.seconds for step in profiled) * 1e3
    head = (
        f"host time by function in the {len(profiled)} packed steps "
        f"({', '.join(str(step.index) for step in profiled)}; {wall:.1f} ms under cProfile):"
    )
    return [head, text.getvalue()]


def system_words(engine: Engine, tokens: int) -> int:
    """Words of system text that, with the tools, make about ``tokens`` prompt tokens."""

    def length(words: int) -> int:
        conversation = agent_conversations(1, words, 24, -1)[0]
        request = GenerationRequest(
            messages=conversation.next_turn(), tools=AGENT_TOOLS, enable_thinking=False
        )
        return len(engine.render(request)[0])

    base, per_word = length(64), (length(128) - length(64)) / 64
    return max(0, round(64 + (tokens - base) / max(per_word, 1e-9)))


def report(replay: Replay, show: list[str]) -> None:
    by_turn: dict[int, list[Submitted]] = {}
    for r in replay.requests.values():
        by_turn.setdefault(r.turn, []).append(r)
    print(
        "| turn | submitted at steps | prompt tokens (mean) | cached (mean) "
        "| steps to first token | TTFT ms mean / max |"
    )
    print("|---:|---|---:|---:|---|---:|")
    for turn, requests in sorted(by_turn.items()):
        steps = [r.first_step - r.step + 1 for r in requests]
        ttft = [(r.first_at - r.at) * 1000 for r in requests]
        print(
            f"| {turn + 1} | {[r.step for r in requests]} "
            f"| {statistics.fmean(r.prompt_tokens for r in requests):.0f} "
            f"| {statistics.fmean(r.cached for r in requests):.0f} | {steps} "
            f"| {statistics.fmean(ttft):.1f} / {max(ttft):.1f} |"
        )
    outputs = len(replay.requests) * replay.output_len
    print(
        f"\n{len(replay.steps)} steps, {replay.seconds:.1f} s, "
        f"{outputs / replay.seconds:.1f} output tok/s"
    )
    step_rows = replay.engine.pool.step_rows
    for rid in show:
        r = replay.requests[rid]
        print(f"\n{rid}: submitted before step {r.step}, {r.prompt_tokens} prompt tokens")
        for step in replay.steps[r.step : r.first_step + 1]:
            print("  " + step.describe(step_rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--system-tokens", type=int, default=4000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--user-words", type=int, default=24)
    parser.add_argument("--prefill-chunk", type=int, default=1024)
    parser.add_argument("--max-context", type=int, default=8192)
    parser.add_argument("--context-capacity", default=None)
    parser.add_argument("--checkpoint-interval", type=int, default=8192)
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument(
        "--one-read",
        action="store_true",
        help="each step's prefill reads the oldest prompt's chunk only (the rule before packed "
        "reads), for comparison",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", default="", help="requests whose steps to print: c0t1,c7t1")
    parser.add_argument(
        "--trace",
        action="store_true",
        help="record the device's work (CUDA) and print each prompt-reading step's kernels",
    )
    parser.add_argument(
        "--host-profile",
        action="store_true",
        help="profile the packed steps (several prompts read): the host's time by function",
    )
    parser.add_argument(
        "--provider",
        action="append",
        default=[],
        type=_provider,
        metavar="FAMILY.OP=NAME",
        help="serve an op by this provider whatever its policy says (repeatable)",
    )
    args = parser.parse_args()
    with ExitStack() as forced:
        for family, op, name in args.provider:
            forced.enter_context(registry.override(family, op, name))
            print(f"{family}.{op} served by {name} (--provider)")
        run(args)


def _provider(spec: str) -> tuple[str, str, str]:
    try:
        return parse_provider(spec)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run(args: argparse.Namespace) -> None:
    engine = Engine(
        args.model,
        backend=args.backend,
        max_lanes=min(args.clients, 8),
        max_context=args.max_context,
        prefill_chunk=args.prefill_chunk,
        context_capacity=args.context_capacity,
        prefix_cache=not args.no_cache,
        checkpoint_interval=args.checkpoint_interval,
    )
    words = system_words(engine, args.system_tokens)
    conversations = agent_conversations(args.clients, words, args.user_words, args.seed)
    replay = Replay(engine, conversations, args.turns, args.output_len, one_read=args.one_read)
    if args.trace:
        lines = traced(replay)
    elif args.host_profile:
        lines = host_profiled(replay)
    else:
        replay.run()
        lines = []
    report(replay, [rid for rid in args.show.split(",") if rid])
    if lines:
        print("\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
