"""Qwen3.5 / Qwen3.6 text model (dense and MoE), notes 5.1:

    h = token_embedding[ids]
    for each layer:  h = h + mixer(RMSNorm_1p(h))      mixer = GDN or gated attention
                     h = h + ffn(RMSNorm_1p(h))        ffn = dense MLP or MoE
    hidden = RMSNorm_1p(h; final_norm)                 (what the MTP head consumes)
    logits = output_head hidden

RMSNorm_1p is the zero-centred norm ``x / rms(x) * (1 + w)``. Each residual add is done
together with the norm that reads its result (``add_norm``), so a layer hands its ffn output
to the next layer (or the final norm) still pending.

Only the math lives here; lanes, batches, prefill chunks and decode-step capture are the
runner's (``ninfer_runtime.runner``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...backends import Backend
from ...errors import ModelError
from ...memory_kinds import MemoryKind
from ...ops.attention.memory import AttentionPages, KvSpec
from ...ops.delta_rule.memory import GdnSpec
from ...parallel import Collective, Shard, Solo
from ...state import ContextPool
from ..base import prepare_parameters, require_parameters
from ..batch import Batch
from ..registry import register_model
from .attention import Rotary
from .config import FULL_ATTENTION, LINEAR_ATTENTION, Qwen35Config
from .gdn import GatedDeltaNet
from .layer import DecoderLayer, add_norm
from .mtp import MtpHead
from .shard import ShardedArtifact, local_config

Array = Any
PROPOSAL_HEAD, PROPOSAL_IDS = "proposal/head", "proposal/token_ids"


class Qwen35Model:
    """The model's math: weights prepared on a backend once, state kept outside."""

    def __init__(
        self,
        artifact: Any,
        backend: Backend,
        collective: Collective | None = None,
        expert_parallel: bool = False,
        expert_offload: Any = None,
    ):
        """``expert_offload`` (an ``expert_offload.ExpertOffload``): the text layers' routed
        experts are not prepared here; it holds them and splits each MoE block."""
        self.collective = collective = collective or Solo()
        c = Qwen35Config.from_text_config(artifact.components["text"].config)
        if collective.world > 1:  # this rank's heads and columns, or experts (shard.py)
            shard = Shard(collective.rank, collective.world, expert_parallel)
            artifact = ShardedArtifact(artifact, c, shard)
            c = local_config(c, shard)
        self.config = c
        self.backend = backend
        #: a prefill read may keep checkpoints inside it (``batch.Mark``): its only layers
        #: with slot states, the Gated DeltaNets, save them at each mark; one rank only (the
        #: other ranks' pools are their processes')
        self.checkpoints_inside_reads = collective.world == 1
        for kind in c.layer_types:
            if kind not in (FULL_ATTENTION, LINEAR_ATTENTION):
                raise ModelError(f"unknown layer type {kind!r} in the text config")
        self.with_mtp = with_mtp = "mtp" in artifact.components
        if c.attention is None and (with_mtp or FULL_ATTENTION in c.layer_types):
            raise ModelError("full attention (a layer or the mtp block) needs num_attention_heads")
        names = self.parameter_names(c, with_mtp)
        require_parameters(artifact, names)
        # the indexed proposal head (spec 5.6): the rows of the output head the drafter scores
        proposal = with_mtp and PROPOSAL_HEAD in artifact.bindings
        loaded = names + [PROPOSAL_HEAD] * proposal
        w = prepare_parameters(self, artifact, backend, loaded, expert_offload)
        self.token_embedding = w["text/token_embedding"]
        self.output_head = w["text/output_head"]
        self.final_norm = backend.array(w["text/final_norm"])
        reduce = collective.all_reduce
        self.layers = [
            DecoderLayer(f"text/layers/{i}/", kind, c, backend, w, reduce)
            for i, kind in enumerate(c.layer_types)
        ]
        if expert_offload is not None:
            expert_offload.attach(self.layers)
        self.rotary = Rotary(c.attention, backend.xp) if c.attention else None
        self.mtp = (
            MtpHead(c, backend, w, self.token_embedding, self.logits, reduce) if with_mtp else None
        )
        self.proposal_head = self.proposal_ids = None
        if proposal:
            self.proposal_head = w[PROPOSAL_HEAD]
            ids = np.asarray(artifact.parameter(PROPOSAL_IDS), dtype=np.int32)
            self.proposal_ids = backend.xp.asarray(ids)

    @staticmethod
    def parameter_names(c: Qwen35Config, with_mtp: bool) -> list[str]:
        names = ["text/token_embedding", "text/output_head", "text/final_norm"]
        for i, kind in enumerate(c.layer_types):
            names += DecoderLayer.parameter_names(f"text/layers/{i}/", kind, c)
        if with_mtp:
            names += MtpHead.parameter_names(c)
        return names

    @property
    def has_mtp(self) -> bool:
        return self.mtp is not None

    def state_specs(self) -> tuple[list[MemoryKind], MemoryKind | None]:
        """What each layer (and the MTP layer, if any) keeps per sequence: K/V pages for
        full attention, recurrent and convolution slots for Gated DeltaNet."""
        c = self.config
        specs: list[MemoryKind] = []
        for kind in c.layer_types:
            if kind == FULL_ATTENTION:
                assert c.attention is not None
                specs.append(KvSpec(c.attention.kv_heads, c.attention.head_dim))
            else:
                assert c.gdn is not None
                g = c.gdn
                specs.append(
                    GdnSpec(g.value_heads, g.key_dim, g.value_dim, g.conv_channels, g.conv_kernel)
                )
        mtp: MemoryKind | None = None
        if self.with_mtp and c.attention is not None:  # known before the weights load
            mtp = KvSpec(c.attention.kv_heads, c.attention.head_dim)
        return specs, mtp

    # ------------------------------------------------------------------------ positions
    def rope(self, positions: np.ndarray) -> tuple[Array, Array]:
        """Device cos/sin rows of host ``positions`` ([N], or [3, N] multimodal positions,
        mrope.py); (None, None) without attention."""
        return self.rotary(positions) if self.rotary is not None else (None, None)

    def rope_table(self, positions: int) -> tuple[Array, Array] | None:
        """Device cos/sin tables for positions ``0 .. positions - 1`` (None without attention),
        which a decode step indexes on the device."""
        return self.rotary.table(positions) if self.rotary is not None else None

    # ---------------------------------------------------------------------------- math
    def embed(self, ids: Array) -> Array:
        """Token ids [N] -> their input embeddings [N, H]."""
        return self.backend.embedding(ids, self.token_embedding)

    def hidden_states(
        self, ids: Array, batch: Batch, pool: ContextPool, embeddings: Array | None = None
    ) -> Array:
        """Token ids [N] through the embedding, every layer and the final norm -> [N, H].
        ``embeddings`` [N, H], when given, are the layers' input instead (a prompt's token
        embeddings with its images' rows placed, ``ninfer_runtime.multimodal``)."""
        h, pending = self.embed(ids) if embeddings is None else embeddings, None
        for layer, memory in zip(self.layers, pool.layers, strict=True):
            h, pending = layer(h, pending, batch, memory)
        return add_norm(self.backend, h, pending, self.final_norm, self.config.eps)[1]

    def logits(self, hidden: Array) -> Array:
        """Hidden states [N, H] -> vocabulary logits [N, V] (each rank's rows of the head,
        gathered)."""
        return self.collective.all_gather(self.backend.linear(hidden, self.output_head))

    def mtp_logits(
        self,
        hidden: Array,
        next_ids: Array,
        batch: Batch,
        memory: AttentionPages,
        embeddings: Array | None = None,
    ) -> Array:
        """Draft logits of the MTP block (``MtpHead``) for rows laid out by ``batch``;
        ``embeddings`` [N, H]: the next tokens' input rows instead of their embeddings (a
        prompt's, its images' rows placed)."""
        return self._mtp_head()(hidden, next_ids, batch, memory, embeddings)

    def mtp_hidden(
        self,
        hidden: Array,
        next_ids: Array,
        batch: Batch,
        memory: AttentionPages,
        embeddings: Array | None = None,
    ) -> Array:
        """The MTP block's post-norm output (what the next draft step continues from)."""
        return self._mtp_head().hidden(hidden, next_ids, batch, memory, embeddings)

    @property
    def has_proposal_head(self) -> bool:
        return self.proposal_head is not None

    def propose(self, hidden: Array, *, optimized: bool = True) -> Array:
        """The drafter's most likely next token for each MTP output row -> int [N]; scored
        over the proposal head's rows when the artifact has one and ``optimized``."""
        xp = self.backend.xp
        if optimized and self.proposal_head is not None:
            best = xp.argmax(self.backend.linear(hidden, self.proposal_head), axis=-1)
            return self.proposal_ids[best]
        return xp.argmax(self.logits(hidden), axis=-1)

    def commit(self, pool: ContextPool, slots: Array, counts: Array) -> None:
        """After a verification (``DecodeIndex.tokens > 1``): fold each lane's first
        ``counts[i]`` tokens into its recurrent states (attention K/V needs nothing: rows
        past a sequence's length are never read)."""
        for layer, memory in zip(self.layers, pool.layers, strict=True):
            if isinstance(layer.mixer, GatedDeltaNet):
                layer.mixer.commit(memory, slots, counts)  # type: ignore[arg-type]

    def _mtp_head(self) -> MtpHead:
        if self.mtp is None:
            raise ModelError("artifact has no mtp component")
        return self.mtp


@register_model("qwen3_5_text", "qwen3_5_moe_text")
def load_qwen3_5(
    artifact: Any,
    backend: Backend,
    collective: Collective | None = None,
    expert_parallel: bool = False,
    expert_offload: Any = None,
) -> Qwen35Model:
    return Qwen35Model(artifact, backend, collective, expert_parallel, expert_offload)
