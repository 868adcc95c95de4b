"""What a binder for a text-only contract does once its architecture's parameters are listed:
check the config's identity and resources, warn about the components it has no contract for,
read the geometry, then check every binding, shape, format and use against the generated
parameters (an indexed proposal head, spec 5.6, is checked as Qwen3.5's, and so is a vision
component: Qwen3.5's tower, spec 5.4, unless the contract names its own); and the same list as
data for producers (``expected_parameters``). The Qwen4Exp and GLM5Next binders are such
contracts; each gives its names, geometry reader and parameter generator."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import DirectoryError
from ..schema import Directory, Resource, Tensor
from .binding_checks import _check_bindings
from .config_reader import show
from .parameter_spec import ParamSpec
from .proposal_head import DRAFTERS, _proposal, _proposal_rows
from .qwen3_5 import ENUMERATION_SLACK
from .qwen3_5_vision import _check_vision_component, _read_vision, _vision
from .registry import Findings
from .resource_checks import TEXT_RESOURCE_ROLES, _check_resources
from .use_checks import _check_uses

#: the parameter prefixes a text contract checks (the proposal head is spec 5.6's, as Qwen3.5's)
CHECKED_PREFIXES = ("text/", "proposal/")


@dataclass(frozen=True)
class VisionTower:
    """A vision tower's contract: ``read(config, text_hidden, findings)`` -> its geometry, or
    None after reporting what prevents it; ``parameters(geometry, text_hidden)`` -> every
    ``vision/`` parameter."""

    read: Callable[[Mapping[str, Any], int, Findings], Any]
    parameters: Callable[[Any, int], Iterable[ParamSpec]]


#: spec 5.4: Qwen3.5's tower, the one a contract carries unless it names another
QWEN3_5_TOWER = VisionTower(_read_vision, _vision)


@dataclass(frozen=True)
class TextContract:
    """``name`` (as messages say it), its ``architecture`` class, ``read_geometry(config,
    errors, with_mtp=...)`` (None: not defined), ``from_config(config, with_mtp=...)`` (raises
    on a bad config),
    ``parameters(geometry)`` (every parameter, lazily), the config members a runaway count
    points at, and the components it has no contract for (name -> why); ``mtp(geometry)``,
    when given, lists the MTP block's parameters from a geometry read ``with_mtp``, and an
    ``mtp`` component is then checked like the text one. ``vision_model_type``, when given,
    is the model_type of the vision component, whose identity and resources are checked as
    Qwen3.5's binder checks them and whose parameters are ``vision_tower``'s (Qwen3.5's tower,
    spec 5.4, by default)."""

    name: str
    architecture: str
    read_geometry: Callable[..., Any]  # (config, errors, *, with_mtp=False)
    from_config: Callable[..., Any]  # (config, *, with_mtp=False)
    parameters: Callable[[Any], Iterable[ParamSpec]]
    count_members: str
    unchecked_components: Mapping[str, str]
    mtp: Callable[[Any], Iterable[ParamSpec]] | None = None
    vision_model_type: str | None = None
    vision_tower: VisionTower = QWEN3_5_TOWER

    def bind(self, directory: Directory, model_type: str, f: Findings) -> None:
        """Check a directory: text config, parameter coverage/shapes/formats, uses."""
        text = directory.components["text"]
        self._check_identity(text.config, model_type, f)
        _check_resources("text", directory, TEXT_RESOURCE_ROLES, TEXT_RESOURCE_ROLES, f)
        # the shared binding check leaves these to the binder; others it reports itself
        for component, why in self.unchecked_components.items():
            if component in directory.components:
                f.warning(f"component {component!r}: not checked by this binder ({why})")
        with_mtp = self.mtp is not None and "mtp" in directory.components
        if with_mtp:
            self._check_mtp_component(directory, f)
        with_vision = self.vision_model_type is not None and "vision" in directory.components
        if with_vision:
            _check_vision_component(directory, model_type, f, self.vision_model_type)
        geometry = self.read_geometry(text.config, f.errors, with_mtp=with_mtp)
        if geometry is None:
            f.warning("parameters were not checked: the text config does not define the geometry")
            return
        vision = None
        if with_vision:
            vision_config = directory.components["vision"].config
            vision = self.vision_tower.read(vision_config, geometry.hidden, f)
            if vision is None:
                f.warning(
                    "vision parameters were not checked: the vision config lacks its geometry"
                )
        cap = len(directory.bindings) + ENUMERATION_SLACK
        everything = self._parameters(geometry, with_mtp, vision)
        generated = list(itertools.islice(everything, cap + 1))
        if len(generated) > cap:
            f.error(
                f"text config{' with the vision tower' if vision else ''} implies more than"
                f" {cap} parameters but only {len(directory.bindings)} are bound; check"
                f" {self.count_members}{' and the vision depth' if vision else ''}"
            )
            return
        drafters = [d for d in DRAFTERS if d in directory.components]
        rows = _proposal_rows(directory, geometry, drafters, f)
        if rows is not None:
            generated += _proposal(rows, geometry.hidden, drafters)
        specs = {spec.name: spec for spec in generated}
        f.parameters.update((name, spec.shape) for name, spec in specs.items())
        objects: dict[str, Tensor | Resource] = {o.id: o for o in directory.objects}
        prefixes = CHECKED_PREFIXES + ("mtp/",) * with_mtp + ("vision/",) * (vision is not None)
        _check_bindings(directory, specs, objects, f, prefixes)
        _check_uses(directory, specs, objects, f)

    def expected_parameters(
        self,
        text_config: Mapping[str, Any],
        components: Sequence[str] = ("text",),
        vision_config: Mapping[str, Any] | None = None,
    ) -> list[ParamSpec]:
        """The contract as data, for producers: every logical parameter with its shape, role
        and use inputs (text, and mtp and vision where the contract has them;
        ``vision_config``, the vision component's config, is needed for vision)."""
        checked = {"text"}
        if self.mtp is not None:
            checked.add("mtp")
        if self.vision_model_type is not None:
            checked.add("vision")
        unchecked = sorted(set(components) - checked)
        if unchecked:
            raise DirectoryError(
                f"{self.name} has no parameter contract for components {unchecked}"
            )
        with_mtp = "mtp" in components
        geometry = self.from_config(text_config, with_mtp=with_mtp)
        vision = None
        if "vision" in components:
            f = Findings()
            vision = self.vision_tower.read(vision_config or {}, geometry.hidden, f)
            if vision is None or f.errors:
                raise DirectoryError(
                    "vision config cannot define a vision geometry", problems=f.errors
                )
        return list(self._parameters(geometry, with_mtp, vision))

    def _parameters(self, geometry: Any, with_mtp: bool, vision: Any) -> Iterator[ParamSpec]:
        """Text, then the MTP block (``with_mtp``), then the tower of ``vision`` (not None)."""
        yield from self.parameters(geometry)
        if with_mtp:
            assert self.mtp is not None
            yield from self.mtp(geometry)
        if vision is not None:
            yield from self.vision_tower.parameters(vision, geometry.hidden)

    def _check_mtp_component(self, directory: Directory, f: Findings) -> None:
        """An MTP block drafts for the text component and says whose block it is."""
        mtp = directory.components["mtp"]
        if mtp.target != "text":
            f.error(f'mtp component must have target "text", got {show(mtp.target)}')
        if not mtp.config.get("architectures"):
            f.warning(f"mtp config has no architectures member ({self.name} MTP block)")

    def _check_identity(self, config: Mapping[str, Any], model_type: str, f: Findings) -> None:
        architectures = config.get("architectures")
        if architectures is None:
            f.warning(f"text config has no architectures member (expected [{self.architecture}])")
        elif architectures != [self.architecture]:
            f.warning(
                f"text config member 'architectures' is {show(architectures)} but model_type"
                f" {model_type} means [{json.dumps(self.architecture)}]"
            )
