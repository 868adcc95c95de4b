"""What log-probabilities cost a decode step, through the engine.

    python benchmarks/logprobs_bench.py MODEL.ninfer [--backend cuda|cpu] [--top 5]
        [--tokens 128] [--prompt-tokens 512] [--lanes 1] [--repeat 3] [--json OUT.json]
        [--trace 16]

Greedy generation of ``--tokens`` tokens (``ignore_eos``) on ``--lanes`` lanes, once asking for
no log-probabilities and once for the chosen token's with ``--top`` alternatives
(``SamplingParams.logprobs``), alternated ``--repeat`` times; each figure is the median decode
time per step (``Finished.decode_seconds`` / tokens after the first). The floor beside it is
the plain step of the same run: the overhead is what scoring adds to it. A second table puts
the prompt's scoring (``prompt_logprobs``, what ``echo`` + ``logprobs`` asks for) beside a
plain prefill of the same prompt. ``--trace N`` then records the device's work over N decode
steps of each case (``torch.profiler``, as ``ninfer-bench run --kernel-trace``): kernels,
their time, the span and the idle time inside it per step, and the top kernels, so what the
scored step adds is seen by kernel. Copy the output with date, device and commit into
docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ninfer_runtime.engine import Engine, Finished, GenerationRequest
from ninfer_runtime.frontend.sampling import SamplingParams


@dataclass
class Timing:
    what: str
    step_ms: float  # decode time per generated token after the first, median over repeats
    prompt_ms: float  # the prompt's time, median over repeats


def _run(engine: Engine, prompt: list[int], lanes: int, tokens: int, **scores: int) -> Finished:
    """One greedy generation a lane, all lanes at once; the slowest lane's ``Finished``."""
    requests = [
        GenerationRequest(
            prompt_ids=prompt,
            parse_output=False,
            sampling=SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, **scores),
        )
        for _ in range(lanes)
    ]
    for request in requests:
        engine.submit(request)
    finished = []
    while engine.has_work:
        finished += [e for e in engine.step() if isinstance(e, Finished)]
    if len(finished) != lanes or any(f.reason != "length" for f in finished):
        sys.exit(f"logprobs_bench: a request ended early ({[f.reason for f in finished]})")
    return max(finished, key=lambda f: f.decode_seconds)


def measure(
    engine: Engine, prompt: list[int], lanes: int, tokens: int, top: int, repeat: int
) -> list[Timing]:
    cases = {
        "plain": {},
        f"logprobs={top}": {"logprobs": top},
        f"prompt_logprobs={top}": {"prompt_logprobs": top},
    }
    _run(engine, prompt, lanes, 4)  # warm-up: compiled steps, graphs
    seen: dict[str, list[Finished]] = {name: [] for name in cases}
    for _ in range(repeat):  # alternated, so drift of the device hits every case alike
        for name, scores in cases.items():
            seen[name].append(_run(engine, prompt, lanes, tokens, **scores))
    return [
        Timing(
            name,
            1e3 * statistics.median(f.decode_seconds / (tokens - 1) for f in runs),
            1e3 * statistics.median(f.prompt_seconds for f in runs),
        )
        for name, runs in seen.items()
    ]


def report(timings: list[Timing]) -> str:
    plain = timings[0]
    lines = [
        "| case | decode ms / step | over the plain step | prompt ms | over the plain prompt |",
        "|---|---:|---:|---:|---:|",
    ]
    for t in timings:
        step = 100 * (t.step_ms / plain.step_ms - 1)
        prompt = 100 * (t.prompt_ms / plain.prompt_ms - 1)
        lines.append(
            f"| {t.what} | {t.step_ms:.3f} | {step:+.1f}% | {t.prompt_ms:.1f} | {prompt:+.1f}% |"
        )
    return "\n".join(lines)


def trace(engine: Engine, prompt: list[int], lanes: int, steps: int, top: int) -> list[str]:
    """Lines of the device's work over ``steps`` decode steps of each case (the prompt and
    the first token read before the window opens), per step."""
    from ninfer_runtime.bench import kernel_trace as K
    from ninfer_runtime.bench.kernel_profiler import record, unavailable

    reason = unavailable(engine.runner)
    if reason:
        return [K.unavailable_line(reason)]
    cases = {"plain": {}, f"logprobs={top}": {"logprobs": top}}

    def work(window: Callable[[str], Any]) -> None:
        for name, scores in cases.items():
            params = SamplingParams(
                temperature=0.0, max_tokens=steps + 1, ignore_eos=True, **scores
            )
            for _ in range(lanes):
                engine.submit(
                    GenerationRequest(prompt_ids=prompt, parse_output=False, sampling=params)
                )
            engine.step()  # the prompt and the first token, outside the window
            with window(name):
                while engine.has_work:
                    engine.step()

    windows = record(work)
    out = [f"device work a decode step, {lanes} lane(s), over {steps} steps"]
    for name in cases:
        t = K.summarize(windows.get(name, []))
        out.append(
            f"  {name}: {t.kernels / steps:.1f} kernels, {t.kernel_ms / steps:.3f} ms of "
            f"kernels, span {t.span_ms / steps:.3f} ms, idle {t.idle_ms / steps:.3f} ms"
        )
        out += [
            f"    {k.name:<48} {k.count / steps:>6.1f} {k.ms / steps:>8.4f} ms" for k in t.top[:6]
        ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--backend", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--top", type=int, default=5, help="alternatives a token (0..20)")
    parser.add_argument("--tokens", type=int, default=128, help="generated tokens a request")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--lanes", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", dest="json_out", help="write the figures as JSON")
    parser.add_argument(
        "--trace",
        type=int,
        default=0,
        metavar="STEPS",
        help="then trace the device's work over this many decode steps",
    )
    args = parser.parse_args()
    if args.tokens < 2 or args.repeat < 1 or not 0 <= args.top <= 20:
        sys.exit("logprobs_bench: --tokens must be at least 2, --repeat at least 1, --top 0..20")
    context = args.prompt_tokens + args.tokens + 1
    # no prefix cache: every run reads its whole prompt
    engine = Engine(args.model, backend=args.backend, max_lanes=args.lanes, max_context=context)
    vocab = engine.tokenizer.vocab_size
    prompt = [(7919 * i + 13) % vocab for i in range(args.prompt_tokens)]
    timings = measure(engine, prompt, args.lanes, args.tokens, args.top, args.repeat)
    print(
        f"{args.model}, {args.backend}, {args.lanes} lane(s), {args.prompt_tokens}-token prompt, "
        f"{args.tokens} tokens, median of {args.repeat}"
    )
    print(report(timings))
    if args.trace:
        print("\n".join(trace(engine, prompt, args.lanes, args.trace, args.top)))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump([asdict(t) for t in timings], f, indent=1)


if __name__ == "__main__":
    main()
