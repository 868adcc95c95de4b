"""GLM5Next on the CUDA backend against the CPU backend, on the tiny random GLM5Next artifact the
CPU artifact tests build (``tests/tiny_glm5_next.py``, recipe ``glm5_next_bf16``, 16 indexer
heads as in ``tests/runtime/test_glm5_next_artifact.py``): KDA, latent attention with its own
DSA indexer and with the shared one, the grouped MoE and the hyper-connections.

GLM5Next is served on the backends of ``models.glm5_next.model.SERVED_BACKENDS`` (cuda since
these tests passed on an H100). On CUDA
the model runs its reference ops (KDA, ``latent``, ``grouped_route``) as CuPy array math, its
products with weights through the backend and its products between arrays through the linear
family's ``matmul`` (cuBLAS when eager; ours inside a capture, which cuBLAS cannot join), and
its decode steps are captured as CUDA graphs from their second call.

* The runner: prompts shorter (6 tokens: every pool seen) and longer (37: the indexer keeps
  ``index_topk`` of them) than ``index_topk``, in one chunk and in chunks of 16, then greedy
  decoding of both lanes side by side, its steps eager and captured: every logit within
  ``LOGIT_TOL`` of the CPU's and the same greedy tokens (a step where the CPU's top two are
  within that bound is a tie: that lane stops being compared).
* The engine with float32 prefill products: greedy answers token for token the CPU engine's
  on short answers; with the prefix cache (resuming from checkpoints) and under preemption (a
  pool too small for its lanes) they equal the same backend's cold, unconstrained streams
  (the rule: neither changes greedy output on one backend; across backends a random model's
  long streams may part at a near-tie, fla's KDA chunk not being the reference's arithmetic).

One test runs everywhere: a CPU backend that calls itself cuda resolves every op GLM5Next uses
through the ``cuda`` rows of the op policies (reference providers, on numpy here) and gives
the CPU backend's logits bit for bit, and a backend that captures steps keeps capturing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_format import Artifact
from ninfer_runtime.backends.cpu import CpuBackend
from ninfer_runtime.engine import Engine, GenerationRequest, TokenEvent
from ninfer_runtime.frontend import SamplingParams
from ninfer_runtime.models import load_model
from ninfer_runtime.runner import ModelRunner
from tests.runtime.test_prefix_cache import _capacity, _concurrent, _serve

from .conftest import REPORT, requires_gpu

#: the tiny model's vocabulary (``tests/tiny_glm5_next.TEXT``)
VOCAB = 512
#: as the CPU artifact tests: more indexer heads than the builder's two, so a pool is rarely
#: scored exactly 0 by every head (ties the two backends would still break alike)
OVERRIDES = {"index_n_heads": 16}
#: within index_topk (8 tokens: two pools of 4, plus the open pool), and past it
PROMPTS = (6, 37)
STEPS = 24
#: float32 products on both sides (NINFER_CUDA_PREFILL=float32): the differences are the
#: small-M kernels' (x carried as two bf16 halves, ~1e-5 of a product) and cuBLAS's summation
#: order, through three layers, their hyper-connections and two softmaxes; as
#: test_backend.py's bound, relative to max(1, max|logit|). An indexer choice that flips on a
#: near-tie shows far past it: look at the index scores there before widening this.
LOGIT_TOL = 2e-3


def on_gpu(test: Callable[..., Any]) -> Callable[..., Any]:
    for mark in requires_gpu:
        test = mark(test)
    return test


def host(a: Any) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a
    import cupy as cp

    return cp.asnumpy(a)


@pytest.fixture(scope="module")
def glm5_next_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tiny = pytest.importorskip("tests.tiny_glm5_next")
    root = tmp_path_factory.mktemp("gpu_glm5_next")
    checkpoint = tiny.build_tiny_glm5_next(root / "checkpoint", **OVERRIDES)
    tiny.convert("glm5_next_bf16", checkpoint, root / "tiny.ninfer")
    return root / "tiny.ninfer"


@pytest.fixture
def float32_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """Float32 prefill products and split decode products, the reference's precision."""
    monkeypatch.setenv("NINFER_CUDA_PREFILL", "float32")
    monkeypatch.setenv("NINFER_CUDA_DECODE", "split")


