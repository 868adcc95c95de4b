"""Attention over the paged K/V cache of full-attention layers (and the MTP layer).

The family's memory kind is ``memory.py``: keys and values in pages of the context pool.

Op ``prefill``: ``(q, k_pages, v_pages, pages, *, start, scale, precision) -> out``: one lane's
T queries q [T, Nq, D] float32 at positions ``start .. start + T - 1`` attend causally over its
first ``start + T`` keys and values, stored in pages [pages, P, Nkv, D] (float32, bf16 words or
E4M3 bytes) at the lane's page ids ``pages``; query head h reads key/value head
``h // (Nq / Nkv)``; out [T, Nq, D] float32. ``precision`` is the backend's
``prefill_precision`` (``bf16``, ``tf32`` or ``float32``).

Providers: ``reference`` (the gathered rows attended as array math), ``nvrtc`` (ours:
``kernels/prefill_attention.cu``, the pages read in place, every precision) and ``sdpa``
(torch's fused scaled-dot-product attention on gathered bf16 K/V; bf16 only). The CUDA
backend's ``attention_pages`` resolves through ``policy.TABLE``; the resolution key is the
device, the precision, the head size and the storage (``float32``, ``bf16``, ``e4m3``).
Decode attention and K/V writes are still the backend's.
"""

from ..registry import Provider, family, register
from .policy import choose

family("attention", choose)
for _name, _accepts, _requires in (
    ("reference", "accepts", ()),
    ("nvrtc", "accepts", ("cupy",)),
    ("sdpa", "accepts", ("cupy", "torch")),
):
    register(
        Provider(
            family="attention",
            op="prefill",
            name=_name,
            module=f"{__name__}.{_name}",
            function="prefill",
            requires=_requires,
            accepts=_accepts,
        )
    )
