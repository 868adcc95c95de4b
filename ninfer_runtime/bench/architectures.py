"""What the bench needs to know of each architecture it synthesizes and measures, in one small
record a model type: how its config is read (the format's geometry class and contract, never
parsed here), what kinds of decoder layer it has, how a config is cut down to some of its
layers, and which of its weights a decode step reads only in part (gathered rows, routed
experts).

A reduced artifact (``ninfer-bench synth --layers N``) keeps every kind of layer at full
width, so the time of each kind measured on it stands in for every layer of that kind in the
whole model (``extrapolate``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ninfer_format.binders import glm5_next as glm_binder
from ninfer_format.binders import qwen3_5 as qwen35_binder
from ninfer_format.binders import qwen4_exp as qwen4_binder
from ninfer_format.binders.glm5_next_geometry import (
    ARCHITECTURE as GLM5_NEXT_ARCHITECTURE,
)
from ninfer_format.binders.glm5_next_geometry import (
    FULL_INDEXER,
    Glm5NextGeometry,
)
from ninfer_format.binders.glm5_next_geometry import MODEL_TYPES as GLM5_NEXT_TYPES
from ninfer_format.binders.qwen3_5_geometry import FULL_ATTENTION, Qwen35Geometry
from ninfer_format.binders.qwen4_exp_geometry import ARCHITECTURE as QWEN4_EXP_ARCHITECTURE
from ninfer_format.binders.qwen4_exp_geometry import DEFAULTS as QWEN4_EXP_DEFAULTS
from ninfer_format.binders.qwen4_exp_geometry import MODEL_TYPES as QWEN4_EXP_TYPES
from ninfer_format.binders.qwen4_exp_geometry import Qwen4ExpGeometry

Config = Mapping[str, Any]


@dataclass(frozen=True)
class BenchArchitecture:
    """``read(config)``: the geometry; ``parameters(config, components, proposal_rows)``: the
    contract's parameters; ``kinds(geometry)``: a name per decoder layer (layers of one name
    cost the same); ``keep(config, geometry, layers)``: the config of those layers only;
    ``gathered(geometry)``: parameter name suffix -> rows one token reads of that table;
    ``mtp``: whether the bench writes and runs an MTP component for it."""

    architecture: str
    mtp_architecture: str | None
    read: Callable[[Config], Any]
    parameters: Callable[[Config, Sequence[str], int | None], list[Any]]
    kinds: Callable[[Any], list[str]]
    keep: Callable[[Config, Any, Sequence[int]], dict[str, Any]]
    gathered: Callable[[Any], dict[str, int]]
    mtp: bool = False


# ------------------------------------------------------------------------------ Qwen3.5
def _qwen35_kinds(g: Qwen35Geometry) -> list[str]:
    ffn = "moe" if g.moe is not None else "mlp"
    return [f"{'attention' if t == FULL_ATTENTION else 'gdn'}/{ffn}" for t in g.layer_types]


def _qwen35_keep(config: Config, g: Qwen35Geometry, layers: Sequence[int]) -> dict[str, Any]:
    types = [g.layer_types[i] for i in layers]
    return {**config, "num_hidden_layers": len(layers), "layer_types": types}


def _qwen35_parameters(config: Config, components: Sequence[str], rows: int | None) -> list:
    return qwen35_binder.expected_parameters(config, components=components, proposal_rows=rows)


def _qwen35(model_type: str) -> BenchArchitecture:
    return BenchArchitecture(
        qwen35_binder.ARCHITECTURE_OF[model_type],
        qwen35_binder.MTP_ARCHITECTURE_OF[model_type],
        Qwen35Geometry.from_config,
        _qwen35_parameters,
        _qwen35_kinds,
        _qwen35_keep,
        lambda g: {"text/token_embedding": 1},
        mtp=True,
    )


# ----------------------------------------------------------------------------- Qwen4Exp
def _qwen4_kinds(g: Qwen4ExpGeometry) -> list[str]:
    out = []
    for i, t in enumerate(g.layer_types):
        if t != "linear_attention":
            out.append("qsa/moe")
        elif g.ple is not None and i in g.ple.layers:
            out.append("gdn+ple/moe")
        else:
            out.append("gdn/moe")
    return out


def _qwen4_keep(config: Config, g: Qwen4ExpGeometry, layers: Sequence[int]) -> dict[str, Any]:
    ple = g.ple.layers if g.ple is not None else ()
    return {
        **config,
        "num_hidden_layers": len(layers),
        "layer_types": [g.layer_types[i] for i in layers],
        "ple_layer_ids": [k + 1 for k, i in enumerate(layers) if i in ple],  # one-indexed
    }


def _qwen4_gathered(g: Qwen4ExpGeometry) -> dict[str, int]:
    rows = {"text/token_embedding": 1}
    if g.ple is not None:  # each hash head of a PLE layer reads one row a token
        rows["ple/ngram_table"] = g.ple.heads
    return rows


QWEN4_EXP = BenchArchitecture(
    QWEN4_EXP_ARCHITECTURE,
    None,  # the runtime runs no Qwen4Exp MTP block
    Qwen4ExpGeometry.from_config,
    lambda config, components, rows: qwen4_binder.expected_parameters(config),
    _qwen4_kinds,
    _qwen4_keep,
    _qwen4_gathered,
)


# ----------------------------------------------------------------------------- GLM5Next
def _glm_kinds(g: Glm5NextGeometry) -> list[str]:
    out = []
    for i, (t, ffn) in enumerate(zip(g.layer_types, g.mlp_types, strict=True)):
        if t == "linear_attention":
            mixer = "kda"
        else:
            mixer = "mla+indexer" if g.indexer_types[i] == FULL_INDEXER else "mla+shared"
        out.append(f"{mixer}/{'moe' if ffn == 'sparse' else 'mlp'}")
    return out


def _glm_keep(config: Config, g: Glm5NextGeometry, layers: Sequence[int]) -> dict[str, Any]:
    kept = {k: v for k, v in config.items() if k != "index_topk_pattern"}
    return {
        **kept,
        "num_hidden_layers": len(layers),
        "layer_types": [g.layer_types[i] for i in layers],
        "mlp_layer_types": [g.mlp_types[i] for i in layers],
        "indexer_types": [g.indexer_types[i] for i in layers],
    }


GLM5_NEXT = BenchArchitecture(
    GLM5_NEXT_ARCHITECTURE,
    None,  # the runtime runs no GLM5Next MTP block
    Glm5NextGeometry.from_config,
    lambda config, components, rows: glm_binder.expected_parameters(config),
    _glm_kinds,
    _glm_keep,
    lambda g: {"text/token_embedding": 1},
)

ARCHITECTURES: dict[str, BenchArchitecture] = {
    **{t: _qwen35(t) for t in qwen35_binder.ARCHITECTURE_OF},
    **dict.fromkeys(QWEN4_EXP_TYPES, QWEN4_EXP),
    **dict.fromkeys(GLM5_NEXT_TYPES, GLM5_NEXT),
}


def architecture_of(config: Config) -> BenchArchitecture:
    model_type = config.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ValueError(f"the bench has no architecture record for model_type {model_type!r}")
    return ARCHITECTURES[model_type]


# ------------------------------------------------------------------------ fewer layers
def kept_layers(kinds: Sequence[str], count: int) -> list[int]:
    """``count`` layers that include one of every kind (its first), then the earliest others,
    in model order."""
    first = list(dict.fromkeys(kinds))
    if count < len(first):
        raise ValueError(
            f"--layers {count} cannot keep every kind of layer; at least {len(first)} "
            f"are needed ({', '.join(first)})"
        )
    if count > len(kinds):
        raise ValueError(f"--layers {count} exceeds the model's {len(kinds)} layers")
    chosen = [kinds.index(k) for k in first]
    rest = [i for i in range(len(kinds)) if i not in chosen]
    return sorted(chosen + rest[: count - len(chosen)])


@dataclass(frozen=True)
class Reduction:
    """A config cut to ``kept`` of the whole model's layers, and what it stands for."""

    config: dict[str, Any]
    kept: list[int]
    kinds: list[str]  # of the kept layers, in order
    whole_kinds: dict[str, int]  # kind -> layers of it in the whole model

    def as_provenance(self) -> dict[str, Any]:
        return {"kept": self.kept, "kinds": self.kinds, "whole_kinds": self.whole_kinds}


