"""The vision component of an artifact as every tower reads it: its config with the text width
its merger feeds, and its parameters prepared on a backend, all present or refused in one
line."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...backends import Backend, Weight
from ...errors import ModelError
from ..base import require_parameters


def vision_config(artifact: Any) -> tuple[dict[str, Any], int]:
    """The vision component's config (the checkpoint's ``vision_config``) and the text
    model's hidden size."""
    component = artifact.components.get("vision")
    if component is None:
        raise ModelError("artifact has no vision component")
    return component.config or {}, int(artifact.components["text"].config["hidden_size"])


def prepare_vision(artifact: Any, backend: Backend, names: Sequence[str]) -> dict[str, Weight]:
    """The tower's parameters ``names`` prepared on ``backend``."""
    require_parameters(artifact, names, "vision parameter(s)")
    return backend.prepare(artifact, names)
