"""Lossless Qwen4Exp (Qwen3.8-Flash-Next): every parameter direct bf16 (fp32 for GDN a_log /
dt_bias), MTP included when the checkpoint has it."""

from ninfer_convert.recipe import Recipe


def build() -> Recipe:
    return Recipe("qwen4_exp_bf16", __doc__.strip())
