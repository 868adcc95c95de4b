"""The device memory the CUDA backend takes beside the weights and the context pool: what
``--vram-budget`` plans as its workspace (``CudaBackend.device_workspace``).

An upper estimate from a model's text config (Hugging Face member names) and the rows of
one prefill call (the engine's prefill chunk, every lane's rows together), the sum of:

* the dequantization scratch: ``SCRATCH_BYTES`` per slab buffer (``slabs.SlabBuffers``),
  two for eager products and a third that only a CUDA graph capture makes;
* the MoE routers' decoded copies each layer's expert table keeps for prefill routing
  (``moe._router_logits``: the router | shared-score rows as float32 and their 3xTF32 split,
  four copies of ``[E + 1, H]`` float32), one more for the table of a streamed window's
  call (``stream_window.placed`` gives the block other experts for that call);
* the activations live together at the chunk's widest point: the largest of the token
  mixers' (Gated DeltaNet, gated attention), the feed-forward blocks' (dense MLP, MoE) and
  the output head's, and the hyper-connections' merge where the model has streams; each
  counts the residual stream (twice: a layer's input and output) and the normed input, and
  the buffers its CUDA path allocates at its peak (see ``_gdn``, ``_attention``,
  ``latent_attention``, ``_dense_mlp``, ``_moe``, ``_head``, ``_hyper_connections``).

Not counted: decode steps (a few rows a lane, far below a chunk's), CUDA graphs and their
memory pool (expert offload runs decode steps eagerly, so none are captured), the prefill
attention's key-range split workspace (only when a chunk has too few rows to fill the device:
then ``splits x rows x heads x head_dim`` floats stay near two waves of blocks, tens of MiB),
the CUDA context, cuBLAS's own workspace and CuPy's cached free blocks.

Other architectures (Qwen4Exp, GLM5Next) are read with the members they share with Qwen3.5
(their hyper-connection streams multiply the residual stream); GLM5Next's latent attention
has its own term (``latent_attention``: its reference's array math, whose scores a block of
queries at a time bound) and Qwen4Exp's QSA attention one block's scores more; the other
layers' buffers are estimated as the nearest Qwen3.5 layer's. Not counted either: the keys,
values, latents and index records such array math gathers for one sequence ([context, width]
float32: tens of MiB at 8K tokens). Imports without CuPy, so a CPU test checks it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ... import functional
from .gdn_prefill import CHUNK as GDN_CHUNK
from .moe import PREFILL_ROWS as MOE_PASS_ROWS
from .moe_experts import GROUP_PAIRS, TENSOR_GROUP_PAIRS

#: bytes of each dequantization scratch buffer (``slabs.SlabBuffers``)
SCRATCH_BYTES = 128 << 20
#: the scratch buffers eager products alternate between; a graph capture makes one more
EAGER_SCRATCH_BUFFERS = 2
F32, BF16 = 4, 2
#: float32 copies of the router | shared-score rows an expert table keeps for prefill: the
#: decoded rows (``backend.array``) and their 3xTF32 split (three K-wide slots)
ROUTER_COPIES = 4


#: lanes whose rows one prefill chunk is planned to pack (the engine's default lanes)
PACKED_LANES = 8


def prefill_workspace(
    config: Mapping[str, Any], rows: int, logit_rows: int, *, captured: bool = True
) -> int:
    """Device bytes beside weights and context for prefill calls of up to ``rows`` token
    rows of the model ``config`` describes (its text config), computing the logits of up to
    ``logit_rows`` of them; ``captured``: decode steps are captured as CUDA graphs (their
    scratch buffer counts)."""
    rows = max(int(rows), 1)
    return (
        (EAGER_SCRATCH_BUFFERS + captured) * SCRATCH_BYTES
        + router_copies(config)
        + max(
            _gdn(config, rows),
            _attention(config, rows),
            _dense_mlp(config, rows),
            _moe(config, rows),
            _head(config, rows, min(rows, logit_rows)),
            _hyper_connections(config, rows),
        )
    )


def router_copies(config: Mapping[str, Any]) -> int:
    """The MoE layers' router copies (module docstring), one layer's more for a streamed
    window's expert table."""
    experts = _experts(config)
    if not experts:
        return 0
    per_layer = ROUTER_COPIES * (experts + 1) * config["hidden_size"] * F32
    return (_moe_layers(config) + 1) * per_layer


