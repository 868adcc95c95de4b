"""Binder for the Qwen3.5 family (spec section 5): dense, MoE, MTP, vision and the proposal head.

Every expected parameter name, shape and Use input is derived from the component configs (text,
and the vision component's own config), so an artifact is checked against its own geometry
rather than against a list of known checkpoints. The text geometry is ``qwen3_5_geometry``'s,
the one reading of a text config that the runtime and the converter share. The name tables
below are written one small generator per block type, in the order of the spec's tables
5.2-5.4, so they can be read side by side with them.

DFlash components are not checked here (they carry their own geometry that this binder does not
model); the report says so instead of silently passing them.
"""

from __future__ import annotations

import enum
import itertools
import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import DirectoryError
from ..schema import Component, Directory, PartsBinding, Resource, Tensor, Use, WholeBinding
from .config_reader import MISSING, ConfigReader, show
from .qwen3_5_geometry import (
    ARCHITECTURE_OF,
    DENSE,
    FULL_ATTENTION,
    MOE,
    Attention,
    DenseMlp,
    Gdn,
    Moe,
    read_geometry,
)
from .qwen3_5_geometry import Qwen35Geometry as Geometry
from .registry import Findings, register_binder

Binding = WholeBinding | PartsBinding
Objects = Mapping[str, Tensor | Resource]

MTP_ARCHITECTURE_OF = {DENSE: "Qwen3_5MTP", MOE: "Qwen3_5MoeMTP"}
#: spec 5.1: the vision tower's model_type follows the text variant it feeds
VISION_MODEL_TYPE_OF = {DENSE: "qwen3_5_vision", MOE: "qwen3_5_moe_vision"}
#: spec 5.1 vision config members, all positive integers
VISION_MEMBERS = (
    "depth",
    "hidden_size",
    "intermediate_size",
    "num_heads",
    "patch_size",
    "temporal_patch_size",
    "spatial_merge_size",
    "num_position_embeddings",
)
#: spec 5.4 fixes the patch embedding's input width at 3 colour channels
PATCH_CHANNELS = 3

#: Components that read hidden states through a head: each adds a Use input on the text head
#: and on ``proposal/head``. Only mtp is checked by this binder; dflash/dflash2 are not.
DRAFTERS = ("mtp", "dflash", "dflash2")
#: Parameter-name prefixes this binder owns; anything else bound under them is unexpected.
#: ``vision/`` joins them when the vision component's config defines a geometry.
CHECKED_PREFIXES = ("text/", "mtp/", "proposal/")
TEXT_RESOURCE_ROLES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
)
#: spec 5.7: the image processor config is what a frontend cannot do without; video is optional
VISION_REQUIRED_ROLES = ("preprocessor_config.json",)
VISION_RESOURCE_ROLES = (*VISION_REQUIRED_ROLES, "video_preprocessor_config.json")

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

#: Expected-parameter enumeration stops this far beyond the number of bindings: a config
#: claiming e.g. 10**9 experts must yield an error line, not exhaust memory.
ENUMERATION_SLACK = 100_000


# ---------------------------------------------------------------------------------------------
# Parameter specs


class Role(enum.Enum):
    """How a parameter is consumed, which decides the formats it may be stored in."""

    MATRIX = "matrix"  # multiplied with activations (or gathered): any float weight format
    VECTOR = "vector"  # norms: read elementwise, so a direct format
    FP32_VECTOR = "fp32 vector"  # GDN a_log / dt_bias: the recurrence needs full precision
    CONVOLUTION = "convolution"  # GDN short convolution, read elementwise: direct
    TOKEN_IDS = "token ids"  # proposal row -> token id map: int32 whole object


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    role: Role
    inputs: tuple[str, ...] = ()

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


def _matrix(name: str, rows: int, cols: int, *inputs: str) -> ParamSpec:
    return ParamSpec(name, (rows, cols), Role.MATRIX, inputs)


