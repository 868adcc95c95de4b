"""Qwen3.8-Flash-Next (Qwen4Exp): routed experts imported bit-exact from NVIDIA's NVFP4
checkpoint (--source nvidia=...; ModelOpt, AllowA4, one divisor per stacked expert); attention,
GDN and shared experts Q8; GDN a/b, router, shared_score, hyper-connections, indexer and PLE
projections bf16; PLE n-gram table rows NF4; embedding Q8, head Q6; MTP projections Q8 with
its routed experts FP8 (E4M3 codes, one bf16 scale a row, AllowA8); a full-vocabulary Q4
proposal head (A16) for drafting."""

from ninfer_convert.recipe import Recipe

from ._common import FP8, KEEP_BF16, NF4, NVFP4, Q6, Q8, TEXT, TEXT_PROJECTIONS, mtp_q8


def build() -> Recipe:
    recipe = Recipe("qwen3_8_flash_next", __doc__.strip(), full_proposal=True)
    recipe.assign(*TEXT_PROJECTIONS, format=Q8)
    recipe.assign(*KEEP_BF16, format="bf16")
    recipe.separate(TEXT + "gdn/a_projection", TEXT + "gdn/b_projection")
    recipe.assign(
        TEXT + "moe/experts/*",
        format=NVFP4,
        method="import_encoded",
        policy="AllowA4",
        source="nvidia",
    )
    recipe.stack_divisors(TEXT + "moe/experts/*")
    recipe.assign(TEXT + "ple/ngram_table", format=NF4)
    recipe.assign("text/token_embedding", format=Q8)
    recipe.assign("text/output_head", format=Q6)
    mtp_q8(recipe)
    recipe.assign("mtp/layers/*/moe/experts/*", format=FP8, policy="AllowA8")
    return recipe
