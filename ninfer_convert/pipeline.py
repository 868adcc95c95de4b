"""The conversion pipeline: sources + recipe -> a streamed, validated artifact and a report.

Peak memory stays near the largest parent object: each parent's members are loaded from the
memory-mapped sources, encoded, written and released before the next one.

Each parameter is read from the source role its recipe choice names. How a parent's bytes are
made depends on its method: an importer (``encoded``: ``import_encoded``, ``gguf_import``)
copies stored words, any other method quantizes float values (``parents.encoder_for``).
Importers are prepared before the writer opens, so a bad field, divisor or header fails in the
first second and never leaves a partial artifact.

The steps, each in its module: ``source_set`` opens the ``--source`` roles and selects the
components, ``prepare`` resolves every parameter's logical tensor and choice (``proposal`` adds
the proposal head), ``parents`` plans the parent objects and makes and writes each one,
``component_records`` and ``report`` describe what was written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from ninfer_format import (
    ArtifactError,
    ArtifactWriter,
    ResourceSpec,
    TargetExists,
    TensorSpec,
    WriteError,
)
from ninfer_format.framing import DEFAULT_SHARD_LIMIT
from ninfer_format.progress import ProgressBar, silent

from .component_records import component_records, component_resources
from .errors import ConvertError, OutputExists
from .parents import object_bytes, plan, write_parent
from .prepare import Prepared, prepare
from .proposal import ProposalRequest
from .recipe import Recipe, load_recipe
from .report import REPORT_SUFFIX, ConversionReport, auxiliary_record, report_path
from .source_set import open_sources

#: what callers import from here: ``convert`` and the steps ``verify`` and tests run alone
__all__ = [
    "ConversionReport",
    "Prepared",
    "ProposalRequest",
    "convert",
    "open_sources",
    "plan",
    "prepare",
    "report_path",
]


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

    resources = component_resources(sources["base"].resources, prepared.components)
    records = component_records(prepared, resources)
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
    total = sum(object_bytes(p) for p in parents)
    try:
        with (
            ArtifactWriter(
                output,
                components=records,
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
                write_parent(parent, prepared, device, writer, report, advance)
            for aux in auxiliaries:
                writer.write(aux.id, aux.data)
                report.objects.append(auxiliary_record(aux))
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
