"""Speculative decoding on the CUDA backend.

* The verification kernels (``gdn.gdn_verify`` / ``gdn.gdn_commit`` behind the delta_rule
  family's ``verify`` / ``commit``) against the reference ops on random data of the
  27B and the bundled model's GDN shapes: outputs and states within float32 rounding of a
  float64 reference, and bit-identical to the same tokens decoded one at a time with
  the family's ``decode`` (a verified token runs the decode step's own device code). Both
  are replayed in CUDA graphs with new slots and counts (the counts are read on the device);
  so is the reference commit a head size without kernels falls back to.
* The runner: the logits a ``speculate`` pass verifies equal plain decode steps of the same
  tokens within the backend's decode tolerance, and after ``commit`` of arbitrary accepted
  prefixes the recurrent states equal plain decoding's.
* The engine: greedy answers with speculation equal those without, token for token, on the
  bundled model in every weight format (dense) and on the tiny MoE model, K = 1, 3, 5, CUDA
  graphs on and off. A verification's products run other kernels than a decode step's (more
  rows), so a difference is accepted only where plain decoding's top two logits are within
  the decode tolerance (then that request stops being compared).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_runtime.backends.base import to_numpy
from ninfer_runtime.engine import SHORT_CHUNK_TOKENS
from ninfer_runtime.ops import delta_rule
from ninfer_runtime.ops.delta_rule import reference as R
from ninfer_runtime.ops.delta_rule.memory import GdnDrafts, GdnSpec
from tests.bundled import BUNDLED
from tests.speculation import short_chunks_against_prefill, speculate_against_decoding

from .conftest import REPORT, requires_gpu

pytestmark = requires_gpu

#: the bundled model in every weight format test_backend.py covers
RECIPES = [
    "qwen3_5_bf16",
    "tiny_q4",
    "tiny_q5",
    "tiny_q6",
    "tiny_q8",
    "tiny_nvfp4",
    "tiny_fp8",
    "tiny_nf4",
    "tiny_mixed",
]
#: logits of a verification vs decode steps: test_backend.py's float32 bound (relative to
#: max(1, max|logit|)), which a reference top-2 gap must undercut to count as a tie
LOGIT_TOL = 2e-3
#: rows per slot of the records (the most a short prompt chunk runs as one step; a round
#: of 5 drafts verifies 6)
RECORD_ROWS = SHORT_CHUNK_TOKENS


def host(a: Any) -> np.ndarray:
    return np.asarray(to_numpy(a))


def bits(a: Any) -> np.ndarray:
    return np.ascontiguousarray(host(a)).view(np.uint32)


def assert_close(got: Any, ref: np.ndarray, what: str) -> None:
    got = host(got).astype(np.float64)
    assert np.all(np.isfinite(got)), what
    scale = float(np.abs(ref).max()) + 1e-30
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * scale, err_msg=what)


# ------------------------------------------------------------------ the kernels themselves
#: (key heads, key dim, value heads, value dim, conv taps)
SHAPES = {
    "27b": (16, 128, 48, 128, 4),
    "tiny": (2, 32, 4, 64, 4),  # models/tiny-qwen3_5
    "odd": (1, 16, 3, 48, 3),  # dv short of a 32-column tile, 3 value heads per key head
    "fallback": (2, 24, 4, 16, 4),  # no kernels for dk = 24: the reference ops on CuPy
}
KERNEL_CASES = [
    ("27b", 1, 2),
    ("27b", 3, 4),
    ("27b", 8, 6),
    ("tiny", 1, 6),
    ("tiny", 2, 3),
    ("tiny", 5, 2),
    ("tiny", 8, 5),
    ("odd", 4, 4),
    ("27b", 2, 8),
]
POOL = 9


class Pools:
    """Random GDN pools of one shape (numpy float32 masters), the inputs of one verification,
    and device copies."""

    def __init__(self, shape: str, lanes: int, tokens: int, seed: int):
        import cupy as cp

        hk, dk, hv, dv, taps = SHAPES[shape]
        self.dims = dict(key_heads=hk, key_dim=dk, value_heads=hv, value_dim=dv)
        self.lanes, self.tokens = lanes, tokens
        c = 2 * hk * dk + hv * dv
        rng = self.rng = np.random.default_rng(seed)
        self.kernel = (rng.standard_normal((taps, c)) * 0.5).astype(np.float32)
        self.conv = rng.standard_normal((POOL, c, taps - 1)).astype(np.float32)
        self.states = (rng.standard_normal((POOL, hv, dk, dv)) * 0.3).astype(np.float32)
        self.spec = GdnSpec(hv, dk, dv, c, taps)
        self.records = GdnDrafts(self.spec, POOL, RECORD_ROWS, cp)
        for a in (self.records.mixed, self.records.g, self.records.beta):
            a[...] = cp.asarray(rng.standard_normal(a.shape).astype(np.float32))  # stale rows
        self.new_inputs()
        self.d_kernel = cp.asarray(self.kernel)
        self.d_conv, self.d_states = cp.asarray(self.conv), cp.asarray(self.states)

    def new_inputs(self) -> None:
        rng, n, hv = self.rng, self.lanes * self.tokens, self.dims["value_heads"]
        self.mixed = rng.standard_normal((n, self.kernel.shape[1])).astype(np.float32)
        self.g = -rng.uniform(0.01, 2.0, (n, hv)).astype(np.float32)
        self.beta = rng.uniform(0.0, 1.0, (n, hv)).astype(np.float32)
        self.slots = rng.permutation(POOL)[: self.lanes].astype(np.int32)
        counts = rng.integers(1, self.tokens + 1, self.lanes)
        counts[0] = self.tokens
        counts[-1] = 1 if self.lanes > 1 else counts[-1]
        self.counts = counts.astype(np.int32)

    def device_inputs(self) -> tuple[Any, ...]:
        import cupy as cp

        return tuple(cp.asarray(a) for a in (self.mixed, self.g, self.beta, self.slots))

    def reference(self, conv: np.ndarray, states: np.ndarray) -> np.ndarray:
        """The reference verify + commit in float64 on ``conv``/``states`` (updated);
        -> the verified rows."""
        records = GdnDrafts(self.spec, POOL, RECORD_ROWS, np)
        f64 = [a.astype(np.float64) for a in (self.mixed, self.kernel, self.g, self.beta)]
        mixed, kernel, g, beta = f64
        o = R.verify(
            mixed, kernel, conv, g, beta, states, self.slots, records, tokens=self.tokens,
            **self.dims,
        )  # fmt: skip
        R.commit(kernel, conv, states, self.slots, records, self.counts, **self.dims)
        return o


@pytest.mark.parametrize(
    ("shape", "lanes", "tokens"), KERNEL_CASES, ids=[f"{s}-{n}x{t}" for s, n, t in KERNEL_CASES]
)
def test_verify_and_commit_kernels(shape: str, lanes: int, tokens: int, cuda_backend: Any) -> None:
    import cupy as cp

    p = Pools(shape, lanes, tokens, seed=lanes * 10 + tokens)
    dims = p.dims  # cuda_backend: the device is set up
    mixed, g, beta, slots = p.device_inputs()
    conv, states = p.d_conv, p.d_states
    stale = [host(a) for a in (p.records.mixed, p.records.g, p.records.beta)]

    o = delta_rule.resolved("verify", "cuda", p.d_kernel, **dims)(
        mixed, p.d_kernel, conv, g, beta, states, slots, p.records, tokens=tokens, **dims
    )
    assert np.array_equal(bits(conv), bits(p.conv)), "verify wrote the conv states"
    assert np.array_equal(bits(states), bits(p.states)), "verify wrote the recurrent states"
    for stored, x, old in zip(
        (p.records.mixed, p.records.g, p.records.beta), (p.mixed, p.g, p.beta), stale, strict=True
    ):
        want = old.copy()
        want[p.slots, :tokens] = x.reshape(lanes, tokens, -1)
        assert np.array_equal(bits(stored), want.view(np.uint32)), "records"

    # T decode steps of the same tokens, one after another, on copies of the pools
    conv_seq, states_seq = conv.copy(), states.copy()
    for j in range(tokens):
        rows = cp.asarray(np.arange(lanes) * tokens + j)
        step = delta_rule.resolved("decode", "cuda", p.d_kernel, **dims)(
            mixed[rows], p.d_kernel, conv_seq, g[rows], beta[rows], states_seq, slots, **dims
        )
        assert np.array_equal(bits(o[rows]), bits(step)), f"verified row {j} != decode step"

    commit = delta_rule.resolved("commit", "cuda", p.d_kernel, **dims)
    commit(p.d_kernel, conv, states, slots, p.records, cp.asarray(p.counts), **dims)
    conv_seq, states_seq = cp.asarray(p.conv), cp.asarray(p.states)
    for j in range(tokens):
        live = np.flatnonzero(p.counts > j)
        rows = cp.asarray(live * tokens + j)
        delta_rule.resolved("decode", "cuda", p.d_kernel, **dims)(
            mixed[rows], p.d_kernel, conv_seq, g[rows], beta[rows], states_seq,
            cp.asarray(p.slots[live]), **dims,
        )  # fmt: skip
    assert np.array_equal(bits(conv), bits(conv_seq)), "committed conv states != decoding"
    assert np.array_equal(bits(states), bits(states_seq)), "committed states != decoding"

    conv_ref, states_ref = p.conv.astype(np.float64), p.states.astype(np.float64)
    o_ref = p.reference(conv_ref, states_ref)
    assert_close(o, o_ref, "verified rows")
    assert_close(states, states_ref, "committed states")
    assert np.array_equal(host(conv), conv_ref.astype(np.float32)), "committed conv states"
    others = np.setdiff1d(np.arange(POOL), p.slots)
    assert np.array_equal(bits(states)[others], p.states[others].view(np.uint32))
    REPORT.append((f"gdn verify {shape} {lanes}x{tokens}", "bit-identical to decode", "yes"))


@pytest.mark.parametrize("shape", ["tiny", "fallback"])
def test_verify_and_commit_replay_in_cuda_graphs(shape: str) -> None:
    """The runner's two steps, a verification (returning its rows) and a commit (returning
    nothing), each compiled by ``compile_step``: run eagerly, captured, then replayed, with
    new inputs, slots and counts every time. ``fallback``: a key head size without kernels,
    where both run the reference ops on CuPy (the commit masks instead of reading counts),
    eagerly: their einsums call cuBLAS, which a capture cannot hold."""
    import cupy as cp

    from ninfer_runtime.backends.cuda import gdn
    from ninfer_runtime.backends.cuda.backend import CudaBackend

    assert (SHAPES[shape][1] in gdn.KEY_DIMS) == (shape != "fallback")
    p = Pools(shape, lanes=3, tokens=4, seed=5)
    be = CudaBackend(
        graphs=shape != "fallback", prefill_precision="float32", decode_precision="split"
    )
    dims, tokens = p.dims, p.tokens
    bufs = [cp.empty(a.shape, a.dtype) for a in (p.mixed, p.g, p.beta)]

    def verify(slots: Any) -> tuple[Any]:
        mixed, g, beta = bufs
        return (
            delta_rule.resolved("verify", "cuda", p.d_kernel, **dims)(
                mixed, p.d_kernel, p.d_conv, g, beta, p.d_states, slots, p.records,
                tokens=tokens, **dims,
            ),
        )  # fmt: skip

    def commit(slots: Any, counts: Any) -> None:
        commit = delta_rule.resolved("commit", "cuda", p.d_kernel, **dims)
        commit(p.d_kernel, p.d_conv, p.d_states, slots, p.records, counts, **dims)

    verify_step = be.compile_step(verify, [(p.lanes,)])
    commit_step = be.compile_step(commit, [(p.lanes,), (p.lanes,)])
    conv_ref, states_ref = p.conv.astype(np.float64), p.states.astype(np.float64)
    for call in range(4):  # eager, captured, replayed twice
        p.new_inputs()
        for buf, x in zip(bufs, (p.mixed, p.g, p.beta), strict=True):
            buf.set(x)
        cp.cuda.Device().synchronize()
        (o,) = verify_step(p.slots)
        assert commit_step(p.slots, p.counts) == ()
        cp.cuda.Device().synchronize()
        o_ref = p.reference(conv_ref, states_ref)
        assert_close(o, o_ref, f"verified rows, call {call}")
        assert_close(p.d_states, states_ref, f"committed states, call {call}")
        assert_close(p.d_conv, conv_ref, f"committed conv states, call {call}")
    if shape != "fallback":  # captured and replayed, not run eagerly
        assert verify_step.graph is not None and commit_step.graph is not None


# ------------------------------------------------------------------------- runner and engine
@pytest.fixture(scope="module")
def bundled(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``bundled(recipe)``: the bundled model converted with ``recipe`` (text and mtp)."""
    from ninfer_convert.pipeline import convert

    root = tmp_path_factory.mktemp("spec_bundled")
    done: dict[str, Path] = {}

    def get(recipe: str) -> Path:
        if recipe not in done:
            done[recipe] = root / f"{recipe}.ninfer"
            convert(recipe, {"base": str(BUNDLED)}, done[recipe])
        return done[recipe]

    return get