def test_cuda_rows_serve_every_op_and_steps_stay_capturable(
    float32_products: None, glm5_next_artifact: Path
) -> None:
    """Runs without a GPU: the ``cuda`` policy rows on numpy arrays (the reference providers;
    where CuPy is installed its kernels would take the rows, so the GPU tests stand instead)."""
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed: the cuda rows would pick its kernels; the GPU tests run")

    class NamedCuda(CpuBackend):
        name = "cuda"
        graphs = False

    class Captures(NamedCuda):
        graphs = True

    captures = Captures()
    load_model(Artifact.open(glm5_next_artifact), captures)
    assert captures.graphs is True
    ids = np.random.default_rng(2).integers(0, VOCAB, 37)
    out = {}
    for name, backend in (("cpu", CpuBackend()), ("cuda", NamedCuda())):
        runner = ModelRunner(load_model(Artifact.open(glm5_next_artifact), backend))
        state = runner.new_state(64)
        logits = [runner.prefill(ids, state, chunk=16).logits[0]]
        for _ in range(3):
            token = np.array([int(np.argmax(logits[-1][-1]))])
            logits.append(runner.forward([token], [state]).logits[0])
        out[name] = logits
    for cpu, cuda in zip(out["cpu"], out["cuda"], strict=True):
        np.testing.assert_array_equal(cpu, cuda)


@on_gpu
@pytest.mark.parametrize(("chunk", "graphs"), [(512, False), (16, False), (16, True)])
def test_runner_logits_and_greedy_tokens_match_cpu(
    chunk: int, graphs: bool, float32_products: None, glm5_next_artifact: Path
) -> None:
    from ninfer_runtime.backends.cuda.backend import CudaBackend

    backends = {
        "cpu": "cpu",
        "cuda": CudaBackend(graphs=graphs, prefill_precision="float32", decode_precision="split"),
    }
    rng = np.random.default_rng(chunk)
    prompts = [rng.integers(0, VOCAB, t) for t in PROMPTS]
    states: dict[str, list[Any]] = {}
    last: dict[str, list[np.ndarray]] = {}
    scale, err = 0.0, 0.0
    runners = {}
    for name, backend in backends.items():
        runner = runners[name] = ModelRunner(load_model(Artifact.open(glm5_next_artifact), backend))
        # 16-token pages: the longer prompt and its decoding span several
        pool = runner.new_pool(lanes=len(PROMPTS), max_context=96, page_tokens=16)
        states[name] = [pool.open(96) for _ in prompts]
        rows = [host(runner.prefill(ids, s, chunk=chunk).logits[0]) for ids, s in
                zip(prompts, states[name], strict=True)]  # fmt: skip
        last[name] = [r[-1] for r in rows]
        if name == "cpu":
            reference = rows
            scale = max(float(np.abs(r).max()) for r in rows)
        else:
            err = max(float(np.abs(a - b).max()) for a, b in zip(reference, rows, strict=True))
    bound = LOGIT_TOL * max(1.0, scale)
    assert err < bound, f"prompt logits max|Δ| {err:.2e}"

    tokens = {n: [int(np.argmax(x)) for x in last[n]] for n in backends}
    compared = [True] * len(PROMPTS)
    same = [0] * len(PROMPTS)
    for step in range(STEPS + 1):
        for i in range(len(PROMPTS)):
            if not compared[i]:
                continue
            ref, got = last["cpu"][i], last["cuda"][i]
            err = max(err, float(np.abs(ref - got).max()))
            t_cpu, t_gpu = int(np.argmax(ref)), int(np.argmax(got))
            if t_cpu != t_gpu:
                gap = float(ref[t_cpu] - ref[t_gpu])
                assert gap < bound, f"lane {i} step {step}: cpu {t_cpu} cuda {t_gpu}, gap {gap}"
                compared[i] = False
            else:
                same[i] += 1
            tokens["cpu"][i], tokens["cuda"][i] = t_cpu, t_gpu
        if step == STEPS:
            break
        for name, runner in runners.items():
            feed = [np.array([t]) for t in tokens[name]]
            last[name] = [host(x)[0] for x in runner.forward(feed, states[name]).logits]
    case = f"glm5_next/chunk {chunk}{' captured' if graphs else ''}"
    REPORT.append((case, "logits max|Δ| (rel to max|logit|)", f"{err:.2e} ({err / scale:.1e})"))
    REPORT.append((case, "identical greedy tokens per lane", f"{same} of {STEPS + 1}"))
    assert err < bound, err
    assert same[0] == STEPS + 1 or not compared[0], same


