"""Lossless GLM5Next: every parameter direct bf16 (fp32 for KDA a_log / dt_bias, the
hyper-connections' bias and scale and the router bias), MTP included."""

from ninfer_convert.recipe import Recipe


def build() -> Recipe:
    return Recipe("glm5_next_bf16", __doc__.strip())
