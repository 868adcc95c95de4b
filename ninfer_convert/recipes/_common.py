"""Building blocks shared by recipes (format groups that several recipes use)."""

from __future__ import annotations

from ninfer_convert.recipe import GGUF_NATIVE, Recipe

Q4, Q5, Q6, Q8 = "q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16", "q8_g32_fp16"
NF4, NVFP4, FP8 = "nf4_g64_fp16", "nvfp4", "fp8_e4m3fn_row_bf16"

TEXT = "text/layers/*/"
#: every text projection matrix of a layer (attention, GDN, dense MLP, MoE)
TEXT_PROJECTIONS = [
    TEXT + s
    for s in (
        "attention/query",
        "attention/key",
        "attention/gate",
        "attention/value",
        "attention/output",
        "gdn/query",
        "gdn/key",
        "gdn/value",
        "gdn/z",
        "gdn/output",
        "gdn/a_projection",
        "gdn/b_projection",
        "mlp/gate",
        "mlp/up",
        "mlp/down",
        "moe/router",
        "moe/shared_score",
        "moe/experts/*/gate",
        "moe/experts/*/up",
        "moe/experts/*/down",
        "moe/shared/gate",
        "moe/shared/up",
        "moe/shared/down",
    )
]
#: small matrices that stay bf16 in every quantized recipe (upstream keeps them direct)
KEEP_BF16 = [
    TEXT + "gdn/a_projection",
    TEXT + "gdn/b_projection",
    TEXT + "moe/router",
    TEXT + "moe/shared_score",
    "mtp/layers/*/moe/router",
    "mtp/layers/*/moe/shared_score",
]


def mtp_q8(recipe: Recipe) -> Recipe:
    """Every MTP projection Q8 (upstream's rule for optional components), router/score bf16."""
    recipe.assign(
        "mtp/input_projection",
        "mtp/layers/*/attention/*",
        "mtp/layers/*/mlp/*",
        "mtp/layers/*/moe/*",
        format=Q8,
    )
    recipe.assign(
        "mtp/layers/*/attention/query_norm", "mtp/layers/*/attention/key_norm", format="bf16"
    )
    recipe.assign("mtp/layers/*/moe/router", "mtp/layers/*/moe/shared_score", format="bf16")
    return recipe


VISION = "vision/layers/*/"


def vision_formats(recipe: Recipe) -> Recipe:
    """Upstream's formats for vision projections (notes 1.4; they apply only when the vision
    component is converted): patch embedding Q6, merger Q8, attention query/key/value and MLP
    fc1 Q4, attention output and MLP fc2 Q5. Every one is a plain [N, K] matrix, which the
    row_split layout takes at any size; biases, norms and the position table stay bf16."""
    recipe.assign("vision/patch_embedding", format=Q6)
    recipe.assign("vision/merger/fc1", "vision/merger/fc2", format=Q8)
    recipe.assign(
        VISION + "attention/query",
        VISION + "attention/key",
        VISION + "attention/value",
        VISION + "mlp/fc1",
        format=Q4,
    )
    recipe.assign(VISION + "attention/output", VISION + "mlp/fc2", format=Q5)
    return recipe


def dense_groupwise(recipe: Recipe, vocabulary: tuple[str, str]) -> Recipe:
    """The published dense split: Q4 for query/key (attention and GDN) and MLP gate/up, Q5 for
    every other text projection, a/b projections bf16, vocabulary (embedding, head) as given;
    MTP and vision projections in upstream's formats."""
    recipe.assign(*TEXT_PROJECTIONS, format=Q5)
    recipe.assign(
        TEXT + "attention/query",
        TEXT + "attention/key",
        TEXT + "gdn/query",
        TEXT + "gdn/key",
        TEXT + "mlp/gate",
        TEXT + "mlp/up",
        format=Q4,
    )
    recipe.assign(*KEEP_BF16, format="bf16")
    recipe.separate(TEXT + "gdn/a_projection", TEXT + "gdn/b_projection")
    recipe.assign("text/token_embedding", format=vocabulary[0])
    recipe.assign("text/output_head", format=vocabulary[1])
    return vision_formats(mtp_q8(recipe))


def uniform(recipe: Recipe, format: str) -> Recipe:
    """Every projection (text, MTP, vocabulary) in one format; small matrices stay bf16."""
    recipe.assign(
        *TEXT_PROJECTIONS,
        "text/token_embedding",
        "text/output_head",
        "mtp/input_projection",
        "mtp/layers/*/attention/*",
        "mtp/layers/*/mlp/*",
        "mtp/layers/*/moe/*",
        format=format,
    )
    recipe.assign(
        "mtp/layers/*/attention/query_norm", "mtp/layers/*/attention/key_norm", format="bf16"
    )
    recipe.assign(*KEEP_BF16, format="bf16")
    return recipe


def gguf_blocks(name: str, description: str) -> Recipe:
    """A GGUF import (the weights from ``--source gguf=``, or the .gguf alone): every text and
    MTP matrix keeps its GGUF blocks verbatim (gguf_* formats, AllowA8; whichever of the MTP
    layer's MLP or MoE the model has), the small matrices of ``KEEP_BF16`` and GDN a/b bf16,
    vision in upstream's formats."""
    matrices = [
        *TEXT_PROJECTIONS,
        "text/token_embedding",
        "text/output_head",
        "mtp/input_projection",
        "mtp/layers/*/attention/query",
        "mtp/layers/*/attention/key",
        "mtp/layers/*/attention/gate",
        "mtp/layers/*/attention/value",
        "mtp/layers/*/attention/output",
        "mtp/layers/*/mlp/*",
        "mtp/layers/*/moe/*",
    ]
    recipe = Recipe(name, description, base_weights=False)
    recipe.assign("text/*", "mtp/*", source="gguf")
    recipe.assign(*matrices, format=GGUF_NATIVE, method="gguf_import", policy="AllowA8")
    recipe.assign(*KEEP_BF16, format="bf16", policy="A16Only")
    recipe.separate(TEXT + "gdn/a_projection", TEXT + "gdn/b_projection")
    return vision_formats(recipe)