def reduce_layers(config: Config, layers: int | None) -> Reduction:
    """The config with ``layers`` decoder layers (None: all of them)."""
    arch = architecture_of(config)
    g = arch.read(config)
    kinds = arch.kinds(g)
    whole = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
    if layers is None:
        return Reduction(dict(config), list(range(len(kinds))), kinds, whole)
    kept = kept_layers(kinds, layers)
    reduced = arch.keep(config, g, kept)
    arch.read(reduced)  # the cut config must still be a model (raises a GeometryError if not)
    return Reduction(reduced, kept, [kinds[i] for i in kept], whole)


def scale_ple_rows(config: Config, scale: float) -> dict[str, Any]:
    """The config with n-gram tables of about ``scale`` times their rows (each hash head's
    prime vocabulary starts from a scaled base); a config without PLE is returned as is."""
    if not 0 < scale <= 1:
        raise ValueError(f"--ple-rows-scale {scale} must be in (0, 1]")
    if scale == 1 or not config.get("ple_layer_ids"):
        return dict(config)
    base = int(config.get("ngram_vocab_size_base", QWEN4_EXP_DEFAULTS["ngram_vocab_size_base"]))
    return {**config, "ngram_vocab_size_base": max(2, round(base * scale))}


def extrapolate(
    step_ms: float, layer_ms: Sequence[float], kinds: Sequence[str], whole: Mapping[str, int]
) -> tuple[dict[str, float], float]:
    """Per kind, the mean measured time of its layers; and the whole model's step: the
    measured step with its layers' time replaced by each kind's time times its count in the
    whole model."""
    per_kind: dict[str, list[float]] = {}
    for kind, ms in zip(kinds, layer_ms, strict=True):
        per_kind.setdefault(kind, []).append(ms)
    means = {k: sum(v) / len(v) for k, v in per_kind.items()}
    outside = step_ms - sum(layer_ms)
    return means, outside + sum(means[k] * n for k, n in whole.items())
