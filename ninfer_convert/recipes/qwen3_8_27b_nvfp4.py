"""Qwen3.8-27B NVFP4 (Unsloth compressed-tensors checkpoint, --source quantized=...): every
text tensor but the embedding read from the quantized checkpoint; MLP of layers 0-55 imported
NVFP4 (AllowA4), every other text projection and the head imported FP8 (AllowA8), norms and
GDN a/b cast from it; embedding FP8 re-quantized from the base; MTP projections Q8 and
vision (when present) in upstream's formats from the base."""

from ninfer_convert.recipe import Recipe

from ._common import FP8, KEEP_BF16, NVFP4, TEXT, TEXT_PROJECTIONS, mtp_q8, vision_formats

NVFP4_MLP_LAYERS = range(56)


def build() -> Recipe:
    recipe = Recipe("qwen3_8_27b_nvfp4", __doc__.strip())
    recipe.assign("text/*", source="quantized")
    recipe.assign(
        *TEXT_PROJECTIONS,
        "text/output_head",
        format=FP8,
        method="import_encoded",
        policy="AllowA8",
    )
    recipe.assign(
        *(f"text/layers/{i}/mlp/{p}" for i in NVFP4_MLP_LAYERS for p in ("gate", "up", "down")),
        format=NVFP4,
        method="import_encoded",
        policy="AllowA4",
    )
    recipe.assign(*KEEP_BF16, format="bf16", policy="A16Only")
    recipe.separate(TEXT + "gdn/a_projection", TEXT + "gdn/b_projection")
    recipe.assign("text/token_embedding", format=FP8, source="base")
    return vision_formats(mtp_q8(recipe))
