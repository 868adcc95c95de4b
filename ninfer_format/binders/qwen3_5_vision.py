"""The Qwen3.5 vision contract (spec 5.1, 5.4, 5.7): the tower's geometry read from its own
config, its parameter table and the vision component's identity checks.

Other architectures carrying the same tower (Qwen4Exp, text contracts) reuse these functions.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..schema import Component, Directory
from .config_reader import MISSING, ConfigReader, show
from .parameter_spec import ParamSpec, _matrix, _vector
from .qwen3_5_geometry import DENSE, MOE
from .registry import Findings
from .resource_checks import _check_resources

#: spec 5.1: the vision tower's model_type follows the text variant it feeds
VISION_MODEL_TYPE_OF = {DENSE: "qwen3_5_vision", MOE: "qwen3_5_moe_vision"}
#: spec 5.1 vision config members, all positive integers
VISION_MEMBERS = (
    "depth",
    "hidden_size",
    "intermediate_size",
    "num_heads",
    "patch_size",
    "temporal_patch_size",
    "spatial_merge_size",
    "num_position_embeddings",
)
#: spec 5.4 fixes the patch embedding's input width at 3 colour channels
PATCH_CHANNELS = 3

#: spec 5.7: the image processor config is what a frontend cannot do without; video is optional
VISION_REQUIRED_ROLES = ("preprocessor_config.json",)
VISION_RESOURCE_ROLES = (*VISION_REQUIRED_ROLES, "video_preprocessor_config.json")


@dataclass(frozen=True)
class Vision:
    """Vision tower geometry (spec 5.1 vision members); the merger's output width is the text
    hidden size, so it is not part of this record."""

    depth: int
    hidden: int  # h
    intermediate: int  # I_v
    heads: int
    patch: int  # ps
    temporal_patch: int  # pt
    merge: int  # spatial_merge_size
    positions: int  # num_position_embeddings

    @property
    def patch_width(self) -> int:
        """Input width of the patch embedding: one flattened [3, pt, ps, ps] patch."""
        return PATCH_CHANNELS * self.temporal_patch * self.patch * self.patch

    @property
    def merged(self) -> int:  # m: merge x merge neighbouring patches concatenated
        return self.merge * self.merge * self.hidden


def _vision_block(V: str, v: Vision) -> Iterator[ParamSpec]:
    h, width = v.hidden, v.intermediate
    for norm in ("norm1_weight", "norm1_bias", "norm2_weight", "norm2_bias"):
        yield _vector(V + norm, h)
    for projection in ("query", "key", "value"):
        yield _matrix(f"{V}attention/{projection}", h, h, V + "attention_input")
    for projection in ("query", "key", "value"):
        yield _vector(f"{V}attention/{projection}_bias", h)
    yield _matrix(V + "attention/output", h, h, V + "attention_output")
    yield _vector(V + "attention/output_bias", h)
    yield _matrix(V + "mlp/fc1", width, h, V + "mlp_input")
    yield _vector(V + "mlp/fc1_bias", width)
    yield _matrix(V + "mlp/fc2", h, width, V + "mlp_activation")
    yield _vector(V + "mlp/fc2_bias", h)


def _vision(v: Vision, text_hidden: int) -> Iterator[ParamSpec]:
    yield _matrix("vision/patch_embedding", v.hidden, v.patch_width, "vision/patch_input")
    yield _vector("vision/patch_embedding_bias", v.hidden)
    # Rows are gathered and interpolated per image grid, never multiplied with activations.
    yield _matrix("vision/position_embedding", v.positions, v.hidden)
    for i in range(v.depth):
        yield from _vision_block(f"vision/layers/{i}/", v)
    m = v.merged
    yield _vector("vision/merger/norm_weight", v.hidden)
    yield _vector("vision/merger/norm_bias", v.hidden)
    yield _matrix("vision/merger/fc1", m, m, "vision/merger/input")
    yield _vector("vision/merger/fc1_bias", m)
    # The merger's output enters the text model as token embeddings: width H.
    yield _matrix("vision/merger/fc2", text_hidden, m, "vision/merger/activation")
    yield _vector("vision/merger/fc2_bias", text_hidden)


def _read_vision(config: Mapping[str, Any], text_hidden: int, findings: Findings) -> Vision | None:
    """The vision geometry, or None after reporting every member that prevents deriving it.

    Members that do not change a shape (head count, the optional HF ``in_channels`` and
    ``out_hidden_size``) are still checked, but a bad one does not stop the parameter checks.
    """
    c = ConfigReader(config, "vision config member '", findings.errors)
    values = [c.positive_int(key) for key in VISION_MEMBERS]
    _, hidden, _, heads, *_ = values
    if hidden is not None and heads is not None and hidden % heads:
        c.error("hidden_size", f"({hidden}) must be a multiple of num_heads ({heads})")
    # Spec 5.4 fixes the patch width at 3·pt·ps·ps and the merger output at the text width;
    # HF configs may still spell both out, and then they must agree.
    for key, wanted in (("in_channels", PATCH_CHANNELS), ("out_hidden_size", text_hidden)):
        if key in config and config[key] != wanted:
            c.error(key, f"must be {wanted} when present, got {show(config[key])}")
    if None in values:
        return None
    return Vision(*values)  # type: ignore[arg-type]


def _check_vision_component(
    directory: Directory, model_type: str, findings: Findings, expected: str | None = None
) -> None:
    """Identity, target and resources of the vision component; its geometry is read later.
    ``expected``: the tower's model_type (default: the Qwen3.5 variant's, spec 5.1), which
    another architecture carrying the same tower passes as its own."""
    vision: Component = directory.components["vision"]
    expected = expected or VISION_MODEL_TYPE_OF[model_type]
    found = vision.config.get("model_type", MISSING)
    if found != expected:
        findings.error(
            f"vision config member 'model_type' must be {json.dumps(expected)} with a"
            f" {model_type} text component, got {show(found)}"
        )
    if vision.target != "text":
        findings.error(f'vision component must have target "text", got {show(vision.target)}')
    _check_resources("vision", directory, VISION_REQUIRED_ROLES, VISION_RESOURCE_ROLES, findings)
