"""Frontend resource checks (spec 5.7) of a component: required and known roles."""

from __future__ import annotations

from collections.abc import Sequence

from ..schema import Directory
from .registry import Findings

TEXT_RESOURCE_ROLES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
)


def _check_resources(
    component_id: str,
    directory: Directory,
    required: Sequence[str],
    known: Sequence[str],
    findings: Findings,
) -> None:
    """Frontend resources (spec 5.7): absent required roles and unknown roles are warnings,
    since the weights are still usable without them."""
    resources = directory.components[component_id].resources or {}
    for role in required:
        if role not in resources:
            findings.warning(f"{component_id} resource {role!r} is absent; frontends need it")
    for role in sorted(set(resources) - set(known)):
        findings.warning(
            f"{component_id} resource role {role!r} is not one the Qwen3.5 frontend reads"
        )
