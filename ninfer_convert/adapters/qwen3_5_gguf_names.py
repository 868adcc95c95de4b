"""llama.cpp's Qwen3.5 tensor names: which rows of which GGUF tensors hold each logical
parameter, with the source shapes the config implies (notes 4.3).

Row selection is expressed with ``SourcePiece`` row ranges (a vector is viewed as ``[n, 1]``),
so block-copying imports and float loads move the same rows. GDN value heads are *tiled* in
the file (head ``r * nk + k`` of the file is grouped head ``k * ratio + r`` of the checkpoint):
their rows are picked back into grouped order. Each projection of all routed experts is one
rank-3 bank, expert e the e-th run of its rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from ninfer_format.binders.qwen3_5_geometry import Attention, DenseMlp, Gdn, Qwen35Geometry

from ..errors import RecipeError
from .base import SourcePiece
from .qwen3_5_gguf_tensor import A_LOG, MINUS_ONE

Pieces = tuple[SourcePiece, ...]


def attention_of(g: Qwen35Geometry) -> Attention:
    assert g.attention is not None  # a periodic layer pattern has full-attention layers
    return g.attention


def _gdn_of(g: Qwen35Geometry) -> Gdn:
    assert g.gdn is not None  # asked for GDN parameters only, which only GDN layers have
    return g.gdn


def _rows(name: str, start: int, stop: int) -> SourcePiece:
    return SourcePiece(name, (start, stop))


def _untiled(name: str, start: int, g: Gdn, per_head: int) -> Pieces:
    """Rows of the grouped value heads, read from a tiled run of heads at row ``start``."""
    pieces: list[SourcePiece] = []
    for h in range(g.value_heads):
        k, r = divmod(h, g.ratio)
        begin = start + (r * g.key_heads + k) * per_head
        last = pieces[-1] if pieces else None
        if last is not None and last.rows is not None and last.rows[1] == begin:
            pieces[-1] = _rows(name, last.rows[0], begin + per_head)  # contiguous: merge
        else:
            pieces.append(_rows(name, begin, begin + per_head))
    return tuple(pieces)


@dataclass(frozen=True)
class Entry:
    """How one logical parameter is read: pieces, transform, and the source tensor shapes."""

    pieces: Pieces
    shapes: dict[str, tuple[int, ...]]
    transform: str = ""
    tiled_columns: tuple[int, int, int] | None = None


def _whole(name: str, shape: tuple[int, ...], transform: str = "") -> Entry:
    return Entry((_rows(name, 0, shape[0]),), {name: shape}, transform)


def _layer(p: str, suffix: str, g: Qwen35Geometry) -> Entry:
    """One text (or MTP) layer's parameter; ``p`` is the GGUF prefix ``blk.N.``."""
    h = g.hidden
    norms = {"input_norm": "attn_norm.weight", "post_attention_norm": "post_attention_norm.weight"}
    if suffix in norms:
        return _whole(p + norms[suffix], (h,), MINUS_ONE)
    if suffix.startswith("attention/"):
        return _attention_entry(p, suffix, attention_of(g), h)
    if suffix.startswith("mlp/"):
        assert isinstance(g.ffn, DenseMlp)  # mlp/ parameters are the dense model's
        i = g.ffn.intermediate
        shapes = {"gate": (i, h), "up": (i, h), "down": (h, i)}
        projection = suffix.removeprefix("mlp/")
        return _whole(f"{p}ffn_{projection}.weight", shapes[projection])
    if suffix.startswith("moe/"):
        return _moe(p, suffix, g)
    return _gdn(p, suffix, _gdn_of(g), h)


def _attention_entry(p: str, suffix: str, a: Attention, h: int) -> Entry:
    d = a.head_dim
    norms = {
        "attention/query_norm": "attn_q_norm.weight",
        "attention/key_norm": "attn_k_norm.weight",
    }
    if suffix in norms:
        return _whole(p + norms[suffix], (d,), MINUS_ONE)
    plain = {
        "attention/key": ("attn_k.weight", (a.kv_heads * d, h)),
        "attention/value": ("attn_v.weight", (a.kv_heads * d, h)),
        "attention/output": ("attn_output.weight", (h, a.heads * d)),
    }
    if suffix in plain:
        return _whole(p + plain[suffix][0], plain[suffix][1])
    if suffix not in ("attention/query", "attention/gate"):
        raise RecipeError(f"no GGUF mapping for {p}{suffix}")
    name, offset = p + "attn_q.weight", 0 if suffix == "attention/query" else d
    starts = [2 * i * d + offset for i in range(a.heads)]
    pieces = tuple(_rows(name, start, start + d) for start in starts)
    return Entry(pieces, {name: (2 * a.heads * d, h)})


