"""Manifold-constrained hyper-connections: the residual is ``n`` streams [N, n, H] instead of
one row, and each block (token mixer, FFN) reads and writes them through weights computed from
the streams themselves:

    m            = projection · (streams flattened to [N, n·H], RMS-normalised, no weight)
    pre          = sigmoid(scale₀ m_pre + bias_pre) + ε                [N, n]
    post         = 2 sigmoid(scale₁ m_post + bias_post)                [N, n]
    comb         = Sinkhorn(softmax_rows(scale₂ m_comb + bias_comb) + ε)   [N, n, n]
    x            = Σ_s pre_s · stream_s                                the block's input
    streams'_i   = post_i · block(x) + Σ_j comb_ji · stream_j

Sinkhorn makes ``comb`` (nearly) doubly stochastic, columns first and then rows and columns
in turn, each sum offset by ε, so mixing the streams neither grows nor shrinks them. The
model's head reads the streams' plain mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ninfer_format.binders.glm5_next_parts import ManifoldHyperConnections

from ...arrays import array_module
from ...backends import Backend, Weight
from ...functional import add_product, sigmoid_affine
from ...ops.linear import matmul
from ...ops.registry import resolve

Array = Any


def expand(h: Array, streams: int) -> Array:
    """The embedding [N, H] as the first residual: every stream starts as it -> [N, n, H]."""
    return array_module(h).repeat(h[:, None, :], streams, axis=1)


def collapse(streams: Array) -> Array:
    """What the model's head reads: the streams' mean [N, H]."""
    return streams.mean(axis=1)


class HyperConnection:
    """One block's connection: ``P projection`` [(2+n)·n, n·H], ``P bias`` [(2+n)·n] and
    ``P scale`` [3] (pre, post, comb)."""

    def __init__(
        self,
        prefix: str,
        hyper: ManifoldHyperConnections,
        norm_eps: float,
        backend: Backend,
        weights: Mapping[str, Weight],
    ):
        self.hyper, self.norm_eps, self.backend = hyper, norm_eps, backend
        self.projection = weights[prefix + "projection"]
        self.bias = backend.array(weights[prefix + "bias"])
        self.scale = backend.array(weights[prefix + "scale"])
        # the unweighted norm as the norm family's ``rms_norm`` with ``0 + 1`` for a weight
        # (x · 1/rms, as transformers computes it; one launch on a device, not five)
        width = self.projection.shape[1]
        self.unit = backend.xp.zeros(width, backend.xp.float32)

    @staticmethod
    def parameter_names(prefix: str) -> list[str]:
        return [prefix + s for s in ("projection", "bias", "scale")]

    def __call__(self, streams: Array) -> tuple[Array, Array, Array]:
        """Streams [N, n, H] -> (the block input [N, H], post [N, n], comb [N, n, n])."""
        be, hc, n = self.backend, self.hyper, self.hyper.streams
        xp = array_module(streams)
        rms_norm = resolve("norm", "rms_norm", device=be.name)
        normed = rms_norm(streams.reshape(streams.shape[0], -1), self.unit, self.norm_eps, 1.0)
        m = be.linear(normed, self.projection)  # [N, (2+n)·n]
        b, s = self.bias, self.scale
        one, two = xp.float32(1), xp.float32(2)
        pre = sigmoid_affine(m[:, :n], s[0], b[:n], one, xp.float32(hc.eps))
        post = sigmoid_affine(m[:, n : 2 * n], s[1], b[n : 2 * n], two, xp.float32(0))
        logits = add_product(b[2 * n :], m[:, 2 * n :], s[2]).reshape(-1, n, n)
        sinkhorn = resolve("norm", "sinkhorn", device=be.name)
        comb = sinkhorn(logits, iterations=hc.sinkhorn_iters, eps=hc.eps)
        x = (pre[:, :, None] * streams).sum(axis=1)
        return x, post, comb

    @staticmethod
    def merge(streams: Array, block_out: Array, post: Array, comb: Array) -> Array:
        """The streams after the block: ``post_i · out + Σ_j comb_ji · stream_j``."""
        mixed = matmul(comb.swapaxes(1, 2), streams)
        return add_product(mixed, post[:, :, None], block_out[:, None, :])
