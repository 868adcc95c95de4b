"""``ninfer-convert verify``: decode an artifact's parameters and compare them with the source.

Direct formats must reproduce the source rounded to that format exactly; quantized formats
must stay within a relative RMS error that only a wrong mapping (swapped rows, transposes,
another tensor) exceeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ninfer_format import Artifact, ArtifactError
from ninfer_format.verify import verify as verify_bytes

from .adapters import adapter_for
from .errors import ConvertError, SourceError
from .sources import open_source

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


def verify_against_source(artifact: Path, source_specs: Mapping[str, str]) -> dict[str, Any]:
    try:
        art = Artifact.open(artifact)
    except ArtifactError as exc:
        raise ConvertError(f"{artifact}: {exc}") from None
    with art:
        errors = [f"binder: {e}" for e in art.binder_report.errors]
        errors += verify_bytes(art).errors
        sources = {role: open_source(spec) for role, spec in source_specs.items()}
        base = sources.get("base")
        if base is None:
            raise SourceError("verify needs the base source: --source PATH_OR_REPO_ID")
        config = art.components["text"].config
        logical = adapter_for(config["model_type"])(
            set(base.keys()), base.text_config, tuple(art.components)
        )
        rows = []
        for name, t in logical.items():
            if name not in art.bindings:
                errors.append(f"{name}: not bound in the artifact")
                continue
            formats = _formats(art, name)
            fmt = formats.pop() if len(formats) == 1 else "mixed"
            try:
                decoded = torch.from_numpy(art.parameter(name).astype(np.float64))
                source = t.load(base)
            except (ArtifactError, ConvertError) as exc:
                errors.append(f"{name}: {exc}")
                continue
            if fmt in DIRECT_DTYPES:
                source = source.to(DIRECT_DTYPES[fmt])
            source = source.to(torch.float64).reshape(decoded.shape)
            diff = decoded - source
            rms = math.sqrt(float((source**2).mean())) or 1.0
            rmse = math.sqrt(float((diff**2).mean()))
            row = {
                "name": name,
                "format": fmt,
                "rmse": rmse,
                "max_abs": float(diff.abs().max()),
                "relative": rmse / rms,
            }
            rows.append(row)
            if fmt in DIRECT_DTYPES and not torch.equal(decoded, source):
                errors.append(
                    f"{name}: {fmt} values differ from the source (max {row['max_abs']:.3e})"
                )
            elif fmt in RELATIVE_BOUND and row["relative"] > RELATIVE_BOUND[fmt]:
                errors.append(
                    f"{name}: relative error {row['relative']:.3f} exceeds {RELATIVE_BOUND[fmt]} "
                    f"for {fmt} (wrong source tensor or row mapping?)"
                )
        return {"artifact": str(artifact), "parameters": rows, "errors": errors}
