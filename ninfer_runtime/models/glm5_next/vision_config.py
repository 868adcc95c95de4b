"""The GLM5Next vision tower's geometry and constants, read from the artifact's vision
component config (the checkpoint's ``vision_config`` as the converter copied it).

The shapes come from the binder's reader (``ninfer_format.binders.glm5_next_vision``), so the
runtime and the contract cannot disagree on them; the members that change no shape are read
here with transformers' ``Glm5NextVisionConfig`` defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ninfer_format.binders.glm5_next_vision import Glm5NextVision, read_vision
from ninfer_format.binders.registry import Findings

from ...errors import ModelError
from ..qwen3_5.vision_ops import checked_activation

#: transformers' ``Glm5NextVisionConfig`` defaults for the members that change no shape
DEFAULT_EPS = 1e-5
DEFAULT_ROPE_THETA = 10000.0
DEFAULT_SWIGLU_LIMIT = 10.0
DEFAULT_ACTIVATION = "silu"
#: the merger's ``post_projection_norm`` is a ``torch.nn.LayerNorm`` at its default eps
MERGER_NORM_EPS = 1e-5


@dataclass(frozen=True)
class Glm5NextVisionConfig:
    """The tower's geometry (``shape``) and the constants its math reads."""

    shape: Glm5NextVision
    eps: float = DEFAULT_EPS  # the blocks', q/k and post_layernorm RMSNorms
    rope_theta: float = DEFAULT_ROPE_THETA
    swiglu_limit: float = DEFAULT_SWIGLU_LIMIT  # gate clamped above, up on both sides
    activation: str = DEFAULT_ACTIVATION

    @classmethod
    def from_component(cls, config: Mapping[str, Any], text_hidden: int) -> Glm5NextVisionConfig:
        """From the vision component's config; a ModelError names the first bad member."""
        findings = Findings()
        shape = read_vision(config, text_hidden, findings)
        if shape is None:
            raise ModelError(findings.errors[0] if findings.errors else "bad vision config")
        rope = config.get("rope_parameters") or {}
        if not isinstance(rope, Mapping) or rope.get("rope_type", "axial") != "axial":
            raise ModelError(f"vision rope_parameters {rope!r}: only the axial rope is known")
        values = {
            "eps": _positive(config, "rms_norm_eps", DEFAULT_EPS),
            "rope_theta": _positive(rope, "rope_theta", DEFAULT_ROPE_THETA),
            "swiglu_limit": _positive(config, "swiglu_limit", DEFAULT_SWIGLU_LIMIT),
        }
        activation = checked_activation(config.get("hidden_act", DEFAULT_ACTIVATION))
        return cls(shape, activation=activation, **values)

    # the names the engine's image path reads from any tower's config
    @property
    def merge(self) -> int:
        return self.shape.merge

    @property
    def out_hidden(self) -> int:
        return self.shape.out_hidden

    @property
    def patch_width(self) -> int:
        return self.shape.patch_width


def _positive(config: Mapping[str, Any], key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ModelError(f"vision config member {key!r} must be a positive number, got {value!r}")
    return float(value)
