"""Decode steps and prefills of a runner timed on random K/V and states, beside their floors."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..arrays import sync
from ..backends.base import to_numpy
from ..errors import EngineError
from ..runner import ModelRunner
from ..state import store_kv
from .costs import decode_step_bytes, prefill_flops
from .results import DecodeResult, PrefillResult, PrefillSegment


def fill_random(pool: Any, xp: Any, seed: int) -> None:
    """Random K/V pages and states: timing on zeros would flatter the hardware."""
    rng = xp.random.default_rng(seed) if hasattr(xp.random, "default_rng") else xp.random
    for layer in [*pool.layers, *([pool.mtp] if pool.mtp is not None else [])]:
        for name in ("k", "v", "recurrent", "conv"):
            a = getattr(layer, name, None)
            if a is not None:
                values = rng.standard_normal(a.shape, dtype=xp.float32) * xp.float32(0.05)
                a[...] = store_kv(values, a.dtype) if name in ("k", "v") else values


#: untimed decode steps before the timed ones
DECODE_WARMUP = 4


def decode_rate(
    runner: ModelRunner,
    lanes: int,
    context: int,
    *,
    steps: int = 32,
    warmup: int = DECODE_WARMUP,
    floor_bw: float,
    kv_dtype: str = "float32",
    weights: Any = None,
) -> DecodeResult:
    """``weights``: as ``decode_step_bytes``."""
    model, xp = runner.model, runner.backend.xp
    room = context + warmup + steps + 1
    pool = runner.new_pool(lanes=lanes, max_context=room, kv_dtype=kv_dtype)
    states = [pool.open(room) for _ in range(lanes)]
    fill_random(pool, xp, lanes * 7919 + context)
    for s in states:
        pool.advance(s, context)  # as if a prompt of `context` tokens had been read
    rng = np.random.default_rng(0)
    vocab = model.config.vocab
    for _ in range(warmup):
        runner.forward([rng.integers(0, vocab, 1) for _ in range(lanes)], states)
    sync(xp)
    start = time.perf_counter()
    for _ in range(steps):
        out = runner.forward([rng.integers(0, vocab, 1) for _ in range(lanes)], states)
    sync(xp)
    step = (time.perf_counter() - start) / steps
    if steps:
        check_finite(out.logits, f"decode of {lanes} lane(s) at context {context}")
    moved = decode_step_bytes(model, lanes, context, kv_dtype, weights)
    return DecodeResult(lanes, context, lanes / step, 1e3 * step, moved, 1e3 * moved / floor_bw)


def prefill_rate(
    runner: ModelRunner, tokens: int, *, chunk: int, flop_rate: float, weights: Any = None
) -> PrefillResult:
    """``weights``: as ``prefill_flops``."""
    xp = runner.backend.xp
    ids = np.random.default_rng(1).integers(0, runner.model.config.vocab, tokens)
    # warm: the same prompt once first, so every chunk size it takes (the last one's too) has
    # met its library plans and memory, as in a server that has run a while; as a served
    # prompt, logits of the last row only
    warm = runner.new_state(tokens + 1)
    first = runner.prefill(ids, warm, chunk=chunk, last_only=True).logits[0]
    del warm
    state = runner.new_state(tokens + 1)
    sync(xp)
    start = time.perf_counter()
    again = runner.prefill(ids, state, chunk=chunk, last_only=True).logits[0]
    sync(xp)
    seconds = time.perf_counter() - start
    check_repeated(to_numpy(first), to_numpy(again), f"prefill of {tokens} tokens, chunk {chunk}")
    flops = prefill_flops(runner.model, tokens, weights=weights)
    return PrefillResult(tokens, chunk, tokens / seconds, seconds, flops, flops / flop_rate)


#: how far the logits of a prompt read twice may differ, of their largest value (kernels
#: that sum in a different order from run to run stay far below it)
REPEAT_TOLERANCE = 1e-3


def check_finite(logits: Any, what: str) -> None:
    """A timed run's logits (arrays on either device) must be finite, or it timed a broken
    computation."""
    if not all(np.isfinite(to_numpy(rows)).all() for rows in logits):
        raise EngineError(f"{what}: the logits are not finite (NaN or inf); not timed")


def check_repeated(first: np.ndarray, again: np.ndarray, what: str) -> None:
    """The timed run read the warm-up's prompt again: its logits must be finite and the
    same, or the rate would time a broken computation (a race between streams, a read of
    memory still being written) instead of saying so."""
    check_finite([again], what)
    scale = max(float(np.abs(first).max()), 1e-30)
    off = float(np.abs(again - first).max()) / scale
    if off > REPEAT_TOLERANCE:
        raise EngineError(
            f"{what}: the same prompt gave logits {off:.1e} apart (of their largest value), "
            f"more than {REPEAT_TOLERANCE:.0e}; not timed"
        )


def long_prefill(
    runner: ModelRunner,
    tokens: int,
    *,
    chunk: int,
    flop_rate: float,
    segments: int = 8,
    kv_dtype: str = "float32",
    weights: Any = None,
) -> list[PrefillSegment]:
    """One ``tokens``-token prompt prefilled in chunks of ``chunk``, timed in ``segments``
    parts of whole chunks: where the time goes as the context grows (``weights``: as
    ``prefill_flops``)."""
    xp, model = runner.backend.xp, runner.model
    ids = np.random.default_rng(2).integers(0, model.config.vocab, tokens)
    warm = runner.new_state(min(tokens, chunk) + 1)
    runner.forward([ids[: min(tokens, chunk)]], [warm], last_only=True)  # compile, plan
    del warm
    pool = runner.new_pool(lanes=1, max_context=tokens + 1, kv_dtype=kv_dtype)
    state = pool.open(tokens + 1)
    chunks = -(-tokens // chunk)
    bounds = sorted(
        {min(tokens, chunk * round(chunks * i / segments)) for i in range(1, segments + 1)}
    )
    out, start = [], 0
    for end in bounds:
        if end <= start:
            continue
        sync(xp)
        began = time.perf_counter()
        for a in range(start, end, chunk):
            runner.forward([ids[a : min(a + chunk, end)]], [state], last_only=True)
        sync(xp)
        flops = prefill_flops(model, end - start, past=start, weights=weights)
        out.append(
            PrefillSegment(start, end, time.perf_counter() - began, flops, flops / flop_rate)
        )
        start = end
    return out
