"""Architecture binders, looked up by the text component's ``model_type``.

The generic reader (spec 2.10, R1-R15) knows nothing about what a parameter *means*. A binder
is the architecture layer on top of it: it derives the expected parameter names and shapes
from the component configs and reports where the directory disagrees. An artifact whose
architecture has no binder is still a valid artifact, so "no binder" is reported, not an error.

Binders never raise on a validated ``Directory``: configs are free-form JSON, and every way
they can be wrong must end up as a line in the report. ``bind`` still converts an unexpected
exception into an error line as a last guard, because one buggy binder must not make an
otherwise readable artifact unopenable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..schema import Directory

#: Most lines of one kind of finding a binder reports before it summarizes the rest.
#: A config that names 256 experts in 40 layers can produce tens of thousands of identical
#: "missing" lines; the first few tell the story.
MAX_LINES_PER_KIND = 50


@dataclass(frozen=True)
class BinderReport:
    """What a binder found about one directory.

    ``parameters`` maps every logical parameter name the architecture expects to its shape,
    so a reader can give ``parameter(name)`` (whose parts are a flat element range) its shape.
    """

    architecture: str | None
    binder: str | None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    parameters: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No errors; warnings and "no binder" do not make an artifact unusable."""
        return not self.errors


class Findings:
    """Mutable collector a binder fills; ``bind`` freezes it into a ``BinderReport``."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.parameters: dict[str, tuple[int, ...]] = {}

    def error(self, message: str) -> None:
        self.errors.append(message)

    def warning(self, message: str) -> None:
        self.warnings.append(message)

    def errors_capped(self, lines: Iterable[str], kind: str) -> None:
        """Report ``lines`` as errors, summarizing after ``MAX_LINES_PER_KIND`` of them."""
        lines = list(lines)
        self.errors.extend(lines[:MAX_LINES_PER_KIND])
        if len(lines) > MAX_LINES_PER_KIND:
            self.errors.append(f"... and {len(lines) - MAX_LINES_PER_KIND} more {kind}")


#: A binder gets the directory, the model_type it was selected for, and the collector.
BinderFunction = Callable[[Directory, str, Findings], None]


@dataclass(frozen=True)
class _Entry:
    name: str
    function: BinderFunction


_BY_MODEL_TYPE: dict[str, _Entry] = {}
_MODEL_TYPE_OF_ARCHITECTURE: dict[str, str] = {}


def register_binder(
    *model_types: str,
    architectures: Mapping[str, str] | None = None,
    name: str | None = None,
) -> Callable[[BinderFunction], BinderFunction]:
    """Decorator: make ``function`` the binder of ``model_types``.

    ``architectures`` maps Hugging Face ``architectures[0]`` names to one of ``model_types``;
    it is consulted only when a config has no ``model_type`` member. ``name`` (default: the
    function's name) is what reports show as ``binder``.
    """
    if not model_types:
        raise ValueError("register_binder needs at least one model_type")
    mapping = dict(architectures or {})
    for architecture, model_type in mapping.items():
        if model_type not in model_types:
            raise ValueError(f"architecture {architecture!r} maps to unregistered {model_type!r}")

    def decorate(function: BinderFunction) -> BinderFunction:
        entry = _Entry(name or function.__name__, function)
        for model_type in model_types:
            if model_type in _BY_MODEL_TYPE:
                raise ValueError(f"model_type {model_type!r} already has a binder")
        for architecture in mapping:
            if architecture in _MODEL_TYPE_OF_ARCHITECTURE:
                raise ValueError(f"architecture {architecture!r} already has a binder")
        for model_type in model_types:
            _BY_MODEL_TYPE[model_type] = entry
        _MODEL_TYPE_OF_ARCHITECTURE.update(mapping)
        return function

    return decorate


def registered_model_types() -> list[str]:
    """Every model_type some binder handles (for tools that list what they can check)."""
    return sorted(_BY_MODEL_TYPE)


def _identify(config: Mapping[str, Any]) -> tuple[str | None, list[str]]:
    """The model_type to dispatch on (or the best name for an unknown one) and warnings."""
    model_type = config.get("model_type")
    if isinstance(model_type, str):
        return model_type, []
    notes = []
    if model_type is not None:
        notes.append(f"text config member 'model_type' is not a string ({model_type!r})")
    architectures = config.get("architectures")
    first = architectures[0] if isinstance(architectures, list) and architectures else None
    if not isinstance(first, str):
        return None, [*notes, "text config names no model_type or architectures[0]"]
    return _MODEL_TYPE_OF_ARCHITECTURE.get(first, first), notes


def bind(directory: Directory) -> BinderReport:
    """Check ``directory`` against the binder of its text architecture, if there is one."""
    text = directory.components.get("text")
    if text is None:
        return BinderReport(None, None, warnings=["no text component; no binder applies"])
    architecture, notes = _identify(text.config)
    entry = _BY_MODEL_TYPE.get(architecture) if architecture is not None else None
    if entry is None:
        shown = repr(architecture) if architecture is not None else "(unnamed)"
        notes.append(f"no binder for architecture {shown}; parameters are not checked")
        return BinderReport(architecture, None, warnings=notes)
    assert architecture is not None
    findings = Findings()  # the binder judges model_type/architectures itself
    try:
        entry.function(directory, architecture, findings)
    except Exception as exc:  # last guard, see module docstring
        findings.error(
            f"binder {entry.name} failed internally ({type(exc).__name__}: {exc}); "
            "this is a bug in the binder, not necessarily in the artifact"
        )
    return BinderReport(
        architecture,
        entry.name,
        errors=list(findings.errors),
        warnings=list(findings.warnings),
        parameters=dict(findings.parameters),
    )
