"""Decode past eight lanes on CUDA: 64 lanes of the tiny dense and MoE artifacts against the CPU
reference. Both backends read the same tokens (the reference's greedy choice), so their logits
compare at every step, whatever the lane count: steps advance 64, 33, 17, 9 and 1 lanes, each
count a decode step of its own (captured once), its rows through the small-M products in
blocks of eight and the MoE decode path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ninfer_format import Artifact
from ninfer_runtime.models import load_model
from ninfer_runtime.runner import ModelRunner

from .conftest import REPORT, requires_gpu
from .test_backend import LOGIT_TOL, VOCAB, host, max_abs

pytestmark = requires_gpu

LANES = 64
#: the lanes each decode step advances (the first that many)
COUNTS = [64, 33, 17, 9, 1, 64, 40]


@pytest.mark.parametrize("kind", ["dense", "moe"])
@pytest.mark.parametrize("recipe", ["tiny_q4", "tiny_mixed"])
def test_sixty_four_lanes_match_the_cpu_reference(
    recipe: str, kind: str, gpu_artifact: Callable[[str, str], Path]
) -> None:
    from ninfer_runtime.backends.cuda.backend import CudaBackend

    assert CudaBackend.max_lanes == LANES
    path = gpu_artifact(recipe, kind)
    backends = {
        "cpu": "cpu",
        "gpu": CudaBackend(prefill_precision="float32", decode_precision="split"),
    }
    runners = {n: ModelRunner(load_model(Artifact.open(path), b)) for n, b in backends.items()}
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, VOCAB, 2 + i % 9) for i in range(LANES)]
    states, last = {}, {}
    for name, runner in runners.items():
        pool = runner.new_pool(lanes=LANES, max_context=64, page_tokens=16, kv_dtype="float32")
        states[name] = [pool.open(64) for _ in prompts]
        last[name] = [
            host(runner.forward([ids], [s]).logits[0])[-1]
            for ids, s in zip(prompts, states[name], strict=True)
        ]
    err = max(max_abs(a, b) for a, b in zip(last["cpu"], last["gpu"], strict=True))
    scale = max(float(np.abs(x).max()) for x in last["cpu"])
    for count in COUNTS:
        feed = [np.array([int(np.argmax(last["cpu"][i]))]) for i in range(count)]
        for name, runner in runners.items():
            out = runner.forward(feed, states[name][:count]).logits
            last[name][:count] = [host(x)[0] for x in out]
        err = max(err, *(max_abs(last["cpu"][i], last["gpu"][i]) for i in range(count)))
        scale = max(scale, *(float(np.abs(last["cpu"][i]).max()) for i in range(count)))
    made = runners["gpu"].steps.made()
    REPORT.append(
        (f"lanes64/{kind}/{recipe}", "logits max|Δ| (rel)", f"{err:.2e} ({err / scale:.1e})")
    )
    assert {("decode", n) for n in COUNTS} <= set(made), made
    assert err < LOGIT_TOL * max(1.0, scale), err
