"""The mixture-of-experts family's oracle, as array math: the routers' choices (``route``:
softmax, top-k renormalised, which the Qwen3.5 block's own ``route`` and expert offload's
split call too; ``grouped_route``: GLM5Next's sigmoid scores chosen by group) and
the Qwen3.5-MoE block (``block``) with its products on the device's own ``linear``, so on the
CPU a block gives the values the float32 backend always gave (a row's result never depends
on which rows share the call)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...arrays import array_module
from ...backends.array_ops import count_pairs, sigmoid, softmax
from ...backends.base import ExpertWeights, MoeWeights
from ...functional import silu_mul, top_k_ids

__all__ = [
    "ROUTING_EPS",
    "TOLERANCE",
    "accepts",
    "block",
    "expert",
    "grouped_route",
    "host_products",
    "route",
    "routed_experts",
]

Array = Any

#: added to the renormalising sum of ``grouped_route``, as transformers does
ROUTING_EPS = 1e-20

#: provider -> (rtol, atol as a fraction of the largest reference value) of ``block``: the
#: reference's against the block's math in float64, ours against this oracle on the same
#: float32 weights (the CUDA products round x to bf16 in prefill: the bound
#: tests/gpu/test_moe_kernels.py holds the prefill path to); ``torch_int4``'s, of a host
#: expert and of the logits of a model whose experts are all on it, against the reference's
#: (bf16 rows and scales: tests/runtime/test_expert_offload_int4.py)
TOLERANCE: dict[str, tuple[float, float]] = {
    "reference": (1e-5, 1e-6),
    "nvrtc": (2e-2, 1e-2),
    "torch_int4": (0.0, 2e-2),
}


def accepts(**_: object) -> bool:
    return True


def route(probs: Array, top_k: int) -> tuple[Array, Array]:
    """A router's choice: each row's ``top_k`` experts by probability (the lower index first
    among equals) -> int [N, k], and their probabilities renormalised to sum 1 over them
    -> [N, k]. One function, so every part of a split block routes alike."""
    xp = array_module(probs)
    top = top_k_ids(probs, top_k)
    share = xp.take_along_axis(probs, top, axis=-1)
    return top, share / share.sum(axis=-1, keepdims=True)


def grouped_route(
    logits: Array,
    bias: Array,
    *,
    groups: int,
    topk_groups: int,
    top_k: int,
    norm_topk_prob: bool,
    scale: float,
) -> tuple[Array, Array]:
    """GLM5Next's router: logits [N, E] -> experts [N, k] and weights [N, k].

    s = sigmoid(logits); c = s + bias chooses the ``topk_groups`` groups with the best sum of
    their two best c, then the top-k experts of c inside them; the weights are s of those
    (renormalised to sum 1 if ``norm_topk_prob``) times ``scale``. Nothing is sorted on a
    device (a sort synchronises CuPy with the host): the choices are ``top_k_ids``'."""
    xp = array_module(logits)
    scores = sigmoid(logits)  # [N, E]
    choice = scores + bias
    n, per_group = logits.shape[0], logits.shape[1] // groups
    group_score = _two_best(choice.reshape(n, groups, per_group))
    best_groups = top_k_ids(group_score, topk_groups)
    allowed = xp.zeros((n, groups), dtype=bool)
    allowed[xp.arange(n)[:, None], best_groups] = True  # CuPy 13.0 lacks put_along_axis
    allowed = xp.repeat(allowed, per_group, axis=1)
    choice = xp.where(allowed, choice, xp.float32(-xp.inf))
    top = top_k_ids(choice, top_k)
    weights = xp.take_along_axis(scores, top, axis=-1)
    if norm_topk_prob:
        weights = weights / (weights.sum(axis=-1, keepdims=True) + ROUTING_EPS)
    return top, weights * scale


def _two_best(values: Array) -> Array:
    """The sum of the two largest values of each row [..., G] (a group's score), the largest
    counted once: the second is the largest of the rest."""
    xp = array_module(values)
    best = values.max(axis=-1)
    first = values.argmax(axis=-1)[..., None] == xp.arange(values.shape[-1])
    return xp.where(first, xp.float32(-xp.inf), values).max(axis=-1) + best


def expert(backend: Any, x: Array, gate: Any, up: Any, down: Any, gated: Any = silu_mul) -> Array:
    """One gated MLP on the device's products: ``down(gated(gate x, up x))``, by default
    ``silu(gate x) * up x`` (a MoE block's ``gated`` says its own)."""
    return backend.linear(gated(backend.linear(x, gate), backend.linear(x, up)), down)


def routed_experts(
    backend: Any, x: Array, top: Array, weights: Array, experts: Any, *, out: Array
) -> None:
    """Adds to ``out`` [N, H] the routed experts' share of rows x [N, H]: row n's chosen
    experts ``top`` [N, k], each weighted by ``weights`` [N, k], each chosen expert called
    once over its rows. An expert is None (held in host memory, or another rank's: it adds
    nothing here) or a gated MLP: called on rows, it gives ``down(silu(min(gate x, L)) *
    clamp(up x, -L, L))`` with its ``gate_up`` [2I, H] (gate rows, then up rows), ``down``
    [H, I] and ``limit`` L (None: no clamp), which a device provider reads instead."""
    xp = array_module(x)
    for e in xp.unique(top).tolist():  # the chosen experts, read back
        mlp = experts[e]
        if mlp is None:
            continue
        rows, slot = xp.nonzero(top == e)
        out[rows] += weights[rows, slot][:, None] * mlp(x[rows])


def host_products() -> None:
    """The reference's ``host_products``: no kernel of its own. A host expert keeps its stored
    codes and decodes them to float32 at each use, multiplying on the CPU backend's products
    (``expert_offload.host_experts``), so on the CPU its rows equal a resident expert's."""
    return None


def block(backend: Any, x: Array, weights: MoeWeights) -> Array:
    """The Qwen3.5-MoE block on rows x [N, H] -> [N, H]: softmax router over all experts,
    renormalised top-k, each chosen expert once over its rows, plus the shared expert scaled
    by a sigmoid score. An expert that is None (another rank's, or one held in host memory)
    adds nothing: its pairs are computed where it is held."""
    probs = softmax(backend.linear(x, weights.router))  # [N, E] over all experts
    top, share = route(probs, weights.top_k)
    count_pairs(weights.hits, top)
    out = np.zeros_like(x)
    for e in np.unique(top):
        ex: ExpertWeights | None = weights.experts[int(e)]
        if ex is None:  # another rank's expert: its share of the output is that rank's
            continue
        rows, slot = np.nonzero(top == e)
        out[rows] += share[rows, slot, None] * expert(backend, x[rows], ex.gate, ex.up, ex.down)
    sh = weights.shared
    score = sigmoid(backend.linear(x, weights.shared_score))  # [N, 1]
    return out + score * expert(backend, x, sh.gate, sh.up, sh.down)
