"""What a step must move and compute, the floors' numerators: the bytes of a decode step, an
MTP draft step and a speculative round, and the FLOPs of a prefill."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..models.qwen3_5.mlp import SparseMoe


def weight_bytes(w: Any) -> int:
    """Stored bytes a full read of one prepared weight touches."""
    segments = getattr(w, "segments", None)
    if segments is not None:
        return sum(s.parent.data.nbytes * s.rows // s.parent.planes.rows for s in segments)
    array = getattr(w, "array", w)
    return int(array.nbytes)


def _weights_of(block: Any) -> list[Any]:
    return [v for v in vars(block).values() if hasattr(v, "shape") and len(v.shape) == 2]


def _layer_bytes(layer: Any, rows: int) -> int:
    """Weight bytes one decoder layer reads for a batch of ``rows`` rows."""
    total = sum(weight_bytes(w) for w in _weights_of(layer.mixer))
    if isinstance(layer.ffn, SparseMoe):
        m = layer.ffn.weights
        experts = len(m.experts)
        # distinct experts a batch touches, on average, with uniform routing
        touched = experts * (1 - (1 - m.top_k / experts) ** rows)
        per_expert = sum(weight_bytes(w) for w in vars(m.experts[0]).values())
        shared = sum(weight_bytes(w) for w in vars(m.shared).values())
        total += int(touched * per_expert) + shared
        total += weight_bytes(m.router) + weight_bytes(m.shared_score)
    else:
        total += sum(weight_bytes(w) for w in _weights_of(layer.ffn))
    return total


def _main_weight_bytes(model: Any, rows: int) -> int:
    """The main model's weights for ``rows`` rows: every layer, the head, embedding rows."""
    embedding_row = weight_bytes(model.token_embedding) // model.config.vocab
    layers = sum(_layer_bytes(layer, rows) for layer in model.layers)
    return weight_bytes(model.output_head) + rows * embedding_row + layers


def _context_bytes(model: Any, lanes: int, context: int, kv_dtype: str) -> int:
    """Each lane's K/V up to ``context`` tokens read, its GDN states read and written."""
    from ..state import ContextPool

    specs, _ = model.state_specs()
    per_token = ContextPool.page_bytes_of(specs, None, 1, kv_dtype)
    return lanes * (context * per_token + 2 * ContextPool.slot_bytes_of(specs))


def decode_step_bytes(
    model: Any, lanes: int, context: int, kv_dtype: str = "float32", weights: Any = None
) -> int:
    """Bytes one decode step of ``lanes`` lanes at ``context`` tokens must move. ``weights``:
    the weight bytes a step of so many rows reads (``active_bytes.ActiveWeights``, which
    reads the architecture's description); by default Qwen3.5's prepared weights."""
    read = _main_weight_bytes(model, lanes) if weights is None else weights(lanes)
    return int(read + _context_bytes(model, lanes, context, kv_dtype))


def draft_head(model: Any, optimized: bool) -> Any:
    """The head a draft step scores with: the proposal rows when asked and present."""
    if optimized and model.proposal_head is not None:
        return model.proposal_head
    return model.output_head


def draft_step_bytes(
    model: Any, lanes: int, context: int, kv_dtype: str = "float32", *, optimized: bool = True
) -> int:
    """Bytes one MTP draft step moves: the block's weights (input projection and its decoder
    layer), its K/V up to ``context`` per lane, and the head it scores with."""
    from ..state import ContextPool

    _, mtp = model.state_specs()
    block = model.mtp.block
    weights = weight_bytes(model.mtp.input_projection) + _layer_bytes(block, lanes)
    kv = lanes * context * ContextPool.page_bytes_of([], mtp, 1, kv_dtype)
    return int(weights + kv + weight_bytes(draft_head(model, optimized)))


def round_bytes(
    model: Any,
    lanes: int,
    context: int,
    draft_tokens: int,
    kv_dtype: str = "float32",
    *,
    optimized: bool = True,
) -> int:
    """Bytes one speculative round moves: K draft steps, then one verification of K+1 rows
    per lane (the main weights read once, each lane's K/V and GDN states as a decode step)."""
    rows = lanes * (draft_tokens + 1)
    verify = _main_weight_bytes(model, rows) + _context_bytes(model, lanes, context, kv_dtype)
    draft = draft_step_bytes(model, lanes, context, kv_dtype, optimized=optimized)
    return int(verify + draft_tokens * draft)


def prefill_flops(model: Any, tokens: int, past: int = 0, weights: Any = None) -> float:
    """Multiply-add FLOPs of the projections (2 per weight per token; MoE: active experts),
    plus the causal attention products, for ``tokens`` tokens read after ``past`` tokens
    already in the context (a prefix resumed from a checkpoint). ``weights``: an
    ``active_bytes.ActiveWeights``, whose count of the projections is used instead (the
    sparse attention of those architectures is not counted)."""
    if weights is not None:
        return weights.flops(tokens)
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
        # each new token attends to the past and, on average, half of the new tokens
        flops += full * 2 * 2 * a.heads * a.head_dim * tokens * (past + tokens / 2)
    return flops
