"""Qwen3.5 GGUF files (llama.cpp architectures ``qwen35``, dense, and ``qwen35moe``) -> v3
logical parameters.

llama.cpp's converter renames every tensor and changes a few on the way (notes 4.3); this
adapter undoes that, with the geometry taken from the base checkpoint's config.json (never
hard-coded, so a tiny file works the same as a 27B one):

* RMSNorm weights are stored as ``1 + w``: the zero-centred ``w`` is ``x - 1`` (``ssm_norm``,
  a plain multiplier, is kept).
* GDN value heads are *tiled* (head ``r * nk + k`` of the file is grouped head ``k * ratio + r``
  of the checkpoint) in ``attn_qkv``'s value rows, ``attn_gate``, ``ssm_alpha``/``ssm_beta``,
  ``ssm_a``, ``ssm_dt.bias`` and the value channels of ``ssm_conv1d``: rows are picked back into
  grouped order. ``ssm_out``'s *input columns* are tiled too; a block-copied ``ssm_out`` keeps
  them and its Use gets an ``input_columns`` auxiliary, a float one is permuted.
* ``ssm_a = -exp(A_log)``: ``A_log = ln(-ssm_a)`` in float32.
* MoE: each projection of all routed experts is one rank-3 bank (``ffn_gate_exps`` /
  ``ffn_up_exps`` [E, I, H], ``ffn_down_exps`` [E, H, I]); expert e is the e-th run of its
  rows. The router is ``ffn_gate_inp``, the shared expert ``ffn_{gate,up,down}_shexp`` and its
  sigmoid score the vector ``ffn_gate_inp_shexp``.
* ``ssm_conv1d.weight`` is ``[channels, taps]``; the parameter is ``[taps, channels]``.

Row selection is expressed with ``SourcePiece`` row ranges (a vector is viewed as ``[n, 1]``),
so block-copying imports and float loads move the same rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ninfer_format.binders.qwen3_5 import expected_parameters
from ninfer_format.binders.qwen3_5_geometry import (
    FULL_ATTENTION,
    Attention,
    DenseMlp,
    Gdn,
    GeometryError,
    Qwen35Geometry,
)

from ..errors import RecipeError, SourceError
from ..sources import GgufSource, HFDirectorySource
from ..sources.hf_dir import INDEX_NAME
from .base import Loader, LogicalTensor, SourcePiece

Pieces = tuple[SourcePiece, ...]
ARCHITECTURE = "qwen35"
MOE_ARCHITECTURE = "qwen35moe"
TEXT_TYPES = {"qwen3_5_text": ARCHITECTURE, "qwen3_5_moe_text": MOE_ARCHITECTURE}
MINUS_ONE, A_LOG = "minus_one", "a_log"


@dataclass(frozen=True)
class GgufTensor(LogicalTensor):
    """A logical parameter read from GGUF tensors, with llama.cpp's changes undone on load."""

    transform: str = ""  # "", MINUS_ONE or A_LOG
    #: (key heads, value heads per key head, head width) when the input columns are tiled
    tiled_columns: tuple[int, int, int] | None = None

    def load(self, source: Loader) -> torch.Tensor:
        """Float32 values in the logical shape and order (columns untiled too)."""
        loaded: dict[str, torch.Tensor] = {}
        chunks = []
        for piece in self.pieces:
            if piece.tensor not in loaded:
                x = source.load(piece.tensor).to(torch.float32)
                loaded[piece.tensor] = (
                    x.reshape(-1, 1) if x.dim() == 1 else x.reshape(-1, x.shape[-1])
                )
            x = loaded[piece.tensor]
            chunks.append(x if piece.rows is None else x[piece.rows[0] : piece.rows[1]])
        x = torch.cat(chunks)
        if self.transpose:
            x = x.reshape(self.shape[1], self.shape[0]).t()
        x = self._transform(x.contiguous())
        if self.tiled_columns is not None:
            index = torch.tensor(untile_columns(*self.tiled_columns))
            x = torch.empty_like(x).index_copy_(1, index, x)
        return x.reshape(self.shape)

    def _transform(self, x: torch.Tensor) -> torch.Tensor:
        if self.transform == MINUS_ONE:
            return x - 1
        if self.transform == A_LOG:
            if not bool((x < 0).all()):
                raise SourceError(
                    f"{self.pieces[0].tensor}: ssm_a must be negative everywhere "
                    f"(it is -exp(A_log)), for {self.name}"
                )
            return torch.log(-x)
        return x


