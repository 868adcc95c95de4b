"""flash-linear-attention's chunked delta rules (pip ``fla-core``, Triton kernels) as
delta_rule providers: ``chunk`` on ``chunk_gated_delta_rule`` (a decay per head),
``kda_chunk`` on ``chunk_kda`` (a decay per key channel), and ``prefill``: our convolution
kernel, then every segment's rows through one ``chunk_gated_delta_rule`` call as a packed
variable-length batch (``cu_seqlens``) in the production precision (q, k, v rounded to bf16;
decays, write strengths and states float32). CuPy arrays go in and out as DLPack views (no
copies) and the kernels run on CuPy's current stream, so they are ordered with the engine's
own launches. Our q is already scaled (``scale=1``); the state keeps our [H, dk, dv] float32
layout (fla's default, key dimension first) and is written back in place."""

from __future__ import annotations

import functools
import itertools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..torch_interop import on_cupy_stream, view

__all__ = ["accepts", "accepts_prefill", "chunk", "kda_chunk", "prefill", "sequences"]


def accepts(*, device: str, key_dim: int, **_: object) -> bool:
    return device == "cuda" and key_dim <= 256


def accepts_prefill(*, device: str, taps: int, key_dim: int, **_: object) -> bool:
    """fla's key head sizes and our convolution kernel's compiled widths and head sizes."""
    from ...backends.cuda.gdn import CONV_TAPS, KEY_DIMS

    return accepts(device=device, key_dim=key_dim) and taps in CONV_TAPS and key_dim in KEY_DIMS


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


def prefill(
    mixed: Any,
    kernel: Any,
    conv_states: Any,
    g: Any,
    beta: Any,
    states: Any,
    segments: Sequence[tuple[int, int, int]],
    **dims: int,
) -> Any:
    """``reference.prefill``: every segment's convolution, SiLU and q/k normalisation in our
    one launch, then the delta rule over all segments in one variable-length call, each
    from its slot's state (gathered) and back into it (scattered). Rows of no segment are
    left unwritten."""
    import cupy as cp
    import torch

    from ...backends.cuda import gdn_prefill

    hk, dk, hv, dv = (dims[n] for n in ("key_heads", "key_dim", "value_heads", "value_dim"))
    plan = sequences(segments, mixed.shape[0])
    out = cp.empty((mixed.shape[0], hv, dv), dtype=cp.float32)
    if plan is None:
        return out
    if not states.flags.c_contiguous:
        raise ValueError("delta_rule.fla: the states must be C-contiguous (written in place)")
    q, k, v = gdn_prefill.conv_heads(
        mixed, kernel, conv_states, plan.segments, key_heads=hk, key_dim=dk, value_width=hv * dv
    )
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    rows = slice(plan.first, plan.end)
    with on_cupy_stream(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fla guesses a head-first layout when T < heads
        place = (cp.cuda.Device().id, cp.cuda.get_current_stream().ptr)
        bounds, bounds_cpu, starts, kept, written = _tables(place, plan.segments)
        held = view(states)
        o, final = chunk_gated_delta_rule(
            *(view(a[rows]).to(torch.bfloat16)[None] for a in (q, k)),
            view(v[rows]).reshape(1, -1, hv, dv).to(torch.bfloat16),
            view(g[rows])[None],
            view(beta[rows])[None],
            scale=1.0,
            initial_state=held.index_select(0, starts),
            output_final_state=True,
            cu_seqlens=bounds,
            cu_seqlens_cpu=bounds_cpu,
        )
        held.index_copy_(0, written, final.index_select(0, kept))
        view(out)[rows].copy_(o[0])
    return out


@functools.lru_cache(maxsize=16)
def _tables(place: tuple[int, int], segments: tuple[tuple[int, int, int], ...]) -> tuple:
    """The packed sequences' tables as torch tensors: (bounds on the device and on the
    host, each sequence's state slot, the segments' sequences, their slots), copied once and
    kept while the same segments come again, as every recurrent layer of a forward does (fla
    keys what it derives from ``cu_seqlens`` on the tensor's identity). Copied by CuPy and
    viewed: torch's own copy from host memory waits for the stream to finish. ``place``: the
    device and stream, part of the key, so a table is only read in the stream order of its
    copy."""
    import cupy as cp
    import torch

    plan = Sequences(segments)
    tables = (plan.bounds, plan.gather, plan.kept, plan.gather[plan.kept])
    bounds, starts, kept, written = (view(cp.asarray(a)) for a in tables)
    return bounds, torch.from_numpy(plan.bounds), starts, kept, written


class Sequences:
    """A prefill's segments as fla's packed sequences over rows ``first .. end``: the
    segments in row order with the gaps between them as sequences of their own (whose
    outputs and states are dropped), ``bounds`` their cumulative row offsets (int64
    ``cu_seqlens``), ``gather`` the state slot each starts from (a gap borrows a segment's:
    its output is never read) and ``kept`` the sequences that are segments."""

    def __init__(self, segments: tuple[tuple[int, int, int], ...]) -> None:
        self.segments = segments
        self.first = segments[0][0]
        self.end = segments[-1][0] + segments[-1][1]
        bounds, gather, kept = [0], [], []
        at = self.first
        for first, count, slot in segments:
            if first > at:  # a gap: rows of no segment, or a later round's
                bounds.append(first - self.first)
                gather.append(slot)
            kept.append(len(gather))
            gather.append(slot)
            bounds.append(first + count - self.first)
            at = first + count
        self.bounds = np.array(bounds, dtype=np.int64)
        self.gather = np.array(gather, dtype=np.int64)
        self.kept = np.array(kept, dtype=np.int64)


def sequences(segments: Sequence[tuple[int, int, int]], rows: int) -> Sequences | None:
    """The packed sequences of ``segments`` (first row, rows, slot) of a ``rows``-row
    prefill; None if none has rows. Segments may not overlap."""
    ordered = tuple(sorted((int(a), int(b), int(c)) for a, b, c in segments if int(b)))
    if not ordered:
        return None
    for (a, n, _), (b, _, _) in itertools.pairwise(ordered):
        if a + n > b:
            raise ValueError(f"delta_rule.fla prefill: segments overlap at row {b}")
    if ordered[-1][0] + ordered[-1][1] > rows:
        raise ValueError(f"delta_rule.fla prefill: a segment ends past the {rows} rows")
    return Sequences(ordered)