def _vector(name: str, length: int) -> ParamSpec:
    return ParamSpec(name, (length,), Role.VECTOR)


def _fp32_vector(name: str, length: int) -> ParamSpec:
    return ParamSpec(name, (length,), Role.FP32_VECTOR)


# ---------------------------------------------------------------------------------------------
# Vision geometry (the text geometry is qwen3_5_geometry's)


@dataclass(frozen=True)
class Vision:
    """Vision tower geometry (spec 5.1 vision members); the merger's output width is the text
    hidden size, so it is not part of this record."""

    depth: int
    hidden: int  # h
    intermediate: int  # I_v
    heads: int
    patch: int  # ps
    temporal_patch: int  # pt
    merge: int  # spatial_merge_size
    positions: int  # num_position_embeddings

    @property
    def patch_width(self) -> int:
        """Input width of the patch embedding: one flattened [3, pt, ps, ps] patch."""
        return PATCH_CHANNELS * self.temporal_patch * self.patch * self.patch

    @property
    def merged(self) -> int:  # m: merge x merge neighbouring patches concatenated
        return self.merge * self.merge * self.hidden


# ---------------------------------------------------------------------------------------------
# Name tables (spec 5.2, 5.3, 5.6), one generator per block type


def _text_globals(g: Geometry, drafters: Sequence[str]) -> Iterator[ParamSpec]:
    head_inputs = ("text/final_hidden", *(f"{d}/final_hidden" for d in drafters))
    yield _matrix("text/token_embedding", g.vocab, g.hidden)  # gathered, never multiplied
    yield _matrix("text/output_head", g.vocab, g.hidden, *head_inputs)
    yield _vector("text/final_norm", g.hidden)


def _attention_block(L: str, a: Attention, hidden: int) -> Iterator[ParamSpec]:
    q, kv, x = a.heads * a.head_dim, a.kv_heads * a.head_dim, L + "mixer_input"
    yield _matrix(L + "attention/query", q, hidden, x)
    yield _matrix(L + "attention/gate", q, hidden, x)
    yield _matrix(L + "attention/key", kv, hidden, x)
    yield _matrix(L + "attention/value", kv, hidden, x)
    yield _vector(L + "attention/query_norm", a.head_dim)
    yield _vector(L + "attention/key_norm", a.head_dim)
    yield _matrix(L + "attention/output", hidden, q, L + "attention/gated_output")


def _gdn_block(L: str, n: Gdn, hidden: int) -> Iterator[ParamSpec]:
    kg, vg, x = n.key_width, n.value_width, L + "mixer_input"
    yield _fp32_vector(L + "gdn/a_log", n.value_heads)
    yield _fp32_vector(L + "gdn/dt_bias", n.value_heads)
    yield ParamSpec(L + "gdn/convolution", (n.conv_kernel, 2 * kg + vg), Role.CONVOLUTION)
    yield _matrix(L + "gdn/a_projection", n.value_heads, hidden, x)
    yield _matrix(L + "gdn/b_projection", n.value_heads, hidden, x)
    yield _matrix(L + "gdn/query", kg, hidden, x)
    yield _matrix(L + "gdn/key", kg, hidden, x)
    yield _matrix(L + "gdn/value", vg, hidden, x)
    yield _matrix(L + "gdn/z", vg, hidden, x)
    yield _vector(L + "gdn/norm", n.value_dim)
    yield _matrix(L + "gdn/output", hidden, vg, L + "gdn/gated_output")


def _dense_mlp(L: str, m: DenseMlp, hidden: int) -> Iterator[ParamSpec]:
    x = L + "ffn_input"
    yield _matrix(L + "mlp/gate", m.intermediate, hidden, x)
    yield _matrix(L + "mlp/up", m.intermediate, hidden, x)
    yield _matrix(L + "mlp/down", hidden, m.intermediate, L + "mlp/product")


