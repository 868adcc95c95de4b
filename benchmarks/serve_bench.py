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
import os
import sys
from pathlib import Path

# the serve package beside this file: Python puts a script's folder first on sys.path
from serve.errors import BenchError
from serve.runs import agent_main, run_random
from serve.server_process import CUDA_CONTEXT_CAPACITY


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
