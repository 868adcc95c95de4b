"""The measuring half of ``ninfer-bench``: decode and prefill rates beside their floors.

Decode is memory-bound, so its floor is the bytes one step must move (every weight read
once, the routed experts' share of the MoE weights, each lane's K/V up to its context, GDN
states read and written) at the bandwidth of a device-to-device copy measured in the same
run. Prefill is compute-bound; its floor is the projections' FLOPs at the rate of a large
half-precision cuBLAS matrix product measured the same way. "% of floor" is floor time over
measured time.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..models.qwen3_5.mlp import SparseMoe
from ..runner import ModelRunner
from ..state import store_kv

#: bytes of the buffer the copy-bandwidth probe copies (well beyond the 50 MB L2)
COPY_BYTES = 2 << 30


@dataclass
class DecodeResult:
    lanes: int
    context: int
    tokens_per_s: float
    step_ms: float
    bytes_per_step: int
    floor_ms: float

    @property
    def percent_of_floor(self) -> float:
        return 100 * self.floor_ms / self.step_ms


@dataclass
class PrefillResult:
    tokens: int
    chunk: int
    tokens_per_s: float
    seconds: float
    flops: float
    floor_s: float

    @property
    def percent_of_floor(self) -> float:
        return 100 * self.floor_s / self.seconds


def _sync(xp: Any) -> None:
    if hasattr(xp, "cuda"):
        xp.cuda.Device().synchronize()


def _median_seconds(xp: Any, fn: Any, repeats: int = 5) -> float:
    """Median wall time of ``fn()`` with the device drained around it, after one warm-up."""
    times = []
    for _ in range(repeats + 1):
        _sync(xp)
        start = time.perf_counter()
        fn()
        _sync(xp)
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:]))


def copy_bandwidth(xp: Any) -> float:
    """Bytes per second read plus written by a large device-to-device copy."""
    src = xp.ones(COPY_BYTES // 4, dtype=xp.float32)
    dst = xp.empty_like(src)

    def copy() -> None:
        dst[...] = src

    return 2 * COPY_BYTES / _median_seconds(xp, copy)


def matmul_rate(xp: Any) -> float:
    """FLOP/s of a large float16 product on the GPU (tensor cores), float32 on the CPU."""
    gpu = hasattr(xp, "cuda")
    n, dtype = (8192, xp.float16) if gpu else (1024, xp.float32)
    a = xp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype=dtype)
    return 2 * n**3 / _median_seconds(xp, lambda: a @ a)


# -------------------------------------------------------------------------------- bytes
def weight_bytes(w: Any) -> int:
    """Stored bytes a full read of one prepared weight touches."""
    segments = getattr(w, "segments", None)
    if segments is not None:
        return sum(s.parent.data.nbytes * s.rows // s.parent.planes.rows for s in segments)
    array = getattr(w, "array", w)
    return int(array.nbytes)


def _weights_of(block: Any) -> list[Any]:
    return [v for v in vars(block).values() if hasattr(v, "shape") and len(v.shape) == 2]


def decode_step_bytes(model: Any, lanes: int, context: int, kv_dtype: str = "float32") -> int:
    """Bytes one decode step of ``lanes`` lanes at ``context`` tokens must move."""
    total = weight_bytes(model.output_head) + lanes * weight_bytes(model.token_embedding) // (
        model.config.vocab
    )
    for layer in model.layers:
        total += sum(weight_bytes(w) for w in _weights_of(layer.mixer))
        if isinstance(layer.ffn, SparseMoe):
            m = layer.ffn.weights
            experts = len(m.experts)
            # distinct experts a batch touches, on average, with uniform routing
            touched = experts * (1 - (1 - m.top_k / experts) ** lanes)
            per_expert = sum(weight_bytes(w) for w in vars(m.experts[0]).values())
            shared = sum(weight_bytes(w) for w in vars(m.shared).values())
            total += int(touched * per_expert) + shared
            total += weight_bytes(m.router) + weight_bytes(m.shared_score)
        else:
            total += sum(weight_bytes(w) for w in _weights_of(layer.ffn))
    specs, _ = model.state_specs()
    from ..state import ContextPool

    per_token = ContextPool.page_bytes_of(specs, None, 1, kv_dtype)
    states = ContextPool.slot_bytes_of(specs)
    return int(total + lanes * (context * per_token + 2 * states))


def prefill_flops(model: Any, tokens: int) -> float:
    """Multiply-add FLOPs of the projections (2 per weight per token; MoE: active experts),
    plus the causal attention products."""
    params = 0
    for layer in model.layers:
        params += sum(int(np.prod(w.shape)) for w in _weights_of(layer.mixer))
        if isinstance(layer.ffn, SparseMoe):
            m = layer.ffn.weights
            ex = sum(int(np.prod(w.shape)) for w in vars(m.experts[0]).values())
            params += m.top_k * ex + sum(int(np.prod(w.shape)) for w in vars(m.shared).values())
        else:
            params += sum(int(np.prod(w.shape)) for w in _weights_of(layer.ffn))
    flops = 2.0 * params * tokens
    a = model.config.attention
    if a is not None:
        full = sum(1 for t in model.config.layer_types if t == "full_attention")
        flops += full * 2 * 2 * a.heads * a.head_dim * tokens * tokens / 2
    return flops


# ------------------------------------------------------------------------------ timing
def _fill_random(pool: Any, xp: Any, seed: int) -> None:
    """Random K/V pages and states: timing on zeros would flatter the hardware."""
    rng = xp.random.default_rng(seed) if hasattr(xp.random, "default_rng") else xp.random
    for layer in [*pool.layers, *([pool.mtp] if pool.mtp is not None else [])]:
        for name in ("k", "v", "recurrent", "conv"):
            a = getattr(layer, name, None)
            if a is not None:
                values = rng.standard_normal(a.shape, dtype=xp.float32) * xp.float32(0.05)
                a[...] = store_kv(values, a.dtype) if name in ("k", "v") else values


def decode_rate(
    runner: ModelRunner,
    lanes: int,
    context: int,
    *,
    steps: int = 32,
    warmup: int = 4,
    floor_bw: float,
    kv_dtype: str = "float32",
) -> DecodeResult:
    model, xp = runner.model, runner.backend.xp
    room = context + warmup + steps + 1
    pool = runner.new_pool(lanes=lanes, max_context=room, kv_dtype=kv_dtype)
    states = [pool.open(room) for _ in range(lanes)]
    _fill_random(pool, xp, lanes * 7919 + context)
    for s in states:
        s.length = context  # as if a prompt of `context` tokens had been read
    rng = np.random.default_rng(0)
    vocab = model.config.vocab
    for _ in range(warmup):
        runner.forward([rng.integers(0, vocab, 1) for _ in range(lanes)], states)
    _sync(xp)
    start = time.perf_counter()
    for _ in range(steps):
        runner.forward([rng.integers(0, vocab, 1) for _ in range(lanes)], states)
    _sync(xp)
    step = (time.perf_counter() - start) / steps
    moved = decode_step_bytes(model, lanes, context, kv_dtype)
    return DecodeResult(lanes, context, lanes / step, 1e3 * step, moved, 1e3 * moved / floor_bw)


def prefill_rate(
    runner: ModelRunner, tokens: int, *, chunk: int, flop_rate: float
) -> PrefillResult:
    xp = runner.backend.xp
    ids = np.random.default_rng(1).integers(0, runner.model.config.vocab, tokens)
    warm = runner.new_state(min(tokens, 2 * chunk) + 1)
    runner.prefill(ids[: min(tokens, 2 * chunk)], warm, chunk=chunk)  # compile, plan, cache
    del warm
    state = runner.new_state(tokens + 1)
    _sync(xp)
    start = time.perf_counter()
    runner.prefill(ids, state, chunk=chunk)
    _sync(xp)
    seconds = time.perf_counter() - start
    flops = prefill_flops(runner.model, tokens)
    return PrefillResult(tokens, chunk, tokens / seconds, seconds, flops, flops / flop_rate)


def as_row(result: DecodeResult | PrefillResult) -> dict[str, Any]:
    return {**asdict(result), "percent_of_floor": result.percent_of_floor}


#: backend ops the profile takes out one at a time, with the shape of what each returns
PROFILED_OPS: dict[str, Any] = {
    "linear": lambda x, w, **_: (x.shape[0], w.shape[0]),
    "rms_norm": lambda x, *_, **__: x.shape,
    "rope": lambda x, *_, **__: x.shape,
    "attention_decode": lambda q, *_, **__: q.shape,
    "gdn_decode": lambda mixed, *_, value_heads, value_dim, **__: (
        mixed.shape[0],
        value_heads,
        value_dim,
    ),
    "moe": lambda x, *_, **__: x.shape,
}


def profile_decode(
    runner: ModelRunner, lanes: int, context: int, *, steps: int = 16
) -> dict[str, float]:
    """Where a decode step's time goes, by ablation: the step (as it really runs, CUDA graph
    replays included) is timed whole, then once with each backend op replaced by an empty
    output of the right shape; an op's share is the difference. ``rest`` is the step with
    every listed op removed (elementwise glue, embedding, K/V writes, sampling input)."""
    be = runner.backend
    xp = be.xp

    def step_ms() -> float:  # a runner of its own: a fresh capture with the ops as they are now
        fresh = ModelRunner(runner.model)
        return decode_rate(fresh, lanes, context, steps=steps, floor_bw=1.0).step_ms

    def hollow(shape_of: Any) -> Any:
        return lambda *a, **k: xp.zeros(shape_of(*a, **k), dtype=xp.float32)

    out = {"step": step_ms()}
    try:
        for name, shape_of in PROFILED_OPS.items():
            setattr(be, name, hollow(shape_of))
            out[name] = out["step"] - step_ms()
            delattr(be, name)
        for name, shape_of in PROFILED_OPS.items():
            setattr(be, name, hollow(shape_of))
        out["rest"] = step_ms()
    finally:
        for name in PROFILED_OPS:
            if name in vars(be):
                delattr(be, name)
    return out
