"""``ninfer-convert verify``: decode an artifact's parameters and compare them with the source.

Direct formats must reproduce the source rounded to that format exactly; imported parameters
(``import_encoded``, ``gguf_import``) must reproduce the decoded source words exactly (unless
the import is documented lossy: F32 FP8 row scales rounded to BF16); other quantized formats
must stay within a relative RMS error that only a wrong mapping (swapped rows, transposes,
another tensor) exceeds.

Which source each parameter came from, and how, is read from the recipe recorded in the
artifact's provenance (or the one given); without a known recipe every parameter is compared
with the base source.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ninfer_format import Artifact, ArtifactError
from ninfer_format.progress import ProgressBar, silent
from ninfer_format.verify import bytes_to_check
from ninfer_format.verify import verify as verify_bytes

from .adapters import LogicalTensor
from .errors import ConvertError, RecipeError
from .prepare import Prepared, prepare
from .recipe import Recipe, load_recipe
from .source_set import open_sources

#: relative RMS error a correct conversion stays below (random Gaussian weights, absmax)
RELATIVE_BOUND = {
    "q4_g64_fp16": 0.2,
    "nf4_g64_fp16": 0.2,
    "nvfp4": 0.2,
    "q5_g64_fp16": 0.1,
    "q6_g64_fp16": 0.05,
    "fp8_e4m3fn_row_bf16": 0.06,
    "q8_g32_fp16": 0.015,
}
DIRECT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "int32": torch.int32}


def _formats(art: Artifact, name: str) -> set[str]:
    binding = art.bindings[name]
    ids = [binding.object] if hasattr(binding, "object") else [p.object for p in binding.parts]
    return {art.objects[i].format for i in ids}  # type: ignore[union-attr]


def _recipe(art: Artifact, recipe: Recipe | str | None) -> Recipe:
    """The recipe that made the artifact; a rule-less one (all from base) if unknown."""
    if isinstance(recipe, Recipe):
        return recipe
    name = recipe or art.provenance.get("recipe")
    if isinstance(name, str):
        try:
            return load_recipe(name)
        except RecipeError:
            if recipe is not None:
                raise
    return Recipe("verify", "every parameter compared with the base source")


def _decoded(art: Artifact, name: str) -> torch.Tensor:
    """The parameter as the runtime computes with it (stored input columns put in place)."""
    return torch.from_numpy(art.parameter(name, in_order=True).astype(np.float64))


def _compare(
    prepared: Prepared, name: str, fmt: str, decoded: torch.Tensor, source: torch.Tensor
) -> tuple[dict[str, Any], str | None]:
    """One report row and the error it implies, if any."""
    choice = prepared.choices[name]
    importer = prepared.importers.get(choice.method)
    exact = fmt in DIRECT_DTYPES or (importer is not None and importer.lossless(name))
    if fmt in DIRECT_DTYPES:
        source = source.to(DIRECT_DTYPES[fmt])
    source = source.to(torch.float64).reshape(decoded.shape)
    diff = decoded - source
    rms = math.sqrt(float((source**2).mean())) or 1.0
    rmse = math.sqrt(float((diff**2).mean()))
    row = {
        "name": name,
        "format": fmt,
        "source": choice.source,
        "method": choice.method,
        "rmse": rmse,
        "max_abs": float(diff.abs().max()),
        "relative": rmse / rms,
    }
    if exact and not torch.equal(decoded, source):
        what = "imported words decode differently from" if importer else f"{fmt} values differ from"
        return row, f"{name}: {what} the source (max {row['max_abs']:.3e})"
    if not exact and fmt in RELATIVE_BOUND and row["relative"] > RELATIVE_BOUND[fmt]:
        return row, (
            f"{name}: relative error {row['relative']:.3f} exceeds {RELATIVE_BOUND[fmt]} "
            f"for {fmt} (wrong source tensor or row mapping?)"
        )
    return row, None


def verify_against_source(
    artifact: Path,
    source_specs: Mapping[str, str],
    recipe: Recipe | str | None = None,
    progress: ProgressBar = silent,
) -> dict[str, Any]:
    """Compare every parameter with the source it was converted from; ``source_specs`` are the
    conversion's ``--source`` roles (base, quantized, gguf ...). ``progress`` shows the bytes
    checked, then the parameters compared."""
    try:
        art = Artifact.open(artifact)
    except ArtifactError as exc:
        raise ConvertError(f"{artifact}: {exc}") from None
    with art:
        errors = [f"binder: {e}" for e in art.binder_report.errors]
        with progress(bytes_to_check(art), "checking bytes", "B") as advance:
            errors += verify_bytes(art, progress=advance).errors
        chosen = _recipe(art, recipe)
        prepared = prepare(chosen, open_sources(source_specs, chosen), tuple(art.components))
        rows = []
        with progress(len(prepared.logical), "comparing", "parameter") as advance:
            for name, t in prepared.logical.items():
                row, error = _compare_parameter(art, prepared, name, t)
                rows += [row] if row else []
                errors += [error] if error else []
                advance(1, name)
        return {"artifact": str(artifact), "parameters": rows, "errors": errors}


def _compare_parameter(
    art: Artifact, prepared: Prepared, name: str, t: LogicalTensor
) -> tuple[dict[str, Any] | None, str | None]:
    """One parameter's report row (None when it cannot be decoded) and its error, if any."""
    if name not in art.bindings:
        return None, f"{name}: not bound in the artifact"
    formats = _formats(art, name)
    fmt = formats.pop() if len(formats) == 1 else "mixed"
    try:
        decoded = _decoded(art, name)
        source = t.load(prepared.views[prepared.choices[name].source])
    except (ArtifactError, ConvertError) as exc:
        return None, f"{name}: {exc}"
    return _compare(prepared, name, fmt, decoded, source)
