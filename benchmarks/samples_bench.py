"""What ``n`` samples of one prompt cost a server: is the prompt prefilled once?

    python benchmarks/samples_bench.py --model MODEL.ninfer [--backend cuda|cpu] [--n 4]
        [--prompt-words 600] [--output-len 64] [--json OUT.json]

Starts ``ninfer-serve`` on the artifact (lanes = ``--n``), then sends two ``/v1/completions``
requests with different prompts of the same length: one with ``n = 1``, one with ``n = --n``
(temperature 1, seeded, ``ignore_eos``). Per request it reports the wall time, the prompt tokens
the server started (one count per sample), those it computed and those it resumed from the
prefix cache (deltas of ``ninfer_prompt_tokens_total``, ``ninfer_prefill_tokens_total`` and
``ninfer_prompt_tokens_cached_total`` on ``/metrics``) and the response's
``usage.prompt_tokens_details.cached_tokens``. The floor beside ``n`` samples is one prompt's
prefill: computed tokens equal to the ``n = 1`` request's mean the samples shared it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx
from serve.client import metric
from serve.errors import BenchError
from serve.server_process import server_args, start_server, stop_server
from serve.workload import prompts

COUNTERS = {
    "started": "ninfer_prompt_tokens_total",
    "computed": "ninfer_prefill_tokens_total",
    "resumed": "ninfer_prompt_tokens_cached_total",
}


def one(url: str, model: str, prompt: str, n: int, output_len: int, seed: int) -> dict:
    before = {k: metric(url, name) for k, name in COUNTERS.items()}
    start = time.perf_counter()
    response = httpx.post(
        f"{url}/v1/completions",
        json={
            "model": model,
            "prompt": prompt,
            "n": n,
            "max_tokens": output_len,
            "temperature": 1.0,
            "seed": seed,
            "ignore_eos": True,
        },
        timeout=600,
    )
    seconds = time.perf_counter() - start
    if response.status_code != 200:
        raise BenchError(f"n={n}: HTTP {response.status_code}: {response.text[:300]}")
    body = response.json()
    after = {k: metric(url, name) for k, name in COUNTERS.items()}
    usage = body["usage"]
    return {
        "n": n,
        "seconds": round(seconds, 3),
        "prompt_tokens": usage["prompt_tokens"],
        "usage_cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
        "completion_tokens": usage["completion_tokens"],
        **{k: int(after[k] - before[k]) for k in COUNTERS},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--context-capacity", help="the server's context pool")
    parser.add_argument("--server-args", help="more ninfer-serve flags")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--prompt-words", type=int, default=600)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--max-context", type=int, default=4096)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    first, second = prompts(2, args.prompt_words, seed=7)
    process, url, model = start_server(
        args.model, args.n, args.max_context, None, server_args(args)
    )
    try:
        one(url, model, "warm up " * 8, 1, 4, seed=0)  # kernels compiled, pools touched
        rows = [
            one(url, model, first, 1, args.output_len, seed=1),
            one(url, model, second, args.n, args.output_len, seed=1),
        ]
    finally:
        stop_server(process)
    print("| n | prompt tokens | started | computed | resumed from cache | usage cached | wall s |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['n']} | {r['prompt_tokens']} | {r['started']} | {r['computed']} | "
            f"{r['resumed']} | {r['usage_cached_tokens']} | "
            f"{r['seconds']:.3f} |"
        )
    single, many = rows
    ratio = many["computed"] / max(single["computed"], 1)
    print(
        f"floor: one prefill of the prompt ({single['computed']} tokens computed for n=1); "
        f"n={args.n} computed {many['computed']} ({ratio:.2f}x)"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        sys.exit(f"samples_bench: {e}")