def untile_columns(key_heads: int, ratio: int, width: int) -> list[int]:
    """``input_columns``: stored column ``c`` (tiled head ``t = c // width``) reads grouped
    input element ``((t % nk) * ratio + t // nk) * width + c % width`` (notes 4.3)."""
    return [
        ((c // width % key_heads) * ratio + c // width // key_heads) * width + c % width
        for c in range(key_heads * ratio * width)
    ]


# --- geometry and names -----------------------------------------------------------------------


def geometry(config: Mapping[str, Any]) -> Qwen35Geometry:
    """The config's geometry (the format's one reading of it), which a ``qwen35`` /
    ``qwen35moe`` file must have: llama.cpp records only periodic layer types."""
    model_type = config.get("model_type")
    if model_type not in TEXT_TYPES:
        raise RecipeError(
            f"GGUF import handles Qwen3.5 ({', '.join(TEXT_TYPES)}), not {model_type!r}"
        )
    try:
        g = Qwen35Geometry.from_config(config)
    except GeometryError as exc:
        problems = "; ".join(exc.problems)
        raise RecipeError(
            f"config.json cannot define the model for GGUF import: {problems}"
        ) from None
    if FULL_ATTENTION not in g.layer_types:
        raise RecipeError("config.json has no full_attention layer in layer_types")
    if g.full_attention_interval is None:
        raise RecipeError(
            "config.json layer_types is not periodic (every n-th layer full attention), "
            "which qwen35 GGUF files require"
        )
    return g


def _attention(g: Qwen35Geometry) -> Attention:
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
class _Entry:
    """How one logical parameter is read: pieces, transform, and the source tensor shapes."""

    pieces: Pieces
    shapes: dict[str, tuple[int, ...]]
    transform: str = ""
    tiled_columns: tuple[int, int, int] | None = None


def _whole(name: str, shape: tuple[int, ...], transform: str = "") -> _Entry:
    return _Entry((_rows(name, 0, shape[0]),), {name: shape}, transform)


def _layer(p: str, suffix: str, g: Qwen35Geometry) -> _Entry:
    """One text (or MTP) layer's parameter; ``p`` is the GGUF prefix ``blk.N.``."""
    h = g.hidden
    norms = {"input_norm": "attn_norm.weight", "post_attention_norm": "post_attention_norm.weight"}
    if suffix in norms:
        return _whole(p + norms[suffix], (h,), MINUS_ONE)
    if suffix.startswith("attention/"):
        return _attention_entry(p, suffix, _attention(g), h)
    if suffix.startswith("mlp/"):
        assert isinstance(g.ffn, DenseMlp)  # mlp/ parameters are the dense model's
        i = g.ffn.intermediate
        shapes = {"gate": (i, h), "up": (i, h), "down": (h, i)}
        projection = suffix.removeprefix("mlp/")
        return _whole(f"{p}ffn_{projection}.weight", shapes[projection])
    if suffix.startswith("moe/"):
        return _moe(p, suffix, g)
    return _gdn(p, suffix, _gdn_of(g), h)


def _attention_entry(p: str, suffix: str, a: Attention, h: int) -> _Entry:
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
    return _Entry(pieces, {name: (2 * a.heads * d, h)})


def _moe(p: str, suffix: str, g: Qwen35Geometry) -> _Entry:
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
        return _Entry((_rows(p + name, 0, shape[0]),), {p + name: shape})
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
    return _Entry((_rows(p + name, first, first + rows),), {p + name: shape})


def _gdn(p: str, suffix: str, g: Gdn, h: int) -> _Entry:
    kg, vg, nv = g.key_width, g.value_width, g.value_heads
    if suffix == "gdn/norm":
        return _whole(p + "ssm_norm.weight", (g.value_dim,))
    channels = 2 * kg + vg
    qkv = p + "attn_qkv.weight"
    if suffix in ("gdn/query", "gdn/key"):
        start = 0 if suffix == "gdn/query" else kg
        return _Entry((_rows(qkv, start, start + kg),), {qkv: (channels, h)})
    if suffix == "gdn/value":
        return _Entry(_untiled(qkv, 2 * kg, g, g.value_dim), {qkv: (channels, h)})
    per_head = {
        "gdn/z": ("attn_gate.weight", (vg, h), g.value_dim, ""),
        "gdn/a_projection": ("ssm_alpha.weight", (nv, h), 1, ""),
        "gdn/b_projection": ("ssm_beta.weight", (nv, h), 1, ""),
        "gdn/a_log": ("ssm_a", (nv,), 1, A_LOG),
        "gdn/dt_bias": ("ssm_dt.bias", (nv,), 1, ""),
    }
    if suffix in per_head:
        name, shape, rows, transform = per_head[suffix]
        return _Entry(_untiled(p + name, 0, g, rows), {p + name: shape}, transform)
    if suffix == "gdn/convolution":
        name = p + "ssm_conv1d.weight"
        pieces = (_rows(name, 0, 2 * kg), *_untiled(name, 2 * kg, g, g.value_dim))
        return _Entry(pieces, {name: (channels, g.conv_kernel)})
    if suffix == "gdn/output":
        name = p + "ssm_out.weight"
        columns = (g.key_heads, g.ratio, g.value_dim)
        return _Entry((_rows(name, 0, h),), {name: (h, vg)}, tiled_columns=columns)
    raise RecipeError(f"no GGUF mapping for {p}{suffix}")


def _globals(suffix: str, g: Qwen35Geometry, names: set[str]) -> _Entry:
    if suffix == "token_embedding":
        return _whole("token_embd.weight", (g.vocab, g.hidden))
    if suffix == "final_norm":
        return _whole("output_norm.weight", (g.hidden,), MINUS_ONE)
    head = "output.weight" if "output.weight" in names else "token_embd.weight"  # tied
    return _whole(head, (g.vocab, g.hidden))


def _mtp(suffix: str, g: Qwen35Geometry) -> _Entry:
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


def has_mtp(source: GgufSource, config: Mapping[str, Any]) -> bool:
    # asked before the config is read whole (a bad one is reported with the base's names):
    # llama.cpp numbers the MTP block after the text layers
    return f"blk.{int(config['num_hidden_layers'])}.nextn.eh_proj.weight" in source


# --- header checks ----------------------------------------------------------------------------


def check_header(source: GgufSource, g: Qwen35Geometry, with_mtp: bool) -> None:
    """Notes 4.4: the header must describe the config's model (it is validated, not used)."""
    arch, wanted = source.architecture, TEXT_TYPES[g.model_type]
    if arch != wanted:
        raise SourceError(
            f"{source.id}: general.architecture is {arch!r}; the config's model is {wanted!r}"
        )
    a = _attention(g)
    expected = {
        "embedding_length": g.hidden,
        "attention.head_count": a.heads,
        "attention.head_count_kv": a.kv_heads,
        "attention.key_length": a.head_dim,
        "attention.value_length": a.head_dim,
        "full_attention_interval": g.full_attention_interval,
        "block_count": g.layers + (1 if with_mtp else 0),
    }
    if g.gdn is not None:  # every layer full attention (interval 1) leaves no GDN to describe
        expected["ssm.conv_kernel"] = g.gdn.conv_kernel
        expected["ssm.state_size"] = g.gdn.key_dim
        expected["ssm.group_count"] = g.gdn.key_heads
        expected["ssm.time_step_rank"] = g.gdn.value_heads
        expected["ssm.inner_size"] = g.gdn.value_width
    if g.moe is not None:
        expected["expert_count"] = g.moe.experts
        expected["expert_feed_forward_length"] = g.moe.expert_width
        expected["expert_shared_feed_forward_length"] = g.moe.shared_width
    else:
        assert isinstance(g.ffn, DenseMlp)
        expected["feed_forward_length"] = g.ffn.intermediate
    wrong = []
    for key, value in expected.items():
        found = source.get(f"{arch}.{key}")
        if found is None or int(found) != value:
            wrong.append(f"{arch}.{key} = {found!r} (config.json implies {value})")
    if wrong:
        raise SourceError(
            f"{source.id} does not describe the base checkpoint's config.json: " + "; ".join(wrong)
        )


def _check_tensors(
    source: GgufSource, shapes: dict[str, tuple[int, ...]], g: Qwen35Geometry
) -> None:
    """The exact tensor set with the config's shapes (nothing unknown is silently dropped)."""
    names = set(source.keys())
    missing = sorted(set(shapes) - names)
    mtp_prefix = f"blk.{g.layers}."
    unknown = sorted(n for n in names - set(shapes) if not n.startswith(mtp_prefix))
    wrong = [
        f"{n} is {list(source.shape(n))}, expected {list(s)}"
        for n, s in shapes.items()
        if n in names and tuple(source.shape(n)) != s
    ]
    problems = [
        f"{what} {', '.join(found[:6])}" + (" ..." if len(found) > 6 else "")
        for what, found in (("missing", missing), ("unexpected", unknown))
        if found
    ]
    problems += wrong[:6]
    if problems:
        raise SourceError(f"{source.id}: tensors do not match the config: " + "; ".join(problems))


# --- the adapter ------------------------------------------------------------------------------


def map_qwen3_5_gguf(
    source: GgufSource, config: Mapping[str, Any], components: tuple[str, ...]
) -> dict[str, GgufTensor]:
    """Every logical parameter of ``components`` read from ``source``, after the header and
    tensor-set checks."""
    g = geometry(config)
    with_mtp = has_mtp(source, config)
    if "mtp" in components and not with_mtp:
        raise SourceError(f"{source.id}: the mtp component needs blk.{g.layers}.nextn.* tensors")
    check_header(source, g, with_mtp)
    names = set(source.keys())
    out: dict[str, GgufTensor] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in expected_parameters(config, components=components):
        component, rest = spec.name.split("/", 1)
        if component == "text" and rest.startswith("layers/"):
            _, index, suffix = rest.split("/", 2)
            entry = _layer(f"blk.{index}.", suffix, g)
        elif component == "text":
            entry = _globals(rest, g, names)
        elif component == "mtp":
            entry = _mtp(rest, g)
        else:
            continue
        shapes.update(entry.shapes)
        out[spec.name] = GgufTensor(
            spec.name,
            spec.shape,
            spec.role.value,
            spec.inputs,
            entry.pieces,
            transpose=spec.name.endswith("gdn/convolution"),
            transform=entry.transform,
            tiled_columns=entry.tiled_columns,
        )
    _check_tensors(source, shapes, g)
    return out


# --- a base directory without weights ---------------------------------------------------------


class ConfigOnlySource(HFDirectorySource):
    """A checkpoint directory read for config.json and the tokenizer files; weights optional.

    GGUF import takes every weight from the .gguf file, so the base directory need not hold
    safetensors (notes 4.5); if it does, they are opened as usual.
    """

    def _open_weights(self) -> None:
        if (self.path / INDEX_NAME).is_file() or any(self.path.glob("*.safetensors")):
            super()._open_weights()


def open_config_only(spec: str | Path) -> HFDirectorySource:
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise SourceError(f"{spec}: a GGUF import needs a local base directory (config.json)")
    return ConfigOnlySource(path)
