"""GLM5Next NVFP4 from NVIDIA's checkpoint (--source nvidia=...), the source of every weight:
routed experts and dense MLPs imported bit-exact (import_encoded, AllowA4; each layer's expert
bank stacked with one divisor per expert); KDA and MLA output projections Q8; MTP projections
FP8 (row-scaled, re-quantized from the values NVIDIA stores, block-FP8 included); everything
else bf16 as stored (decoded where NVIDIA quantized it), fp32 vectors fp32; the base source
gives config, tokenizer and the vision tower (bf16), when it has one."""

from ninfer_convert.recipe import Recipe

from ._common import FP8, NVFP4, Q8, TEXT

MTP = "mtp/layers/*/"
#: MTP projections re-quantized to FP8 (router, hyper-connection and indexer weights stay bf16)
MTP_PROJECTIONS = [
    "mtp/input_projection",
    *(MTP + f"mla/{p}" for p in ("query_down", "query_up", "kv_down", "key_up", "value_up")),
    MTP + "mla/output",
    MTP + "indexer/query",
    MTP + "indexer/key",
    MTP + "moe/experts/*",
    MTP + "moe/shared/*",
]


def build() -> Recipe:
    recipe = Recipe("glm5next", __doc__.strip(), base_weights=False)
    recipe.assign("text/*", "mtp/*", source="nvidia")
    recipe.assign(
        TEXT + "moe/experts/*",
        TEXT + "mlp/*",
        format=NVFP4,
        method="import_encoded",
        policy="AllowA4",
    )
    recipe.stack_divisors(TEXT + "moe/experts/*")
    recipe.assign(TEXT + "kda/output", TEXT + "mla/output", format=Q8)
    recipe.assign(*MTP_PROJECTIONS, format=FP8)
    return recipe
