"""Time to first token of an image chat, the image's encode alone and the text prefill, each
against its FLOPs floor.

    python benchmarks/image_bench.py --model MODEL.ninfer [--backend cuda|cpu]
        [--image-size 1024] [--runs 5] [--prefill-chunk N] [--json OUT.json]

MODEL is an artifact with a Qwen3.5 vision component (``ninfer-bench synth --vision`` writes
one of any Qwen3.5/3.6 geometry). The request is one user message of a deterministic synthetic
RGB PNG (a colour gradient with noise, ``--image-size`` pixels a side) and a short question,
greedy, one output token, through ``Engine.generate``; its time to first token is the wall
time from the call to the first token (render, the image's decode and preprocessing, the
encode, the prompt's prefill, the first token's choice). Every run sends a fresh image (its
noise seeded by the run's index), so the media cache never serves it and the encode is timed
each time. Each figure is the median over ``--runs`` after one warm-up.

Beside it:

* encode: the vision tower's ``encode`` on the processed pixels alone, the device drained
  around each call (``bench.probes.median_seconds``); preprocessing (decode, resize,
  patchify; CPU) separately;
* text prefill: a text-only prompt of as many tokens as the image chat's, one output token
  (``Finished.prompt_seconds``).

Floors: FLOPs over the matmul rate measured in the same run (``bench.probes.matmul_rate``:
float16 8192² on the GPU, the tensor cores' bf16 rate too; float32 on the CPU). The encoder's
FLOPs are counted from its config (``encoder_flops``); the text prefill's from the model's
weights (``bench.costs.prefill_flops``: 2 per weight per token plus causal attention). Copy
the output with date, device and commit into docs/performance.md.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ninfer_runtime.bench.costs import prefill_flops
from ninfer_runtime.bench.probes import matmul_rate, median_seconds
from ninfer_runtime.engine import Engine, Finished, GenerationRequest, TokenEvent
from ninfer_runtime.frontend.sampling import SamplingParams
from ninfer_runtime.media import ImageInput

QUESTION = "What is in this picture? Answer in one word."
FIRST_TOKEN = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


@dataclass
class Figure:
    what: str
    ms: float  # median over the runs
    gflop: float  # the work the floor counts
    floor_ms: float  # gflop at the measured matmul rate


def synthetic_png(size: int, seed: int) -> bytes:
    """A ``size``² RGB PNG: a colour gradient under noise seeded by ``seed`` (so every seed
    gives other bytes, hence another media-cache digest)."""
    from PIL import Image

    y, x = np.mgrid[0:size, 0:size].astype(np.float32) * (255 / max(size - 1, 1))
    pixels = np.stack([x, y, (x + y) / 2], axis=-1)
    pixels += np.random.default_rng(seed).normal(0, 24, pixels.shape)
    out = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(out, format="PNG")
    return out.getvalue()


def encoder_flops(config: Any, grid_thw: np.ndarray) -> float:
    """Multiply-add FLOPs of the vision tower (``VisionConfig``) on images ``grid_thw``
    [images, 3]: the patch embedding, per block the query/key/value, output, fc1 and fc2
    products (2·n·in·out each) and attention over each frame (4·n²·hidden: Q·Kᵀ and P·V),
    and the merger's two products on the merged tokens."""
    h, width = config.hidden, config.intermediate
    merged = config.merge**2 * h
    flops = 0.0
    for t, gh, gw in np.asarray(grid_thw, dtype=np.int64).tolist():
        n, frame = t * gh * gw, gh * gw
        flops += 2 * n * config.patch_width * h
        block = 2 * n * (3 * h * h + h * h + 2 * h * width) + 4 * t * frame**2 * h
        flops += config.depth * block
        m = n // config.merge**2
        flops += 2 * m * merged * merged + 2 * m * merged * config.out_hidden
    return float(flops)


def image_request(png: bytes) -> GenerationRequest:
    content = [{"type": "image"}, {"type": "text", "text": QUESTION}]
    return GenerationRequest(
        messages=[{"role": "user", "content": content}],
        images=[ImageInput(png)],
        sampling=FIRST_TOKEN,
    )


def first_token(engine: Engine, request: GenerationRequest) -> tuple[float, int, Finished]:
    """Seconds from the call to the first token, that token, and the request's ``Finished``."""
    start = time.perf_counter()
    ttft, token, finished = None, None, None
    for event in engine.generate(request):
        if isinstance(event, TokenEvent) and ttft is None:
            ttft, token = time.perf_counter() - start, event.token_id
        elif isinstance(event, Finished):
            finished = event
    if ttft is None or finished is None:
        sys.exit(f"image_bench: no token came back ({finished})")
    return ttft, token, finished


