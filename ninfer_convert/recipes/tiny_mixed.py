"""Test recipe: one tiny artifact holding every CORE weight format plus NF4, packed groups
included (attention Q4/Q5, GDN NF4/FP8, MLP NVFP4/FP8, vocabulary Q8/Q6, MTP Q8)."""

from ninfer_convert.recipe import Recipe

from ._common import FP8, KEEP_BF16, NF4, NVFP4, Q4, Q5, Q6, Q8, TEXT, mtp_q8


def build() -> Recipe:
    recipe = Recipe("tiny_mixed", __doc__.strip())
    recipe.assign(TEXT + "attention/query", TEXT + "attention/key", format=Q4)
    recipe.assign(TEXT + "attention/gate", TEXT + "attention/value", format=Q5)
    recipe.assign(TEXT + "attention/output", format=Q6)
    recipe.assign(TEXT + "gdn/query", TEXT + "gdn/key", format=NF4)
    recipe.assign(TEXT + "gdn/value", TEXT + "gdn/z", format=FP8)
    recipe.assign(TEXT + "gdn/output", format=Q8)
    recipe.assign(
        TEXT + "mlp/gate",
        TEXT + "mlp/up",
        TEXT + "moe/experts/*/gate",
        TEXT + "moe/experts/*/up",
        format=NVFP4,
    )
    recipe.assign(TEXT + "mlp/down", TEXT + "moe/experts/*/down", TEXT + "moe/shared/*", format=FP8)
    recipe.assign(*KEEP_BF16, format="bf16")
    recipe.assign("text/token_embedding", format=Q8)
    recipe.assign("text/output_head", format=Q6)
    return mtp_q8(recipe)
