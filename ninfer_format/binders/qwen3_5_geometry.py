"""The geometry of a Qwen3.5 / Qwen3.6 text model, dense or MoE: the one reading of its text
config (spec 5.1) that the binder, the converter's adapters, the runtime and the benchmarks
share.

Every member is checked and every default and derivation applied here, nowhere else:

* the variant (dense or MoE) is ``model_type``, else the one ``architectures[0]`` names;
* ``layer_types`` is read as given; a config without it may give ``full_attention_interval``
  instead (layer i is full attention iff (i + 1) % interval == 0, Hugging Face's and
  llama.cpp's rule), and one with both must have them agree;
* attention members are needed only by full-attention layers and the MTP block, the Gated
  DeltaNet members only by linear-attention layers;
* the rotated width of each head is ``head_dim × partial_rotary_factor`` (rounded: configs
  may carry f32-rounded factors), which ``mrope_section`` must cover pair for pair.

``read_geometry`` reports each bad member as one line (the binder's report); ``from_config``
raises them together as one ``GeometryError``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import DirectoryError
from .config_reader import ConfigReader, show

DENSE = "qwen3_5_text"
MOE = "qwen3_5_moe_text"
ARCHITECTURE_OF = {DENSE: "Qwen3_5ForCausalLM", MOE: "Qwen3_5MoeForCausalLM"}
FULL_ATTENTION = "full_attention"
LINEAR_ATTENTION = "linear_attention"
LAYER_TYPES = (FULL_ATTENTION, LINEAR_ATTENTION)
WHERE = "text config member '"
#: layer_types is derived from full_attention_interval for at most this many layers, so an
#: absurd num_hidden_layers is an error line rather than a list that exhausts memory
MAX_DERIVED_LAYERS = 100_000


class GeometryError(DirectoryError):
    """A text config that does not define a geometry of ``architecture`` (a subclass names
    its own); ``problems``: one line a member."""

    architecture = "Qwen3.5"

    def __init__(self, problems: list[str]):
        message = f"text config cannot define a {self.architecture} geometry: "
        super().__init__(message + "; ".join(problems), problems=problems)


@dataclass(frozen=True)
class Attention:
    """Gated full attention: query (and gate) heads over grouped key/value heads."""

    heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int  # the first rotary_dim dims of each head rotate (partial RoPE)
    rope_theta: float
    mrope_section: tuple[int, ...]  # rotary frequency pairs per (t, h, w) position axis

    #: the integer members as the config spells them (also what error lines name)
    MEMBERS: ClassVar[dict[str, str]] = {
        "heads": "num_attention_heads",
        "kv_heads": "num_key_value_heads",
        "head_dim": "head_dim",
    }


@dataclass(frozen=True)
class Gdn:
    """Gated DeltaNet: key heads (K), value heads (a multiple of K), the short convolution."""

    key_heads: int
    key_dim: int
    value_heads: int
    value_dim: int
    conv_kernel: int

    MEMBERS: ClassVar[dict[str, str]] = {
        "key_heads": "linear_num_key_heads",
        "key_dim": "linear_key_head_dim",
        "value_heads": "linear_num_value_heads",
        "value_dim": "linear_value_head_dim",
        "conv_kernel": "linear_conv_kernel_dim",
    }

    @property
    def key_width(self) -> int:  # Kg
        return self.key_heads * self.key_dim

    @property
    def value_width(self) -> int:  # Vg
        return self.value_heads * self.value_dim

    @property
    def conv_channels(self) -> int:  # channel order [q | k | v]
        return 2 * self.key_width + self.value_width

    @property
    def ratio(self) -> int:  # value heads reading each key head
        return self.value_heads // self.key_heads


@dataclass(frozen=True)
class DenseMlp:
    intermediate: int

    MEMBERS: ClassVar[dict[str, str]] = {"intermediate": "intermediate_size"}


@dataclass(frozen=True)
class Moe:
    """Routed experts (``top_k`` of them a token) and the always-on shared expert."""

    experts: int
    top_k: int
    expert_width: int
    shared_width: int

    MEMBERS: ClassVar[dict[str, str]] = {
        "experts": "num_experts",
        "top_k": "num_experts_per_tok",
        "expert_width": "moe_intermediate_size",
        "shared_width": "shared_expert_intermediate_size",
    }


@dataclass(frozen=True)
class Qwen35Geometry:
    model_type: str  # DENSE or MOE
    hidden: int
    vocab: int
    layer_types: tuple[str, ...]
    eps: float  # rms_norm_eps
    tie_word_embeddings: bool
    max_positions: int
    attention: Attention | None  # None: no full-attention layer and no MTP block
    gdn: Gdn | None  # None: no linear-attention layer
    ffn: DenseMlp | Moe

    @property
    def layers(self) -> int:
        return len(self.layer_types)

    @property
    def moe(self) -> Moe | None:
        return self.ffn if isinstance(self.ffn, Moe) else None

    @property
    def full_attention_interval(self) -> int | None:
        """n when layer i is full attention iff (i + 1) % n == 0 (what llama.cpp's files
        record); None when the layer types follow no such pattern."""
        if FULL_ATTENTION not in self.layer_types:
            return None
        n = self.layer_types.index(FULL_ATTENTION) + 1
        return n if layer_types_for_interval(self.layers, n) == list(self.layer_types) else None

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], *, with_mtp: bool = False, model_type: str | None = None
    ) -> Qwen35Geometry:
        """The geometry of a text config, or ``GeometryError`` naming every bad member.
        ``with_mtp``: the MTP block (a full-attention block) is read too; ``model_type``
        overrides the config's."""
        problems: list[str] = []
        geometry = read_geometry(config, problems, with_mtp=with_mtp, model_type=model_type)
        if geometry is None:
            raise GeometryError(problems)
        return geometry


