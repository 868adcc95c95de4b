"""Qwen3.6-27B NVFP4: every text projection imported bit-exact from an NVFP4 checkpoint
(--source quantized=...; AllowA4), except attention on layers < 24, attention/output of layers 3
and 7 and gdn/output of layer 4 (bf16 from the base); GDN a/b bf16; embedding and head Q8 from
the base; MTP projections Q8; vision (when present) in upstream's formats."""

from ninfer_convert.recipe import Recipe

from ._common import KEEP_BF16, NVFP4, Q8, TEXT, TEXT_PROJECTIONS, mtp_q8, vision_formats

#: upstream's bf16 exceptions (N-rec): layers whose NVFP4 weights hurt quality most
ATTENTION = ("query", "key", "gate", "value")
BF16_EXCEPTIONS = [
    *(f"text/layers/{i}/attention/{p}" for i in range(24) for p in ATTENTION),
    "text/layers/3/attention/output",
    "text/layers/7/attention/output",
    "text/layers/4/gdn/output",
]


def build() -> Recipe:
    recipe = Recipe("qwen3_6_27b_nvfp4", __doc__.strip())
    recipe.assign(
        *TEXT_PROJECTIONS,
        format=NVFP4,
        method="import_encoded",
        policy="AllowA4",
        source="quantized",
    )
    recipe.assign(*BF16_EXCEPTIONS, *KEEP_BF16, format="bf16", policy="A16Only", source="base")
    recipe.separate(TEXT + "gdn/a_projection", TEXT + "gdn/b_projection")
    recipe.assign("text/token_embedding", "text/output_head", format=Q8)
    return vision_formats(mtp_q8(recipe))
