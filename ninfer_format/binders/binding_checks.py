"""Binding checks: every expected parameter bound once, with its shape and a format that suits
its role; bindings a binder does not expect are reported."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from ..schema import Directory, PartsBinding, Resource, Tensor, WholeBinding
from .parameter_spec import ParamSpec, Role
from .registry import Findings

Binding = WholeBinding | PartsBinding
Objects = Mapping[str, Tensor | Resource]

DIRECT_FORMATS = frozenset({"bf16", "fp32"})
INTEGER_FORMATS = frozenset({"int32", "int64"})
FLOAT_MATRIX_FORMATS = frozenset(
    {
        "bf16",
        "fp32",
        "q4_g64_fp16",
        "q5_g64_fp16",
        "q6_g64_fp16",
        "q8_g32_fp16",
        "nf4_g64_fp16",
        "nvfp4",
        "fp8_e4m3fn_row_bf16",
    }
)
GGUF_PREFIX = "gguf_"


def _describe(tensor: Tensor) -> str:
    return f"object {tensor.id!r} ({tensor.format} {list(tensor.shape)})"


def _tensors(binding: Binding, objects: Objects) -> list[Tensor] | str:
    """The tensors a binding reads, or a reason why they cannot be resolved."""
    if isinstance(binding, WholeBinding):
        ids = [binding.object]
    else:
        ids = [p.object for p in binding.parts]
    out = []
    for object_id in ids:
        obj = objects.get(object_id)
        if not isinstance(obj, Tensor):
            return f"object {object_id!r} is {'not a tensor' if obj else 'not in the directory'}"
        out.append(obj)
    return out


def _unique(tensors: Iterable[Tensor]) -> list[Tensor]:
    return list({t.id: t for t in tensors}.values())


def _format_problem(role: Role, fmt: str) -> tuple[str, str] | None:
    """(severity, reason) when ``fmt`` does not suit ``role``; None when it does."""
    if role is Role.MATRIX:
        if fmt in FLOAT_MATRIX_FORMATS or fmt.startswith(GGUF_PREFIX):
            return None
        if fmt in INTEGER_FORMATS:
            return "error", f"a weight matrix cannot be stored in the integer format {fmt}"
        return "warning", f"format {fmt} is not a float weight format this binder knows"
    if role in (Role.VECTOR, Role.CONVOLUTION):
        if fmt in DIRECT_FORMATS:
            return None
        return "error", f"a {role.value} must be stored as bf16 or fp32, not {fmt}"
    wanted = "fp32" if role is Role.FP32_VECTOR else "int32"
    return None if fmt == wanted else ("error", f"must be stored as {wanted}, not {fmt}")


def _check_binding(spec: ParamSpec, binding: Binding, objects: Objects, f: Findings) -> None:
    tensors = _tensors(binding, objects)
    if isinstance(tensors, str):
        f.error(f"{spec.name}: {tensors}")
        return
    shape = list(spec.shape)
    if isinstance(binding, WholeBinding):
        if tuple(tensors[0].shape) != spec.shape:
            f.error(f"{spec.name}: {_describe(tensors[0])} does not have the shape {shape}")
    else:
        if spec.role is Role.TOKEN_IDS:
            f.error(f"{spec.name}: must bind a whole int32 object, not parts")
        total = sum(p.elements for p in binding.parts)
        if total != spec.elements:
            f.error(
                f"{spec.name}: parts total {total} elements but the parameter {shape} has"
                f" {spec.elements}"
            )
    for tensor in _unique(tensors):
        problem = _format_problem(spec.role, tensor.format)
        if problem is not None:
            severity, reason = problem
            line = f"{spec.name}: {_describe(tensor)}: {reason}"
            (f.error if severity == "error" else f.warning)(line)


def _check_bindings(
    directory: Directory,
    specs: Mapping[str, ParamSpec],
    objects: Objects,
    f: Findings,
    prefixes: tuple[str, ...],
) -> None:
    """``prefixes``: the parameter-name prefixes whose every binding must be an expected one."""
    components = directory.components
    unchecked: Counter[str] = Counter()
    for name, binding in directory.bindings.items():
        spec = specs.get(name)
        if spec is not None:
            _check_binding(spec, binding, objects, f)
        elif name.startswith(prefixes):
            hint = _absence_hint(name, directory)
            f.error(f"{name}: bound but not a parameter of this model{hint}")
        else:
            component = name.split("/", 1)[0]
            if component in components:
                unchecked[component] += 1
            else:
                f.error(f"{name}: bound but there is no component {component!r}")
    # vision is reported by bind_qwen3_5 itself when its config cannot be read
    for component in sorted(set(components) - {"text", "mtp", "vision"}):
        f.warning(
            f"component {component!r} ({unchecked[component]} bound parameters):"
            " not checked by this binder"
        )
    missing = [
        f"{spec.name}: not bound (expected shape {list(spec.shape)})"
        for spec in specs.values()
        if spec.name not in directory.bindings
    ]
    f.errors_capped(missing, "unbound parameters")


def _absence_hint(name: str, directory: Directory) -> str:
    if name.startswith("mtp/") and "mtp" not in directory.components:
        return " (there is no mtp component)"
    proposal = directory.components["text"].proposal
    if name.startswith("proposal/") and (proposal is None or proposal.domain != "indexed"):
        return " (text has no indexed proposal)"
    return ""
