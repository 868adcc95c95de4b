"""What a binder for a text-only contract does once its architecture's parameters are listed:
check the config's identity and resources, warn about the components it has no contract for,
read the geometry, then check every binding, shape, format and use against the generated
parameters (an indexed proposal head, spec 5.6, is checked as Qwen3.5's); and the same list as
data for producers (``expected_parameters``). The Qwen4Exp and GLM5Next binders are such
contracts; each gives its names, geometry reader and parameter generator."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import DirectoryError
from ..schema import Directory, Resource, Tensor
from .config_reader import show
from .qwen3_5 import (
    DRAFTERS,
    ENUMERATION_SLACK,
    TEXT_RESOURCE_ROLES,
    ParamSpec,
    _check_bindings,
    _check_resources,
    _check_uses,
    _proposal,
    _proposal_rows,
)
from .registry import Findings

#: the parameter prefixes a text contract checks (the proposal head is spec 5.6's, as Qwen3.5's)
CHECKED_PREFIXES = ("text/", "proposal/")


@dataclass(frozen=True)
class TextContract:
    """``name`` (as messages say it), its ``architecture`` class, ``read_geometry(config,
    errors)`` (None: not defined), ``from_config(config)`` (raises on a bad config),
    ``parameters(geometry)`` (every parameter, lazily), the config members a runaway count
    points at, and the components it has no contract for (name -> why)."""

    name: str
    architecture: str
    read_geometry: Callable[[Mapping[str, Any], list[str]], Any]
    from_config: Callable[[Mapping[str, Any]], Any]
    parameters: Callable[[Any], Iterable[ParamSpec]]
    count_members: str
    unchecked_components: Mapping[str, str]

    def bind(self, directory: Directory, model_type: str, f: Findings) -> None:
        """Check a directory: text config, parameter coverage/shapes/formats, uses."""
        text = directory.components["text"]
        self._check_identity(text.config, model_type, f)
        _check_resources("text", directory, TEXT_RESOURCE_ROLES, TEXT_RESOURCE_ROLES, f)
        # the shared binding check leaves these to the binder; others it reports itself
        for component, why in self.unchecked_components.items():
            if component in directory.components:
                f.warning(f"component {component!r}: not checked by this binder ({why})")
        geometry = self.read_geometry(text.config, f.errors)
        if geometry is None:
            f.warning("parameters were not checked: the text config does not define the geometry")
            return
        cap = len(directory.bindings) + ENUMERATION_SLACK
        generated = list(itertools.islice(self.parameters(geometry), cap + 1))
        if len(generated) > cap:
            f.error(
                f"text config implies more than {cap} parameters but only"
                f" {len(directory.bindings)} are bound; check {self.count_members}"
            )
            return
        drafters = [d for d in DRAFTERS if d in directory.components]
        rows = _proposal_rows(directory, geometry, drafters, f)
        if rows is not None:
            generated += _proposal(rows, geometry.hidden, drafters)
        specs = {spec.name: spec for spec in generated}
        f.parameters.update((name, spec.shape) for name, spec in specs.items())
        objects: dict[str, Tensor | Resource] = {o.id: o for o in directory.objects}
        _check_bindings(directory, specs, objects, f, CHECKED_PREFIXES)
        _check_uses(directory, specs, objects, f)

    def expected_parameters(
        self, text_config: Mapping[str, Any], components: Sequence[str] = ("text",)
    ) -> list[ParamSpec]:
        """The contract as data, for producers: every logical parameter with its shape, role
        and use inputs (only the text component has a contract)."""
        unchecked = sorted(set(components) - {"text"})
        if unchecked:
            raise DirectoryError(
                f"{self.name} has no parameter contract for components {unchecked}"
            )
        return list(self.parameters(self.from_config(text_config)))

    def _check_identity(self, config: Mapping[str, Any], model_type: str, f: Findings) -> None:
        architectures = config.get("architectures")
        if architectures is None:
            f.warning(f"text config has no architectures member (expected [{self.architecture}])")
        elif architectures != [self.architecture]:
            f.warning(
                f"text config member 'architectures' is {show(architectures)} but model_type"
                f" {model_type} means [{json.dumps(self.architecture)}]"
            )
