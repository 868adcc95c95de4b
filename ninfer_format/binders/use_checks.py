"""Use checks: every expected (parameter, input) site declared once, with an activation policy
its weights can serve and auxiliaries of the right shape and format."""

from __future__ import annotations

from collections.abc import Mapping

from ..schema import Directory, Tensor, Use, WholeBinding
from .binding_checks import GGUF_PREFIX, Binding, Objects, _describe, _tensors, _unique
from .parameter_spec import ParamSpec
from .registry import Findings


def _use_site(use: Use) -> str:
    return f"use {use.parameter} @ {use.input}"


def _aux_vector(
    where: str, role: str, aux: Binding, fmt: str, length: int, objects: Objects, f: Findings
) -> bool:
    """Shared shape/format rule of the EXT vector auxiliaries: ``fmt`` values, ``[length]``."""
    tensors = _tensors(aux, objects)
    if isinstance(tensors, str):
        f.error(f"{where}: {role} {tensors}")
        return False
    formats = sorted({t.format for t in tensors})
    if isinstance(aux, WholeBinding):
        size_ok = list(tensors[0].shape) == [length]
        got = _describe(tensors[0])
    else:
        total = sum(p.elements for p in aux.parts)
        size_ok = total == length
        got = f"parts of {total} {'/'.join(formats)} elements"
    if formats != [fmt] or not size_ok:
        f.error(f"{where}: {role} must be {fmt} [{length}] (the weight's input width), got {got}")
        return False
    return True


def _check_divisor(
    where: str, aux: Binding, spec: ParamSpec, weights: list[Tensor], objects: Objects, f: Findings
) -> None:
    tensors = _tensors(aux, objects)
    if isinstance(tensors, str):
        f.error(f"{where}: activation_input_divisor {tensors}")
        return
    if isinstance(aux, WholeBinding):
        ok = tensors[0].format == "fp32" and list(tensors[0].shape) == []
        got = _describe(tensors[0])
    else:
        part = aux.parts[0]
        ok = (
            len(aux.parts) == 1
            and part.elements == 1
            and tensors[0].format == "fp32"
            and len(tensors[0].shape) == 1
        )
        got = f"{len(aux.parts)} part(s) of {sum(p.elements for p in aux.parts)} element(s)"
        got += f" of {_describe(tensors[0])}"
    if not ok:
        f.error(
            f"{where}: activation_input_divisor must bind an fp32 scalar (shape []) or one"
            f" element of an fp32 vector, got {got}"
        )


def _check_input_columns(
    where: str, aux: Binding, spec: ParamSpec, weights: list[Tensor], objects: Objects, f: Findings
) -> None:
    _aux_vector(where, "input_columns", aux, "int32", spec.shape[-1], objects, f)
    other = sorted({w.format for w in weights if not w.format.startswith(GGUF_PREFIX)})
    if other:
        f.error(f"{where}: input_columns only applies to gguf_* weights, the weight is {other}")


def _check_hadamard_signs(
    where: str, aux: Binding, spec: ParamSpec, weights: list[Tensor], objects: Objects, f: Findings
) -> None:
    width = spec.shape[-1]
    if _aux_vector(where, "hadamard_signs", aux, "bf16", width, objects, f) and width % 1024:
        f.error(
            f"{where}: hadamard_signs needs an input width that is a multiple of 1024, got {width}"
        )


_AUXILIARY_CHECKS = {
    "activation_input_divisor": _check_divisor,
    "input_columns": _check_input_columns,
    "hadamard_signs": _check_hadamard_signs,
}


def _check_use(
    use: Use, spec: ParamSpec, directory: Directory, objects: Objects, f: Findings
) -> None:
    where = _use_site(use)
    weights = _tensors(directory.bindings[use.parameter], objects)
    if isinstance(weights, str):
        return  # the binding check already reported it
    weights = _unique(weights)
    auxiliaries = use.auxiliaries or {}
    policy = use.activation_policy
    if policy is None:
        f.warning(
            f"{where}: no activation_policy (the binder requires one; A16Only is the safe reading)"
        )
    elif policy == "AllowA4":
        for weight in weights:
            if weight.format != "nvfp4":
                f.error(
                    f"{where}: AllowA4 but {_describe(weight)} is not nvfp4; the weight"
                    " cannot serve A4 activations"
                )
        if "activation_input_divisor" not in auxiliaries:
            f.error(f"{where}: AllowA4 needs an activation_input_divisor auxiliary")
    if policy != "AllowA4" and "activation_input_divisor" in auxiliaries:
        f.warning(f"{where}: activation_input_divisor is only read by AllowA4 uses")
    for role, aux in auxiliaries.items():
        check = _AUXILIARY_CHECKS.get(role)
        if check is None:
            known = ", ".join(sorted(_AUXILIARY_CHECKS))
            f.error(f"{where}: unknown auxiliary role {role!r} (known: {known})")
        else:
            check(where, aux, spec, weights, objects, f)


def _check_uses(
    directory: Directory, specs: Mapping[str, ParamSpec], objects: Objects, f: Findings
) -> None:
    expected = {
        (spec.name, site)
        for spec in specs.values()
        if spec.name in directory.bindings  # an unbound parameter is reported once, as unbound
        for site in spec.inputs
    }
    seen: set[tuple[str, str]] = set()
    for use in directory.uses:
        spec = specs.get(use.parameter)
        if spec is None:
            continue  # unexpected or unchecked parameter: reported (or skipped) with bindings
        if (use.parameter, use.input) not in expected:
            defined = ", ".join(spec.inputs) or "none"
            f.error(f"{_use_site(use)}: input not defined for this parameter (defined: {defined})")
            continue
        seen.add((use.parameter, use.input))
        _check_use(use, spec, directory, objects, f)
    unused = expected - seen
    missing = [
        f"use {spec.name} @ {site}: missing"
        for spec in specs.values()
        for site in spec.inputs
        if (spec.name, site) in unused
    ]
    f.errors_capped(missing, "missing uses")
