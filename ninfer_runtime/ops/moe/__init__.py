"""Mixtures of experts: routers and the Qwen3.5-MoE block.

Ops (signatures as the reference's, ``reference.py``):

* ``block``: ``(backend, x, weights) -> out``: the Qwen3.5-MoE block (``backends.MoeWeights``)
  on rows x [N, H] float32: softmax router over all experts, top-k renormalised, each chosen
  expert's gated MLP over its rows, plus the shared expert scaled by a sigmoid score; the
  products are the device's (``backend.linear``); an expert that is None (another rank's, or
  one held in host memory by expert offload) adds nothing; where ``weights.hits`` is an
  array [E], each chosen (row, expert) pair is added to it on the device
  (``array_ops.count_pairs``);
* ``route``: ``(probs, top_k) -> (top, share)``: the softmax router's choice, top-k of the
  probabilities [N, E] (lower index first among equals), renormalised over them;
* ``grouped_route``: ``(logits, bias, *, groups, topk_groups, top_k, norm_topk_prob, scale)
  -> (top, weights)``: GLM5Next's sigmoid router, experts chosen inside the best groups;
* ``routed_experts``: ``(backend, x, top, weights, experts, *, out)``: adds to ``out`` the
  routed share of rows x for choices a block made itself (GLM5Next's grouped router): each
  row's ``top`` [N, k] experts weighted by ``weights``, an expert None adding nothing, the
  others gated MLPs whose SwiGLU may be clamped (``reference.routed_experts``);
* ``host_products``: ``() -> kernel | None``: what expert offload's host experts multiply
  with: an object with ``pack(pieces, columns)`` (stored rows into its own layout, None
  where it cannot read them) and ``linear(x, packed)``; None: decode the stored codes at
  each use and multiply on the CPU backend's float32 products.

Providers: ``reference`` (array math, every op) and ``nvrtc`` (ours, ``block`` on CUDA:
``backends/cuda/moe.py``, the router and expert products on the device, capturable up to
``nvrtc.MOE_DEVICE_ROWS`` rows, grouped by expert beyond; ``route``: the block's router
kernel, capturable, expert offload's split routing a step with it; ``routed_experts``: the expert
GEMVs over a table of the layer's experts, no read back, up to ``MOE_DEVICE_ROWS`` rows) and
``torch_int4``
(``host_products``: torch's CPU int4 kernel on repacked q4 codes, ``host_int4.py``). Which
serves an op is ``policy.TABLE``; the resolution key is the device (for ``host_products``,
the engine's).
"""

from ..registry import Provider, family, register
from .policy import choose

family("moe", choose)
#: (op, provider) -> (module, libraries it needs)
_PROVIDERS = {
    **{
        (op, "reference"): ("reference", ())
        for op in ("block", "route", "grouped_route", "routed_experts", "host_products")
    },
    ("block", "nvrtc"): ("nvrtc", ("cupy",)),
    ("route", "nvrtc"): ("nvrtc", ("cupy",)),
    ("routed_experts", "nvrtc"): ("nvrtc", ("cupy",)),
    ("host_products", "torch_int4"): ("host_int4", ("torch",)),
}
for (_op, _name), (_module, _requires) in _PROVIDERS.items():
    register(
        Provider(
            family="moe",
            op=_op,
            name=_name,
            module=f"{__name__}.{_module}",
            function=_op,
            requires=_requires,
            accepts="accepts",
        )
    )
