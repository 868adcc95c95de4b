"""The decoder layer both the text stack and the MTP block are made of (notes 5.1):
a pre-norm residual block, a token mixer then a feed-forward block, each residual add done
together with the norm that reads its result (``add_norm``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ...backends import Backend, Weight
from ...memory_kinds import LayerMemory
from ...ops.registry import resolve
from ..batch import Batch
from .attention import GatedAttention
from .config import FULL_ATTENTION, Qwen35Config
from .gdn import GatedDeltaNet
from .mlp import DenseMlp, SparseMoe

Array = Any


def add_norm(
    backend: Backend, h: Array, delta: Array | None, w: Array, eps: float
) -> tuple[Array, Array]:
    """``h + delta`` and its RMSNorm_1p in one op; ``delta`` None: nothing to add."""
    if delta is None:
        return h, resolve("norm", "rms_norm", device=backend.name)(h, w, eps, offset=1.0)
    return resolve("norm", "add_rms_norm", device=backend.name)(h, delta, w, eps, offset=1.0)


class DecoderLayer:
    """Pre-norm residual block: a token mixer, then a feed-forward block. Under tensor
    parallelism each computes this rank's share of its output, and ``reduce`` (the
    collective's all-reduce) sums the shares; alone, it is the identity."""

    def __init__(
        self,
        prefix: str,
        layer_type: str,
        c: Qwen35Config,
        backend: Backend,
        weights: Mapping[str, Weight],
        reduce: Callable[[Array], Array] | None = None,
    ):
        self.backend, self.eps = backend, c.eps
        self.reduce = reduce or _whole
        self.input_norm = backend.array(weights[prefix + "input_norm"])
        self.post_attention_norm = backend.array(weights[prefix + "post_attention_norm"])
        self.mixer: GatedAttention | GatedDeltaNet
        if layer_type == FULL_ATTENTION:
            assert c.attention is not None
            self.mixer = GatedAttention(prefix, c.attention, c.eps, backend, weights)
        else:
            assert c.gdn is not None
            self.mixer = GatedDeltaNet(prefix, c.gdn, c.eps, backend, weights)
        self.ffn: DenseMlp | SparseMoe = (
            SparseMoe(prefix, c.moe, backend, weights)
            if c.moe
            else DenseMlp(prefix, backend, weights)
        )

    @staticmethod
    def parameter_names(prefix: str, layer_type: str, c: Qwen35Config) -> list[str]:
        names = [prefix + "input_norm", prefix + "post_attention_norm"]
        if layer_type == FULL_ATTENTION:
            names += GatedAttention.parameter_names(prefix)
        else:
            names += GatedDeltaNet.parameter_names(prefix)
        if c.moe:
            names += SparseMoe.parameter_names(prefix, c.moe)
        else:
            names += DenseMlp.parameter_names(prefix)
        return names

    def __call__(
        self, h: Array, pending: Array | None, batch: Batch, memory: LayerMemory
    ) -> tuple[Array, Array]:
        """The residual stream ``h`` with ``pending`` (the previous layer's ffn output, None
        before the first layer) not yet added -> the same pair after this layer."""
        be, eps = self.backend, self.eps
        h, x = add_norm(be, h, pending, self.input_norm, eps)
        mixed = self.reduce(self.mixer(x, batch, memory))  # type: ignore[arg-type]
        h, x = add_norm(be, h, mixed, self.post_attention_norm, eps)
        return h, self.reduce(self.ffn(x))


def _whole(x: Array) -> Array:
    return x
