"""Lossless Qwen3.5 MoE: every parameter direct bf16 (fp32 for GDN a_log / dt_bias)."""

from ninfer_convert.recipe import Recipe


def build() -> Recipe:
    return Recipe("qwen3_5_moe_bf16", __doc__.strip())
