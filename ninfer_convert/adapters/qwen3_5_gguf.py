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

The pieces live apart: the names and row selection (``qwen3_5_gguf_names``), the loaded
values with the transforms undone (``qwen3_5_gguf_tensor``) and the config, header and
tensor-set checks (``qwen3_5_gguf_checks``). This module joins them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ninfer_format.binders.qwen3_5 import expected_parameters

from ..errors import SourceError
from ..sources import GgufSource
from ..sources.config_only import ConfigOnlySource, open_config_only
from .qwen3_5_gguf_checks import TEXT_TYPES, check_header, check_tensors, geometry
from .qwen3_5_gguf_names import entry_for
from .qwen3_5_gguf_tensor import A_LOG, MINUS_ONE, GgufTensor, untile_columns

__all__ = [
    "A_LOG",
    "MINUS_ONE",
    "TEXT_TYPES",
    "ConfigOnlySource",
    "GgufTensor",
    "check_header",
    "geometry",
    "has_mtp",
    "map_qwen3_5_gguf",
    "open_config_only",
    "untile_columns",
]


def has_mtp(source: GgufSource, config: Mapping[str, Any]) -> bool:
    # asked before the config is read whole (a bad one is reported with the base's names):
    # llama.cpp numbers the MTP block after the text layers
    return f"blk.{int(config['num_hidden_layers'])}.nextn.eh_proj.weight" in source


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
        entry = entry_for(spec.name, g, names)
        if entry is None:
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
    check_tensors(source, shapes, g)
    return out
