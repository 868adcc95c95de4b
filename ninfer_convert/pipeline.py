"""The conversion pipeline: sources + recipe -> a streamed, validated artifact and a report.

Peak memory stays near the largest parent object: each parent's members are loaded from the
memory-mapped sources, encoded, written and released before the next one.

Each parameter is read from the source role its recipe choice names. How a parent's bytes are
made depends on its method: an importer (``encoded.py``: ``import_encoded``, ``gguf_import``)
copies stored words, any other method quantizes float values (``encoder_for``). Importers are
prepared before the writer opens, so a bad field, divisor or header fails in the first second
and never leaves a partial artifact.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ninfer_format import (
    ArtifactError,
    ArtifactWriter,
    ResourceSpec,
    TargetExists,
    TensorSpec,
    WriteError,
)
from ninfer_format.codecs import codec_for
from ninfer_format.errors import DirectoryError
from ninfer_format.framing import DEFAULT_SHARD_LIMIT
from ninfer_format.progress import Advance, ProgressBar, silent

from .adapters import LogicalTensor, adapter_for
from .adapters.base import architecture_of, has_mtp_weights, maps_vision
from .adapters.qwen3_5_gguf import has_mtp as gguf_has_mtp
from .adapters.qwen3_5_gguf import map_qwen3_5_gguf, open_config_only
from .encoded import DecodedView, Importer, importers, values_view, weight_names
from .errors import ConvertError, OutputExists, RecipeError, SourceError
from .plan import Auxiliary, Parent, attach_auxiliaries, bindings_and_uses, plan_parents
from .proposal import DEFAULT_ROWS, read_ranking, select_shortlist, token_domain
from .quantize import quantize
from .recipe import DEFAULT_METHOD, Choice, Recipe, load_recipe
from .source_sizes import check_sizes
from .sources import GgufSource, open_source
from .sources.gguf_base import write_base
from .vision import VISION_RESOURCES, check_processors, check_vision_source, has_vision
from .vision import vision_config as read_vision_config

TEXT_RESOURCES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
)
#: frontend resources each component carries (spec 5.7), read from the base source
RESOURCES = {"text": TEXT_RESOURCES, "vision": VISION_RESOURCES}
KNOWN_COMPONENTS = ("text", "mtp", "vision")
#: drafter components whose final hidden state a proposal head reads (spec 5.6)
DRAFTERS = ("mtp", "dflash", "dflash2")
#: the conversion report is published beside the entry, as ``<entry>.conversion.json``
REPORT_SUFFIX = ".conversion.json"


def report_path(output: str | Path) -> Path:
    output = Path(output)
    return output.with_name(output.name + REPORT_SUFFIX)


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
        for obj in (o for o in self.objects if o["kind"] == "tensor"):
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


def _components(
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


def _has_mtp(sources: Mapping[str, Any], recipe: Recipe, config: Mapping[str, Any]) -> bool:
    """Whether the source the MTP weights would come from holds them."""
    source = sources.get(recipe.choice("mtp/input_projection", "matrix").source, sources["base"])
    if isinstance(source, GgufSource):
        return gguf_has_mtp(source, config)
    return has_mtp_weights(str(config.get("model_type")), set(source.keys()), config)


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


@dataclass(frozen=True)
class ProposalRequest:
    """``--proposal RANKING_FILE --proposal-rows N``; ``ranking`` None: the first ``rows``
    token ids in order, what a recipe's ``full_proposal`` asks for (every row of the head)."""

    ranking: Path | None
    rows: int = DEFAULT_ROWS