def artifact_for(
    model: str, recipe: str, bundled: Callable[[str], Path], gpu_artifact: Callable[..., Path]
) -> Path:
    """The bundled dense model, or the tiny MoE checkpoint (``conftest.gpu_checkpoints``)."""
    if model == "bundled":
        return bundled(recipe)
    return gpu_artifact("qwen3_5_moe_bf16" if recipe == "qwen3_5_bf16" else recipe, "moe")


RUNNER_CASES = [
    ("bundled", "tiny_mixed", 2, True),
    ("bundled", "tiny_mixed", 5, False),
    ("bundled", "qwen3_5_bf16", 5, True),
    ("bundled", "tiny_nf4", 3, True),
    ("moe", "tiny_mixed", 3, True),
    ("moe", "qwen3_5_bf16", 5, False),
]


@pytest.mark.parametrize(
    ("model", "recipe", "k", "graphs"),
    RUNNER_CASES,
    ids=[f"{m}-{r}-k{k}-{'graphs' if g else 'eager'}" for m, r, k, g in RUNNER_CASES],
)
def test_verified_logits_equal_decode_steps(
    model: str,
    recipe: str,
    k: int,
    graphs: bool,
    bundled: Callable[[str], Path],
    gpu_artifact: Callable[..., Path],
) -> None:
    from ninfer_runtime.backends.cuda.backend import CudaBackend

    path = artifact_for(model, recipe, bundled, gpu_artifact)
    err, scale, state_err = speculate_against_decoding(
        path,
        lambda: CudaBackend(graphs=graphs, prefill_precision="float32", decode_precision="split"),
        lanes=3,
        k=k,
        rounds=8,
        seed=k,
    )
    case = f"spec {model}/{recipe} k{k} {'graphs' if graphs else 'eager'}"
    REPORT.append((case, "verified logits max|Δ| (rel)", f"{err:.2e} ({err / scale:.1e})"))
    REPORT.append((case, "GDN states max|Δ| (rel)", f"{state_err:.1e}"))
    assert err < LOGIT_TOL * max(1.0, scale), err
    assert state_err < 1e-3, state_err


