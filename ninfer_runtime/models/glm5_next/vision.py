"""The GLM5Next vision tower (the artifact's ``vision`` component, model_type
``glm5_next_vision``): image patches in, the embeddings that replace the image's placeholder
tokens out (transformers' ``Glm5NextVisionModel`` with its merger).

Input, laid out as Qwen3.5's (the processors share the patch order and width):

    pixel_values [P, 3·pt·ps·ps]   one row per patch, images one after another, each frame's
                                   patches in merge-block order (qwen3_5/vision_grid.py)
    grid_thw     [images, 3]       frames, height, width of each image in patches

Math (RMS = RMSNorm without bias at ``rms_norm_eps``; m = spatial_merge_size; L = swiglu_limit):

    x  = patch_embedding row + bias                the Conv3d whose stride is its kernel
    each block:
        q, k, v = split(qkv(RMS1 x)) per head;  q, k = RMS_q q, RMS_k k   (per head, width d)
        q, k rotated by the 2-D rotary embedding   (rows, then columns: Qwen3.5's angles)
        x += output(attention(q, k, v))            bidirectional within one frame
        x += down(act(min(gate y, L)) · clip(up y, -L, L)),  y = RMS2 x   (act = silu)
    x = RMS_post x
    y = downsample(each m×m block's values channel-major [h, m, m])  -> [P / m², o]
    merger: z = gelu(LN(projection y));  out = down(act(min(gate z, L)) · clip(up z, -L, L))

There is no learned position table: the rotary embedding is the only position signal. Output
row ``j`` is the ``j``-th merged token in patch order, ``o`` (the text hidden size) wide.

Usage (weights load once; calls are independent):

    tower = Glm5NextVisionTower(artifact, get_backend("cpu"))
    embeddings = tower.encode(pixel_values, grid_thw)   # [sum of merged_tokens(grid_thw), o]

Projections go through ``backend.linear``; the glue is array math on ``backend.xp``. Matches
transformers in float32 to ~1e-6 of the output's scale (tests/runtime/test_glm5_next_vision.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...arrays import array_module
from ...backends import Backend, Weight
from ...ops.registry import resolve
from ..qwen3_5.vision_grid import input_grid, merged_tokens, rotary_angles
from ..qwen3_5.vision_ops import ACTIVATIONS, gelu_erf, layer_norm, tower_attention
from ..qwen3_5.vision_weights import prepare_vision, vision_config
from .vision_config import MERGER_NORM_EPS, Glm5NextVisionConfig

Array = Any


def rms_norm(backend: Backend, x: Array, weight: Array, eps: float) -> Array:
    """``x / sqrt(mean(x²) + eps) · weight`` over the last axis (no bias, no offset): the norm
    family's ``rms_norm`` on ``backend``'s device."""
    return resolve("norm", "rms_norm", device=backend.name)(x, weight, eps, 0.0)


class _Projections:
    """A block's or the tower's weights by logical name: ``apply(x, name)`` is ``x Wᵀ (+ b)``
    (the bias when the artifact binds ``name_bias``), ``vector(name)`` a norm's weight."""

    def __init__(self, backend: Backend, weights: Mapping[str, Weight]):
        self.backend, self.weights = backend, weights

    def vector(self, name: str) -> Array:
        return self.backend.array(self.weights[name])

    def apply(self, x: Array, name: str) -> Array:
        y = self.backend.linear(x, self.weights[name])
        bias = self.weights.get(name + "_bias")
        return y if bias is None else y + self.backend.array(bias)


def clamped_swiglu(gate: Array, up: Array, limit: float, act: Any) -> Array:
    """GLM's SwiGLU: the gate capped at ``limit`` above, the up side clipped to ±limit."""
    xp = array_module(gate)
    return act(xp.minimum(gate, limit)) * xp.clip(up, -limit, limit)


