"""Binder for the Qwen3.5 family (spec section 5): dense, MoE, MTP, vision and the proposal head.

Every expected parameter name, shape and Use input is derived from the component configs (text,
and the vision component's own config), so an artifact is checked against its own geometry
rather than against a list of known checkpoints. The text geometry is ``qwen3_5_geometry``'s,
the one reading of a text config that the runtime and the converter share. This module is the
entry point; the parts live beside it: the parameter record (``parameter_spec``), the text
layer tables (``qwen3_5_layers``), the MTP component (``qwen3_5_mtp``), the vision contract
(``qwen3_5_vision``), the proposal head (``proposal_head``) and the checks of resources,
bindings and uses (``resource_checks``, ``binding_checks``, ``use_checks``).

DFlash components are not checked here (they carry their own geometry that this binder does not
model); the report says so instead of silently passing them.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..errors import DirectoryError
from ..schema import Directory, Resource, Tensor
from .binding_checks import _check_bindings
from .config_reader import show
from .parameter_spec import ParamSpec, Role
from .proposal_head import DRAFTERS, _proposal, _proposal_rows
from .qwen3_5_geometry import ARCHITECTURE_OF, DENSE, MOE, read_geometry
from .qwen3_5_geometry import Qwen35Geometry as Geometry
from .qwen3_5_layers import _decoder_layer, _text_globals
from .qwen3_5_mtp import MTP_ARCHITECTURE_OF, _check_mtp_component, _mtp
from .qwen3_5_vision import (
    VISION_MEMBERS,
    VISION_MODEL_TYPE_OF,
    Vision,
    _check_vision_component,
    _read_vision,
    _vision,
)
from .registry import Findings, register_binder
from .resource_checks import TEXT_RESOURCE_ROLES, _check_resources
from .use_checks import _check_uses

#: names other modules read from here (record types, identity tables, vision constants)
__all__ = [
    "ARCHITECTURE_OF",
    "CHECKED_PREFIXES",
    "DRAFTERS",
    "ENUMERATION_SLACK",
    "MTP_ARCHITECTURE_OF",
    "TEXT_RESOURCE_ROLES",
    "VISION_MEMBERS",
    "VISION_MODEL_TYPE_OF",
    "ParamSpec",
    "Role",
    "bind_qwen3_5",
    "expected_parameters",
]

#: Parameter-name prefixes this binder owns; anything else bound under them is unexpected.
#: ``vision/`` joins them when the vision component's config defines a geometry.
CHECKED_PREFIXES = ("text/", "mtp/", "proposal/")


#: Expected-parameter enumeration stops this far beyond the number of bindings: a config
#: claiming e.g. 10**9 experts must yield an error line, not exhaust memory.
ENUMERATION_SLACK = 100_000


def _all_parameters(
    g: Geometry,
    drafters: Sequence[str],
    with_mtp: bool,
    proposal_rows: int | None,
    vision: Vision | None = None,
) -> Iterator[ParamSpec]:
    yield from _text_globals(g, drafters)
    for i, layer_type in enumerate(g.layer_types):
        yield from _decoder_layer(f"text/layers/{i}/", layer_type, g)
    if with_mtp:
        yield from _mtp(g)
    if vision is not None:
        yield from _vision(vision, g.hidden)
    if proposal_rows is not None:
        yield from _proposal(proposal_rows, g.hidden, drafters)


def _check_identity(config: Mapping[str, Any], model_type: str, findings: Findings) -> None:
    """model_type and architectures must agree on dense vs MoE (the binder relies on it)."""
    expected = ARCHITECTURE_OF[model_type]
    if "model_type" not in config:
        findings.warning(f"text config has no model_type; {model_type} taken from architectures")
    elif config["model_type"] != model_type:  # selected through architectures[0]
        findings.error(
            f"text config member 'model_type' must be {json.dumps(model_type)},"
            f" got {show(config['model_type'])}"
        )
    if "architectures" not in config:
        findings.warning(f"text config has no architectures member (expected [{expected}])")
        return
    architectures = config["architectures"]
    if architectures == [expected]:
        return
    first = architectures[0] if isinstance(architectures, list) and architectures else None
    message = (
        f"text config member 'architectures' is {show(architectures)} but"
        f" model_type {model_type} means [{json.dumps(expected)}]"
    )
    if first in ARCHITECTURE_OF.values():  # the other Qwen3.5 variant: dense/MoE confusion
        findings.error(message)
    else:
        findings.warning(message)


# ---------------------------------------------------------------------------------------------
# Entry point


@register_binder(
    DENSE,
    MOE,
    architectures={arch: model_type for model_type, arch in ARCHITECTURE_OF.items()},
    name="qwen3_5",
)
def bind_qwen3_5(directory: Directory, model_type: str, f: Findings) -> None:
    """Check a Qwen3.5 directory: configs, parameter coverage/shapes/formats, uses."""
    text = directory.components["text"]
    with_mtp = "mtp" in directory.components
    drafters = [d for d in DRAFTERS if d in directory.components]
    with_vision = "vision" in directory.components
    _check_identity(text.config, model_type, f)
    if with_mtp:
        _check_mtp_component(directory, model_type, f)
    _check_resources("text", directory, TEXT_RESOURCE_ROLES, TEXT_RESOURCE_ROLES, f)
    if with_vision:
        _check_vision_component(directory, model_type, f)
    geometry = read_geometry(text.config, f.errors, with_mtp=with_mtp, model_type=model_type)
    if geometry is None:
        f.warning("parameters were not checked: the text config does not define the geometry")
        return
    vision = None
    if with_vision:
        vision = _read_vision(directory.components["vision"].config, geometry.hidden, f)
        if vision is None:
            f.warning("vision parameters were not checked: the vision config lacks its geometry")
    rows = _proposal_rows(directory, geometry, drafters, f)
    cap = len(directory.bindings) + ENUMERATION_SLACK
    everything = _all_parameters(geometry, drafters, with_mtp, rows, vision)
    generated = list(itertools.islice(everything, cap + 1))
    if len(generated) > cap:
        f.error(
            f"text config{' with the vision tower' if vision else ''} implies more than {cap}"
            f" parameters but only {len(directory.bindings)} are bound; check"
            f" num_hidden_layers, num_experts{' and the vision depth' if vision else ''}"
        )
        return
    specs = {spec.name: spec for spec in generated}
    f.parameters.update((name, spec.shape) for name, spec in specs.items())
    objects: dict[str, Tensor | Resource] = {o.id: o for o in directory.objects}
    prefixes = (*CHECKED_PREFIXES, "vision/") if vision else CHECKED_PREFIXES
    _check_bindings(directory, specs, objects, f, prefixes)
    _check_uses(directory, specs, objects, f)


def expected_parameters(
    text_config: Mapping[str, Any],
    *,
    components: Sequence[str] = ("text",),
    proposal_rows: int | None = None,
    vision_config: Mapping[str, Any] | None = None,
) -> list[ParamSpec]:
    """The contract as data, for producers (converter, sample writer): every logical parameter
    with its shape, role and use inputs, for a text config and the selected components
    (``vision_config``, the vision component's config, is needed when "vision" is selected)."""
    f = Findings()
    with_mtp = "mtp" in components
    geometry = Geometry.from_config(text_config, with_mtp=with_mtp)
    vision = None
    if "vision" in components:
        vision = _read_vision(vision_config or {}, geometry.hidden, f)
        if vision is None or f.errors:
            raise DirectoryError("vision config cannot define a vision geometry", problems=f.errors)
    drafters = [d for d in DRAFTERS if d in components]
    return list(_all_parameters(geometry, drafters, with_mtp, proposal_rows, vision))