SHORT_CHUNK_CASES = [
    ("bundled", "tiny_mixed", 1, 2, True),
    ("bundled", "qwen3_5_bf16", 3, 8, True),
    ("bundled", "tiny_q4", 2, 5, False),
    ("moe", "tiny_mixed", 2, 4, True),
]


@pytest.mark.parametrize(
    ("model", "recipe", "lanes", "tokens", "graphs"),
    SHORT_CHUNK_CASES,
    ids=[f"{m}-{r}-{n}x{t}-{'graphs' if g else 'eager'}" for m, r, n, t, g in SHORT_CHUNK_CASES],
)
def test_short_chunks_as_one_step_equal_prefill(
    model: str,
    recipe: str,
    lanes: int,
    tokens: int,
    graphs: bool,
    bundled: Callable[[str], Path],
    gpu_artifact: Callable[..., Path],
) -> None:
    """A prompt's few last tokens as one captured multi-row step (the engine's tail after a
    checkpoint): logits, the decode step after and the GDN states as prefilling them."""
    from ninfer_runtime.backends.cuda.backend import CudaBackend

    path = artifact_for(model, recipe, bundled, gpu_artifact)
    err, scale, state_err = short_chunks_against_prefill(
        path,
        lambda: CudaBackend(graphs=graphs, prefill_precision="float32", decode_precision="split"),
        lanes=lanes,
        tokens=tokens,
        seed=tokens,
    )
    case = f"short chunk {model}/{recipe} {lanes}x{tokens} {'graphs' if graphs else 'eager'}"
    REPORT.append((case, "logits max|Δ| (rel)", f"{err:.2e} ({err / scale:.1e})"))
    REPORT.append((case, "GDN states max|Δ| (rel)", f"{state_err:.1e}"))
    assert err < LOGIT_TOL * max(1.0, scale), err
    assert state_err < 1e-3, state_err