def _moe(L: str, m: Moe, hidden: int) -> Iterator[ParamSpec]:
    x = L + "ffn_input"
    yield _matrix(L + "moe/router", m.experts, hidden, x)
    yield _matrix(L + "moe/shared_score", 1, hidden, x)
    for e in range(m.experts):
        expert = f"{L}moe/experts/{e}/"
        yield _matrix(expert + "gate", m.expert_width, hidden, x)
        yield _matrix(expert + "up", m.expert_width, hidden, x)
        yield _matrix(expert + "down", hidden, m.expert_width, expert + "product")
    yield _matrix(L + "moe/shared/gate", m.shared_width, hidden, x)
    yield _matrix(L + "moe/shared/up", m.shared_width, hidden, x)
    yield _matrix(L + "moe/shared/down", hidden, m.shared_width, L + "moe/shared/product")


def _decoder_layer(L: str, layer_type: str, g: Geometry) -> Iterator[ParamSpec]:
    yield _vector(L + "input_norm", g.hidden)
    yield _vector(L + "post_attention_norm", g.hidden)
    if layer_type == FULL_ATTENTION:
        assert g.attention is not None  # the config reader requires it for such layers
        yield from _attention_block(L, g.attention, g.hidden)
    else:
        assert g.gdn is not None
        yield from _gdn_block(L, g.gdn, g.hidden)
    if isinstance(g.ffn, Moe):
        yield from _moe(L, g.ffn, g.hidden)
    else:
        yield from _dense_mlp(L, g.ffn, g.hidden)


def _mtp(g: Geometry) -> Iterator[ParamSpec]:
    # Concat order of the stem input is embedding first, hidden second: [H, 2H].
    yield _matrix("mtp/input_projection", g.hidden, 2 * g.hidden, "mtp/stem_input")
    yield _vector("mtp/embedding_norm", g.hidden)
    yield _vector("mtp/hidden_norm", g.hidden)
    yield _vector("mtp/final_norm", g.hidden)
    yield from _decoder_layer("mtp/layers/0/", FULL_ATTENTION, g)


def _proposal(rows: int, hidden: int, drafters: Sequence[str]) -> Iterator[ParamSpec]:
    yield _matrix("proposal/head", rows, hidden, *(f"{d}/final_hidden" for d in drafters))
    yield ParamSpec("proposal/token_ids", (rows,), Role.TOKEN_IDS)


def _vision_block(V: str, v: Vision) -> Iterator[ParamSpec]:
    h, width = v.hidden, v.intermediate
    for norm in ("norm1_weight", "norm1_bias", "norm2_weight", "norm2_bias"):
        yield _vector(V + norm, h)
    for projection in ("query", "key", "value"):
        yield _matrix(f"{V}attention/{projection}", h, h, V + "attention_input")
    for projection in ("query", "key", "value"):
        yield _vector(f"{V}attention/{projection}_bias", h)
    yield _matrix(V + "attention/output", h, h, V + "attention_output")
    yield _vector(V + "attention/output_bias", h)
    yield _matrix(V + "mlp/fc1", width, h, V + "mlp_input")
    yield _vector(V + "mlp/fc1_bias", width)
    yield _matrix(V + "mlp/fc2", h, width, V + "mlp_activation")
    yield _vector(V + "mlp/fc2_bias", h)


def _vision(v: Vision, text_hidden: int) -> Iterator[ParamSpec]:
    yield _matrix("vision/patch_embedding", v.hidden, v.patch_width, "vision/patch_input")
    yield _vector("vision/patch_embedding_bias", v.hidden)
    # Rows are gathered and interpolated per image grid, never multiplied with activations.
    yield _matrix("vision/position_embedding", v.positions, v.hidden)
    for i in range(v.depth):
        yield from _vision_block(f"vision/layers/{i}/", v)
    m = v.merged
    yield _vector("vision/merger/norm_weight", v.hidden)
    yield _vector("vision/merger/norm_bias", v.hidden)
    yield _matrix("vision/merger/fc1", m, m, "vision/merger/input")
    yield _vector("vision/merger/fc1_bias", m)
    # The merger's output enters the text model as token embeddings: width H.
    yield _matrix("vision/merger/fc2", text_hidden, m, "vision/merger/activation")
    yield _vector("vision/merger/fc2_bias", text_hidden)


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