def _greedy(engine: Engine, prompt: list[int], tokens: int = 20) -> list[int]:
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    request = GenerationRequest(prompt_ids=prompt, sampling=params, parse_output=False)
    return [e.token_id for e in engine.generate(request) if isinstance(e, TokenEvent)]


@on_gpu
def test_engine_greedy_equals_cpu(float32_products: None, glm5_next_artifact: Path) -> None:
    cpu = Engine(glm5_next_artifact, max_context=256, prefill_chunk=32)
    gpu = Engine(glm5_next_artifact, backend="cuda", max_context=256, prefill_chunk=32,
                 kv_dtype="float32")  # fmt: skip
    rng = np.random.default_rng(4)
    for t in (5, 40, 100):  # within index_topk, past it (in two chunks), in four chunks
        prompt = rng.integers(0, VOCAB, t).tolist()
        assert _greedy(gpu, prompt) == _greedy(cpu, prompt), t


@on_gpu
def test_prefix_cache_and_preemption_keep_cold_cuda_streams(
    float32_products: None, glm5_next_artifact: Path
) -> None:
    """``tests/runtime/artifact_checks.assert_warm_streams_equal_cold`` and the CPU artifact
    test's preemption case on CUDA: the warm and the constrained engines against cold,
    unconstrained ones on the same backend."""
    rng = np.random.default_rng(1)
    system = rng.integers(0, 400, 70).tolist()
    prompts = [system + rng.integers(0, 400, n).tolist() for n in (3, 20, 9)] + [system]
    cold = _serve(Engine(glm5_next_artifact, backend="cuda", max_lanes=2, max_context=256,
                         prefill_chunk=32, kv_dtype="float32"), prompts)  # fmt: skip
    warm_engine = Engine(glm5_next_artifact, backend="cuda", max_lanes=2, max_context=256,
                         prefill_chunk=32, prefix_cache=True, checkpoint_interval=32,
                         kv_dtype="float32")  # fmt: skip
    warm = _serve(warm_engine, prompts)
    assert [t for t, _ in warm] == [t for t, _ in cold]
    assert [f.usage.cached_tokens for _, f in warm][1:3] == [64, 64]

    # three lanes that each outgrow one 256-token page, in a pool of four pages
    roomy = Engine(glm5_next_artifact, backend="cuda", max_lanes=3, max_context=512,
                   kv_dtype="float32")  # fmt: skip
    lanes = [rng.integers(0, 400, 220 + 10 * i).tolist() for i in range(3)]
    params = SamplingParams(max_tokens=60, ignore_eos=True, temperature=0.0)
    small = Engine(glm5_next_artifact, backend="cuda", max_lanes=3, max_context=512,
                   context_capacity=_capacity(roomy.pool, 4), kv_dtype="float32")  # fmt: skip
    assert small.pool.pages == 4
    assert _concurrent(small, lanes, params) == _concurrent(roomy, lanes, params)
    assert small.preemptions > 0
