"""Where a decode step's, a speculative round's or a prefill chunk's time goes, by ablation:
timed whole, then with each backend op in turn replaced by an empty output of its shape (an
op family's op only where the work used it)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..arrays import sync
from ..ops import registry
from ..runner import ModelRunner
from .rates import decode_rate
from .spec_rates import spec_round_rate

#: backend ops the profile takes out one at a time, with the shape of what each returns
PROFILED_OPS: dict[str, Any] = {
    "linear": lambda x, w, **_: (x.shape[0], w.shape[0]),
    "rms_norm": lambda x, *_, **__: x.shape,
    "gated_rms_norm": lambda x, *_, **__: x.shape,
    "rope": lambda x, *_, **__: x.shape,
    "attention_decode": lambda q, *_, **__: q.shape,
    "gdn_decode": lambda mixed, *_, value_heads, value_dim, **__: (
        mixed.shape[0],
        value_heads,
        value_dim,
    ),
    "moe": lambda _backend, x, *_, **__: x.shape,
    # GLM5Next's: Kimi Delta Attention's recurrence, latent attention, its routed experts
    # (which add to the block's output in place)
    "kda_decode": lambda mixed, *_, heads, head_dim, **__: (mixed.shape[0], heads, head_dim),
    "latent_attention": lambda q, *_, **__: q.shape,
    "routed_experts": lambda _backend, x, *_, **__: x.shape,
}
#: the ops of a prefill chunk's path (products, norms, RoPE, attention over the lane's cache,
#: the GDN convolution and chunked scan, MoE)
PREFILL_OPS: dict[str, Any] = {
    "linear": PROFILED_OPS["linear"],
    "rms_norm": PROFILED_OPS["rms_norm"],
    "gated_rms_norm": PROFILED_OPS["gated_rms_norm"],
    "rope": PROFILED_OPS["rope"],
    "attention_pages": lambda q, *_, **__: q.shape,
    "gdn_prefill": lambda x, *_, value_heads, value_dim, **__: (
        x.shape[0],
        value_heads,
        value_dim,
    ),
    "moe": PROFILED_OPS["moe"],
}
#: a round's ops: a decode step's, and the verification's recurrent pair
ROUND_OPS: dict[str, Any] = {
    **PROFILED_OPS,
    "gdn_verify": PROFILED_OPS["gdn_decode"],
    "gdn_commit": lambda *_, **__: (),
}


def profile_decode(
    runner: ModelRunner, lanes: int, context: int, *, steps: int = 16
) -> dict[str, float]:
    """Where a decode step's time goes, by ablation: the step (as it really runs, CUDA graph
    replays included) is timed whole, then once with each backend op replaced by an empty
    output of the right shape; an op's share is the difference. ``rest`` is the step with
    every listed op removed (elementwise glue, embedding, K/V writes, sampling input)."""

    def step_ms() -> float:  # a runner of its own: a fresh capture with the ops as they are now
        fresh = ModelRunner(runner.model)
        return decode_rate(fresh, lanes, context, steps=steps, floor_bw=1.0).step_ms

    return _ablate(runner.backend, PROFILED_OPS, step_ms, "step")


def profile_round(
    runner: ModelRunner, lanes: int, context: int, draft_tokens: int, *, rounds: int = 8
) -> dict[str, float]:
    """``profile_decode`` for a speculative round (``speculate`` + ``commit``), with the
    verification's recurrent ops (``gdn_verify``, ``gdn_commit``) among the ablated ones."""

    def round_ms() -> float:
        fresh = ModelRunner(runner.model)
        return spec_round_rate(
            fresh, lanes, context, draft_tokens, step_ms=0.0, floor_bw=1.0, rounds=rounds
        ).round_ms

    return _ablate(runner.backend, ROUND_OPS, round_ms, "round")


def profile_prefill(runner: ModelRunner, tokens: int, *, past: int = 0) -> dict[str, float]:
    """Where a prefill chunk's time goes, by ablation (as ``profile_decode``): one chunk of
    ``tokens`` tokens after ``past`` tokens of context, timed whole and with each backend op
    of the prefill path replaced by an empty output of its shape. ``host_issue``: when the
    host had issued the whole chunk (``forward`` returned; the device may still be working).
    Near ``chunk``, the chunk is bound by the host, and an op's empty output then costs the
    host about what the op did: the ablation says little."""
    xp, model = runner.backend.xp, runner.model
    ids = np.random.default_rng(3).integers(0, model.config.vocab, past + tokens)

    def chunk_times() -> tuple[float, float]:  # ms: (whole, until the host had issued it)
        state = runner.new_state(past + tokens + 1)
        if past:
            runner.prefill(ids[:past], state, chunk=tokens, last_only=True)
        sync(xp)
        began = time.perf_counter()
        runner.forward([ids[past:]], [state], last_only=True)
        issued = time.perf_counter()
        sync(xp)
        return 1000 * (time.perf_counter() - began), 1000 * (issued - began)

    chunk_times()  # compile, plan
    host_issue = chunk_times()[1]
    spent = _ablate(runner.backend, PREFILL_OPS, lambda: chunk_times()[0], "chunk")
    return {"chunk": spent.pop("chunk"), "host_issue": host_issue, **spent}


#: profiled ops served by an op family rather than a backend method: (family, op)
FAMILY_OPS = {
    "attention_pages": ("attention", "prefill"),
    "attention_decode": ("attention", "decode"),
    "gdn_prefill": ("delta_rule", "prefill"),
    "gdn_decode": ("delta_rule", "decode"),
    "gdn_verify": ("delta_rule", "verify"),
    "gdn_commit": ("delta_rule", "commit"),
    "moe": ("moe", "block"),
    "kda_decode": ("delta_rule", "kda_decode"),
    "latent_attention": ("attention", "latent"),
    "routed_experts": ("moe", "routed_experts"),
    "rms_norm": ("norm", "rms_norm"),
    "gated_rms_norm": ("norm", "gated_rms_norm"),
}


def _ablate(be: Any, ops: dict[str, Any], measure: Any, whole: str) -> dict[str, float]:
    xp = be.xp

    def hollow(shape_of: Any) -> Any:
        return lambda *a, **k: xp.zeros(shape_of(*a, **k), dtype=xp.float32)

    @contextlib.contextmanager
    def without(names: list[str]) -> Iterator[None]:
        """The named ops replaced by empty outputs of their shapes within the block."""
        with contextlib.ExitStack() as stack:
            for name in names:
                if name in FAMILY_OPS:
                    stack.enter_context(registry.patched(*FAMILY_OPS[name], hollow(ops[name])))
                else:
                    setattr(be, name, hollow(ops[name]))
                    stack.callback(delattr, be, name)
            yield

    with registry.recording() as used:  # an op family's op it never runs is not taken out
        measure()  # (the memo dropped: each op resolved again, which a timed call must not pay)
    out = {whole: measure()}
    ops = {n: shape for n, shape in ops.items() if n not in FAMILY_OPS or FAMILY_OPS[n] in used}
    for name in ops:
        with without([name]):
            out[name] = out[whole] - measure()
    with without(list(ops)):
        out["rest"] = measure()
    return out
