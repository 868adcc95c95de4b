"""Qwen3.6-35B-A3B: routed experts gate/up Q4, down Q5 (Q6 on layers 34, 38, 39); shared
experts, attention and GDN Q8; router, shared_score and GDN a/b bf16; embedding Q8, head Q6;
MTP projections Q8; vision (when present) in upstream's formats."""

from ninfer_convert.recipe import Recipe

from ._common import KEEP_BF16, Q4, Q5, Q6, Q8, TEXT, TEXT_PROJECTIONS, mtp_q8, vision_formats


def build() -> Recipe:
    recipe = Recipe("qwen3_6_35b_a3b", __doc__.strip())
    recipe.assign(*TEXT_PROJECTIONS, format=Q8)
    recipe.assign(TEXT + "moe/experts/*/gate", TEXT + "moe/experts/*/up", format=Q4)
    recipe.assign(TEXT + "moe/experts/*/down", format=Q5)
    recipe.assign(*(f"text/layers/{i}/moe/experts/*/down" for i in (34, 38, 39)), format=Q6)
    recipe.assign(*KEEP_BF16, format="bf16")
    recipe.separate(TEXT + "gdn/a_projection", TEXT + "gdn/b_projection")
    recipe.assign("text/token_embedding", format=Q8)
    recipe.assign("text/output_head", format=Q6)
    return vision_formats(mtp_q8(recipe))
