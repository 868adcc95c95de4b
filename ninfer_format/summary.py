"""A structured description of an opened artifact: what ``ninfer-inspect`` prints.

The same dictionary backs the text view and ``--json``; its keys are documented in
``docs/inspect.md`` and are stable.
"""

from __future__ import annotations

import math
from typing import Any

from .codecs import codec_for
from .errors import ArtifactError
from .reader import Artifact
from .resources import CORE_ENCODINGS, ENCODINGS
from .schema import Resource, Tensor

CONFIG_KEYS = (
    "architectures",
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "vocab_size",
    "num_experts",
    "num_experts_per_tok",
)


def object_checks(artifact: Artifact) -> tuple[list[str], list[str], set[str]]:
    """Lazy rules R13/R14 for every object (no payload read): errors, warnings, dialects."""
    errors, warnings, dialects = [], [], {"CORE"}
    for obj in artifact.directory.objects:
        if isinstance(obj, Resource):
            if obj.encoding not in ENCODINGS:
                warnings.append(
                    f"object {obj.id!r}: resource encoding {obj.encoding!r} is unknown "
                    f"(known: {', '.join(sorted(ENCODINGS))}); it cannot be decoded"
                )
            elif obj.encoding not in CORE_ENCODINGS:
                dialects.add("ninfer")
            continue
        if obj.divisors is not None:
            dialects.add("EXT-ALL")
        try:
            codec = artifact.codec(obj.id)
        except ArtifactError as exc:
            known = True
            try:
                codec_for(obj.format, obj.layout)
            except ArtifactError:
                known = False
            (errors if known else warnings).extend(exc.problems)
            continue
        if codec.profile != "CORE":
            dialects.add(codec.profile)
    return errors, warnings, dialects


def summarize(artifact: Artifact) -> dict[str, Any]:
    errors, warnings, dialects = object_checks(artifact)
    report = artifact.binder_report
    errors += [f"binder: {e}" for e in report.errors]
    warnings += [f"binder: {w}" for w in report.warnings]
    formats: dict[str, dict[str, Any]] = {}
    objects = []
    for obj in artifact.directory.objects:
        row: dict[str, Any] = {"id": obj.id, "kind": obj.kind, "offset": obj.offset}
        row["bytes"] = obj.bytes
        if isinstance(obj, Tensor):
            row |= {"format": obj.format, "layout": obj.layout, "shape": list(obj.shape)}
            if obj.divisors is not None:
                row["divisors"] = obj.divisors
            key = obj.format
            elements = math.prod(obj.shape)
        else:
            row["encoding"] = obj.encoding
            key, elements = f"resource:{obj.encoding}", 0
        objects.append(row)
        total = formats.setdefault(key, {"objects": 0, "bytes": 0, "elements": 0})
        total["objects"] += 1
        total["bytes"] += obj.bytes
        total["elements"] += elements
    for total in formats.values():
        e = total["elements"]
        total["bits_per_weight"] = round(8 * total["bytes"] / e, 4) if e else None
    components = {}
    for cid, comp in artifact.components.items():
        components[cid] = {
            "target": comp.target,
            "summary": {k: comp.config[k] for k in CONFIG_KEYS if k in comp.config},
            "config": comp.config,
            "resources": comp.resources or {},
            "proposal": comp.proposal.model_dump() if comp.proposal else None,
        }
    return {
        "path": str(artifact.path),
        "artifact_id": artifact.artifact_id.hex(),
        "valid": not errors,
        "dialects": sorted(dialects),
        "json_bytes": artifact.json_bytes,
        "entry_payload_start": artifact.entry_payload_start,
        "payload_bytes": artifact.payload_bytes,
        "files": [
            {
                "index": f.index,
                "path": f.path.name,
                "payload_bytes": f.payload_bytes,
                "file_size": f.file_size,
            }
            for f in artifact.files
        ],
        "metadata": artifact.metadata,
        "components": components,
        "objects": objects,
        "formats": formats,
        "bindings": len(artifact.bindings),
        "uses": len(artifact.uses),
        "binder": {
            "architecture": report.architecture,
            "binder": report.binder,
            "ok": report.ok,
            "parameters": len(report.parameters),
        },
        "verify": None,
        "errors": errors,
        "warnings": warnings,
    }