def layer_types_for_interval(layers: int, interval: int) -> list[str]:
    """The layer types of ``full_attention_interval``: layer i is full attention iff
    (i + 1) % interval == 0."""
    if type(interval) is not int or interval <= 0:
        raise ValueError(f"full_attention_interval must be a positive integer, got {interval!r}")
    return [FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(layers)]


def model_type_of(config: Mapping[str, Any], problems: list[str]) -> str | None:
    """DENSE or MOE: ``model_type``, else the variant ``architectures[0]`` names, else dense."""
    if "model_type" in config:
        found = config["model_type"]
        if found in ARCHITECTURE_OF:
            return found
        allowed = " or ".join(json.dumps(t) for t in ARCHITECTURE_OF)
        problems.append(f"{WHERE}model_type' must be {allowed}, got {show(found)}")
        return None
    architectures = config.get("architectures")
    first = architectures[0] if isinstance(architectures, list) and architectures else None
    return next((t for t, a in ARCHITECTURE_OF.items() if a == first), DENSE)


def read_geometry(
    config: Mapping[str, Any],
    problems: list[str],
    *,
    with_mtp: bool = False,
    model_type: str | None = None,
) -> Qwen35Geometry | None:
    """The geometry, or None after appending a line to ``problems`` for every member that
    prevents deriving it."""
    before = len(problems)
    model_type = model_type or model_type_of(config, problems)
    c = ConfigReader(config, WHERE, problems)
    hidden = c.positive_int("hidden_size")
    vocab = c.positive_int("vocab_size")
    layers = c.positive_int("num_hidden_layers")
    max_positions = c.positive_int("max_position_embeddings")
    tied = c.boolean("tie_word_embeddings")
    eps = c.positive_number("rms_norm_eps")
    layer_types = _read_layer_types(c, layers)
    types = set(layer_types or ())
    attention = gdn = None
    if FULL_ATTENTION in types:
        attention = _read_attention(c, " (full-attention layers need it)")
    elif with_mtp:
        attention = _read_attention(c, " (the mtp block is a full-attention block)")
    if LINEAR_ATTENTION in types:
        c.why = " (linear_attention layers need it)"
        gdn = _read_gdn(c)
        c.why = ""
    ffn = _read_ffn(c, model_type == MOE)
    if len(problems) > before:
        return None
    assert model_type is not None and layer_types is not None and ffn is not None
    assert hidden and vocab and eps and max_positions and tied is not None
    return Qwen35Geometry(
        model_type, hidden, vocab, layer_types, eps, tied, max_positions, attention, gdn, ffn
    )


def _ints(c: ConfigReader, members: Mapping[str, str]) -> dict[str, int | None]:
    return {attribute: c.positive_int(key) for attribute, key in members.items()}


