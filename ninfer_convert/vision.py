"""The vision component of a VLM source (spec 2.3, 5.1, 5.4, 5.7): its config and the checks
that tie the checkpoint's ``model.visual.*`` tensors and processor files to that config.

Everything here runs while the conversion is prepared, before the writer opens: a vision config
that does not describe the checkpoint's tensors (a wrong depth silently dropping blocks, a wrong
width) or a processor whose patch sizes disagree with the weights fails in the first second.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ninfer_format.binders import glm5_next_geometry, glm5_next_vision, qwen3_5, qwen4_exp
from ninfer_format.binders.qwen3_5 import VISION_MEMBERS
from ninfer_format.binders.qwen3_5_vision import VISION_RESOURCE_ROLES

from .adapters import LogicalTensor
from .adapters.qwen3_5 import VISUAL, has_vision_weights
from .errors import SourceError
from .source_sizes import piece_values

#: spec 5.7 vision resource roles (= the source's file names)
VISION_RESOURCES = VISION_RESOURCE_ROLES
#: text model_type -> the model_type of the vision tower that feeds it (spec 5.1)
VISION_MODEL_TYPE_OF = {
    **qwen3_5.VISION_MODEL_TYPE_OF,
    **dict.fromkeys(qwen4_exp.MODEL_TYPES, qwen4_exp.VISION_MODEL_TYPE),
    **dict.fromkeys(glm5_next_geometry.MODEL_TYPES, glm5_next_vision.VISION_MODEL_TYPE),
}
#: vision model_type -> its positive-integer config members, where not Qwen3.5's (spec 5.1)
MEMBERS_OF = {glm5_next_vision.VISION_MODEL_TYPE: glm5_next_vision.VISION_MEMBERS}
#: processor file member -> vision config member it must equal (spec 5.7)
PROCESSOR_MEMBERS = {
    "patch_size": "patch_size",
    "temporal_patch_size": "temporal_patch_size",
    "merge_size": "spatial_merge_size",
}


def has_vision(source: Any) -> bool:
    """Whether ``source`` can supply the vision component: a vision config and its weights."""
    if getattr(source, "vision_config", None) is None:
        return False
    return has_vision_weights(source.keys())


def vision_config(source: Any, text_model_type: str) -> dict[str, Any]:
    """The vision component config: the source's ``vision_config`` members, with the
    ``model_type`` spec 5.1 gives the tower of this text variant (HF checkpoints write
    ``qwen3_5`` or ``qwen3_5_vision`` there whatever the text variant; GLM5Next's tower is
    ``glm5_next_vision``)."""
    config = dict(source.vision_config)
    config["model_type"] = VISION_MODEL_TYPE_OF[text_model_type]
    members = MEMBERS_OF.get(config["model_type"], VISION_MEMBERS)
    bad = [m for m in members if type(config.get(m)) is not int or config[m] <= 0]
    if bad:
        raise SourceError(
            f"{source.id}: config.json vision_config needs positive integers for "
            f"{', '.join(bad)} (spec 5.1)"
        )
    return config


def check_processors(
    source_id: str, config: Mapping[str, Any], resources: Mapping[str, bytes]
) -> None:
    """The processor files cut images into the patches the weights expect (spec 5.7)."""
    for role in VISION_RESOURCES:
        if role not in resources:
            continue
        try:
            processor = json.loads(resources[role])
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SourceError(f"{source_id}: {role} is not valid JSON: {exc}") from None
        if not isinstance(processor, dict):
            raise SourceError(f"{source_id}: {role} must hold a JSON object")
        for key, member in PROCESSOR_MEMBERS.items():
            if key in processor and processor[key] != config[member]:
                raise SourceError(
                    f"{source_id}: {role} has {key} {processor[key]!r} but the vision config "
                    f"has {member} {config[member]!r}"
                )


def check_vision_source(source: Any, logical: Mapping[str, LogicalTensor]) -> None:
    """Every ``model.visual.*`` tensor is read, and each vision parameter gets exactly its
    element count from the source; otherwise the config does not describe these weights."""
    vision = [t for name, t in logical.items() if name.startswith("vision/")]
    read = {piece.tensor for t in vision for piece in t.pieces}
    visual = [k for k in source.keys() if k.startswith(VISUAL)]  # noqa: SIM118 (a source)
    unread = sorted(set(visual) - read)
    if unread:
        more = f" and {len(unread) - 3} more" if len(unread) > 3 else ""
        shown = ", ".join(unread[:3]) + more
        raise SourceError(
            f"{source.id}: the vision config (depth {source.vision_config.get('depth')}) "
            f"leaves {shown} unread"
        )
    for t in vision:
        missing = [p.tensor for p in t.pieces if p.tensor not in source]
        if missing:
            raise SourceError(f"{source.id}: tensor {missing[0]!r} (for {t.name}) is missing")
        got = sum(piece_values(source.shape(p.tensor), p) for p in t.pieces)
        if got != t.elements:
            shapes = sorted({str(list(source.shape(p.tensor))) for p in t.pieces})
            raise SourceError(
                f"{source.id}: {t.name} {list(t.shape)} needs {t.elements} values but "
                f"{', '.join(shapes)} give {got}; the vision config does not match the weights"
            )