def _residual(config: Mapping[str, Any], rows: int) -> int:
    """The residual stream (float32, times any hyper-connection streams) twice, as a layer's
    input stays referenced while it makes its output, and the normed layer input (float32)."""
    return rows * (2 * _streams(config) + 1) * config["hidden_size"] * F32


def _streams(config: Mapping[str, Any]) -> int:
    """The residual's hyper-connection streams (1: a plain residual)."""
    return int(config.get("hc_count") or config.get("hc_mult") or 1)


def _hyper_connections(config: Mapping[str, Any], rows: int) -> int:
    """Hyper-connection streams at a block's merge: the streams, their three mixing copies
    (the block output's share, the streams' mixture and their sum) and the block's output."""
    streams = _streams(config)
    if streams == 1:
        return 0
    return rows * (4 * streams + 1) * config["hidden_size"] * F32


def _gdn(config: Mapping[str, Any], rows: int) -> int:
    """A Gated DeltaNet layer inside its chunked delta rule (``gdn_prefill.gdn_chunk_rows``):
    the joined projections' output [q | k | v | z | b | a], the convolved q, k and v, g and
    beta, and the kernel's buffers: out (value width), and per chunk of CHUNK rows u and vnew
    (value width), w (value heads x key dim), ``qk`` ([CHUNK] a head) and ``starts`` (one
    state). Every lane of a packed chunk starts a chunk of its own: the chunks counted are
    those of ``PACKED_LANES`` lanes sharing the rows."""
    value_heads = config.get("linear_num_value_heads") or config.get("linear_num_heads")
    if not value_heads:
        return 0
    key_heads = config.get("linear_num_key_heads") or value_heads
    key_dim = config.get("linear_key_head_dim") or config.get("linear_head_dim") or 128
    value_dim = config.get("linear_value_head_dim") or config.get("linear_head_dim") or 128
    key_width, value_width = key_heads * key_dim, value_heads * value_dim
    projections = 2 * key_width + 2 * value_width + 2 * value_heads
    per_row = (
        projections
        + 2 * key_width  # q, k
        + 2 * value_width  # v, out
        + 4 * value_heads  # g, beta and their aligned copies
    )
    chunk_row = (
        2 * value_width  # u, vnew
        + value_heads * key_dim  # w
        + value_heads * GDN_CHUNK  # qk
    )
    per_chunk = GDN_CHUNK * chunk_row + value_heads * key_dim * value_dim  # and starts
    chunks = -(-rows // GDN_CHUNK) + PACKED_LANES - 1
    return _residual(config, rows) + (rows * per_row + chunks * per_chunk) * F32


def _attention(config: Mapping[str, Any], rows: int) -> int:
    """A gated attention layer at its prefill attention: the joined projections' output
    [q | gate | k | v], q and k normed and rotated (the normed copy until the rotation is
    made) and the attention's output."""
    heads = config.get("num_attention_heads")
    if not heads:
        return 0
    if config.get("kv_lora_rank"):
        return latent_attention(config, rows)
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    width = heads * head_dim
    kv_width = (config.get("num_key_value_heads") or heads) * head_dim
    per_row = (2 * width + 2 * kv_width) + 2 * (width + kv_width) + width
    # past its budget, QSA's selection and masked attention are array math, a block of
    # queries' scores at a time (Qwen4Exp, ``models/qwen4_exp/qsa.py``)
    blocks = (
        SCORE_BLOCK_COPIES * functional.SCORE_BLOCK_BYTES if config.get("indexer_budget") else 0
    )
    return _residual(config, rows) + rows * per_row * F32 + blocks


#: score-sized arrays a block of queries holds at once in the array-math attentions (the
#: scores, their masked copy, the probabilities) or a token indexer (the scores, their
#: weighted copy and what they are summed into); the two never hold theirs together
SCORE_BLOCK_COPIES = 3


def latent_attention(config: Mapping[str, Any], rows: int) -> int:
    """A latent attention layer with its token indexer (GLM5Next, ``models/glm5_next/mla.py``),
    whose device path is its reference's array math: per row the joined down projection,
    both latents, the queries, their absorbed form (and the product's copy), the indexer's
    projections, key normalisation, record, query heads and weights, the attention's latent
    output, its expansion (and copy) and the output; then one block of queries' scores
    (``SCORE_BLOCK_COPIES`` of ``functional.SCORE_BLOCK_BYTES``)."""
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    q_rank, kv_rank = config.get("q_lora_rank") or hidden, config["kv_lora_rank"]
    nope, rope = config.get("qk_nope_head_dim") or 0, config.get("qk_rope_head_dim") or 0
    value = config.get("v_head_dim") or nope
    index_heads, index_dim = config.get("index_n_heads") or 0, config.get("index_head_dim") or 0
    per_row = (
        2 * (q_rank + kv_rank) + rope  # down, then the two latents
        + heads * (nope + 3 * kv_rank + 2 * value)  # q, absorbed (twice), context, o (twice)
        + hidden  # the output
        + 7 * index_dim + index_heads * (index_dim + 2)  # the indexer's
    )  # fmt: skip
    return (
        _residual(config, rows)
        + rows * per_row * F32
        + SCORE_BLOCK_COPIES * functional.SCORE_BLOCK_BYTES
    )


def _dense_mlp(config: Mapping[str, Any], rows: int) -> int:
    """A dense MLP at its down projection: gate | up (float32), SiLU(gate)·up as the
    product's bf16 operand, and the output. A MoE model's ``intermediate_size`` counts only
    where ``mlp_layer_types`` has dense layers."""
    inter = config.get("intermediate_size")
    if not inter or (_experts(config) and "dense" not in (config.get("mlp_layer_types") or ())):
        return 0
    per_row = 2 * inter * F32 + inter * BF16 + config["hidden_size"] * F32
    return _residual(config, rows) + rows * per_row


def _moe(config: Mapping[str, Any], rows: int) -> int:
    """A MoE block at its down projection (``moe._prefill_rows``, passes of at most
    ``moe.PREFILL_ROWS`` rows): the (token, expert) pairs grouped by expert, each expert's in
    whole groups (at most ``pairs + experts x group`` rows), with the larger of the two
    paths' buffers: the tensor-core groups (96 rows) keep gate | up, the gated hidden rows
    and the down output per grouped row; the GEMV groups (8 rows) also each pair's copy of
    its token row. Besides: both routings' logits (the split's and the block's), the shared
    expert's hidden rows and output, the block's combined output and the split's sum."""
    experts = _experts(config)
    if not experts:
        return 0
    hidden, k = config["hidden_size"], int(config.get("num_experts_per_tok") or 1)
    inter = config.get("moe_intermediate_size") or config.get("intermediate_size") or hidden
    shared = config.get("shared_expert_intermediate_size") or inter * int(
        config.get("n_shared_experts") or 1
    )
    pass_rows = min(rows, MOE_PASS_ROWS, 65535 // k)
    tensor = (pass_rows * k + experts * TENSOR_GROUP_PAIRS) * (3 * inter + hidden)
    gemv = (pass_rows * k + experts * GROUP_PAIRS) * (2 * hidden + 3 * inter)
    per_row = 2 * (experts + 1) + shared + 3 * hidden
    return _residual(config, rows) + (max(tensor, gemv) + rows * per_row) * F32


def _head(config: Mapping[str, Any], rows: int, logit_rows: int) -> int:
    """The output head: the residual stream, and for the ``logit_rows`` it scores the final
    norm's hidden rows (bf16) and their logits."""
    hidden = config["hidden_size"]
    return _residual(config, rows) + logit_rows * (hidden * BF16 + config["vocab_size"] * F32)


def _experts(config: Mapping[str, Any]) -> int:
    return int(config.get("num_experts") or config.get("n_routed_experts") or 0)


def _moe_layers(config: Mapping[str, Any]) -> int:
    """The layers with a MoE block: those ``mlp_layer_types`` marks sparse, else all."""
    kinds = config.get("mlp_layer_types")
    if kinds:
        return sum(1 for kind in kinds if kind != "dense")
    return int(config.get("num_hidden_layers") or 0)