def _read_layer_types(c: ConfigReader, layers: int | None) -> tuple[str, ...] | None:
    interval = None
    if "full_attention_interval" in c.values:
        interval = c.positive_int("full_attention_interval")
    if "layer_types" not in c.values and interval is not None:  # Hugging Face's derivation
        if layers is not None and layers > MAX_DERIVED_LAYERS:  # a list this long: no model
            c.error("layer_types", f"is missing and {layers} layers are too many to derive")
            return None
        return None if layers is None else tuple(layer_types_for_interval(layers, interval))
    types = c.string_list("layer_types")
    if types is None:
        return None
    bad = [i for i, t in enumerate(types) if t not in LAYER_TYPES]
    for i in bad:
        c.error(f"layer_types[{i}]", f"must be {' or '.join(LAYER_TYPES)}, got {show(types[i])}")
    if layers is not None and len(types) != layers:
        c.error("layer_types", f"has {len(types)} entries but num_hidden_layers is {layers}")
        return None
    if interval is not None and not bad and types != layer_types_for_interval(len(types), interval):
        c.error(
            "full_attention_interval",
            f"({interval}) disagrees with layer_types (layer i is full attention iff"
            f" (i + 1) % {interval} == 0)",
        )
        return None
    return None if bad else tuple(types)


def _read_attention(c: ConfigReader, why: str) -> Attention | None:
    c.why = why
    values = _ints(c, Attention.MEMBERS)
    heads, kv_heads, head_dim = values.values()
    rope = c.section("rope_parameters")
    theta = factor = mrope = None
    if rope is not None:
        theta = rope.positive_number("rope_theta")
        factor = rope.positive_number("partial_rotary_factor")
        mrope = rope.int_list("mrope_section", 3)
    c.why = ""
    rotary = None
    if rope is not None and factor is not None and factor > 1:
        rope.error("partial_rotary_factor", f"must be at most 1, got {show(factor)}")
    elif rope is not None and factor is not None and mrope is not None and head_dim is not None:
        # mrope splits the rotary frequency pairs over (t, h, w): 2·Σ = rotated dims.
        # Configs may carry f32-rounded factors (spec 8.6), hence a relative tolerance.
        covered = 2 * sum(mrope)
        try:
            rotated = head_dim * factor
            matches = math.isclose(covered, rotated, rel_tol=1e-6)
        except OverflowError:  # head_dim beyond float range: cannot match a real section
            rotated, matches = math.inf, False
        if matches:
            rotary = round(rotated)
        else:
            rope.error(
                "mrope_section",
                f"covers {covered} rotated dims but head_dim × partial_rotary_factor = {rotated:g}",
            )
    if heads is not None and kv_heads is not None and heads % kv_heads:
        c.error(
            "num_attention_heads",
            f"({heads}) must be a multiple of num_key_value_heads ({kv_heads})",
        )
    if None in values.values() or rotary is None or theta is None or mrope is None:
        return None
    rope_members = dict(rotary_dim=rotary, rope_theta=theta, mrope_section=tuple(mrope))
    return Attention(**values, **rope_members)  # type: ignore[arg-type]


def _read_gdn(c: ConfigReader) -> Gdn | None:
    values = _ints(c, Gdn.MEMBERS)
    key_heads, value_heads = values["key_heads"], values["value_heads"]
    if key_heads is not None and value_heads is not None and value_heads % key_heads:
        c.error(
            "linear_num_value_heads",
            f"({value_heads}) must be a multiple of linear_num_key_heads ({key_heads})",
        )
    if None in values.values():
        return None
    return Gdn(**values)  # type: ignore[arg-type]


def _read_ffn(c: ConfigReader, moe: bool) -> DenseMlp | Moe | None:
    if not moe:
        values = _ints(c, DenseMlp.MEMBERS)
        return None if None in values.values() else DenseMlp(**values)  # type: ignore[arg-type]
    values = _ints(c, Moe.MEMBERS)
    experts, top_k = values["experts"], values["top_k"]
    if experts is not None and top_k is not None and top_k > experts:
        c.error("num_experts_per_tok", f"({top_k}) exceeds num_experts ({experts})")
    if None in values.values():
        return None
    return Moe(**values)  # type: ignore[arg-type]
