"""The geometry of a Qwen4Exp text model, as the model code reads it.

The text config is read by the format's one Qwen4Exp geometry (``qwen4_exp_geometry``), the
reading the binder checks artifacts with. This adds only the refusals of what the CPU
reference does not compute yet, each a ``ModelError`` naming the config member.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ninfer_format.binders.qwen3_5_geometry import LINEAR_ATTENTION
from ninfer_format.binders.qwen4_exp_geometry import (
    INDEXED_ATTENTION,
    GeometryError,
    Qwen4ExpGeometry,
)

from ...errors import ModelError
from ..qwen3_5.config import MoeConfig

__all__ = ["INDEXED_ATTENTION", "LINEAR_ATTENTION", "Qwen4ExpGeometry", "moe_config", "read_config"]


def read_config(text_config: Mapping[str, Any]) -> Qwen4ExpGeometry:
    """The geometry of ``text_config``, or a ``ModelError`` naming every bad member."""
    try:
        g = Qwen4ExpGeometry.from_config(text_config)
    except GeometryError as exc:
        raise ModelError(
            f"text config cannot define a Qwen4Exp model: {'; '.join(exc.problems)}"
        ) from None
    # The experts and the shared expert run through the backend's MoE, which is SiLU-gated
    # and renormalises the top-k shares, as every Qwen4Exp checkpoint configures it.
    if g.hidden_act != "silu":
        raise ModelError(f"text config hidden_act {g.hidden_act!r}: only silu experts run here")
    if not g.norm_topk_prob:
        raise ModelError("text config norm_topk_prob false: only renormalised top-k routing runs")
    if g.output_gate != "silu":
        raise ModelError(
            f"text config output_gate_type {g.output_gate!r}: only the silu GDN output gate runs"
        )
    return g


def moe_config(g: Qwen4ExpGeometry) -> MoeConfig:
    """The MoE record as Qwen3.5's MoE block takes it (every routed expert held)."""
    return MoeConfig(**vars(g.moe))
