"""The sources a conversion reads: every ``--source`` role opened, and the components to
convert from what they hold."""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .adapters.base import has_mtp_weights
from .adapters.qwen3_5_gguf import has_mtp as gguf_has_mtp
from .errors import RecipeError, SourceError
from .recipe import Recipe
from .sources import GgufSource, open_source
from .sources.config_only import open_config_only
from .sources.gguf_base import write_base

KNOWN_COMPONENTS = ("text", "mtp", "vision")


def open_sources(source_specs: Mapping[str, str], recipe: Recipe) -> dict[str, Any]:
    """Every ``--source``; the base may be config-only when the recipe reads no weights from it.
    A lone .gguf for a recipe that reads no base weights is both: the GGUF and the base
    directory its metadata describes (``gguf_base``)."""
    if "base" not in source_specs:
        raise SourceError("a base source is required: --source PATH_OR_REPO_ID")
    base = Path(source_specs["base"]).expanduser()
    if base.suffix.lower() == ".gguf" and not recipe.base_weights and "gguf" not in source_specs:
        gguf = GgufSource(base)
        return {
            **{role: open_source(spec) for role, spec in source_specs.items() if role != "base"},
            "base": _base_of(gguf),
            "gguf": gguf,
        }
    return {
        role: open_config_only(spec)
        if role == "base" and not recipe.base_weights
        else open_source(spec)
        for role, spec in source_specs.items()
    }


def _base_of(gguf: GgufSource) -> Any:
    """The base directory written from ``gguf``'s metadata, removed with the source."""
    directory = Path(tempfile.mkdtemp(prefix="ninfer-gguf-base-"))
    try:
        source = open_config_only(write_base(gguf, directory))
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    weakref.finalize(source, shutil.rmtree, directory, True)
    return source


def select_components(
    available: Mapping[str, bool],
    source_id: str,
    recipe: Recipe,
    requested: tuple[str, ...] | None,
) -> tuple[str, ...]:
    """The components to convert. ``available``: per optional component, whether the source
    holds it. Without ``--components``, the recipe's list plus vision when the source has a
    vision tower (spec 2.3: vision weights are passed through when present)."""
    wanted = requested or recipe.components
    if "text" not in wanted:
        raise RecipeError("the text component is required")
    unknown = set(wanted) - set(KNOWN_COMPONENTS)
    if unknown:
        raise RecipeError(
            f"unsupported components: {', '.join(sorted(unknown))} "
            f"(known: {', '.join(KNOWN_COMPONENTS)})"
        )
    if not requested and available.get("vision") and "vision" not in wanted:
        wanted = (*wanted, "vision")
    for component in ("mtp", "vision"):
        if component in wanted and not available.get(component):
            if requested:
                raise SourceError(
                    f"{source_id}: --components asks for {component} but the source has no "
                    f"{component} tensors"
                    + (" (model.visual.* with a vision_config)" if component == "vision" else "")
                )
            wanted = tuple(c for c in wanted if c != component)
    return tuple(wanted)


def source_holds_mtp(sources: Mapping[str, Any], recipe: Recipe, config: Mapping[str, Any]) -> bool:
    """Whether the source the MTP weights would come from holds them."""
    source = sources.get(recipe.choice("mtp/input_projection", "matrix").source, sources["base"])
    if isinstance(source, GgufSource):
        return gguf_has_mtp(source, config)
    return has_mtp_weights(str(config.get("model_type")), set(source.keys()), config)
