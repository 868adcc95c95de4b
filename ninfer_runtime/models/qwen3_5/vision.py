"""The Qwen3.5 vision tower (the artifact's ``vision`` component, spec 5.4): image patches in,
the embeddings that replace the image's placeholder tokens out (transformers'
``Qwen3_5VisionModel``; the MoE variant's tower is the same).

Input, as the HF image processor lays it out:

    pixel_values [P, C·pt·ps·ps]  one row per patch: C channels × pt frames × ps × ps pixels,
                                  normalised; images one after another, each frame's patches in
                                  merge-block order (vision_grid.py)
    grid_thw     [images, 3]      frames, height, width of each image in patches (t·h·w rows)

Math (LN = LayerNorm with bias, eps 1e-6; m = spatial_merge_size):

    x  = patch_embedding row + bias                 the Conv3d whose stride is its kernel
    x += bilinear(position_embedding, h×w)          learned side×side grid resampled per frame
    each block:  x += output(attention(LN1 x))      bidirectional within one frame (never across
                                                    frames or images), 2-D rotary on q and k
                 x += fc2(act(fc1(LN2 x)))          act = hidden_act (gelu_pytorch_tanh)
    y   = LN_merger(x), each m×m block's m² rows side by side -> [P/m², m²·h]
    out = fc2(gelu(fc1 y))                          exact (erf) GELU -> [P/m², text hidden]

Output row ``j`` is the ``j``-th merged token in the order the patches came: the rows for one
image are its ``t·h·w / m²`` placeholder tokens, in order.

Usage (weights load once; each call is independent, with no state between calls):

    tower = VisionTower(artifact, get_backend("cpu"))
    embeddings = tower.encode(pixel_values, grid_thw)   # [sum of merged_tokens(grid_thw), H]

The geometry comes from the vision component's config (``artifact.components["vision"]``: the
checkpoint's ``vision_config`` as the converter copied it), the merger's output width from the
text config's ``hidden_size``, the weights from the ``vision/`` names of spec 5.4 (query, key
and value stored apart; joined again here into one product).

Projections go through ``backend.linear`` (weights prepared by the backend, so quantized formats
load as the text weights do); the attention is the attention family's ``segment`` op, the rest
of the glue array math on ``backend.xp`` (vision_ops.py); the per-patch positions are host
numpy (vision_grid.py), moved to the device where the glue uses them. On the CPU backend it
matches transformers in float32 to ~1e-6 of the output's scale
(tests/runtime/test_vision_tower.py); the CUDA backend runs the same statements on CuPy
(tests/gpu/test_images_cuda.py). Image preprocessing, placing the embeddings among the
text tokens and the text layers' multimodal RoPE positions are not here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...backends import Backend, Weight
from ...errors import ModelError
from .vision_grid import PatchGrid, input_grid, merged_tokens, position_taps, rotary_angles
from .vision_ops import ACTIVATIONS, checked_activation, gelu_erf, layer_norm, tower_attention
from .vision_weights import prepare_vision, vision_config

Array = Any
#: a projection with its bias: (weight prepared by the backend, bias as a backend array)
Affine = tuple[Weight, Array]

#: transformers' vision LayerNorms (blocks and merger) hard-code this eps
NORM_EPS = 1e-6
#: what HF computes with when a vision config has no ``rope_parameters`` / ``hidden_act``
DEFAULT_ROPE_THETA = 10000.0
DEFAULT_ACTIVATION = "gelu_pytorch_tanh"


@dataclass(frozen=True)
class VisionConfig:
    """The tower's geometry, from the vision component's config (spec 5.1 members, plus HF's
    ``in_channels``, ``hidden_act`` and ``rope_parameters`` where the checkpoint had them)."""

    depth: int
    hidden: int
    intermediate: int
    heads: int
    patch: int
    temporal_patch: int
    merge: int
    positions: int
    out_hidden: int  # the text model's hidden size: the merger's output width
    channels: int = 3
    activation: str = DEFAULT_ACTIVATION
    rope_theta: float = DEFAULT_ROPE_THETA

    @classmethod
    def from_component(cls, config: Mapping[str, Any], text_hidden: int) -> VisionConfig:
        def positive(key: str) -> int:
            value = config.get(key)
            if type(value) is not int or value <= 0:
                raise ModelError(f"vision config member {key!r} must be a positive integer")
            return value

        rope = config.get("rope_parameters") or {}
        c = cls(
            depth=positive("depth"),
            hidden=positive("hidden_size"),
            intermediate=positive("intermediate_size"),
            heads=positive("num_heads"),
            patch=positive("patch_size"),
            temporal_patch=positive("temporal_patch_size"),
            merge=positive("spatial_merge_size"),
            positions=positive("num_position_embeddings"),
            out_hidden=text_hidden,
            channels=positive("in_channels") if "in_channels" in config else 3,
            activation=checked_activation(str(config.get("hidden_act", DEFAULT_ACTIVATION))),
            rope_theta=float(rope.get("rope_theta", DEFAULT_ROPE_THETA)),
        )
        if c.hidden % c.heads or c.head_dim % 4:
            raise ModelError(
                f"vision hidden_size {c.hidden} must split into {c.heads} heads whose size is a "
                "multiple of 4 (the 2-D rotary embedding)"
            )
        if math.isqrt(c.positions) ** 2 != c.positions:
            raise ModelError(f"vision num_position_embeddings {c.positions} is not a square")
        return c

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def patch_width(self) -> int:
        """Values of one flattened patch: C × pt × ps × ps."""
        return self.channels * self.temporal_patch * self.patch * self.patch

    @property
    def position_side(self) -> int:
        return math.isqrt(self.positions)


class VisionBlock:
    """Pre-norm residual block: attention over each frame, then the MLP."""

    def __init__(
        self, prefix: str, c: VisionConfig, backend: Backend, weights: Mapping[str, Weight]
    ):
        self.c, self.backend, p = c, backend, prefix
        vector, affine = _readers(backend, weights)
        self.norm1 = (vector(p + "norm1_weight"), vector(p + "norm1_bias"))
        self.norm2 = (vector(p + "norm2_weight"), vector(p + "norm2_bias"))
        # query | key | value as one product of the normed input, as HF's fused qkv
        inputs = [f"{p}attention/{s}" for s in ("query", "key", "value")]
        self.qkv = (
            backend.join_rows([weights[n] for n in inputs]),
            backend.xp.concatenate([vector(n + "_bias") for n in inputs]),
        )
        self.output = affine(p + "attention/output")
        self.fc1, self.fc2 = affine(p + "mlp/fc1"), affine(p + "mlp/fc2")
        self.act = ACTIVATIONS[c.activation]

    @staticmethod
    def parameter_names(prefix: str) -> list[str]:
        names = [prefix + n for n in ("norm1_weight", "norm1_bias", "norm2_weight", "norm2_bias")]
        for s in ("query", "key", "value", "output"):
            names += [f"{prefix}attention/{s}", f"{prefix}attention/{s}_bias"]
        for s in ("fc1", "fc2"):
            names += [f"{prefix}mlp/{s}", f"{prefix}mlp/{s}_bias"]
        return names

    def __call__(self, x: Array, cos: Array, sin: Array, bounds: tuple[int, ...]) -> Array:
        be, c = self.backend, self.c
        n = x.shape[0]
        qkv = _apply(be, layer_norm(x, *self.norm1, NORM_EPS), self.qkv)
        q, k, v = qkv.reshape(n, 3, c.heads, c.head_dim).transpose(1, 0, 2, 3)
        q, k = be.rope(q, cos, sin), be.rope(k, cos, sin)
        o = tower_attention(be, q, k, v, bounds, c.head_dim**-0.5).reshape(n, c.hidden)
        x = x + _apply(be, o, self.output)
        h = self.act(_apply(be, layer_norm(x, *self.norm2, NORM_EPS), self.fc1))
        return x + _apply(be, h, self.fc2)


class VisionTower:
    """The vision component's weights prepared on a backend; ``encode`` runs the tower."""

    def __init__(self, artifact: Any, backend: Backend):
        self.config = c = VisionConfig.from_component(*vision_config(artifact))
        self.backend = backend
        w = prepare_vision(artifact, backend, self.parameter_names(c))
        vector, affine = _readers(backend, w)
        self.patch_embedding = affine("vision/patch_embedding")
        self.position_table = backend.array(w["vision/position_embedding"])
        self.blocks = [VisionBlock(f"vision/layers/{i}/", c, backend, w) for i in range(c.depth)]
        self.merger_norm = (vector("vision/merger/norm_weight"), vector("vision/merger/norm_bias"))
        self.merger_fc1 = affine("vision/merger/fc1")
        self.merger_fc2 = affine("vision/merger/fc2")

    @staticmethod
    def parameter_names(c: VisionConfig) -> list[str]:
        names = ["vision/patch_embedding", "vision/patch_embedding_bias"]
        names.append("vision/position_embedding")
        for i in range(c.depth):
            names += VisionBlock.parameter_names(f"vision/layers/{i}/")
        for s in ("norm_weight", "norm_bias", "fc1", "fc1_bias", "fc2", "fc2_bias"):
            names.append(f"vision/merger/{s}")
        return names

    def merged_tokens(self, grid_thw: Any) -> list[int]:
        """Embedding rows (placeholder tokens) of each image: t·h·w / m²."""
        return merged_tokens(grid_thw, self.config.merge)

    def encode(self, pixel_values: Any, grid_thw: Any) -> Array:
        """Patches [P, C·pt·ps·ps] of the images ``grid_thw`` [images, 3] describes ->
        their embeddings [P / m², text hidden] (float32, on the backend)."""
        be, c, xp = self.backend, self.config, self.backend.xp
        grid = input_grid(pixel_values, grid_thw, c.merge, c.patch_width)
        x = _apply(be, xp.asarray(pixel_values, dtype=xp.float32), self.patch_embedding)
        x = x + self._positions(grid)
        cos, sin = (xp.asarray(a) for a in rotary_angles(grid, c.head_dim, c.rope_theta))
        for block in self.blocks:
            x = block(x, cos, sin, grid.bounds)
        y = layer_norm(x, *self.merger_norm, NORM_EPS).reshape(-1, c.merge**2 * c.hidden)
        return _apply(be, gelu_erf(_apply(be, y, self.merger_fc1)), self.merger_fc2)

    def _positions(self, grid: PatchGrid) -> Array:
        """Each patch's learned position embedding, resampled to its frame's grid."""
        xp = self.backend.xp
        indices, weights = position_taps(grid, self.config.position_side)
        rows = self.position_table[xp.asarray(indices)]  # [P, 4, hidden]
        return (rows * xp.asarray(weights)[:, :, None]).sum(axis=1)


def _readers(backend: Backend, weights: Mapping[str, Weight]) -> tuple[Any, Any]:
    """``vector(name)``: a norm or bias vector as a backend array; ``affine(name)``: the
    projection ``name`` with its ``name_bias``."""

    def vector(name: str) -> Array:
        return backend.array(weights[name])

    def affine(name: str) -> Affine:
        return weights[name], vector(name + "_bias")

    return vector, affine


def _apply(backend: Backend, x: Array, projection: Affine) -> Array:
    """``x Wᵀ + b``."""
    weight, bias = projection
    return backend.linear(x, weight) + bias
