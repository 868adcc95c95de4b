"""GLM5Next's decoder layer: a token mixer (KDA or latent attention) and an FFN (clamped MLP or
grouped MoE), each between the hyper-connection streams:

    x, post, comb = mixer_connection(streams);  y = mixer(RMSNorm(x; input_norm))
    streams       = post ⊗ y + combᵀ streams
    x, post, comb = ffn_connection(streams);    y = ffn(RMSNorm(x; post_attention_norm))
    streams       = post ⊗ y + combᵀ streams

(plain-weight RMSNorms, ``x / rms(x) · w``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ninfer_format.binders.glm5_next_geometry import Glm5NextGeometry

from ...backends import Backend, Weight
from ...memory_kinds import LayerMemory, MemoryKind
from ...ops.registry import resolve
from ..batch import Batch
from . import kda, mla
from .config import INDEXED_ATTENTION, SPARSE
from .ffn import ClampedMlp, GroupedMoe
from .hyper_connections import HyperConnection
from .kda import KimiDeltaAttention
from .mla import LatentAttention

Array = Any


class DecoderLayer:
    def __init__(self, i: int, g: Glm5NextGeometry, backend: Backend, w: Mapping[str, Weight]):
        p = f"text/layers/{i}/"
        self.backend, self.eps = backend, g.eps
        self.mixer_connection = HyperConnection(p + "mixer_connection/", g.hyper, g.eps, backend, w)
        self.ffn_connection = HyperConnection(p + "ffn_connection/", g.hyper, g.eps, backend, w)
        self.input_norm = backend.array(w[p + "input_norm"])
        self.post_attention_norm = backend.array(w[p + "post_attention_norm"])
        self.mixer: KimiDeltaAttention | LatentAttention
        if g.layer_types[i] == INDEXED_ATTENTION:
            assert g.mla is not None
            indexer = g.indexer if g.runs_indexer(i) else None
            self.mixer = LatentAttention(p, g.mla, indexer, g.eps, backend, w)
        else:
            assert g.kda is not None
            self.mixer = KimiDeltaAttention(p, g.kda, g.eps, backend, w)
        self.ffn: GroupedMoe | ClampedMlp
        if g.mlp_types[i] == SPARSE:
            assert g.moe is not None and g.routing is not None
            self.ffn = GroupedMoe(p, g.moe, g.routing, g.swiglu_limit, backend, w)
        else:
            self.ffn = ClampedMlp(p + "mlp/", g.swiglu_limit, backend, w)

    @staticmethod
    def parameter_names(i: int, g: Glm5NextGeometry) -> list[str]:
        p = f"text/layers/{i}/"
        names = [p + "input_norm", p + "post_attention_norm"]
        names += HyperConnection.parameter_names(p + "mixer_connection/")
        names += HyperConnection.parameter_names(p + "ffn_connection/")
        if g.layer_types[i] == INDEXED_ATTENTION:
            names += LatentAttention.parameter_names(p, g.runs_indexer(i))
        else:
            names += KimiDeltaAttention.parameter_names(p)
        if g.mlp_types[i] == SPARSE:
            assert g.moe is not None
            names += GroupedMoe.parameter_names(p, g.moe)
        else:
            names += ClampedMlp.parameter_names(p + "mlp/")
        return names

    @staticmethod
    def memory_spec(i: int, g: Glm5NextGeometry) -> MemoryKind:
        """What the layer keeps per sequence: latent pages, or KDA slots."""
        if g.layer_types[i] == INDEXED_ATTENTION:
            assert g.mla is not None
            return mla.memory_spec(g.mla, g.indexer if g.runs_indexer(i) else None)
        assert g.kda is not None
        return kda.memory_spec(g.kda)

    def __call__(
        self, streams: Array, batch: Batch, memory: LayerMemory, chosen: list[Array] | None
    ) -> tuple[Array, list[Array] | None]:
        """Streams [N, n, H] -> the streams after the layer, and the tokens its attention
        chose for each query group (None from a KDA layer), for a ``shared`` layer next."""
        eps, rms_norm = self.eps, resolve("norm", "rms_norm", device=self.backend.name)
        x, post, comb = self.mixer_connection(streams)
        x = rms_norm(x, self.input_norm, eps, offset=0.0)
        if isinstance(self.mixer, LatentAttention):
            y, chosen = self.mixer(x, batch, memory, chosen)  # type: ignore[arg-type]
        else:
            y, chosen = self.mixer(x, batch, memory), None  # type: ignore[arg-type]
        streams = HyperConnection.merge(streams, y, post, comb)
        x, post, comb = self.ffn_connection(streams)
        y = self.ffn(rms_norm(x, self.post_attention_norm, eps, offset=0.0))
        return HyperConnection.merge(streams, y, post, comb), chosen
