"""Preparation: each parameter's logical tensor, source role and final choice, and the
importers checked, before anything is written (shared by conversion and ``verify``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ninfer_format.errors import DirectoryError

from .adapters import LogicalTensor, adapter_for
from .adapters.qwen3_5_gguf import map_qwen3_5_gguf
from .encoded import DecodedView, Importer, importers, values_view, weight_names
from .errors import SourceError
from .proposal import ProposalRequest, add_proposal_head
from .recipe import Choice, Recipe
from .source_set import select_components, source_holds_mtp
from .source_sizes import check_sizes
from .sources import GgufSource
from .vision import check_processors, check_vision_source, has_vision
from .vision import vision_config as read_vision_config


@dataclass
class Prepared:
    """What planning and verification share: per-role logical maps and the final choices."""

    recipe: Recipe
    sources: dict[str, Any]
    #: per role, what float values are read through (quantized safetensors decode)
    views: dict[str, Any]
    components: tuple[str, ...]
    model_type: str
    text_config: dict[str, Any]
    logical: dict[str, LogicalTensor]
    choices: dict[str, Choice]
    importers: dict[str, Importer]
    #: the vision component's config (spec 5.1), when vision is converted
    vision_config: dict[str, Any] | None = None
    #: the proposal head requested, or the full one the recipe asks for
    proposal: ProposalRequest | None = None


def _role_map(
    source: Any,
    model_type: str,
    config: Mapping[str, Any],
    components: tuple[str, ...],
    vision: Mapping[str, Any] | None,
) -> Mapping[str, LogicalTensor]:
    """The logical map of one non-base source: GGUF names (text and MTP only), or the HF
    adapter run on the source's own names (its expert layout and prefixes may differ)."""
    if isinstance(source, GgufSource):
        return map_qwen3_5_gguf(source, config, tuple(c for c in components if c != "vision"))
    return adapter_for(model_type)(weight_names(source), config, components, vision)


def _base_map(
    base: Any,
    model_type: str,
    config: Mapping[str, Any],
    components: tuple[str, ...],
    vision: Mapping[str, Any] | None,
) -> dict[str, LogicalTensor]:
    """The adapter on the base's names; a config the binder cannot read is a source error."""
    try:
        logical = adapter_for(model_type)(set(base.keys()), config, components, vision)
    except DirectoryError as exc:
        raise SourceError(f"{base.id}: config.json: {'; '.join(exc.problems)}") from None
    if vision is not None:
        check_vision_source(base, logical)
        check_processors(base.id, vision, base.resources)
    return logical


def prepare(
    recipe: Recipe,
    sources: dict[str, Any],
    components: tuple[str, ...] | None = None,
    proposal: ProposalRequest | None = None,
) -> Prepared:
    """Resolve every parameter's source, pieces and choice, and prepare the importers."""
    base = sources["base"]
    text_config = dict(getattr(base, "text_config", None) or {})
    model_type = text_config.get("model_type")
    if not model_type:
        raise SourceError(f"{base.id}: config.json has no model_type")
    available = {
        "mtp": source_holds_mtp(sources, recipe, text_config),
        "vision": has_vision(base),
    }
    comps = select_components(available, base.id, recipe, components)
    vision = read_vision_config(base, model_type) if "vision" in comps else None
    logical = _base_map(base, model_type, text_config, comps, vision)
    raw = {name: recipe.choice(name, t.role) for name, t in logical.items()}
    for name, choice in raw.items():
        if choice.source not in sources:
            raise SourceError(
                f"{name}: recipe {recipe.name} reads it from --source {choice.source}=..., "
                "which was not given"
            )
    for role in sorted({c.source for c in raw.values()} - {"base"}):
        mapped = _role_map(sources[role], model_type, text_config, comps, vision)
        logical.update({n: mapped[n] for n, c in raw.items() if c.source == role})
    if proposal is None and recipe.full_proposal:
        proposal = ProposalRequest(None, int(text_config["vocab_size"]))
    if proposal is not None:
        add_proposal_head(proposal, logical, raw, base, text_config, comps, recipe)
    methods = importers(sources, recipe)
    choices = {
        name: methods[c.method].resolve(logical[name], c) if c.method in methods else c
        for name, c in raw.items()
    }
    views = {role: values_view(s) for role, s in sources.items()}
    _check_pieces(logical, choices, views, methods)
    for importer in methods.values():
        importer.prepare(logical, choices)
    return Prepared(
        recipe, sources, views, comps, model_type, text_config, logical, choices, methods, vision,
        proposal,
    )  # fmt: skip


def _check_pieces(
    logical: Mapping[str, LogicalTensor],
    choices: Mapping[str, Choice],
    views: Mapping[str, Any],
    methods: Mapping[str, Importer],
) -> None:
    """Float-read parameters: every source tensor exists and, where it is a plain tensor of a
    safetensors source, holds the parameter's values (importers check their own)."""
    for name, t in logical.items():
        if choices[name].method in methods:
            continue
        view = views[choices[name].source]
        for piece in t.pieces:
            if piece.tensor not in view:
                raise SourceError(f"{view.id}: tensor {piece.tensor!r} (for {t.name}) is missing")
        if isinstance(view, DecodedView) and all(view.fields(p.tensor) is None for p in t.pieces):
            check_sizes(view.source, t)
