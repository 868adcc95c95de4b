"""The conversion report: per-parameter error of the decoded objects against the source
values, and a record of every object written."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ninfer_format.codecs import codec_for

from .plan import Auxiliary, Parent

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


def parameter_errors(
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


def kept_reports(parent: Parent, non_finite: list[bool]) -> list[ParameterReport]:
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


def object_record(parent: Parent, size: int) -> dict[str, Any]:
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


def auxiliary_record(aux: Auxiliary) -> dict[str, Any]:
    return {
        "id": aux.id,
        "kind": "auxiliary",
        "format": aux.format,
        "shape": list(aux.shape),
        "bytes": len(aux.data),
        "elements": math.prod(aux.shape),
    }
