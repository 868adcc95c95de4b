"""Planning a synthetic artifact: every object, binding and use fixed before the first byte.

Parameters are packed into parents exactly as a real conversion with the same recipe packs
them (``plan_parents``, ``bindings_and_uses``), so object shapes, bindings and uses match a
converted artifact. With fewer layers (``layers``) or shrunk n-gram tables
(``ple_rows_scale``) the plan also carries the whole model's bytes (``reduction``), so
``ninfer-bench run`` can extrapolate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ninfer_convert.adapters import LogicalTensor, SourcePiece
from ninfer_convert.plan import (
    Auxiliary,
    Parent,
    attach_auxiliaries,
    bindings_and_uses,
    plan_parents,
)
from ninfer_convert.proposal import DEFAULT_ROWS
from ninfer_convert.recipe import DEFAULT_METHOD, Choice, Recipe, load_recipe
from ninfer_convert.recipes._gguf_mixes import MIXES, mix_recipe
from ninfer_format import ResourceSpec, TensorSpec
from ninfer_format.codecs.nvfp4 import TILE_ROWS
from ninfer_format.writer import place_objects

from ...expert_offload.plan import routed_expert
from ..architectures import architecture_of, reduce_layers, scale_ple_rows
from ..geometries import GEOMETRIES
from .resources import text_resources
from .vision import VISION_TOKENS, chat_template, vision_config, vision_parameters, vision_resources

#: the activation divisor of synthetic AllowA4 uses: 6 * 448 / (an activation amax of 8)
ACTIVATION_DIVISOR = np.float32(6 * 448 / 8)


@dataclass
class SyntheticPlan:
    """Everything fixed before the first byte: what ``write_synthetic`` streams."""

    geometry: str
    recipe: Recipe
    text_config: dict[str, Any]
    components: dict[str, Any]
    logical: dict[str, LogicalTensor]
    parents: list[Parent]
    auxiliaries: list[Auxiliary]
    bindings: dict[str, Any]
    uses: list[dict[str, Any]]
    resources: dict[str, bytes]
    specs: list[TensorSpec | ResourceSpec]
    proposal_rows: int = 0
    #: with fewer layers: ``Reduction.as_provenance()`` and the whole model's bytes
    reduction: dict[str, Any] | None = None

    @property
    def objects(self) -> list[dict[str, Any]]:
        """Object records with placement (offsets, bytes), as the writer will lay them out."""
        return place_objects(self.specs)

    @property
    def payload_bytes(self) -> int:
        last = self.objects[-1]
        return int(last["offset"] + last["bytes"])

    @property
    def weight_bytes(self) -> int:
        return sum(r["bytes"] for r in self.objects if r["kind"] == "tensor")

    def bytes_by_component(self) -> dict[str, int]:
        """Weight bytes per component (``text``, ``mtp``, ``proposal``), auxiliaries aside."""
        sizes = {r["id"]: r["bytes"] for r in self.objects}
        out: dict[str, int] = {}
        for p in self.parents:
            component = p.members[0].name.split("/", 1)[0]
            out[component] = out.get(component, 0) + sizes[p.id]
        return out

    def bytes_by_parameter(self) -> dict[str, int]:
        """Stored bytes of each logical parameter (a packed parent's shared out by elements)."""
        sizes = {r["id"]: r["bytes"] for r in self.objects}
        out: dict[str, int] = {}
        for p in self.parents:
            elements = sum(math.prod(m.shape) for m in p.members)
            for m in p.members:
                out[m.name] = sizes[p.id] * math.prod(m.shape) // max(elements, 1)
        return out

    def bytes_by_format(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.objects:
            if r["kind"] == "tensor":
                out[r["format"]] = out.get(r["format"], 0) + r["bytes"]
        return out


def _recipe(formats: str | Recipe, geometry: str) -> Recipe:
    """A recipe, by name or given; also a GGUF type mix (``recipes._gguf_mixes``) by name."""
    if isinstance(formats, Recipe):
        return formats
    if formats in MIXES:
        return mix_recipe(formats, GEOMETRIES[geometry])
    return load_recipe(formats)


def _stacking(recipe: Recipe) -> Callable[[Sequence[LogicalTensor], Choice], int]:
    """What ``EncodedImport.stacking`` answers for a checkpoint whose divisors are equal
    within every packing group: expert banks of ``stack_divisors`` keep one per member."""

    def stacking(members: Sequence[LogicalTensor], choice: Choice) -> int:
        if choice.method != "import_encoded" or choice.format != "nvfp4":
            return 1
        rows = {m.shape[0] for m in members}
        if (
            all(recipe.stacks_divisors(m.name) for m in members)
            and len(rows) == 1
            and rows.pop() % TILE_ROWS == 0
        ):
            return len(members)
        return 1

    return stacking


def proposal_rows_for(geometry: str, rows: int | None, mtp: bool) -> int:
    """Rows of the synthetic proposal head: ``rows`` as asked (0: none), by default
    ``DEFAULT_ROWS`` capped by the vocabulary when there is a drafter to read it."""
    vocab = int(GEOMETRIES[geometry]["vocab_size"])
    if rows is None:
        return min(DEFAULT_ROWS, vocab) if mtp else 0
    if rows and not mtp:
        raise ValueError("a proposal head needs the mtp component (its drafter)")
    if not 0 <= rows <= vocab:
        raise ValueError(f"proposal rows {rows} must be in 0..{vocab} (the vocabulary)")
    return rows


def _logical(spec: Any) -> LogicalTensor:
    """The parameter as a tensor of its own; the proposal's token ids are 0 .. Ns - 1."""
    if spec.name == "proposal/token_ids":
        ids = tuple(range(spec.shape[0]))
        return LogicalTensor(spec.name, spec.shape, spec.role.value, (), (), constant=ids)
    piece = (SourcePiece(spec.name),)
    return LogicalTensor(spec.name, spec.shape, spec.role.value, spec.inputs, piece)


def _choice(recipe: Recipe, tensor: LogicalTensor) -> Choice:
    if tensor.name == "proposal/token_ids":
        return Choice(format="int32", method="cast")
    if tensor.name == "proposal/head":
        fmt = recipe.proposal_format
        return Choice(format=fmt, method=DEFAULT_METHOD[fmt])
    return recipe.choice(tensor.name, tensor.role)


def _whole_model_bytes(plan: SyntheticPlan, kinds: list[str], whole: dict[str, int]) -> dict:
    """The whole model's text weight and routed-expert bytes, from the kept layers: each kind's
    mean layer bytes times its layers in the whole model, plus what no layer holds; and
    ``others``, what the text model loads beside its own component (the MTP block, the
    proposal head: they do not scale with the layers)."""
    weights: dict[int | None, int] = {}
    experts: dict[int, int] = {}
    others = 0
    for name, size in plan.bytes_by_parameter().items():
        if not name.startswith("text/"):
            others += 0 if name.startswith("vision/") else size
            continue
        parts = name.split("/")
        layer = int(parts[2]) if parts[1] == "layers" else None
        weights[layer] = weights.get(layer, 0) + size
        if routed_expert(name) is not None:
            experts[layer] = experts.get(layer, 0) + size  # type: ignore[index]
    out = {"weights": weights.pop(None, 0), "experts": 0, "others": others}
    for kind, count in whole.items():
        layers = [i for i, k in enumerate(kinds) if k == kind]
        out["weights"] += count * sum(weights.get(i, 0) for i in layers) // len(layers)
        out["experts"] += count * sum(experts.get(i, 0) for i in layers) // len(layers)
    return out


def plan_synthetic(
    geometry: str,
    formats: str | Recipe,
    *,
    mtp: bool = True,
    proposal_rows: int | None = None,
    layers: int | None = None,
    ple_rows_scale: float = 1.0,
    vision: bool = False,
) -> SyntheticPlan:
    """Parents, bindings, uses, auxiliaries and object specs, without generating any bytes.
    ``mtp``: the MTP component when the recipe has one (and the bench runs one for the
    architecture); ``proposal_rows``: see ``proposal_rows_for``; ``layers``: that many
    decoder layers at full width (every kind kept); ``ple_rows_scale``: n-gram tables of
    about that share of their rows; ``vision``: a Qwen3.5 vision component too (the released
    tower's geometry; a tiny one for the tiny geometries: ``vision.is_tiny``)."""
    if geometry not in GEOMETRIES:
        raise ValueError(f"unknown geometry {geometry!r} (known: {', '.join(GEOMETRIES)})")
    recipe = _recipe(formats, geometry)
    reduction = reduce_layers(GEOMETRIES[geometry], layers)
    config = scale_ple_rows(reduction.config, ple_rows_scale)
    arch = architecture_of(config)
    comps = tuple(c for c in recipe.components if c == "text" or (c == "mtp" and mtp and arch.mtp))
    rows = proposal_rows_for(geometry, proposal_rows, "mtp" in comps)
    logical = {s.name: _logical(s) for s in arch.parameters(config, comps, rows or None)}
    tower = vision_config(geometry, config) if vision else None
    if tower is not None:
        logical.update({s.name: _logical(s) for s in vision_parameters(config, tower)})
    choices = {name: _choice(recipe, t) for name, t in logical.items()}
    parents = plan_parents(logical, recipe, choices=choices, stacking=_stacking(recipe))
    bindings, uses = bindings_and_uses(parents)

    def provide(parent: Parent, use: dict[str, Any]) -> Any:
        if parent.choice.format == "nvfp4" and use.get("activation_policy") == "AllowA4":
            return {"activation_input_divisor": ("fp32", (), ACTIVATION_DIVISOR.tobytes())}
        return {}

    auxiliaries = attach_auxiliaries(parents, uses, provide)
    by_component = {"text": text_resources()}
    if tower is not None:
        by_component["text"] = text_resources(VISION_TOKENS, chat_template())
        by_component["vision"] = vision_resources(geometry, tower)
    resources = {
        f"resource/{component}/{role}": data
        for component, roles in by_component.items()
        for role, data in roles.items()
    }
    roles = {c: {role: f"resource/{c}/{role}" for role in r} for c, r in by_component.items()}
    components: dict[str, Any] = {
        "text": {
            "config": {**config, "architectures": [arch.architecture]},
            "resources": roles["text"],
        }
    }
    if rows:
        components["text"]["proposal"] = {"domain": "indexed", "rows": rows}
    if "mtp" in comps:
        components["mtp"] = {
            "config": {"architectures": [arch.mtp_architecture]},
            "target": "text",
        }
    if tower is not None:
        components["vision"] = {"config": tower, "target": "text", "resources": roles["vision"]}
    specs: list[TensorSpec | ResourceSpec] = [
        ResourceSpec(rid, "raw_bytes_v1", len(data)) for rid, data in resources.items()
    ]
    specs += [TensorSpec(p.id, p.shape, p.choice.format, p.layout, p.divisors) for p in parents]
    specs += [TensorSpec(a.id, a.shape, a.format, "contiguous_le_v1") for a in auxiliaries]
    plan = SyntheticPlan(
        geometry, recipe, config, components, logical, parents, auxiliaries, bindings, uses,
        resources, specs, rows,
    )  # fmt: skip
    if layers is not None or ple_rows_scale != 1:
        # the whole model's bytes at the real table size: sized on an unscaled plan
        sizing = (
            plan
            if ple_rows_scale == 1
            else plan_synthetic(
                geometry, recipe, mtp=mtp, proposal_rows=proposal_rows, layers=layers
            )
        )
        whole = _whole_model_bytes(sizing, reduction.kinds, reduction.whole_kinds)
        plan.reduction = {
            **reduction.as_provenance(),
            "ple_rows_scale": ple_rows_scale if config.get("ple_layer_ids") else 1.0,
            "whole_bytes": whole,
        }
    return plan
