"""The GLM5Next vision contract: the tower of transformers' ``Glm5NextVisionModel`` (the
``model.visual.*`` of ``Glm5NextForConditionalGeneration``) under ``vision/`` names, its
geometry read from the vision component's config (model_type ``glm5_next_vision``).

Spec 5.4's names are kept where the tower has the same piece (the patch embedding, the blocks'
attention projections, the merger's LayerNorm); GLM's own pieces get names this module defines.
With ``V = vision/layers/{i}/``, h = ``hidden_size``, d = h / ``num_heads``, I_v =
``intermediate_size``, o = ``out_hidden_size`` (the text hidden size), P =
``projection_intermediate_size``, m = ``spatial_merge_size``:

* ``vision/patch_embedding [h, 3·pt·ps·ps]`` @ ``vision/patch_input`` (the Conv3d read flat),
  ``vision/patch_embedding_bias [h]``; there is no position table (the blocks' rotary
  embedding is the only position signal);
* ``V norm1_weight``, ``V norm2_weight [h]`` (RMSNorms, no bias);
  ``V attention/query|key|value [h, h]`` @ ``V attention_input`` (HF's fused ``attn.qkv``
  split by rows), ``V attention/query_norm|key_norm [d]`` (per-head RMSNorms);
  ``V attention/output [h, h]`` @ ``V attention_output``;
  ``V mlp/gate|up [I_v, h]`` @ ``V mlp_input``, ``V mlp/down [h, I_v]`` @ ``V mlp_product``;
  with ``attention_bias`` (the default) each of these projections has a ``…_bias``;
* ``vision/post_norm [h]`` (``post_layernorm``);
* ``vision/downsample [o, h·m·m]`` @ ``vision/downsample_input`` (the Conv2d over each m×m
  block read flat: input values channel-major, ``[h, m, m]``), ``vision/downsample_bias [o]``;
* the merger: ``vision/merger/projection [o, o]`` @ ``vision/merger/input``,
  ``vision/merger/norm_weight|norm_bias [o]`` (``post_projection_norm``, a LayerNorm),
  ``vision/merger/gate|up [P, o]`` @ ``vision/merger/activation``, ``vision/merger/down [o, P]``
  @ ``vision/merger/product`` (no biases).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .config_reader import ConfigReader, show
from .parameter_spec import ParamSpec, _matrix, _vector
from .registry import Findings

#: the vision component's model_type (transformers' ``Glm5NextVisionConfig``)
VISION_MODEL_TYPE = "glm5_next_vision"
#: the config members that fix a shape, all positive integers
VISION_MEMBERS = (
    "depth",
    "hidden_size",
    "intermediate_size",
    "num_heads",
    "patch_size",
    "temporal_patch_size",
    "spatial_merge_size",
    "out_hidden_size",
    "projection_intermediate_size",
)
PATCH_CHANNELS = 3


@dataclass(frozen=True)
class Glm5NextVision:
    """The tower's geometry (``VISION_MEMBERS`` in order, then ``attention_bias``)."""

    depth: int
    hidden: int  # h
    intermediate: int  # I_v
    heads: int
    patch: int  # ps
    temporal_patch: int  # pt
    merge: int  # m
    out_hidden: int  # o: the text hidden size
    projection: int  # P: the merger's SwiGLU width
    bias: bool = True  # attention_bias: the blocks' projections have biases

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def patch_width(self) -> int:
        """Input width of the patch embedding: one flattened [3, pt, ps, ps] patch."""
        return PATCH_CHANNELS * self.temporal_patch * self.patch * self.patch


def read_vision(
    config: Mapping[str, Any], text_hidden: int, findings: Findings
) -> Glm5NextVision | None:
    """The geometry, or None after reporting every member that prevents deriving it."""
    before = len(findings.errors)
    c = ConfigReader(config, "vision config member '", findings.errors)
    values = [c.positive_int(key) for key in VISION_MEMBERS]
    _, hidden, _, heads, *_ = values
    if hidden is not None and heads is not None and (hidden % heads or (hidden // heads) % 4):
        c.error(
            "hidden_size",
            f"({hidden}) must split into num_heads ({heads}) heads of a size "
            "divisible by 4 (the 2-D rotary embedding)",
        )
    out_hidden = values[VISION_MEMBERS.index("out_hidden_size")]
    if out_hidden is not None and out_hidden != text_hidden:
        c.error("out_hidden_size", f"must be the text hidden size {text_hidden}, got {out_hidden}")
    if config.get("in_channels", PATCH_CHANNELS) != PATCH_CHANNELS:
        c.error(
            "in_channels",
            f"must be {PATCH_CHANNELS} when present, got {show(config['in_channels'])}",
        )
    bias = config.get("attention_bias", True)
    if type(bias) is not bool:
        c.error("attention_bias", f"must be true or false, got {show(bias)}")
    if len(findings.errors) > before:
        return None
    return Glm5NextVision(*values, bias=bias)  # type: ignore[arg-type]


def _affine(name: str, rows: int, cols: int, source: str, bias: bool) -> Iterator[ParamSpec]:
    yield _matrix(name, rows, cols, source)
    if bias:
        yield _vector(name + "_bias", rows)


def _block(V: str, v: Glm5NextVision) -> Iterator[ParamSpec]:
    h, width = v.hidden, v.intermediate
    yield _vector(V + "norm1_weight", h)
    for projection in ("query", "key", "value"):
        yield from _affine(f"{V}attention/{projection}", h, h, V + "attention_input", v.bias)
    yield _vector(V + "attention/query_norm", v.head_dim)
    yield _vector(V + "attention/key_norm", v.head_dim)
    yield from _affine(V + "attention/output", h, h, V + "attention_output", v.bias)
    yield _vector(V + "norm2_weight", h)
    yield from _affine(V + "mlp/gate", width, h, V + "mlp_input", v.bias)
    yield from _affine(V + "mlp/up", width, h, V + "mlp_input", v.bias)
    yield from _affine(V + "mlp/down", h, width, V + "mlp_product", v.bias)


def vision_parameters(v: Glm5NextVision, text_hidden: int) -> Iterator[ParamSpec]:
    """Every vision parameter (``text_hidden`` is ``v.out_hidden``, checked on reading)."""
    yield from _affine(
        "vision/patch_embedding", v.hidden, v.patch_width, "vision/patch_input", True
    )
    for i in range(v.depth):
        yield from _block(f"vision/layers/{i}/", v)
    yield _vector("vision/post_norm", v.hidden)
    merged = v.hidden * v.merge * v.merge
    yield from _affine("vision/downsample", text_hidden, merged, "vision/downsample_input", True)
    M = "vision/merger/"
    yield _matrix(M + "projection", text_hidden, text_hidden, M + "input")
    yield _vector(M + "norm_weight", text_hidden)
    yield _vector(M + "norm_bias", text_hidden)
    yield _matrix(M + "gate", v.projection, text_hidden, M + "activation")
    yield _matrix(M + "up", v.projection, text_hidden, M + "activation")
    yield _matrix(M + "down", text_hidden, v.projection, M + "product")
