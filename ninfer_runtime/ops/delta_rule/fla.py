"""flash-linear-attention's chunked delta rules (pip ``fla-core``, Triton kernels) as
delta_rule providers: ``chunk`` on ``chunk_gated_delta_rule`` (a decay per head) and
``kda_chunk`` on ``chunk_kda`` (a decay per key channel). CuPy arrays go in and out as DLPack
views (no copies) and the kernels run on CuPy's current stream, so they are ordered with the
engine's own launches. Our q is already scaled (``scale=1``); the state keeps our
[H, dk, dv] float32 layout (fla's default, key dimension first) and is written back in place."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from ..torch_interop import on_cupy_stream, view

__all__ = ["accepts", "chunk", "kda_chunk"]


def accepts(*, device: str, key_dim: int, **_: object) -> bool:
    return device == "cuda" and key_dim <= 256


def chunk(q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any) -> Any:
    """``reference.chunk`` (g [T, Hv]) through fla's ``chunk_gated_delta_rule``."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return _run(chunk_gated_delta_rule, q, k, v, g, beta, state)


def kda_chunk(q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any) -> Any:
    """``kda_reference.kda_chunk`` (g [T, H, dk], the log-decays already computed) through
    fla's ``chunk_kda``."""
    from fla.ops.kda import chunk_kda

    return _run(chunk_kda, q, k, v, g, beta, state)


def _run(kernel: Callable[..., Any], q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any) -> Any:
    import cupy as cp

    if not state.flags.c_contiguous:
        raise ValueError("delta_rule.fla: the state must be C-contiguous (it is written in place)")
    with on_cupy_stream(), warnings.catch_warnings():
        # fla warns when T < heads, guessing a head-first layout; ours is [T, H, d]
        warnings.simplefilter("ignore")
        held = view(state)
        out, final = kernel(
            view(q)[None],
            view(k)[None],
            view(v)[None],
            view(g)[None],
            view(beta)[None],
            scale=1.0,
            initial_state=held[None],
            output_final_state=True,
        )
        held.copy_(final[0])
    return cp.from_dlpack(out[0])
