"""Attention over the paged K/V cache of full-attention layers (and the MTP layer).

The family's memory kind is ``memory.py``: keys and values in pages of the context pool.

Ops (signatures as the reference's, ``reference.py``):

* ``write``: ``(k_pages, v_pages, page_table, slots, positions, k, v)``: keys and values,
  each row stored at its own slot's position in the pools (rounded to the pools' storage): a
  decode step's, one row per lane, or a prefill chunk's, every lane's rows in one call;
* ``decode``: ``(q, k_pages, v_pages, page_table, slots, positions, *, scale) -> out``: row i
  of q [N, Nq, D] attends over tokens ``0 .. positions[i]`` of slot ``slots[i]``;
* ``prefill``: ``(q, k_pages, v_pages, pages, *, start, scale, precision) -> out``: one lane's
T queries q [T, Nq, D] float32 at positions ``start .. start + T - 1`` attend causally over its
first ``start + T`` keys and values, stored in pages [pages, P, Nkv, D] (float32, bf16 words or
E4M3 bytes) at the lane's page ids ``pages``; query head h reads key/value head
``h // (Nq / Nkv)``; out [T, Nq, D] float32. ``precision`` is the backend's
``prefill_precision`` (``bf16``, ``tf32`` or ``float32``).

* ``prefill_lanes``: ``(q, k_pages, v_pages, lanes, *, scale, precision, one_lane) -> out``:
  ``prefill`` of several lanes at once: ``lanes`` are (tokens, start, pages) in the row order
  of q [N, Nq, D] (their tokens sum to N); ``one_lane`` is the layer's resolved ``prefill``,
  which a provider without a packed kernel calls lane by lane (``lanes.py``).

* ``latent``: ``(q, latents, visible, *, scale) -> out``: multi-head latent attention over a
  lane's cached latents (``latent.py``: their memory kind), each query over the tokens its
  mask lets it see (``latent_reference.py``).
* ``segment``: ``(q, k, v, bounds, scale) -> out``: a vision tower's bidirectional attention
  of q, k, v [P, heads, D] float32, each row over the rows of its segment
  ``bounds[i] .. bounds[i+1]`` (one frame of one image) only (``segment_reference.py``);
  resolved by device, the backend's prefill precision and the head size.

Providers: ``reference`` (the gathered rows attended as array math), ``nvrtc`` (ours:
``kernels/attention.cu`` and ``kernels/prefill_attention.cu``, the pages read in place, every
precision) and ``sdpa`` (torch's fused scaled-dot-product attention on gathered bf16 K/V;
``prefill`` in bf16 only; ``segment`` likewise, ``segment_sdpa.py``), ``varlen`` (torch's
variable-length flash attention: ``prefill_lanes`` in one call, bf16 only) and ``each``
(``prefill_lanes`` lane by lane through ``one_lane``). Which serves an op is
``policy.TABLE``; the resolution key is the device, the prefill precision, the head size and
the storage (``float32``, ``bf16``, ``e4m3``).
"""

from collections.abc import Callable
from typing import Any

import numpy as np

from ..registry import Provider, family, register, resolve
from .policy import choose

__all__ = ["resolved"]

#: how the op catalogue names a K/V pool's storage dtype
STORAGE_NAMES = {
    np.dtype(np.float32): "float32",
    np.dtype(np.uint16): "bf16",
    np.dtype(np.uint8): "e4m3",
}


def resolved(
    op: str, device: str, k_pages: Any, *, precision: str, group: int = 1
) -> Callable[..., Any]:
    """``op`` for a layer on ``device`` whose keys sit in ``k_pages`` [pages, P, Nkv, D],
    prefilled in ``precision``, with ``group`` query heads to a key/value head."""
    storage = STORAGE_NAMES.get(np.dtype(k_pages.dtype), str(k_pages.dtype))
    head_dim = int(k_pages.shape[-1])
    return resolve(
        "attention",
        op,
        device=device,
        precision=precision,
        head_dim=head_dim,
        storage=storage,
        group=group,
    )


family("attention", choose)
#: (op, provider) -> (module, its accepts function, libraries it needs)
_PROVIDERS = {
    **{(op, "reference"): ("reference", "accepts", ()) for op in ("write", "decode", "prefill")},
    ("write", "nvrtc"): ("nvrtc", "accepts_step", ("cupy",)),
    ("decode", "nvrtc"): ("nvrtc", "accepts_decode", ("cupy",)),
    ("prefill", "nvrtc"): ("nvrtc", "accepts", ("cupy",)),
    ("prefill", "sdpa"): ("sdpa", "accepts", ("cupy", "torch")),
    ("prefill_lanes", "each"): ("lanes", "accepts", ()),
    ("prefill_lanes", "varlen"): ("varlen", "accepts", ("cupy", "torch")),
    ("latent", "reference"): ("latent_reference", "accepts", ()),
    ("segment", "reference"): ("segment_reference", "accepts", ()),
    ("segment", "sdpa"): ("segment_sdpa", "accepts", ("cupy", "torch")),
}
for (_op, _name), (_module, _accepts, _requires) in _PROVIDERS.items():
    register(
        Provider(
            family="attention",
            op=_op,
            name=_name,
            module=f"{__name__}.{_module}",
            function=_op,
            requires=_requires,
            accepts=_accepts,
        )
    )
