"""The conversion pipeline: sources + recipe -> a streamed, validated artifact and a report.

Peak memory stays near the largest parent object: each parent's members are loaded from the
memory-mapped sources, encoded, written and released before the next one.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ninfer_format import ArtifactError, ArtifactWriter, ResourceSpec, TensorSpec
from ninfer_format.codecs import codec_for
from ninfer_format.framing import DEFAULT_SHARD_LIMIT

from .adapters import LogicalTensor, adapter_for
from .errors import ConvertError, RecipeError, SourceError
from .plan import Parent, bindings_and_uses, plan_parents
from .quantize import quantize
from .recipe import Recipe, load_recipe
from .sources import open_source

TEXT_RESOURCES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
)
ARCHITECTURES = {"qwen3_5_text": "Qwen3_5ForCausalLM", "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM"}
MTP_ARCHITECTURES = {"qwen3_5_text": "Qwen3_5MTP", "qwen3_5_moe_text": "Qwen3_5MoeMTP"}


@dataclass
class ParameterReport:
    name: str
    object: str
    format: str
    method: str
    elements: int
    rmse: float
    max_abs: float
    relative: float  # RMSE / RMS of the source

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


@dataclass
class ConversionReport:
    recipe: str
    output: str
    artifact_id: str = ""
    device: str = "cpu"
    seconds: float = 0.0
    parameters: list[ParameterReport] = field(default_factory=list)
    objects: list[dict[str, Any]] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)
    payload_bytes: int = 0

    def totals(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for obj in self.objects:
            t = out.setdefault(obj["format"], {"objects": 0, "bytes": 0, "elements": 0})
            t["objects"] += 1
            t["bytes"] += obj["bytes"]
            t["elements"] += obj["elements"]
        for t in out.values():
            t["bits_per_weight"] = 8 * t["bytes"] / t["elements"] if t["elements"] else 0.0
        return out

    def as_dict(self) -> dict[str, Any]:
        weights = [o for o in self.objects if o["kind"] == "tensor"]
        total_bytes = sum(o["bytes"] for o in weights)
        total_elements = sum(o["elements"] for o in weights)
        return {
            "recipe": self.recipe,
            "output": self.output,
            "artifact_id": self.artifact_id,
            "device": self.device,
            "seconds": round(self.seconds, 3),
            "payload_bytes": self.payload_bytes,
            "files": self.files,
            "bits_per_weight": 8 * total_bytes / total_elements if total_elements else 0.0,
            "formats": self.totals(),
            "parameters": [p.as_dict() for p in self.parameters],
            "objects": self.objects,
        }


def _components(source: Any, recipe: Recipe, requested: tuple[str, ...] | None) -> tuple[str, ...]:
    has_mtp = any(k.startswith("mtp.") for k in source.keys())  # noqa: SIM118 (a source, not a dict)
    wanted = requested or recipe.components
    if "text" not in wanted:
        raise RecipeError("the text component is required")
    if "mtp" in wanted and not has_mtp:
        if requested:
            raise SourceError(
                f"{source.id}: --components asks for mtp but the source has no mtp.* tensors"
            )
        wanted = tuple(c for c in wanted if c != "mtp")
    unknown = set(wanted) - {"text", "mtp"}
    if unknown:
        raise RecipeError(
            f"unsupported components: {', '.join(sorted(unknown))} (known: text, mtp)"
        )
    return tuple(wanted)


def _check_sources(
    logical: Mapping[str, LogicalTensor], sources: Mapping[str, Any], recipe: Recipe
) -> None:
    for t in logical.values():
        role = recipe.choice(t.name, t.role).source
        source = sources.get(role)
        if source is None:
            raise SourceError(
                f"{t.name}: recipe {recipe.name} reads it from --source {role}=..., "
                "which was not given"
            )
        keys = set(source.keys())
        for piece in t.pieces:
            if piece.tensor not in keys:
                raise SourceError(f"{source.id}: tensor {piece.tensor!r} (for {t.name}) is missing")


def _parent_values(parent: Parent, sources: Mapping[str, Any]) -> torch.Tensor:
    source = sources[parent.choice.source]
    values = [m.load(source) for m in parent.stacked]
    if len(values) == 1:
        return values[0]
    return torch.cat([v.reshape(-1, v.shape[-1]) for v in values], dim=0)


ERROR_CHUNK = 1 << 22  # elements per step of the error statistics (bounded temporaries)


def _error_stats(decoded: np.ndarray, source: np.ndarray) -> tuple[float, float, float]:
    """RMSE, max |error| and RMSE relative to the source RMS, accumulated in float64."""
    squared = err_squared = 0.0
    worst = 0.0
    for start in range(0, decoded.size, ERROR_CHUNK):
        d = decoded[start : start + ERROR_CHUNK].astype(np.float64)
        x = source[start : start + ERROR_CHUNK].astype(np.float64)
        diff = d - x
        err_squared += float(np.dot(diff, diff))
        squared += float(np.dot(x, x))
        worst = max(worst, float(np.max(np.abs(diff))))
    n = max(decoded.size, 1)
    rmse = math.sqrt(err_squared / n)
    rms = math.sqrt(squared / n)
    return rmse, worst, rmse / rms if rms else 0.0


def _errors(parent: Parent, encoded: bytes, source_values: torch.Tensor) -> list[ParameterReport]:
    codec = codec_for(parent.choice.format, parent.layout)
    decoded = codec.decode(np.frombuffer(encoded, np.uint8), parent.shape, parent.divisors or 1)
    flat_decoded = decoded.reshape(-1)
    flat_source = source_values.reshape(-1)
    if flat_source.dtype == torch.bfloat16:
        flat_source = flat_source.float()
    flat_source = flat_source.cpu().numpy()
    ranges, start = {}, 0
    for m in parent.stacked:
        ranges[(m.pieces, m.transpose)] = (start, start + m.elements)
        start += m.elements
    out = []
    for m in parent.members:
        a, b = ranges[(m.pieces, m.transpose)]
        rmse, worst, relative = _error_stats(flat_decoded[a:b], flat_source[a:b])
        out.append(
            ParameterReport(
                m.name,
                parent.id,
                parent.choice.format,
                parent.choice.method,
                m.elements,
                rmse,
                worst,
                relative,
            )
        )
    return out


def convert(
    recipe_name: str,
    source_specs: Mapping[str, str],
    output: Path,
    *,
    components: tuple[str, ...] | None = None,
    device: str = "cpu",
    shard_limit: int = DEFAULT_SHARD_LIMIT,
    force: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
) -> ConversionReport:
    """Convert and publish ``output``; returns the per-parameter report (also saved as JSON)."""
    started = time.perf_counter()
    recipe = load_recipe(recipe_name)
    if "base" not in source_specs:
        raise SourceError("a base source is required: --source PATH_OR_REPO_ID")
    sources = {role: open_source(spec) for role, spec in source_specs.items()}
    base = sources["base"]
    text_config = dict(getattr(base, "text_config", None) or {})
    model_type = text_config.get("model_type")
    if not model_type:
        raise SourceError(f"{base.id}: config.json has no model_type")
    comps = _components(base, recipe, components)
    logical = adapter_for(model_type)(set(base.keys()), text_config, comps)
    _check_sources(logical, sources, recipe)
    parents = plan_parents(logical, recipe)
    bindings, uses = bindings_and_uses(parents)

    resources = {r: base.resources[r] for r in TEXT_RESOURCES if r in base.resources}
    text_config["architectures"] = [ARCHITECTURES[model_type]]
    component_records: dict[str, Any] = {
        "text": {"config": text_config, "resources": {r: f"resource/text/{r}" for r in resources}},
    }
    if "mtp" in comps:
        component_records["mtp"] = {
            "config": {"architectures": [MTP_ARCHITECTURES[model_type]]},
            "target": "text",
        }
    specs: list[TensorSpec | ResourceSpec] = [
        ResourceSpec(f"resource/text/{r}", "raw_bytes_v1", len(data))
        for r, data in resources.items()
    ]
    specs += [TensorSpec(p.id, p.shape, p.choice.format, p.layout, p.divisors) for p in parents]
    from . import __version__

    provenance = {
        "converter": f"ninfer-convert {__version__}",
        "recipe": recipe.name,
        "torch": torch.__version__,
        "sources": {role: s.provenance() for role, s in sources.items()},
    }
    report = ConversionReport(recipe.name, str(output), device=device)
    total = sum(math.prod(p.shape) for p in parents)
    done = 0
    try:
        with ArtifactWriter(
            output,
            components=component_records,
            objects=specs,
            bindings=bindings,
            uses=uses,
            provenance=provenance,
            metadata={"name": output.stem},
            shard_limit=shard_limit,
            overwrite=force,
        ) as writer:
            for role, data in resources.items():
                writer.write(f"resource/text/{role}", data)
            for parent in parents:
                values = _parent_values(parent, sources)
                try:
                    encoded = quantize(
                        parent.choice.method,
                        values.to(device),
                        parent.choice.format,
                        divisors=parent.divisors or 1,
                        **dict(parent.choice.params),
                    )
                except ConvertError as exc:
                    names = ", ".join(m.name for m in parent.members)
                    raise RecipeError(f"{names}: {exc}") from None
                writer.write(parent.id, encoded)
                report.parameters += _errors(parent, encoded, values)
                report.objects.append(
                    {
                        "id": parent.id,
                        "kind": "tensor",
                        "format": parent.choice.format,
                        "shape": list(parent.shape),
                        "bytes": len(encoded),
                        "elements": math.prod(parent.shape),
                        "parameters": [m.name for m in parent.members],
                    }
                )
                done += math.prod(parent.shape)
                if progress:
                    progress(", ".join(m.name for m in parent.members), done, total)
                del values, encoded
            directory = writer.directory
    except ArtifactError as exc:
        raise ConvertError(f"{output}: {exc}") from None
    report.artifact_id = writer.artifact_id.hex()
    report.files = [f.model_dump() for f in directory.files]
    report.payload_bytes = directory.payload_bytes
    report.seconds = time.perf_counter() - started
    report_path = output.with_name(output.name + ".conversion.json")
    tmp = report_path.with_name(report_path.name + ".tmp")
    tmp.write_text(json.dumps(report.as_dict(), indent=2))
    tmp.replace(report_path)
    return report
