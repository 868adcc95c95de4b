"""The artifact's component records (spec 2.3) and the frontend resources each carries."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ninfer_format.binders.resource_checks import TEXT_RESOURCE_ROLES

from .adapters.base import architecture_of
from .prepare import Prepared
from .vision import VISION_RESOURCES

#: frontend resources each component carries (spec 5.7), read from the base source
RESOURCES = {"text": TEXT_RESOURCE_ROLES, "vision": VISION_RESOURCES}


def _resource_id(component: str, role: str) -> str:
    return f"resource/{component}/{role}"  # spec 5.7 reference converter IDs


def component_resources(
    available: Mapping[str, bytes], components: tuple[str, ...]
) -> dict[str, bytes]:
    """Resource object ID -> bytes, for the roles of each converted component the source has."""
    return {
        _resource_id(component, role): available[role]
        for component in components
        for role in RESOURCES.get(component, ())
        if role in available
    }


def component_records(prepared: Prepared, resources: Mapping[str, bytes]) -> dict[str, Any]:
    """Spec 2.3 component records: configs (5.1), targets and resource roles (5.7)."""
    architecture = architecture_of(prepared.model_type)
    configs = {
        "text": {**prepared.text_config, "architectures": [architecture.text]},
        "mtp": {"architectures": [architecture.mtp]},
        "vision": prepared.vision_config,
    }
    records: dict[str, Any] = {}
    for component in prepared.components:
        record: dict[str, Any] = {"config": configs[component]}
        if component != "text":
            record["target"] = "text"
        roles = {
            role: _resource_id(component, role)
            for role in RESOURCES.get(component, ())
            if _resource_id(component, role) in resources
        }
        if roles or component == "text":
            record["resources"] = roles
        records[component] = record
    if prepared.proposal is not None:
        records["text"]["proposal"] = {"domain": "indexed", "rows": prepared.proposal.rows}
    return records