PROMPTS = [list(range(3, 40)), [5, 9, 200, 31, 7, 2, 100, 11], list(range(100, 117))]
GENERATED = 64


def greedy_answers(path: Path, k: int) -> list[list[int]]:
    """The engine's greedy tokens for ``PROMPTS``, all in flight at once (``k`` drafts a
    round; 0: no speculation)."""
    from ninfer_runtime.engine import Engine, Failed, Finished, GenerationRequest, TokenEvent
    from ninfer_runtime.frontend import SamplingParams
    from ninfer_runtime.speculative import SpecConfig

    engine = Engine(
        path,
        backend="cuda",
        max_context=256,
        spec=SpecConfig(draft_tokens=k) if k else None,
    )
    params = SamplingParams(max_tokens=GENERATED, temperature=0.0, ignore_eos=True)
    requests = [GenerationRequest(prompt_ids=p, sampling=params) for p in PROMPTS]
    ids: dict[str, list[int]] = {engine.submit(r): [] for r in requests}
    done = 0
    while done < len(requests):
        for event in engine.step():
            assert not isinstance(event, Failed), event
            if isinstance(event, TokenEvent):
                ids[event.request_id].append(event.token_id)
            elif isinstance(event, Finished):
                done += 1
    if k:
        assert engine.spec_stats is not None and engine.spec_stats.rounds > 0
    return [ids[r.request_id] for r in requests]


