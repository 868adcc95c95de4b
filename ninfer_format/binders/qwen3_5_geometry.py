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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import DirectoryError
from .config_reader import ConfigReader, show

# the blocks' records, with their readers (callers import the records from here too)
from .qwen3_5_parts import Attention, DenseMlp, Gdn, Moe, _read_attention, _read_ffn, _read_gdn

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
