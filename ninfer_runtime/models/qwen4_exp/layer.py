"""A Qwen4Exp decoder layer: a Qwen3.5 token mixer and MoE block, each read from the
hyper-connection streams and injected back into them (``hyper_connections``); a GDN layer
with per-layer embeddings first adds PLE to the streams.

    streams += ple(streams, ids)                       (PLE layers only)
    x, z = mixer_connection(streams);  streams = streams + 2σ(z / hc) ⊗ mixer(x)
    x, z = ffn_connection(streams);    streams = streams + 2σ(z / hc) ⊗ moe(x)

There is no input or post-attention norm: each connection norms the streams it reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...backends import Backend, Weight
from ...memory_kinds import LayerMemory
from ..batch import Batch
from ..qwen3_5.gdn import GatedDeltaNet
from ..qwen3_5.mlp import SparseMoe
from .config import INDEXED_ATTENTION, Qwen4ExpGeometry, moe_config
from .hyper_connections import HyperConnection
from .ple import PerLayerEmbedding
from .qsa import IndexedAttention

Array = Any


class DecoderLayer:
    def __init__(
        self,
        index: int,
        g: Qwen4ExpGeometry,
        backend: Backend,
        weights: Mapping[str, Weight],
    ):
        prefix = f"text/layers/{index}/"
        self.mixer_connection = HyperConnection(
            prefix + "mixer_connection/", g.hyper, g.eps, backend, weights, with_inject=True
        )
        self.ffn_connection = HyperConnection(
            prefix + "ffn_connection/", g.hyper, g.eps, backend, weights, with_inject=True
        )
        self.mixer: IndexedAttention | GatedDeltaNet
        if g.layer_types[index] == INDEXED_ATTENTION:
            assert g.attention is not None and g.indexer is not None
            self.mixer = IndexedAttention(prefix, g.attention, g.indexer, g.eps, backend, weights)
        else:
            assert g.gdn is not None
            self.mixer = GatedDeltaNet(prefix, g.gdn, g.eps, backend, weights)
        self.ple = None
        if g.ple is not None and index in g.ple.layers:
            self.ple = PerLayerEmbedding(
                prefix, index, g.ple, g.hyper.streams, g.eps, backend, weights
            )
        self.ffn = SparseMoe(prefix, moe_config(g), backend, weights)

    @staticmethod
    def parameter_names(index: int, g: Qwen4ExpGeometry) -> list[str]:
        prefix = f"text/layers/{index}/"
        names = [
            *HyperConnection.parameter_names(prefix + "mixer_connection/", with_inject=True),
            *HyperConnection.parameter_names(prefix + "ffn_connection/", with_inject=True),
            *SparseMoe.parameter_names(prefix, moe_config(g)),
        ]
        if g.layer_types[index] == INDEXED_ATTENTION:
            names += IndexedAttention.parameter_names(prefix)
        else:
            names += GatedDeltaNet.parameter_names(prefix)
        if g.ple is not None and index in g.ple.layers:
            names += PerLayerEmbedding.parameter_names(prefix)
        return names

    def __call__(self, streams: Array, ids: Array, batch: Batch, memory: LayerMemory) -> Array:
        """The streams [N, hc·H] of rows with token ids [N] -> the streams after this layer."""
        if self.ple is not None:
            streams = streams + self.ple(streams, ids, batch, memory)  # type: ignore[arg-type]
        x, logits = self.mixer_connection(streams)
        out = self.mixer(x, batch, memory)  # type: ignore[arg-type]
        streams = self.mixer_connection.inject(streams, out, logits)  # type: ignore[arg-type]
        x, logits = self.ffn_connection(streams)
        return self.ffn_connection.inject(streams, self.ffn(x), logits)  # type: ignore[arg-type]

    def commit(self, memory: LayerMemory, slots: Array, counts: Array) -> None:
        """After a multi-row step: fold each lane's first ``counts[i]`` rows into its
        recurrent states (attention K/V needs nothing)."""
        if isinstance(self.mixer, GatedDeltaNet):
            self.mixer.commit(memory, slots, counts)  # type: ignore[arg-type]
        if self.ple is not None:
            self.ple.commit(memory, slots, counts)  # type: ignore[arg-type]