def _add_proposal(
    request: ProposalRequest,
    logical: dict[str, LogicalTensor],
    choices: dict[str, Choice],
    base: Any,
    config: Mapping[str, Any],
    components: tuple[str, ...],
    recipe: Recipe,
) -> None:
    """``proposal/head`` (rows of the output head's source; spec 5.6: used at each drafter's
    final hidden state) and ``proposal/token_ids`` (row -> token id)."""
    head = logical["text/output_head"]
    inputs = tuple(f"{d}/final_hidden" for d in DRAFTERS if d in components)
    fmt = recipe.proposal_format
    choices["proposal/head"] = Choice(
        format=fmt, method=DEFAULT_METHOD[fmt], source=choices["text/output_head"].source
    )
    if request.ranking is None:  # rows in id order: the head's values in the proposal format
        gather = tuple(range(request.rows))
    else:
        count, special = token_domain(base.resources)
        vocab = int(config["vocab_size"])
        ranking = read_ranking(request.ranking, vocab)
        ids = select_shortlist(ranking, request.rows, min(count, vocab), special)
        gather = tuple(int(i) for i in ids)
    logical["proposal/head"] = LogicalTensor(
        "proposal/head", (request.rows, head.shape[1]), "matrix", inputs, head.pieces,
        gather=gather,
    )  # fmt: skip
    logical["proposal/token_ids"] = LogicalTensor(
        "proposal/token_ids", (request.rows,), "token ids", (), (), constant=gather
    )
    choices["proposal/token_ids"] = Choice(format="int32", method="cast")


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
    if components and "vision" in components and not maps_vision(model_type):
        raise RecipeError(f"model_type {model_type}: no vision contract, its tower cannot convert")
    vision_here = has_vision(base) and maps_vision(model_type)
    available = {"mtp": _has_mtp(sources, recipe, text_config), "vision": vision_here}
    comps = _components(available, base.id, recipe, components)
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
        _add_proposal(proposal, logical, raw, base, text_config, comps, recipe)
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


def _parent_values(parent: Parent, views: Mapping[str, Any]) -> torch.Tensor:
    source = views[parent.choice.source]
    values = [m.load(source) for m in parent.stacked]
    if len(values) == 1:
        return values[0]
    return torch.cat([v.reshape(-1, v.shape[-1]) for v in values], dim=0)


#: makes a parent's object bytes and the source values the decoded object should match
ParentEncoder = Callable[[Parent], tuple[bytes, "torch.Tensor | np.ndarray"]]


def encoder_for(parent: Parent, prepared: Prepared, device: str) -> ParentEncoder:
    """An importer for its method, else quantization of the float values."""
    importer = prepared.importers.get(parent.choice.method)
    if importer is not None:
        return importer.encode

    def quantized(parent: Parent) -> tuple[bytes, torch.Tensor]:
        values = _parent_values(parent, prepared.views)
        encoded = quantize(
            parent.choice.method,
            values.to(device),
            parent.choice.format,
            divisors=parent.divisors or 1,
            **dict(parent.choice.params),
        )
        return encoded, values

    return quantized


def _stacking(prepared: Prepared) -> Callable[[Any, Choice], int]:
    def stacking(members: Any, choice: Choice) -> int:
        importer = prepared.importers.get(choice.method)
        return importer.stacking(members, choice) if importer is not None else 1

    return stacking


def plan(prepared: Prepared) -> tuple[list[Parent], dict[str, Any], list[dict], list[Auxiliary]]:
    """Parents, bindings, uses and the auxiliary objects their uses bind."""
    parents = plan_parents(
        prepared.logical,
        prepared.recipe,
        choices=prepared.choices,
        stacking=_stacking(prepared),
    )
    bindings, uses = bindings_and_uses(parents)

    def provide(parent: Parent, use: dict[str, Any]) -> Any:
        importer = prepared.importers.get(parent.choice.method)
        return importer.auxiliaries(parent, use) if importer is not None else {}

    return parents, bindings, uses, attach_auxiliaries(parents, uses, provide)


ERROR_CHUNK = 1 << 22  # elements per step of the error statistics (bounded temporaries)


def _error_stats(
    decoded: np.ndarray, source: torch.Tensor | np.ndarray
) -> tuple[float, float, float]:
    """RMSE, max |error| and RMSE relative to the source RMS, accumulated in float64 chunk by
    chunk (a bf16 source is widened one chunk at a time, never as a whole copy)."""
    squared = err_squared = worst = 0.0
    for start in range(0, decoded.size, ERROR_CHUNK):
        d = decoded[start : start + ERROR_CHUNK].astype(np.float64)
        chunk = source[start : start + ERROR_CHUNK]
        if isinstance(chunk, torch.Tensor):
            chunk = chunk.to(torch.float64).cpu().numpy()
        x = np.asarray(chunk, dtype=np.float64)
        diff = d - x
        err_squared += float(np.dot(diff, diff))
        squared += float(np.dot(x, x))
        worst = max(worst, float(np.max(np.abs(diff))) if diff.size else 0.0)
    n = max(decoded.size, 1)
    rmse = math.sqrt(err_squared / n)
    rms = math.sqrt(squared / n)
    return rmse, worst, rmse / rms if rms else 0.0


