"""GLM5Next text model ("GLM-5.3-Flash"; ``glm5_next``, ``glm5_next_text``):

    streams = [e | … | e] (hc_mult copies of the token embedding)      [N, n, H]
    for each layer:  streams = layer(streams)        KDA or latent attention, then MLP or MoE,
                                                     each between hyper-connections (layer.py)
    hidden  = RMSNorm(mean of the streams; final_norm)
    logits  = output_head hidden

The attention layers are NoPE (positions reach the model through the KDA layers only), so
there are no RoPE tables. A ``shared`` attention layer attends over the tokens the attention
layer right before it chose. transformers defines no MTP block for GLM5Next; an artifact's
``mtp`` component, if any, is not run. Only the math lives here; lanes, batches and steps are
the runner's. The math is written on the backend's array module and its KDA, latent-attention
and grouped-router ops have reference providers on CPU and CUDA alike; the model is served on
the backends in ``SERVED_BACKENDS``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ninfer_format.binders.glm5_next_geometry import Glm5NextGeometry

from ...backends import Backend
from ...errors import ModelError
from ...functional import ranked_rows
from ...memory_kinds import MemoryKind
from ...ops.registry import resolve
from ...parallel import Collective
from ...state import ContextPool
from ..base import WithoutMtp, prepare_parameters, require_parameters
from ..batch import Batch, token_bucket
from ..registry import check_backend, register_model
from .config import read_config
from .hyper_connections import collapse, expand
from .kda import KimiDeltaAttention
from .layer import DecoderLayer

Array = Any
GLOBALS = ("text/token_embedding", "text/output_head", "text/final_norm")
#: the backends GLM5Next is served on: the math and its ops' reference providers are
#: array-generic; cuda since tests/gpu/test_glm5_next_cuda.py passed on an H100
SERVED_BACKENDS = ("cpu", "cuda")


class Glm5NextModel(WithoutMtp):
    """The model's math: weights prepared on a backend once, state kept outside."""

    architecture = "GLM5Next"
    #: a prefill read may keep checkpoints inside it (``batch.Mark``): its only layers with
    #: slot states, the KDA layers, save them at each mark (latent pages hold no slot state)
    checkpoints_inside_reads = True

    def __init__(self, artifact: Any, backend: Backend, expert_offload: Any = None):
        """``expert_offload`` (an ``expert_offload.ExpertOffload``): the routed experts it
        plans into host memory are not prepared here; it splits each MoE block."""
        g = read_config(artifact.components["text"].config)
        self.config: Glm5NextGeometry = g
        self.backend = backend
        names = self.parameter_names(g)
        require_parameters(artifact, names)
        w = prepare_parameters(self, artifact, backend, names, expert_offload)
        self.token_embedding = w["text/token_embedding"]
        self.output_head = w["text/output_head"]
        self.final_norm = backend.array(w["text/final_norm"])
        self.layers = [DecoderLayer(i, g, backend, w) for i in range(g.layers)]
        if expert_offload is not None:
            expert_offload.attach(self.layers)

    @staticmethod
    def parameter_names(g: Glm5NextGeometry) -> list[str]:
        names = list(GLOBALS)
        for i in range(g.layers):
            names += DecoderLayer.parameter_names(i, g)
        return names

    def state_specs(self) -> tuple[list[MemoryKind], MemoryKind | None]:
        """Latent pages for attention layers, recurrent and convolution slots for KDA; no
        MTP layer."""
        return [DecoderLayer.memory_spec(i, self.config) for i in range(self.config.layers)], None

    # ------------------------------------------------------------------------ positions
    def rope(self, positions: np.ndarray) -> tuple[Array, Array]:
        """No RoPE: the attention layers are NoPE."""
        return None, None

    def rope_table(self, positions: int) -> tuple[Array, Array] | None:
        return None

    # ------------------------------------------------------------------------ steps
    def step_variant(self, kind: str, last_position: int) -> tuple[int, bool]:
        """A compiled step's variant, the tokens its attention layers read (``token_bucket``
        of the last position its rows reach, host-known), so no step reads its positions
        back; and whether it may be captured: its products between arrays are the linear
        family's ``matmul`` (ours inside a capture), and its indexer ranks a row's pools on
        the device while a row's ranking fits (``functional.ranked_rows``; past that, about
        64k tokens, it sorts, which waits for the device)."""
        bucket, indexer = token_bucket(last_position), self.config.indexer
        return bucket, indexer is None or ranked_rows(bucket // indexer.kpool) > 0

    # ---------------------------------------------------------------------------- math
    def embed(self, ids: Array) -> Array:
        return self.backend.embedding(ids, self.token_embedding)

    def hidden_states(
        self, ids: Array, batch: Batch, pool: ContextPool, embeddings: Array | None = None
    ) -> Array:
        """Token ids [N] through the embedding, every layer and the final norm -> [N, H]."""
        h = self.embed(ids) if embeddings is None else embeddings
        streams, chosen = expand(h, self.config.hyper.streams), None
        for layer, memory in zip(self.layers, pool.layers, strict=True):
            streams, chosen = layer(streams, batch, memory, chosen)
        rms_norm = resolve("norm", "rms_norm", device=self.backend.name)
        return rms_norm(collapse(streams), self.final_norm, self.config.eps, offset=0.0)

    def logits(self, hidden: Array) -> Array:
        return self.backend.linear(hidden, self.output_head)

    def commit(self, pool: ContextPool, slots: Array, counts: Array) -> None:
        """After a multi-row step: fold each lane's first ``counts[i]`` rows into its KDA
        states (latent pages need nothing: rows past a sequence's length are never read)."""
        for layer, memory in zip(self.layers, pool.layers, strict=True):
            if isinstance(layer.mixer, KimiDeltaAttention):
                layer.mixer.commit(memory, slots, counts)  # type: ignore[arg-type]


@register_model("glm5_next", "glm5_next_text")
def load_glm5_next(
    artifact: Any,
    backend: Backend,
    collective: Collective | None = None,
    expert_parallel: bool = False,
    expert_offload: Any = None,
) -> Glm5NextModel:
    check_backend("GLM5Next", backend, SERVED_BACKENDS, None)
    if collective is not None and collective.world > 1:
        raise ModelError("GLM5Next has no tensor-parallel split yet: run it on one rank")
    return Glm5NextModel(artifact, backend, expert_offload)
