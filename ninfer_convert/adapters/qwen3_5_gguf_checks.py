"""What a Qwen3.5 GGUF import requires of the base config and of the file (notes 4.4).

The geometry always comes from the base checkpoint's config.json; the GGUF header is checked
against it (validated, never used), and the file must hold exactly the tensors the config
implies, with its shapes, so nothing unknown is silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ninfer_format.binders.qwen3_5_geometry import (
    FULL_ATTENTION,
    DenseMlp,
    GeometryError,
    Qwen35Geometry,
)

from ..errors import RecipeError, SourceError
from ..sources import GgufSource
from .qwen3_5_gguf_names import attention_of

ARCHITECTURE = "qwen35"
MOE_ARCHITECTURE = "qwen35moe"
#: the text config's model_type -> the llama.cpp architecture its files name
TEXT_TYPES = {"qwen3_5_text": ARCHITECTURE, "qwen3_5_moe_text": MOE_ARCHITECTURE}


def geometry(config: Mapping[str, Any]) -> Qwen35Geometry:
    """The config's geometry (the format's one reading of it), which a ``qwen35`` /
    ``qwen35moe`` file must have: llama.cpp records only periodic layer types."""
    model_type = config.get("model_type")
    if model_type not in TEXT_TYPES:
        raise RecipeError(
            f"GGUF import handles Qwen3.5 ({', '.join(TEXT_TYPES)}), not {model_type!r}"
        )
    try:
        g = Qwen35Geometry.from_config(config)
    except GeometryError as exc:
        problems = "; ".join(exc.problems)
        raise RecipeError(
            f"config.json cannot define the model for GGUF import: {problems}"
        ) from None
    if FULL_ATTENTION not in g.layer_types:
        raise RecipeError("config.json has no full_attention layer in layer_types")
    if g.full_attention_interval is None:
        raise RecipeError(
            "config.json layer_types is not periodic (every n-th layer full attention), "
            "which qwen35 GGUF files require"
        )
    return g


def check_header(source: GgufSource, g: Qwen35Geometry, with_mtp: bool) -> None:
    """Notes 4.4: the header must describe the config's model (it is validated, not used)."""
    arch, wanted = source.architecture, TEXT_TYPES[g.model_type]
    if arch != wanted:
        raise SourceError(
            f"{source.id}: general.architecture is {arch!r}; the config's model is {wanted!r}"
        )
    a = attention_of(g)
    expected = {
        "embedding_length": g.hidden,
        "attention.head_count": a.heads,
        "attention.head_count_kv": a.kv_heads,
        "attention.key_length": a.head_dim,
        "attention.value_length": a.head_dim,
        "full_attention_interval": g.full_attention_interval,
        "block_count": g.layers + (1 if with_mtp else 0),
    }
    if g.gdn is not None:  # every layer full attention (interval 1) leaves no GDN to describe
        expected["ssm.conv_kernel"] = g.gdn.conv_kernel
        expected["ssm.state_size"] = g.gdn.key_dim
        expected["ssm.group_count"] = g.gdn.key_heads
        expected["ssm.time_step_rank"] = g.gdn.value_heads
        expected["ssm.inner_size"] = g.gdn.value_width
    if g.moe is not None:
        expected["expert_count"] = g.moe.experts
        expected["expert_feed_forward_length"] = g.moe.expert_width
        expected["expert_shared_feed_forward_length"] = g.moe.shared_width
    else:
        assert isinstance(g.ffn, DenseMlp)
        expected["feed_forward_length"] = g.ffn.intermediate
    wrong = []
    for key, value in expected.items():
        found = source.get(f"{arch}.{key}")
        if found is None or int(found) != value:
            wrong.append(f"{arch}.{key} = {found!r} (config.json implies {value})")
    if wrong:
        raise SourceError(
            f"{source.id} does not describe the base checkpoint's config.json: " + "; ".join(wrong)
        )


def check_tensors(
    source: GgufSource, shapes: dict[str, tuple[int, ...]], g: Qwen35Geometry
) -> None:
    """The exact tensor set with the config's shapes (nothing unknown is silently dropped)."""
    names = set(source.keys())
    missing = sorted(set(shapes) - names)
    mtp_prefix = f"blk.{g.layers}."
    unknown = sorted(n for n in names - set(shapes) if not n.startswith(mtp_prefix))
    wrong = [
        f"{n} is {list(source.shape(n))}, expected {list(s)}"
        for n, s in shapes.items()
        if n in names and tuple(source.shape(n)) != s
    ]
    problems = [
        f"{what} {', '.join(found[:6])}" + (" ..." if len(found) > 6 else "")
        for what, found in (("missing", missing), ("unexpected", unknown))
        if found
    ]
    problems += wrong[:6]
    if problems:
        raise SourceError(f"{source.id}: tensors do not match the config: " + "; ".join(problems))