def _errors(
    parent: Parent, encoded: bytes, source_values: torch.Tensor | np.ndarray
) -> list[ParameterReport]:
    """Decoded object vs the source values (for imports: the decoded source words)."""
    codec = codec_for(parent.choice.format, parent.layout)
    decoded = codec.decode(np.frombuffer(encoded, np.uint8), parent.shape, parent.divisors or 1)
    flat_decoded = decoded.reshape(-1)
    flat_source = source_values.reshape(-1)
    ranges, start = {}, 0
    for m in parent.stacked:
        ranges[m.identity] = (start, start + m.elements)
        start += m.elements
    out = []
    for m in parent.members:
        a, b = ranges[m.identity]
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
    recipe_name: str | Recipe,
    source_specs: Mapping[str, str],
    output: str | Path,
    *,
    components: tuple[str, ...] | None = None,
    device: str = "cpu",
    shard_limit: int = DEFAULT_SHARD_LIMIT,
    force: bool = False,
    progress: ProgressBar = silent,
    proposal: ProposalRequest | None = None,
) -> ConversionReport:
    """Convert and publish ``output``; returns the per-parameter report, which is published
    with the artifact as ``report_path(output)`` (never beside another artifact).

    ``recipe_name`` is a recipe module name, or a ``Recipe`` built by the caller; ``progress``
    shows the weights written (``ninfer_format.progress.terminal_bar`` draws a bar).
    """
    started = time.perf_counter()
    output = Path(output)
    recipe = recipe_name if isinstance(recipe_name, Recipe) else load_recipe(recipe_name)
    sources = open_sources(source_specs, recipe)
    prepared = prepare(recipe, sources, components, proposal)
    parents, bindings, uses, auxiliaries = plan(prepared)

    resources = _resources(sources["base"].resources, prepared.components)
    component_records = _component_records(prepared, resources, prepared.proposal)
    specs: list[TensorSpec | ResourceSpec] = [
        ResourceSpec(object_id, "raw_bytes_v1", len(data)) for object_id, data in resources.items()
    ]
    specs += [TensorSpec(p.id, p.shape, p.choice.format, p.layout, p.divisors) for p in parents]
    specs += [TensorSpec(a.id, a.shape, a.format, "contiguous_le_v1") for a in auxiliaries]
    from . import __version__

    provenance = {
        "converter": f"ninfer-convert {__version__}",
        "recipe": recipe.name,
        "torch": torch.__version__,
        "sources": {role: s.provenance() for role, s in sources.items()},
    }
    report = ConversionReport(recipe.name, str(output), device=device)
    total = sum(_object_bytes(p) for p in parents)
    try:
        with (
            ArtifactWriter(
                output,
                components=component_records,
                objects=specs,
                bindings=bindings,
                uses=uses,
                provenance=provenance,
                metadata={"name": output.stem},
                shard_limit=shard_limit,
                overwrite=force,
            ) as writer,
            progress(total, "converting", "B") as advance,
        ):
            for object_id, data in resources.items():
                writer.write(object_id, data)
            for parent in parents:
                _write_parent(parent, prepared, device, writer, report, advance)
            for aux in auxiliaries:
                writer.write(aux.id, aux.data)
                report.objects.append(_auxiliary_record(aux))
            report.artifact_id = writer.artifact_id.hex()
            report.files = [f.model_dump() for f in writer.directory.files]
            report.payload_bytes = writer.directory.payload_bytes
            report.seconds = time.perf_counter() - started
            writer.add_sidecar(REPORT_SUFFIX, json.dumps(report.as_dict(), indent=2).encode())
    except TargetExists as exc:
        raise OutputExists(exc.path) from None
    except WriteError as exc:  # its message starts with the output path
        raise ConvertError(str(exc)) from None
    except ArtifactError as exc:
        raise ConvertError(f"{output}: {exc}") from None
    return report