# ---------------------------------------------------------------------------------------------
# Config reading: free-form JSON in, typed geometry or error lines out


def _read_vision(config: Mapping[str, Any], text_hidden: int, findings: Findings) -> Vision | None:
    """The vision geometry, or None after reporting every member that prevents deriving it.

    Members that do not change a shape (head count, the optional HF ``in_channels`` and
    ``out_hidden_size``) are still checked, but a bad one does not stop the parameter checks.
    """
    c = ConfigReader(config, "vision config member '", findings.errors)
    values = [c.positive_int(key) for key in VISION_MEMBERS]
    _, hidden, _, heads, *_ = values
    if hidden is not None and heads is not None and hidden % heads:
        c.error("hidden_size", f"({hidden}) must be a multiple of num_heads ({heads})")
    # Spec 5.4 fixes the patch width at 3·pt·ps·ps and the merger output at the text width;
    # HF configs may still spell both out, and then they must agree.
    for key, wanted in (("in_channels", PATCH_CHANNELS), ("out_hidden_size", text_hidden)):
        if key in config and config[key] != wanted:
            c.error(key, f"must be {wanted} when present, got {show(config[key])}")
    if None in values:
        return None
    return Vision(*values)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Component-level checks


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


def _check_mtp_component(directory: Directory, model_type: str, findings: Findings) -> None:
    mtp = directory.components["mtp"]
    expected = [MTP_ARCHITECTURE_OF[model_type]]
    architectures = mtp.config.get("architectures", MISSING)
    if architectures != expected:
        findings.error(
            f"mtp config member 'architectures' must be {json.dumps(expected)} with a"
            f" {model_type} text component, got {show(architectures)}"
        )
    if mtp.target != "text":
        findings.error(f'mtp component must have target "text", got {show(mtp.target)}')


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


def _check_vision_component(
    directory: Directory, model_type: str, findings: Findings, expected: str | None = None
) -> None:
    """Identity, target and resources of the vision component; its geometry is read later.
    ``expected``: the tower's model_type (default: the Qwen3.5 variant's, spec 5.1), which
    another architecture carrying the same tower passes as its own."""
    vision: Component = directory.components["vision"]
    expected = expected or VISION_MODEL_TYPE_OF[model_type]
    found = vision.config.get("model_type", MISSING)
    if found != expected:
        findings.error(
            f"vision config member 'model_type' must be {json.dumps(expected)} with a"
            f" {model_type} text component, got {show(found)}"
        )
    if vision.target != "text":
        findings.error(f'vision component must have target "text", got {show(vision.target)}')
    _check_resources("vision", directory, VISION_REQUIRED_ROLES, VISION_RESOURCE_ROLES, findings)


def _proposal_rows(
    directory: Directory, g: Geometry, drafters: Sequence[str], findings: Findings
) -> int | None:
    proposal = directory.components["text"].proposal
    if proposal is None or proposal.domain != "indexed" or proposal.rows is None:
        return None
    if proposal.rows > g.vocab:
        findings.error(f"text proposal rows ({proposal.rows}) exceed vocab_size ({g.vocab})")
    if not drafters:
        findings.warning("text has an indexed proposal but no drafter component reads it")
    return proposal.rows


# ---------------------------------------------------------------------------------------------
# Binding checks


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
    prefixes: tuple[str, ...] = CHECKED_PREFIXES,
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


# ---------------------------------------------------------------------------------------------
# Use checks


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