class VisionBlock:
    """Pre-norm residual block: attention over each frame with q/k norms, then the MLP."""

    def __init__(self, prefix: str, c: Glm5NextVisionConfig, p: _Projections):
        self.prefix, self.c, self.p = prefix, c, p
        self.norm1, self.norm2 = (
            p.vector(prefix + "norm1_weight"),
            p.vector(prefix + "norm2_weight"),
        )
        self.query_norm = p.vector(prefix + "attention/query_norm")
        self.key_norm = p.vector(prefix + "attention/key_norm")
        self.act = ACTIVATIONS[c.activation]

    @staticmethod
    def parameter_names(prefix: str, bias: bool) -> list[str]:
        names = [prefix + "norm1_weight", prefix + "norm2_weight"]
        names += [prefix + "attention/query_norm", prefix + "attention/key_norm"]
        projections = [f"attention/{s}" for s in ("query", "key", "value", "output")]
        for s in (*projections, "mlp/gate", "mlp/up", "mlp/down"):
            names += [prefix + s] + [prefix + s + "_bias"] * bias
        return names

    def __call__(self, x: Array, cos: Array, sin: Array, bounds: tuple[int, ...]) -> Array:
        be, c, p, P = self.p.backend, self.c.shape, self.p, self.prefix
        n, eps = x.shape[0], self.c.eps
        a = rms_norm(be, x, self.norm1, eps)
        q, k, v = (
            p.apply(a, f"{P}attention/{s}").reshape(n, c.heads, c.head_dim)
            for s in ("query", "key", "value")
        )
        q = be.rope(rms_norm(be, q, self.query_norm, eps), cos, sin)
        k = be.rope(rms_norm(be, k, self.key_norm, eps), cos, sin)
        o = tower_attention(be, q, k, v, bounds, c.head_dim**-0.5).reshape(n, c.hidden)
        x = x + p.apply(o, P + "attention/output")
        y = rms_norm(be, x, self.norm2, eps)
        limit = self.c.swiglu_limit
        h = clamped_swiglu(p.apply(y, P + "mlp/gate"), p.apply(y, P + "mlp/up"), limit, self.act)
        return x + p.apply(h, P + "mlp/down")


class Glm5NextVisionTower:
    """The vision component's weights prepared on a backend; ``encode`` runs the tower."""

    def __init__(self, artifact: Any, backend: Backend):
        self.config = c = Glm5NextVisionConfig.from_component(*vision_config(artifact))
        self.backend = backend
        weights = prepare_vision(artifact, backend, self.parameter_names(c))
        self.p = p = _Projections(backend, weights)
        self.blocks = [VisionBlock(f"vision/layers/{i}/", c, p) for i in range(c.shape.depth)]
        self.post_norm = p.vector("vision/post_norm")
        self.merger_norm = (
            p.vector("vision/merger/norm_weight"),
            p.vector("vision/merger/norm_bias"),
        )

    @staticmethod
    def parameter_names(c: Glm5NextVisionConfig) -> list[str]:
        names = ["vision/patch_embedding", "vision/patch_embedding_bias"]
        for i in range(c.shape.depth):
            names += VisionBlock.parameter_names(f"vision/layers/{i}/", c.shape.bias)
        names += ["vision/post_norm", "vision/downsample", "vision/downsample_bias"]
        merger = ("projection", "norm_weight", "norm_bias", "gate", "up", "down")
        return names + [f"vision/merger/{s}" for s in merger]

    def merged_tokens(self, grid_thw: Any) -> list[int]:
        """Embedding rows (placeholder tokens) of each image: t·h·w / m²."""
        return merged_tokens(grid_thw, self.config.merge)

    def encode(self, pixel_values: Any, grid_thw: Any) -> Array:
        """Patches [P, 3·pt·ps·ps] of the images ``grid_thw`` [images, 3] describes ->
        their embeddings [P / m², text hidden] (float32, on the backend)."""
        c, p, xp = self.config, self.p, self.backend.xp
        grid = input_grid(pixel_values, grid_thw, c.merge, c.patch_width)
        x = p.apply(xp.asarray(pixel_values, dtype=xp.float32), "vision/patch_embedding")
        angles = rotary_angles(grid, c.shape.head_dim, c.rope_theta)
        cos, sin = (xp.asarray(a) for a in angles)
        for block in self.blocks:
            x = block(x, cos, sin, grid.bounds)
        x = rms_norm(self.backend, x, self.post_norm, c.eps)
        m2, h = c.merge * c.merge, c.shape.hidden
        blocks = x.reshape(-1, m2, h).transpose(0, 2, 1).reshape(-1, h * m2)  # [h, m, m] each
        y = p.apply(xp.ascontiguousarray(blocks), "vision/downsample")
        z = gelu_erf(
            layer_norm(p.apply(y, "vision/merger/projection"), *self.merger_norm, MERGER_NORM_EPS)
        )
        act = ACTIVATIONS[c.activation]
        gate, up = p.apply(z, "vision/merger/gate"), p.apply(z, "vision/merger/up")
        return p.apply(clamped_swiglu(gate, up, c.swiglu_limit, act), "vision/merger/down")