def tie_gap(
    path: Path, prompt: list[int], answer: list[int], a: int, b: int
) -> tuple[float, float]:
    """Plain decoding's logit gap between tokens a and b after ``prompt`` and the ``answer``
    tokens (decoded one at a time, as the engine does), and its max |logit|."""
    from ninfer_runtime.backends.cuda.backend import CudaBackend
    from ninfer_runtime.models import load_model
    from ninfer_runtime.runner import ModelRunner

    runner = ModelRunner(
        load_model(path, CudaBackend(prefill_precision="float32", decode_precision="split"))
    )
    state = runner.new_state(256)
    logits = host(runner.forward([prompt], [state]).logits[0])[-1]
    for token in answer:
        logits = host(runner.forward([[token]], [state]).logits[0])[0]
    return abs(float(logits[a] - logits[b])), float(np.abs(logits).max())


ENGINE_CASES = [("bundled", r, True) for r in RECIPES] + [
    ("bundled", "qwen3_5_bf16", False),
    ("bundled", "tiny_mixed", False),
    ("moe", "tiny_mixed", True),
    ("moe", "tiny_mixed", False),
    ("moe", "qwen3_5_bf16", True),
]
_PLAIN: dict[tuple[str, str, bool], list[list[int]]] = {}


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize(
    ("model", "recipe", "graphs"),
    ENGINE_CASES,
    ids=[f"{m}-{r}-{'graphs' if g else 'eager'}" for m, r, g in ENGINE_CASES],
)
def test_greedy_answers_equal_without_speculation(
    model: str,
    recipe: str,
    graphs: bool,
    k: int,
    bundled: Callable[[str], Path],
    gpu_artifact: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NINFER_CUDA_PREFILL", "float32")  # token-for-token comparable
    monkeypatch.setenv("NINFER_CUDA_DECODE", "split")
    monkeypatch.setenv("NINFER_CUDA_GRAPHS", "1" if graphs else "0")
    path = artifact_for(model, recipe, bundled, gpu_artifact)
    key = (model, recipe, graphs)
    if key not in _PLAIN:
        _PLAIN[key] = greedy_answers(path, 0)
    plain, spec = _PLAIN[key], greedy_answers(path, k)
    ties = 0
    for prompt, a, b in zip(PROMPTS, plain, spec, strict=True):
        assert len(a) == len(b) == GENERATED
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
        if first is None:
            continue
        gap, scale = tie_gap(path, prompt, a[:first], a[first], b[first])
        assert gap < LOGIT_TOL * max(1.0, scale), (
            f"token {first}: {a[first]} without speculation, {b[first]} with (gap {gap:.2e})"
        )
        ties += 1
    case = f"spec engine {model}/{recipe} k{k} {'graphs' if graphs else 'eager'}"
    REPORT.append((case, "greedy answers equal (ties)", f"{len(PROMPTS) - ties}/3 ({ties})"))
