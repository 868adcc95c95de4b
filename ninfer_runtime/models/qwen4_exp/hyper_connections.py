"""Hyper-connections: the residual is ``hc`` streams of width H, side by side in one row
[N, hc·H], instead of one stream.

    streams = [e | e | … | e]                        the token embedding, once per stream
    n       = RMSNorm_1p of each stream (one weight row of hc·H, a group of H per stream)
    w       = sigmoid(up · silu(down · n / hc))      [N, hc·H], rank-``hc_lowrank`` mixer
    x       = mean over streams of w ⊙ n             [N, H]: the block's input
    inject  = 2 sigmoid(inject · n / hc)             [N, hc]: how much of the output each
                                                      stream receives
    streams = streams + inject ⊗ block(x)            (the un-normed streams take the add)

Each decoder layer has one such connection before its token mixer and one before its FFN;
the final connection (no inject) folds the streams into the row the output head reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ninfer_format.binders.qwen4_exp_parts import HyperConnections

from ...arrays import array_module
from ...backends import Backend, Weight
from ...functional import add_twice_sigmoid_product, mul_sigmoid, silu_of_quotient
from ...ops.registry import resolve

Array = Any


def expand(h: Array, streams: int) -> Array:
    """The embedding [N, H] as the first residual: every stream starts as it."""
    return array_module(h).tile(h, (1, streams))


class GroupNorm:
    """RMSNorm_1p of each of the ``groups`` equal slices of a row's last axis, with one weight
    ``w`` over the whole row: [N, G·W] -> [N, G·W].

    The norm family's ops take one weight of the last axis for every row (a device kernel
    reads only W values), so the slices are normed with a unit weight and each group's
    ``1 + w`` applied after: the reference's values bit for bit, since x·inv·1 is x·inv. Both
    are made once, not at every call (on a device, two launches fewer a norm)."""

    def __init__(self, backend: Backend, w: Array, groups: int, eps: float):
        xp = backend.xp
        self.backend, self.groups, self.eps = backend, groups, eps
        self.scale = w.reshape(groups, -1) + xp.float32(1.0)
        self.unit = xp.zeros(self.scale.shape[-1], xp.float32)  # the kernel's "1 +" weight

    def __call__(self, x: Array) -> Array:
        n, width = x.shape
        rms_norm = resolve("norm", "rms_norm", device=self.backend.name)
        normed = rms_norm(x.reshape(n, self.groups, -1), self.unit, self.eps, offset=1.0)
        return (normed * self.scale).reshape(n, width)


class HyperConnection:
    """One connection's weights (``P norm``, ``down``, ``up``, and ``inject`` unless it is
    the final one)."""

    def __init__(
        self,
        prefix: str,
        hyper: HyperConnections,
        eps: float,
        backend: Backend,
        weights: Mapping[str, Weight],
        *,
        with_inject: bool,
    ):
        self.streams, self.backend = hyper.streams, backend
        self.norm = GroupNorm(backend, backend.array(weights[prefix + "norm"]), hyper.streams, eps)
        down = weights[prefix + "down"]
        self.rank, self.with_inject = down.shape[0], with_inject
        # down | inject: one product of the normed streams (one launch where the artifact
        # stores them as one object, as the converter packs them)
        self.down_inject = (
            backend.join_rows([down, weights[prefix + "inject"]]) if with_inject else down
        )
        self.up = weights[prefix + "up"]

    @staticmethod
    def parameter_names(prefix: str, *, with_inject: bool) -> list[str]:
        return [prefix + s for s in ("norm", "down", "up", *(("inject",) * with_inject))]

    def __call__(self, streams: Array) -> tuple[Array, Array | None]:
        """Streams [N, hc·H] -> the block input [N, H] and the inject weights' logits [N, hc]
        (``inject`` makes the weights as it adds; None for the final connection)."""
        be = self.backend
        hc = be.xp.float32(self.streams)  # float32 math in the fused kernels as on the host
        normed = self.norm(streams)
        projected = be.linear(normed, self.down_inject)  # [N, rank (+ hc)]
        rank = silu_of_quotient(projected[:, : self.rank], hc)
        mixed = mul_sigmoid(normed, be.linear(rank, self.up))
        n, width = normed.shape
        x = mixed.reshape(n, self.streams, width // self.streams).mean(axis=1)
        return x, projected[:, self.rank :] if self.with_inject else None

    def inject(self, streams: Array, block_out: Array, logits: Array) -> Array:
        """``streams`` [N, hc·H] plus the block's output [N, H] scaled per stream by the
        inject weights ``2 sigmoid(logits / hc)`` ([N, hc], this connection's call's)."""
        n, hc = logits.shape
        width = block_out.shape[-1]
        added = add_twice_sigmoid_product(
            streams.reshape(n, hc, width),
            logits[:, :, None],
            self.backend.xp.float32(hc),
            block_out[:, None, :],
        )
        return added.reshape(n, hc * width)