def _write_parent(
    parent: Parent,
    prepared: Prepared,
    device: str,
    writer: ArtifactWriter,
    report: ConversionReport,
    advance: Advance,
) -> None:
    """One parent object into the writer, streamed (kept words) or encoded whole, and its
    lines of the report; the bar advances by the object's bytes."""
    importer = prepared.importers.get(parent.choice.method)
    if importer is not None and importer.streams:
        non_finite = importer.copy(parent, lambda chunk: writer.write(parent.id, chunk), advance)
        report.parameters += _kept_reports(parent, non_finite)
        report.objects.append(_object_record(parent, _object_bytes(parent)))
        return
    names = ", ".join(m.name for m in parent.members)
    with _threads_for(math.prod(parent.shape)):
        try:
            encoded, reference = encoder_for(parent, prepared, device)(parent)
        except ConvertError as exc:
            raise RecipeError(f"{names}: {exc}") from None
        report.parameters += _errors(parent, encoded, reference)
    writer.write(parent.id, encoded)
    report.objects.append(_object_record(parent, len(encoded)))
    advance(len(encoded), names)


#: parents with fewer elements are encoded on one CPU thread
PARALLEL_ELEMENTS = 1 << 22


@contextmanager
def _threads_for(elements: int) -> Iterator[None]:
    """One torch thread for a small parent: each of its many small operations would start and
    join a parallel region, which costs more than the work, and on a busy machine an OpenMP
    team spins waiting for a core it does not get (docs/performance.md has the figures)."""
    threads = torch.get_num_threads()
    if elements >= PARALLEL_ELEMENTS or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _object_bytes(parent: Parent) -> int:
    codec = codec_for(parent.choice.format, parent.layout)
    return codec.encoded_size(parent.shape, parent.divisors or 1)


def _kept_reports(parent: Parent, non_finite: list[bool]) -> list[ParameterReport]:
    """Report lines of a parent whose stored words were kept: the decoded object is the decoded
    source, error 0, except a member with a NaN or Inf word, whose error a decode makes NaN."""
    flagged = {m.identity: bad for m, bad in zip(parent.stacked, non_finite, strict=True)}
    out = []
    for member in parent.members:
        error = math.nan if flagged[member.identity] else 0.0
        out.append(
            ParameterReport(
                member.name,
                parent.id,
                parent.choice.format,
                parent.choice.method,
                member.elements,
                error,
                error,
                error,
            )
        )
    return out


def _resource_id(component: str, role: str) -> str:
    return f"resource/{component}/{role}"  # spec 5.7 reference converter IDs


def _resources(available: Mapping[str, bytes], components: tuple[str, ...]) -> dict[str, bytes]:
    """Resource object ID -> bytes, for the roles of each converted component the source has."""
    return {
        _resource_id(component, role): available[role]
        for component in components
        for role in RESOURCES.get(component, ())
        if role in available
    }


def _component_records(
    prepared: Prepared, resources: Mapping[str, bytes], proposal: ProposalRequest | None
) -> dict[str, Any]:
    """Spec 2.3 component records: configs (5.1), targets and resource roles (5.7)."""
    architecture = architecture_of(prepared.model_type)
    configs = {
        "text": {**prepared.text_config, "architectures": [architecture.text]},
        "mtp": {"architectures": [architecture.mtp]},
        "vision": prepared.vision_config,
    }
    records: dict[str, Any] = {}
    for component in prepared.components:
        record: dict[str, Any] = {"config": configs[component]}
        if component != "text":
            record["target"] = "text"
        roles = {
            role: _resource_id(component, role)
            for role in RESOURCES.get(component, ())
            if _resource_id(component, role) in resources
        }
        if roles or component == "text":
            record["resources"] = roles
        records[component] = record
    if proposal is not None:
        records["text"]["proposal"] = {"domain": "indexed", "rows": proposal.rows}
    return records


def _object_record(parent: Parent, size: int) -> dict[str, Any]:
    record = {
        "id": parent.id,
        "kind": "tensor",
        "format": parent.choice.format,
        "method": parent.choice.method,
        "shape": list(parent.shape),
        "bytes": size,
        "elements": math.prod(parent.shape),
        "parameters": [m.name for m in parent.members],
    }
    if parent.divisors:
        record["divisors"] = parent.divisors
    return record


def _auxiliary_record(aux: Auxiliary) -> dict[str, Any]:
    return {
        "id": aux.id,
        "kind": "auxiliary",
        "format": aux.format,
        "shape": list(aux.shape),
        "bytes": len(aux.data),
        "elements": math.prod(aux.shape),
    }