def measure(engine: Engine, image_size: int, runs: int) -> dict[str, Any]:
    """The figures and what they were taken on; see the module docstring."""
    from ninfer_runtime.frontend.vision import decode_image

    vision = engine.vision
    if vision is None:
        sys.exit("image_bench: the engine takes no images (no vision component?)")
    xp = engine.model.backend.xp
    rate = matmul_rate(xp)

    first_token(engine, image_request(synthetic_png(image_size, seed=runs)))  # warm-up
    ttfts, answers = [], []
    for run in range(runs):
        seconds, token, finished = first_token(
            engine, image_request(synthetic_png(image_size, run))
        )
        ttfts.append(seconds)
        answers.append(token)
    prompt_tokens = finished.usage.prompt_tokens

    png = synthetic_png(image_size, seed=0)
    preprocess = median_seconds(np, lambda: vision.processor.process([decode_image(png)]), runs)
    pixels, grid = vision.processor.process([decode_image(png)])
    encode = median_seconds(xp, lambda: vision.tower.encode(pixels, grid), runs)
    image_tokens = int(sum(vision.tower.merged_tokens(grid)))

    # text-only prompt of the same length: ordinary byte tokens, no placeholder among them
    text_ids = [int(i) for i in np.arange(prompt_tokens) % 200 + 32]
    text = GenerationRequest(prompt_ids=text_ids, parse_output=False, sampling=FIRST_TOKEN)
    first_token(engine, text)
    prefill = statistics.median(first_token(engine, text)[2].prompt_seconds for _ in range(runs))

    encode_flops = encoder_flops(vision.tower.config, grid)
    text_flops = prefill_flops(engine.model, prompt_tokens)
    figures = [
        Figure("time to first token", 1e3 * statistics.median(ttfts), 0.0, 0.0),
        Figure("image encode", 1e3 * encode, encode_flops / 1e9, 1e3 * encode_flops / rate),
        Figure("text prefill", 1e3 * prefill, text_flops / 1e9, 1e3 * text_flops / rate),
        Figure("preprocess (cpu)", 1e3 * preprocess, 0.0, 0.0),
    ]
    floor = figures[1].floor_ms + figures[2].floor_ms
    figures[0].gflop, figures[0].floor_ms = figures[1].gflop + figures[2].gflop, floor
    return {
        "image_size": image_size,
        "grid_thw": [int(x) for x in grid[0]],
        "patches": int(np.prod(grid[0])),
        "image_tokens": image_tokens,
        "prompt_tokens": prompt_tokens,
        "runs": runs,
        "media_cache": "bypassed: a fresh image every run",
        "matmul_tflops": rate / 1e12,
        "answer_tokens": answers,
        "figures": [asdict(f) for f in figures],
    }


def report(result: dict[str, Any]) -> str:
    lines = [
        f"{result['image_size']}² image: grid {result['grid_thw']}, {result['patches']} patches, "
        f"{result['image_tokens']} image tokens; prompt {result['prompt_tokens']} tokens; "
        f"matmul {result['matmul_tflops']:.1f} TFLOP/s; median of {result['runs']}",
        f"{'':<22}{'ms':>10}{'GFLOP':>10}{'floor ms':>10}{'% floor':>9}",
    ]
    for f in result["figures"]:
        share = f"{100 * f['floor_ms'] / f['ms']:8.1f}%" if f["floor_ms"] else f"{'':>9}"
        floor = f"{f['floor_ms']:10.2f}" if f["floor_ms"] else f"{'':>10}"
        gflop = f"{f['gflop']:10.4g}" if f["gflop"] else f"{'':>10}"
        lines.append(f"{f['what']:<22}{f['ms']:10.2f}{gflop}{floor}{share}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="an artifact with a vision component")
    parser.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--image-size", type=int, default=1024, help="pixels a side")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--prefill-chunk", type=int, help="the engine's (default: the backend's own)"
    )
    parser.add_argument("--json", help="write the result here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.runs < 1 or args.image_size < 1:
        sys.exit("image_bench: --runs and --image-size must be positive")
    engine = Engine(
        args.model,
        backend=args.backend,
        max_lanes=1,
        # the full-size tower makes a merged token of a 32² block; text beside it
        max_context=max(4096, args.image_size**2 // 256 + 512),
        prefill_chunk=args.prefill_chunk,
    )
    result = {
        "model": str(args.model),
        "backend": args.backend,
        "prefill_chunk": engine.prefill_chunk,
        **measure(engine, args.image_size, args.runs),
    }
    print(report(result))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
    return result


if __name__ == "__main__":
    main()