def _moe(p: str, suffix: str, g: Qwen35Geometry) -> Entry:
    """A MoE block's parameter: llama.cpp keeps each projection of all routed experts in one
    rank-3 tensor ([E, I, H] gate and up, [E, H, I] down), expert e's rows one run of it."""
    assert g.moe is not None  # moe/ parameters are the MoE model's
    h, e, i, s = g.hidden, g.moe.experts, g.moe.expert_width, g.moe.shared_width
    plain = {
        "moe/router": ("ffn_gate_inp.weight", (e, h)),
        "moe/shared_score": ("ffn_gate_inp_shexp.weight", (h,)),
        "moe/shared/gate": ("ffn_gate_shexp.weight", (s, h)),
        "moe/shared/up": ("ffn_up_shexp.weight", (s, h)),
        "moe/shared/down": ("ffn_down_shexp.weight", (h, s)),
    }
    if suffix in plain:
        name, shape = plain[suffix]
        return Entry((_rows(p + name, 0, shape[0]),), {p + name: shape})
    _, _, index, projection = suffix.split("/")
    banks = {
        "gate": ("ffn_gate_exps.weight", (e, i, h), i),
        "up": ("ffn_up_exps.weight", (e, i, h), i),
        "down": ("ffn_down_exps.weight", (e, h, i), h),
    }
    if projection not in banks:
        raise RecipeError(f"no GGUF mapping for {p}{suffix}")
    name, shape, rows = banks[projection]
    first = int(index) * rows
    return Entry((_rows(p + name, first, first + rows),), {p + name: shape})


def _gdn(p: str, suffix: str, g: Gdn, h: int) -> Entry:
    kg, vg, nv = g.key_width, g.value_width, g.value_heads
    if suffix == "gdn/norm":
        return _whole(p + "ssm_norm.weight", (g.value_dim,))
    channels = 2 * kg + vg
    qkv = p + "attn_qkv.weight"
    if suffix in ("gdn/query", "gdn/key"):
        start = 0 if suffix == "gdn/query" else kg
        return Entry((_rows(qkv, start, start + kg),), {qkv: (channels, h)})
    if suffix == "gdn/value":
        return Entry(_untiled(qkv, 2 * kg, g, g.value_dim), {qkv: (channels, h)})
    per_head = {
        "gdn/z": ("attn_gate.weight", (vg, h), g.value_dim, ""),
        "gdn/a_projection": ("ssm_alpha.weight", (nv, h), 1, ""),
        "gdn/b_projection": ("ssm_beta.weight", (nv, h), 1, ""),
        "gdn/a_log": ("ssm_a", (nv,), 1, A_LOG),
        "gdn/dt_bias": ("ssm_dt.bias", (nv,), 1, ""),
    }
    if suffix in per_head:
        name, shape, rows, transform = per_head[suffix]
        return Entry(_untiled(p + name, 0, g, rows), {p + name: shape}, transform)
    if suffix == "gdn/convolution":
        name = p + "ssm_conv1d.weight"
        pieces = (_rows(name, 0, 2 * kg), *_untiled(name, 2 * kg, g, g.value_dim))
        return Entry(pieces, {name: (channels, g.conv_kernel)})
    if suffix == "gdn/output":
        name = p + "ssm_out.weight"
        columns = (g.key_heads, g.ratio, g.value_dim)
        return Entry((_rows(name, 0, h),), {name: (h, vg)}, tiled_columns=columns)
    raise RecipeError(f"no GGUF mapping for {p}{suffix}")


def _globals(suffix: str, g: Qwen35Geometry, names: set[str]) -> Entry:
    if suffix == "token_embedding":
        return _whole("token_embd.weight", (g.vocab, g.hidden))
    if suffix == "final_norm":
        return _whole("output_norm.weight", (g.hidden,), MINUS_ONE)
    head = "output.weight" if "output.weight" in names else "token_embd.weight"  # tied
    return _whole(head, (g.vocab, g.hidden))


def _mtp(suffix: str, g: Qwen35Geometry) -> Entry:
    p = f"blk.{g.layers}."
    fixed = {
        "input_projection": ("nextn.eh_proj.weight", (g.hidden, 2 * g.hidden), ""),
        "embedding_norm": ("nextn.enorm.weight", (g.hidden,), MINUS_ONE),
        "hidden_norm": ("nextn.hnorm.weight", (g.hidden,), MINUS_ONE),
        "final_norm": ("nextn.shared_head_norm.weight", (g.hidden,), MINUS_ONE),
    }
    if suffix in fixed:
        name, shape, transform = fixed[suffix]
        return _whole(p + name, shape, transform)
    _, index, rest = suffix.split("/", 2)
    if index != "0":
        raise RecipeError(f"GGUF files hold one MTP layer, not mtp/layers/{index}")
    return _layer(p, rest, g)


def entry_for(parameter: str, g: Qwen35Geometry, names: set[str]) -> Entry | None:
    """How the logical ``parameter`` is read from a file holding ``names``; None for a
    component GGUF files do not hold (vision)."""
    component, rest = parameter.split("/", 1)
    if component == "text" and rest.startswith("layers/"):
        _, index, suffix = rest.split("/", 2)
        return _layer(f"blk.{index}.", suffix, g)
    if component == "text":
        return _globals(rest, g, names)
    if component == "mtp":
        return _mtp(rest, g)
    return None
