"""llama.cpp's GGUF type mixes as recipes for synthetic artifacts, so a GGUF-block model can be
benchmarked at full size without a GGUF file: ``ninfer-bench synth --formats gguf_q4_k_m``
(not conversion recipes: K- and I-quant blocks can only be imported, never written here).

Each mix assigns ``gguf_*`` formats by tensor the way llama.cpp's quantizer does for that
file type (names mapped to ours: llama.cpp's ``attn_qkv`` is the GDN query/key/value,
``ffn_down`` the dense, routed and shared down projections). "More bits" layers are
llama.cpp's ``use_more_bits`` choice: the first and last eighth of the layers and every third
one between. GDN a/b projections and the MoE router stay bf16, as in every GGUF recipe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ninfer_convert.recipe import Recipe

from ._common import TEXT, uniform


def more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _downs(layer: int) -> list[str]:
    p = f"text/layers/{layer}/"
    return [p + "mlp/down", p + "moe/experts/*/down", p + "moe/shared/down"]


def _layers(config: dict[str, Any]) -> tuple[int, list[int]]:
    """Layer count, and the full-attention layers (the ones with a value projection)."""
    types = config["layer_types"]
    return len(types), [i for i, t in enumerate(types) if t == "full_attention"]


def q4_k_m(recipe: Recipe, config: dict[str, Any]) -> None:
    """Q4_K throughout; GDN query/key/value Q5_K; the head Q6_K; attention values and down
    projections of the more-bits layers Q6_K (counted over attention layers for the values,
    over all layers for the downs)."""
    n, attention = _layers(config)
    uniform(recipe, "gguf_q4_k")
    recipe.assign(TEXT + "gdn/query", TEXT + "gdn/key", TEXT + "gdn/value", format="gguf_q5_k")
    recipe.assign("text/output_head", format="gguf_q6_k")
    values = [
        f"text/layers/{i}/attention/value"
        for j, i in enumerate(attention)
        if more_bits(j, len(attention))
    ]
    downs = [d for i in range(n) if more_bits(i, n) for d in _downs(i)]
    recipe.assign(*values, *downs, format="gguf_q6_k")


def iq2_xxs(recipe: Recipe, config: dict[str, Any]) -> None:
    """IQ2_XXS (2.06 bits a weight) throughout; attention values Q4_K (grouped-query
    attention: few, small matrices); the down projections of the first eighth of the layers
    Q2_K; the head Q5_K and the embedding Q2_K."""
    n, _ = _layers(config)
    uniform(recipe, "gguf_iq2_xxs")
    recipe.assign(TEXT + "attention/value", format="gguf_q4_k")
    recipe.assign(*(d for i in range(n // 8) for d in _downs(i)), format="gguf_q2_k")
    recipe.assign("text/output_head", format="gguf_q5_k")
    recipe.assign("text/token_embedding", format="gguf_q2_k")


MIXES: dict[str, Callable[[Recipe, dict[str, Any]], None]] = {
    "gguf_q4_k_m": q4_k_m,
    "gguf_iq2_xxs": iq2_xxs,
}


def mix_recipe(name: str, config: dict[str, Any]) -> Recipe:
    """The recipe of mix ``name`` for a model of text config ``config``."""
    recipe = Recipe(name, MIXES[name].__doc__ or name)
    MIXES[name](recipe, config)
    recipe.separate(TEXT + "gdn/a_projection", TEXT + "gdn/b_projection")
    return recipe
