"""Qwen3.6-35B-A3B NVFP4: routed and shared experts imported bit-exact from a compressed-tensors
NVFP4 checkpoint (--source quantized=...; AllowA4), each layer's expert banks stacked with one
divisor per expert matrix; attention, GDN Q8 and router, shared_score, GDN a/b bf16 from the
base; embedding Q8, head Q6; MTP projections Q8;
vision (when present) in upstream's formats."""

from ninfer_convert.recipe import Recipe

from ._common import KEEP_BF16, NVFP4, Q6, Q8, TEXT, TEXT_PROJECTIONS, mtp_q8, vision_formats


def build() -> Recipe:
    recipe = Recipe("qwen3_6_35b_a3b_nvfp4", __doc__.strip())
    recipe.assign(*TEXT_PROJECTIONS, format=Q8)
    recipe.assign(*KEEP_BF16, format="bf16")
    recipe.separate(TEXT + "gdn/a_projection", TEXT + "gdn/b_projection")
    recipe.assign(
        TEXT + "moe/experts/*",
        TEXT + "moe/shared/*",
        format=NVFP4,
        method="import_encoded",
        policy="AllowA4",
        source="quantized",
    )
    recipe.stack_divisors(TEXT + "moe/experts/*")
    recipe.assign("text/token_embedding", format=Q8)
    recipe.assign("text/output_head", format=Q6)
    return vision_formats(mtp_q8(recipe))
