"""Qwen3.6-35B-A3B from a llama.cpp GGUF (qwen35moe; --source gguf=FILE.gguf with a base
directory for config.json and the tokenizer files, or the .gguf alone): every text and MTP
matrix keeps its GGUF blocks verbatim (gguf_* formats, AllowA8), each routed expert its run
of the expert banks' rows; the router, the shared-expert score, GDN a/b and float-stored
matrices bf16; norms, A_log, dt_bias and the convolution cast from the GGUF values."""

from ninfer_convert.recipe import GGUF_NATIVE, Recipe

from ._common import KEEP_BF16, TEXT, TEXT_PROJECTIONS, vision_formats

MATRICES = [
    *TEXT_PROJECTIONS,
    "text/token_embedding",
    "text/output_head",
    "mtp/input_projection",
    "mtp/layers/*/attention/query",
    "mtp/layers/*/attention/key",
    "mtp/layers/*/attention/gate",
    "mtp/layers/*/attention/value",
    "mtp/layers/*/attention/output",
    "mtp/layers/*/moe/*",
]


def build() -> Recipe:
    recipe = Recipe("qwen3_6_35b_a3b_gguf", __doc__.strip(), base_weights=False)
    recipe.assign("text/*", "mtp/*", source="gguf")
    recipe.assign(*MATRICES, format=GGUF_NATIVE, method="gguf_import", policy="AllowA8")
    recipe.assign(*KEEP_BF16, format="bf16", policy="A16Only")
    recipe.separate(TEXT + "gdn/a_projection", TEXT + "gdn/b_projection")
    return vision_formats(recipe)
