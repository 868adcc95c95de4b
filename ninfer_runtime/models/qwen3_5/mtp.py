"""The multi-token-prediction head (Qwen3.5 ``mtp``), notes 5.8.

To draft token t+2 it combines what the main model knew at t with the token chosen at t+1:

    e = RMSNorm_1p(embed(id_{t+1}); embedding_norm);  hh = RMSNorm_1p(h_t; hidden_norm)
    x = input_projection [e | hh]                      (embedding first, then hidden)
    x = full-attention decoder layer at the position of token t+1, with its own K/V cache
    logits = output_head RMSNorm_1p(x; final_norm)        (embedding and head shared with text)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ...backends import Backend, Weight
from ...ops.attention.memory import AttentionPages
from ...ops.registry import resolve
from ..batch import Batch
from .config import FULL_ATTENTION, Qwen35Config
from .layer import DecoderLayer, add_norm

Array = Any
PREFIX = "mtp/layers/0/"


class MtpHead:
    def __init__(
        self,
        c: Qwen35Config,
        backend: Backend,
        weights: Mapping[str, Weight],
        token_embedding: Weight,
        logits: Callable[[Array], Array],
        reduce: Callable[[Array], Array] | None = None,
    ):
        self.backend, self.eps = backend, c.eps
        self.token_embedding, self.logits = token_embedding, logits
        self.input_projection = weights["mtp/input_projection"]
        self.embedding_norm = backend.array(weights["mtp/embedding_norm"])
        self.hidden_norm = backend.array(weights["mtp/hidden_norm"])
        self.final_norm = backend.array(weights["mtp/final_norm"])
        self.block = DecoderLayer(PREFIX, FULL_ATTENTION, c, backend, weights, reduce)

    @staticmethod
    def parameter_names(c: Qwen35Config) -> list[str]:
        names = ["mtp/input_projection", "mtp/embedding_norm", "mtp/hidden_norm", "mtp/final_norm"]
        return names + DecoderLayer.parameter_names(PREFIX, FULL_ATTENTION, c)

    def __call__(
        self,
        hidden: Array,
        next_ids: Array,
        batch: Batch,
        memory: AttentionPages,
        embeddings: Array | None = None,
    ) -> Array:
        return self.logits(self.hidden(hidden, next_ids, batch, memory, embeddings))

    def hidden(
        self,
        hidden: Array,
        next_ids: Array,
        batch: Batch,
        memory: AttentionPages,
        embeddings: Array | None = None,
    ) -> Array:
        """The block's post-norm output [N, H]: what the head reads, and what the next draft
        step pairs with the token drafted from it. ``embeddings`` [N, H], when given, stand
        for the next tokens' embeddings: a prompt's, where an image's placeholders read the
        vision tower's rows, as the main model's layers do."""
        be, eps = self.backend, self.eps
        if embeddings is None:
            embeddings = be.embedding(next_ids, self.token_embedding)
        rms_norm = resolve("norm", "rms_norm", device=be.name)
        e = rms_norm(embeddings, self.embedding_norm, eps, offset=1.0)
        h = rms_norm(hidden, self.hidden_norm, eps, offset=1.0)
        x = be.linear(be.xp.concatenate([e, h], axis=-1), self.input_projection)
        x, pending = self.block(x, None, batch, memory)
        return add_norm(be, x, pending, self.final_norm, eps)[1]
