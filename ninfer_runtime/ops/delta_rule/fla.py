"""flash-linear-attention's chunked gated delta rule (pip ``fla-core``, Triton kernels) as a
delta_rule provider. CuPy arrays go in and out as DLPack views (no copies) and the kernels run
on CuPy's current stream, so they are ordered with the engine's own launches. Our q is
already scaled (``scale=1``); the state keeps our [Hv, dk, dv] float32 layout (fla's default,
key dimension first) and is written back in place."""

from __future__ import annotations

import warnings
from typing import Any

from ..torch_interop import on_cupy_stream, view

__all__ = ["accepts", "chunk"]


def accepts(*, device: str, key_dim: int, **_: object) -> bool:
    return device == "cuda" and key_dim <= 256


def chunk(q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any) -> Any:
    import cupy as cp
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    if not state.flags.c_contiguous:
        raise ValueError("delta_rule.fla: the state must be C-contiguous (it is written in place)")
    with on_cupy_stream(), warnings.catch_warnings():
        # fla warns when T < heads, guessing a head-first layout; ours is [T, H, d]
        warnings.simplefilter("ignore")
        held = view(state)
        out, final = chunk_gated_delta_rule(
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
