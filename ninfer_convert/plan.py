"""From logical parameters and a recipe to the artifact's objects, bindings and uses.

Packing follows spec 5.2: members of a group share one parent (rows stacked) when their
choices agree, the recipe does not separate them, and the stacked shape fits the layout;
larger groups are tried first. Vision blocks have groups of their own (upstream's adapter packs
query/key/value and their biases), so a vision name never joins a text group. Parameters with
identical sources and choices (a tied head) share one object. Encoded imports add one rule:
NVFP4 members share a parent only when their weight divisors allow it (``Stacking``).
Auxiliary objects (per-Use activation divisors, input column maps) are numbered after the
weights.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ninfer_format.codecs import codec_for
from ninfer_format.errors import CodecError

from .adapters import LogicalTensor
from .errors import RecipeError
from .recipe import Choice, Recipe

PACK_GROUPS: tuple[tuple[str, ...], ...] = (
    ("attention/query", "attention/key", "attention/gate", "attention/value"),
    ("attention/query", "attention/key"),
    ("attention/gate", "attention/value"),
    ("gdn/query", "gdn/key", "gdn/value", "gdn/z"),
    ("gdn/query", "gdn/key"),
    ("gdn/value", "gdn/z"),
    ("gdn/a_projection", "gdn/b_projection"),
    ("mlp/gate", "mlp/up"),
    ("moe/router", "moe/shared_score"),
    ("moe/shared/gate", "moe/shared/up"),
    # a hyper-connection's low-rank mixer and inject weights read the same normed streams
    ("mixer_connection/down", "mixer_connection/inject"),
    ("ffn_connection/down", "ffn_connection/inject"),
)
VISION_PACK_GROUPS: tuple[tuple[str, ...], ...] = (
    ("attention/query", "attention/key", "attention/value"),
    ("attention/query_bias", "attention/key_bias", "attention/value_bias"),
)


def _pack_templates(name: str) -> tuple[tuple[str, ...], ...]:
    return VISION_PACK_GROUPS if name.startswith("vision/") else PACK_GROUPS


def layout_of(format: str) -> str:
    if format in ("bf16", "fp32", "int32"):
        return "contiguous_le_v1"
    if format == "nvfp4":
        return "block_scale_k16_m128x4_v1"
    if format == "fp8_e4m3fn_row_bf16":
        return "row_scale_v1"
    if format.startswith("gguf_"):
        return "gguf_blocks_v1"
    return "row_split_k128_v1"


@dataclass
class Parent:
    """One tensor object of the artifact: one or more parameters stacked by rows."""

    id: str
    members: list[LogicalTensor]
    choice: Choice
    shape: tuple[int, ...]
    divisors: int | None = None

    @property
    def layout(self) -> str:
        return layout_of(self.choice.format)

    @property
    def stacked(self) -> list[LogicalTensor]:
        """Members that own rows of the parent (a shared member reuses another's rows)."""
        out, seen = [], set()
        for m in self.members:
            if m.identity not in seen:
                seen.add(m.identity)
                out.append(m)
        return out


def _expert_banks(names: list[str]) -> list[tuple[str, list[str]]]:
    """All experts' {gate, up} of a block, and all experts' down, as packing groups."""
    banks: dict[tuple[str, str], list[str]] = {}
    for name in names:
        if "/moe/experts/" in name:
            prefix, rest = name.split("/moe/experts/")
            which = rest.split("/")[1]
            key = (prefix, "down" if which == "down" else "gate_up")
            banks.setdefault(key, []).append(name)
    return [(members[0], members) for members in banks.values()]


#: for members about to share a parent: 0 if they may not, else the parent's divisor count
#: (1 = one divisor or none; n > 1 = one divisor per stacked member, EXT-ALL ``divisors``)
Stacking = Callable[[Sequence[LogicalTensor], Choice], int]


def _one_divisor(members: Sequence[LogicalTensor], choice: Choice) -> int:
    return 1


def _fits(
    members: list[LogicalTensor], choice: Choice, divisors: int = 1
) -> tuple[int, ...] | None:
    shapes = {m.shape[1:] for m in members}
    ranks = {len(m.shape) for m in members}
    if len(shapes) != 1 or ranks not in ({1}, {2}):  # matrices by rows, vectors end to end
        return None
    shape = (sum(m.shape[0] for m in members), *members[0].shape[1:])
    try:
        codec_for(choice.format, layout_of(choice.format)).check_shape(shape, divisors)
    except CodecError:
        return None
    return shape


def plan_parents(
    logical: dict[str, LogicalTensor],
    recipe: Recipe,
    *,
    choices: Mapping[str, Choice] | None = None,
    stacking: Stacking = _one_divisor,
) -> list[Parent]:
    """Parents in emission order. ``choices`` (default: the recipe's) may be resolved
    further by the caller, e.g. a GGUF tensor's own block format."""
    if choices is None:
        choices = {name: recipe.choice(name, t.role) for name, t in logical.items()}
    names = list(logical)
    groups: dict[str, list[list[str]]] = {}
    for name in names:
        for template in _pack_templates(name):
            if name.endswith("/" + template[0]):
                prefix = name[: -len(template[0])]
                groups.setdefault(name, []).append([prefix + s for s in template])
    for first, members in _expert_banks(names):
        groups.setdefault(first, []).insert(0, members)

    parents: list[Parent] = []
    placed: dict[str, Parent] = {}
    shared: dict[tuple[Any, ...], Parent] = {}
    for name in names:
        if name in placed:
            continue
        members, divisors = [name], 1
        for candidate in groups.get(name, []):
            if not all(
                m in logical
                and m not in placed
                and not recipe.is_separate(m)
                and choices[m].pack_key == choices[name].pack_key
                for m in candidate
            ):
                continue
            tensors = [logical[m] for m in candidate]
            count = stacking(tensors, choices[name])
            if count and _fits(tensors, choices[name], count):
                members, divisors = candidate, count
                break
        tensors = [logical[m] for m in members]
        key = (tuple(t.identity for t in tensors), choices[name].pack_key)
        if key in shared:  # e.g. a tied output head: same source, same encoding
            placed[name] = shared[key]
            shared[key].members.append(logical[name])
            continue
        shape = _fits(tensors, choices[name], divisors) if len(tensors) > 1 else tensors[0].shape
        assert shape is not None
        parent = Parent(
            f"weight/{len(parents):06d}",
            tensors,
            choices[name],
            shape,
            divisors if divisors > 1 else None,
        )
        try:
            codec_for(parent.choice.format, parent.layout).check_shape(shape, divisors)
        except CodecError as exc:
            raise RecipeError(f"recipe {recipe.name}: {name}: {exc}") from None
        parents.append(parent)
        shared[key] = parent
        for m in members:
            placed[m] = parent
    return parents


def bindings_and_uses(
    parents: list[Parent],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Bindings (whole object or element ranges) and one Use per (parameter, input site)."""
    bindings: dict[str, Any] = {}
    uses: list[dict[str, Any]] = []
    for parent in parents:
        start = 0
        seen_pieces: dict[Any, tuple[int, int]] = {}
        for m in parent.members:
            key = m.identity
            if key in seen_pieces:  # shared object: same range as the first holder
                begin, end = seen_pieces[key]
            else:
                begin, end = start, start + m.elements
                seen_pieces[key] = (begin, end)
                start = end
            whole = begin == 0 and m.shape == parent.shape
            bindings[m.name] = (
                {"object": parent.id}
                if whole
                else {"parts": [{"object": parent.id, "range": [begin, end]}]}
            )
            for site in m.inputs:
                uses.append(
                    {"parameter": m.name, "input": site, "activation_policy": parent.choice.policy}
                )
    return bindings, uses


@dataclass(frozen=True)
class Auxiliary:
    """A small object a Use binds by role (spec 2.6): written after every weight."""

    id: str
    format: str
    shape: tuple[int, ...]
    data: bytes


#: the auxiliaries one Use needs: role -> (format, shape, bytes)
AuxiliaryValues = dict[str, tuple[str, tuple[int, ...], bytes]]


def attach_auxiliaries(
    parents: list[Parent],
    uses: list[dict[str, Any]],
    provide: Callable[[Parent, dict[str, Any]], AuxiliaryValues],
) -> list[Auxiliary]:
    """Ask ``provide`` for every Use's auxiliaries, give each its own object and bind it.

    One object per (Use, role), never shared, so two aliased parameters (or two sites of one
    parameter) can later carry different values without renumbering.
    """
    owner = {m.name: p for p in parents for m in p.members}
    out: list[Auxiliary] = []
    for use in uses:
        for role, (fmt, shape, data) in provide(owner[use["parameter"]], use).items():
            aux = Auxiliary(f"auxiliary/{len(out):06d}", fmt, shape, data)
            use.setdefault("auxiliaries", {})[role] = {"object": aux.id}
            out.append(aux)
    return out
